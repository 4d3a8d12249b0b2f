//! Full compaction of one region: fill the lowest holes exactly with the
//! topmost blocks, then slide what is left down.
//!
//! A plain [`slide()`] moves every block above the first hole that can go
//! lower, each onto space the block before it has just left. With one hole
//! at the bottom of N equal blocks that is N - 1 moves, a chain that must run
//! one after another; putting the topmost block into the hole is one move.
//!
//! Phase 1 (fill from the top) takes the region's holes, the free ranges
//! between all its blocks, pinned or not, in address order. Each is filled
//! from its start with the topmost movable blocks not used yet, strictly in
//! order from the top, each placed where the one before ended. A block is
//! used only if that offset is a multiple of its alignment, it fits in what
//! is left of the hole, and it lies wholly at or above the hole's end. A
//! hole counts only if it ends up full to its last byte, with no padding.
//! The first hole that cannot be filled so (the next block is too big,
//! misaligned there, or not above the hole) keeps nothing and ends phase 1.
//!
//! Phase 2 slides the blocks as they lie after phase 1.
//!
//! The plan is phase 1's moves, then phase 2's. Executed in that order, it
//! is safe:
//! - A phase-1 move copies a block's current bytes into a range that was
//!   free when the plan was made. No destination overlaps any block, so none
//!   overlaps its own source or another move's: the phase-1 moves are
//!   independent of one another (they may run in any order, or as one batch)
//!   and overwrite nothing live.
//! - Once they ran, memory holds the layout phase 2 was planned for, and the
//!   slide's own argument (slide.rs) covers its moves.
//! - No block moves twice, which [`crate::Heap::commit`] would reject. Phase 1
//!   stops at the first hole it cannot fill, so once it ran no byte is free
//!   from the region's start to the end of the last hole it filled: every
//!   hole there is full, and every block it took came from above that end
//!   (the last block taken lies above the last hole filled, and each one
//!   taken before it lies higher still). A slide leaves such a packed prefix
//!   where it is: each block there finds every segment below its own full,
//!   and its own segment filled up to exactly its offset, a multiple of its
//!   alignment. So phase 2 moves none of the blocks phase 1 placed.
//!
//! # Bytes copied
//!
//! One would expect phase 1 to copy only blocks the slide copies too (they
//! all lie above the first hole) and phase 2 a subset of the rest. That is
//! not so: alignment and pins can keep a block above a hole where it is in a
//! slide. With a free `[0, 768)`, then a 1-byte block at 768 (256-aligned), a
//! 1024-byte block at 1024 (1024-aligned) and a 768-byte block at 2048
//! (1024-aligned), phase 1 moves the last block into the hole, 768 bytes. The
//! slide moves only the 1-byte block, to 0, after which the next 1024-byte
//! boundary is 1024 again and the two big blocks stay: 1 byte. So the
//! two-phase plan is kept only when it copies no more bytes than the plain
//! slide; otherwise the plan is the slide.

use alloc::vec::Vec;

use super::{Move, Placed, holes, moved, slide};
use crate::Extent;

/// Moves that compact the `blocks` (sorted by offset, movable ones inside
/// `region`) of one region toward its low end, in execution order: phase 1
/// then phase 2, or the plain slide where that copies fewer bytes. Never
/// copies more bytes than [`slide()`], and empty wherever that is (nothing
/// moves, or the slide finds the blocks are not a sound layout).
pub(crate) fn pack(region: Extent, blocks: &[Placed]) -> Vec<Move> {
    let plain = slide(region, blocks);
    let (mut moves, packed_end) = fill_from_top(region, blocks);
    if moves.is_empty() {
        return plain;
    }
    let rest = slide(region, &moved(blocks, &moves));
    // For a sound layout phase 2 starts above the packed prefix (module
    // doc); a block at an offset its own alignment rules out (a broken
    // allocator) could break that, and then the slide alone is the answer.
    let prefix_kept = rest.iter().all(|m| m.src >= packed_end);
    if !prefix_kept || bytes(&moves).saturating_add(bytes(&rest)) > bytes(&plain) {
        return plain;
    }
    moves.extend(rest);
    moves
}

/// Phase 1: moves that fill the lowest holes of `region` exactly with its
/// topmost movable blocks, and the end of the last hole filled (the region's
/// start if none was). Once the moves ran, no byte below that end is free and
/// every block above it is where it was or gone.
fn fill_from_top(region: Extent, blocks: &[Placed]) -> (Vec<Move>, u64) {
    let movable: Vec<&Placed> = blocks.iter().filter(|b| !b.pinned).collect();
    // `movable[..top]` are the blocks not used yet, the topmost last.
    let mut top = movable.len();
    let mut moves = Vec::new();
    let mut packed_end = region.offset;
    for hole in holes(region, blocks) {
        let kept = moves.len();
        let mut at = hole.offset;
        while at < hole.end() {
            let next = top.checked_sub(1).and_then(|i| movable.get(i));
            let usable = next.filter(|b| {
                b.offset >= hole.end() && at % b.align == 0 && b.size <= hole.end() - at
            });
            let Some(block) = usable else {
                moves.truncate(kept);
                return (moves, packed_end);
            };
            moves.push(Move::new(block.handle, block.offset, at, block.size));
            at += block.size;
            top -= 1;
        }
        packed_end = hole.end();
    }
    (moves, packed_end)
}

/// Bytes `moves` copy.
fn bytes(moves: &[Move]) -> u64 {
    moves.iter().fold(0, |sum, m| sum.saturating_add(m.len))
}

#[cfg(test)]
mod tests;
