//! Targeted compaction: make room for one request while copying as few bytes
//! as possible.
//!
//! The request needs a window `[start, start + size)` with `start` aligned,
//! inside one region, and free of pinned blocks. Every block that touches the
//! window has to leave it, so a window costs the bytes of the blocks it
//! touches. The cheapest windows are tried in turn; for each, its blocks are
//! placed, largest first, best-fit into the free holes outside the window.
//!
//! Only holes that are free before the plan runs are used, so no destination
//! overlaps any block's current bytes and the moves can run in any order.
//!
//! When no window's blocks fit in the holes around it (free space scattered
//! in many small holes), the fallback is the full compaction ([`pack`]) of
//! the one region where it makes room, moving the fewest bytes: the same
//! per-region plan as [`crate::Heap::plan_full`], so whatever a full
//! compaction makes room for, this finds. Its moves may overlap their
//! sources, like any slide.

use alloc::vec::Vec;

use super::{Move, Placed, fit_in, holes, moved, pack};
use crate::Extent;

/// How many of the cheapest windows to try before giving up. Placing the
/// blocks of one window costs O(blocks x holes); the cap keeps a hopeless
/// request from costing that once per candidate window.
const WINDOWS_TRIED: usize = 64;

/// A candidate window and the blocks it touches.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Bytes of the blocks touching the window.
    cost: u64,
    /// Aligned first byte.
    start: u64,
    /// Index of the region in the layout.
    region: usize,
    /// The touching blocks are `blocks[lo..hi]` of that region.
    lo: usize,
    hi: usize,
}

/// Moves, in execution order, after which `[start, start + size)` is free
/// for some aligned `start`; empty if such a window is free already. `None`
/// if no tried window's blocks fit in the holes outside it and no region's
/// full compaction makes room either.
///
/// `layout` is every region with its blocks, sorted by offset.
///
/// `steps` grows by the work done, in blocks and holes looked at.
pub(crate) fn make_room(
    layout: &[(Extent, Vec<Placed>)],
    size: u64,
    align: u64,
    steps: &mut u64,
) -> Option<Vec<Move>> {
    let blocks: usize = layout.iter().map(|(_, blocks)| blocks.len()).sum();
    *steps = steps.saturating_add(blocks as u64);
    let mut windows: Vec<Window> = layout
        .iter()
        .enumerate()
        .flat_map(|(ri, (region, blocks))| windows_of(ri, *region, blocks, size, align))
        .collect();
    windows.sort_by_key(|w| (w.cost, w.start));
    windows.dedup_by_key(|w| w.start);
    if windows.first()?.cost == 0 {
        return Some(Vec::new());
    }
    let all_holes: Vec<Extent> = layout
        .iter()
        .flat_map(|(region, blocks)| holes(*region, blocks))
        .collect();
    *steps = steps.saturating_add(all_holes.len() as u64);
    windows
        .iter()
        .take(WINDOWS_TRIED)
        .find_map(|w| {
            let window = Extent::new(w.start, size);
            let victims = &layout[w.region].1[w.lo..w.hi];
            relocate(victims, outside(&all_holes, window), w.cost, steps)
        })
        .or_else(|| {
            // A full compaction of each region walks its blocks a few times.
            *steps = steps.saturating_add(4 * blocks as u64);
            compaction_making_room(layout, size, align)
        })
}

/// The full compaction of one region after which the request fits, the one
/// that copies the fewest bytes.
fn compaction_making_room(
    layout: &[(Extent, Vec<Placed>)],
    size: u64,
    align: u64,
) -> Option<Vec<Move>> {
    layout
        .iter()
        .filter_map(|(region, blocks)| {
            let moves = pack(*region, blocks);
            let after = moved(blocks, &moves);
            let room = holes(*region, &after)
                .into_iter()
                .any(|hole| fit_in(hole, size, align).is_some());
            room.then_some(moves)
        })
        .min_by_key(|moves| moves.iter().map(|m| m.len).sum::<u64>())
}

/// Windows worth considering in one region. Sliding a window down until its
/// start meets the region's start or the end of a block never makes it touch
/// more blocks, so only starts just above those points are candidates.
fn windows_of(ri: usize, region: Extent, blocks: &[Placed], size: u64, align: u64) -> Vec<Window> {
    let mut bytes_before = Vec::with_capacity(blocks.len() + 1);
    let mut pins_before = Vec::with_capacity(blocks.len() + 1);
    let (mut bytes, mut pins) = (0u64, 0usize);
    for b in blocks {
        bytes_before.push(bytes);
        pins_before.push(pins);
        bytes = bytes.saturating_add(b.size);
        pins += usize::from(b.pinned);
    }
    bytes_before.push(bytes);
    pins_before.push(pins);

    core::iter::once(region.offset)
        .chain(blocks.iter().map(|b| b.extent().end()))
        .filter_map(|floor| {
            let start = crate::align_up(floor, align)?;
            let end = start.checked_add(size)?;
            if start < region.offset || end > region.end() {
                return None;
            }
            let lo = blocks.partition_point(|b| b.extent().end() <= start);
            let hi = blocks.partition_point(|b| b.offset < end).max(lo);
            (pins_before[hi] == pins_before[lo]).then(|| Window {
                cost: bytes_before[hi] - bytes_before[lo],
                start,
                region: ri,
                lo,
                hi,
            })
        })
        .collect()
}

/// `holes` with the bytes of `window` cut out.
fn outside(holes: &[Extent], window: Extent) -> Vec<Extent> {
    let mut out = Vec::with_capacity(holes.len() + 1);
    for h in holes {
        if !h.overlaps(&window) {
            out.push(*h);
            continue;
        }
        if h.offset < window.offset {
            out.push(Extent::new(h.offset, window.offset - h.offset));
        }
        if h.end() > window.end() {
            out.push(Extent::new(window.end(), h.end() - window.end()));
        }
    }
    out
}

/// Best-fit placement of `victims` (`cost` bytes in all) into `holes`,
/// largest first; `None` if one does not fit.
fn relocate(
    victims: &[Placed],
    mut holes: Vec<Extent>,
    cost: u64,
    steps: &mut u64,
) -> Option<Vec<Move>> {
    *steps = steps.saturating_add(holes.len() as u64);
    let room: u64 = holes.iter().map(|h| h.size).sum();
    if room < cost {
        return None;
    }
    let mut order: Vec<&Placed> = victims.iter().collect();
    order.sort_by(|a, b| b.size.cmp(&a.size).then(b.align.cmp(&a.align)));
    let mut moves = Vec::with_capacity(order.len());
    for v in order {
        *steps = steps.saturating_add(holes.len() as u64);
        let (i, at) = holes
            .iter()
            .enumerate()
            .filter_map(|(i, h)| fit_in(*h, v.size, v.align).map(|at| (i, at)))
            .min_by_key(|&(i, _)| (holes[i].size, holes[i].offset))?;
        let hole = holes.swap_remove(i);
        let end = at + v.size;
        if at > hole.offset {
            holes.push(Extent::new(hole.offset, at - hole.offset));
        }
        if hole.end() > end {
            holes.push(Extent::new(end, hole.end() - end));
        }
        moves.push(Move::new(v.handle, v.offset, at, v.size));
    }
    moves.sort_by_key(|m| m.dst);
    Some(moves)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::testing;
    use alloc::vec;

    fn block(slot: u32, offset: u64, size: u64, pinned: bool) -> Placed {
        testing::block(slot, offset, size, 1, pinned)
    }

    #[test]
    fn empties_the_cheapest_window() {
        // One region of 1000 bytes whose holes are all too small for 300.
        let region = Extent::new(0, 1000);
        let blocks = vec![
            block(0, 0, 250, false),
            block(1, 400, 10, false), // cheap to evict
            block(2, 650, 250, false),
        ];
        // Holes: [250,400) 150, [410,650) 240, [900,1000) 100. A 300-byte
        // window around block 1 costs 10 bytes.
        let moves = make_room(&[(region, blocks)], 300, 1, &mut 0).unwrap();
        assert_eq!(moves.len(), 1);
        assert_eq!(moves[0].handle.slot, 1);
        // The window is [250, 550); best fit among the 100-byte holes left
        // outside it takes the lower one.
        assert_eq!(moves[0].dst, 550);
        assert!(!moves[0].overlapping);
    }

    #[test]
    fn pinned_block_rules_out_windows() {
        let region = Extent::new(0, 300);
        let blocks = vec![block(0, 100, 10, true)];
        // Every 200-byte window in [0,300) contains the pinned block.
        assert_eq!(make_room(&[(region, blocks)], 200, 1, &mut 0), None);
    }

    #[test]
    fn scattered_holes_fall_back_to_full_compaction() {
        // Reported from ctx's pool: 101 KiB free in holes, none big enough
        // for the 29 KiB (8 KiB-aligned) request's evicted blocks.
        let placed = |slot, offset, size, align| {
            let align = super::super::planning_align(offset, align);
            testing::block(slot, offset, size, align, false)
        };
        let blocks = vec![
            placed(0, 0x0, 43009, 256),
            placed(1, 0xa900, 1, 256),
            placed(2, 0xc900, 11777, 128),
            placed(3, 0xf800, 38913, 2048),
            placed(4, 0x1fe00, 90625, 256),
            placed(5, 0x36400, 32769, 1024),
            placed(6, 0x46400, 77144, 512),
            placed(7, 0x5a000, 65092, 4096),
            placed(8, 0x69f00, 59092, 32),
        ];
        let region = Extent::new(0, 0x80000);
        let (size, align) = super::super::request_window(29200, 8192).unwrap();
        let layout = [(region, blocks.clone())];
        let moves = make_room(&layout, size, align, &mut 0).expect("a full compaction makes room");
        let after = moved(&blocks, &moves);
        let room = holes(region, &after)
            .into_iter()
            .any(|h| fit_in(h, size, align).is_some());
        assert!(room);
    }

    #[test]
    fn free_window_needs_no_moves() {
        let region = Extent::new(0, 300);
        let blocks = vec![block(0, 0, 100, false)];
        assert_eq!(
            make_room(&[(region, blocks)], 200, 1, &mut 0),
            Some(Vec::new())
        );
    }
}
