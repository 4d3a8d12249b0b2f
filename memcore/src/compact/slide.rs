//! Full compaction: slide every movable block of a region toward its low end.
//!
//! Pinned blocks cut the region into segments. Blocks are taken in address
//! order and each goes to the lowest segment where it fits, at that
//! segment's fill point (rounded up to the block's alignment); a block too
//! big for what is left before a pinned block goes past it, and the space it
//! left stays open for a later, smaller block.
//!
//! Why this order is safe to execute as plain copies in sequence: the block
//! at `src` could always stay where it is (its own place is free of pinned
//! blocks and above every fill point), so its destination is at most `src`,
//! and it ends at most where the block ends now, below every block not yet
//! moved. It lands on no block that still holds data: earlier blocks were
//! copied out already and their destinations are taken out of the segments,
//! later ones lie above. Only its own bytes can overlap, and the move says so.

use alloc::vec::Vec;

use super::{Move, Placed, fit_in, holes};
use crate::Extent;

/// Moves that slide the movable `blocks` (sorted by offset, all inside
/// `region`) of one region down, in execution order. Empty if nothing
/// moves, or if the blocks are not a sound layout.
pub(crate) fn slide(region: Extent, blocks: &[Placed]) -> Vec<Move> {
    let pinned: Vec<Placed> = blocks.iter().filter(|b| b.pinned).copied().collect();
    // Segments shrink from the front as blocks land in them; the front is
    // the segment's fill point.
    let mut segments = holes(region, &pinned);
    let mut moves = Vec::new();
    for block in blocks.iter().filter(|b| !b.pinned) {
        let landing = segments
            .iter_mut()
            .find_map(|seg| fit_in(*seg, block.size, block.align).map(|at| (seg, at)));
        let Some((segment, dst)) = landing else {
            // Unreachable for a sound layout (the block's own place fits);
            // moving nothing is the safe answer to an unsound one.
            return Vec::new();
        };
        let end = dst + block.size;
        *segment = Extent::new(end, segment.end() - end);
        if dst != block.offset {
            moves.push(Move::new(block.handle, block.offset, dst, block.size));
        }
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::testing::{block, dsts};

    #[test]
    fn packs_down_keeping_alignment() {
        let region = Extent::new(0, 10_000);
        let blocks = [
            block(0, 512, 100, 1, false),
            block(1, 1024, 100, 256, false),
            block(2, 4096, 10, 8, false),
        ];
        let moves = slide(region, &blocks);
        assert_eq!(dsts(&moves), [(0, 0), (1, 256), (2, 360)]);
        assert!(moves.iter().all(|m| !m.overlapping));
    }

    #[test]
    fn big_block_jumps_pinned_and_small_one_fills_gap() {
        let region = Extent::new(0, 10_000);
        let blocks = [
            block(0, 1000, 100, 1, true),
            block(1, 2000, 500, 1, false), // lands at 0
            block(2, 3000, 800, 1, false), // [500, 1300) would hit the pin: goes past
            block(3, 5000, 400, 1, false), // fills [500, 900)
        ];
        let moves = slide(region, &blocks);
        assert_eq!(dsts(&moves), [(1, 0), (2, 1100), (3, 500)]);
        // Block 2's destination [1100, 1900) does not touch its source.
        assert!(moves.iter().all(|m| !m.overlapping));
    }

    #[test]
    fn short_slide_overlaps_itself() {
        let region = Extent::new(0, 4096);
        let blocks = [block(0, 100, 1000, 1, false)];
        let moves = slide(region, &blocks);
        assert_eq!(dsts(&moves), [(0, 0)]);
        assert!(moves[0].overlapping);
    }

    #[test]
    fn unsound_layout_moves_nothing() {
        // Two blocks on top of each other cannot come from a heap.
        let region = Extent::new(0, 300);
        let blocks = [block(0, 0, 200, 1, false), block(1, 100, 200, 1, false)];
        assert!(slide(region, &blocks).is_empty());
    }
}
