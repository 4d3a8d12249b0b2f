//! The heap's own behaviour: handles, plans and their staleness.

use super::*;
use crate::{Fit, FreeList};
use alloc::vec::Vec;

const KIB: u64 = 1 << 10;

fn heap(size: u64) -> Heap<FreeList> {
    let mut heap = Heap::new(FreeList::new(Fit::First));
    heap.add_region(0, size).unwrap();
    heap
}

fn movable() -> BlockFlags {
    BlockFlags::empty()
}

#[test]
fn stale_handle_is_rejected_and_never_aliases() {
    let mut heap = heap(64 * KIB);
    let a = heap.allocate(KIB, 256, movable()).unwrap();
    heap.free(a).unwrap();
    // Same slot, next generation.
    let b = heap.allocate(KIB, 256, movable()).unwrap();
    assert_eq!(a.slot, b.slot);
    assert_ne!(a, b);
    assert_eq!(heap.get(a), None);
    assert_eq!(heap.offset(a), Err(Error::StaleHandle(a)));
    assert_eq!(
        heap.set_flags(a, BlockFlags::PINNED),
        Err(Error::StaleHandle(a))
    );
    let forged = Handle {
        heap: heap.id,
        slot: 99,
        generation: 0,
    };
    assert_eq!(heap.free(forged), Err(Error::StaleHandle(forged)));
    assert_eq!(heap.get(b).map(|i| i.offset), Some(0));
}

#[test]
fn another_heaps_handle_is_refused_and_frees_nothing() {
    let mut mine = heap(64 * KIB);
    let mut theirs = heap(64 * KIB);
    let kept = mine.allocate(KIB, 256, movable()).unwrap();
    // Same slot and generation as `kept`, made by the other heap.
    let foreign = theirs.allocate(KIB, 256, movable()).unwrap();
    assert_eq!(
        (foreign.slot, foreign.generation),
        (kept.slot, kept.generation)
    );
    assert_eq!(mine.free(foreign), Err(Error::ForeignHandle(foreign)));
    assert_eq!(mine.offset(foreign), Err(Error::ForeignHandle(foreign)));
    assert_eq!(mine.get(foreign), None);
    assert_eq!(
        mine.set_flags(foreign, BlockFlags::PINNED),
        Err(Error::ForeignHandle(foreign))
    );
    assert_eq!(mine.len(), 1);
    assert_eq!(mine.offset(kept), Ok(0));
    assert_eq!(mine.stats().live_bytes, KIB);
    assert_eq!(theirs.free(foreign).map(|info| info.size), Ok(KIB));
}

#[test]
fn another_heaps_plan_is_refused_even_at_the_same_epoch() {
    // Two heaps built alike are at the same epoch, with the same slots.
    let build = || {
        let mut heap = heap(64 * KIB);
        let a = heap.allocate(KIB, 256, movable()).unwrap();
        let b = heap.allocate(KIB, 256, movable()).unwrap();
        heap.free(a).unwrap();
        (heap, b)
    };
    let (mut mine, b) = build();
    let (theirs, _) = build();
    let plan = theirs.plan_full();
    assert_eq!(plan.moves().len(), 1);
    assert_eq!(plan.epoch, mine.epoch);
    assert_eq!(mine.commit(plan), Err(Error::ForeignPlan));
    // The block was not moved behind the caller's back.
    assert_eq!(mine.offset(b), Ok(KIB));
    let own = mine.plan_full();
    assert_eq!(mine.commit(own), Ok(()));
    assert_eq!(mine.offset(b), Ok(0));
}

#[test]
fn slot_whose_generations_ran_out_is_retired() {
    let mut heap = heap(64 * KIB);
    heap.generations.push(u32::MAX);
    let last = heap.allocate(KIB, 256, movable()).unwrap();
    assert_eq!((last.slot, last.generation), (0, u32::MAX));
    heap.free(last).unwrap();
    // Slot 0 cannot take a new generation, so it is never reused.
    let next = heap.allocate(KIB, 256, movable()).unwrap();
    assert_eq!(next.slot, 1);
    assert_eq!(heap.free(last), Err(Error::StaleHandle(last)));
    assert_eq!((heap.len(), heap.blocks().count()), (1, 1));
}

#[test]
fn double_free_changes_nothing() {
    let mut heap = heap(64 * KIB);
    let a = heap.allocate(KIB, 256, movable()).unwrap();
    let _b = heap.allocate(KIB, 256, movable()).unwrap();
    let info = heap.free(a).unwrap();
    assert_eq!((info.offset, info.size, info.align), (0, KIB, 256));
    let before = heap.stats();
    let plan = heap.plan_full();
    assert_eq!(heap.free(a), Err(Error::StaleHandle(a)));
    assert_eq!(heap.stats(), before);
    assert_eq!(heap.len(), 1);
    // A failed free is no change: the plan made before it still commits.
    heap.commit(plan).unwrap();
}

#[test]
fn full_compaction_leaves_pinned_blocks_and_keeps_alignment() {
    let mut heap = heap(64 * KIB);
    let a = heap.allocate(3 * KIB, 1, movable()).unwrap();
    let pin = heap.allocate(KIB, 1, BlockFlags::PINNED).unwrap();
    let b = heap.allocate(2 * KIB, 1, movable()).unwrap();
    let c = heap.allocate(100, 4 * KIB, movable()).unwrap();
    assert_eq!(heap.offset(c), Ok(8 * KIB));
    heap.free(a).unwrap();
    // b (2 KiB) fits before the pin; c needs a 4 KiB boundary, which
    // only exists past the pin.
    let plan = heap.plan_full();
    let moved: Vec<_> = plan.moves().iter().map(|m| (m.handle, m.dst)).collect();
    assert_eq!(moved, [(b, 0), (c, 4 * KIB)]);
    heap.commit(plan).unwrap();
    assert_eq!(heap.offset(pin), Ok(3 * KIB));
    assert_eq!(heap.offset(b), Ok(0));
    assert_eq!(heap.offset(c), Ok(4 * KIB));
    assert_eq!(heap.stats().live_blocks, 3);
    // Compacted already: nothing left to move.
    assert!(heap.plan_full().is_empty());
}

#[test]
fn full_compaction_fills_from_the_top_then_slides() {
    let mut heap = heap(64 * KIB);
    let sizes = [KIB, KIB, KIB / 2, KIB, KIB, KIB];
    let h: Vec<Handle> = sizes
        .iter()
        .map(|&size| heap.allocate(size, 256, movable()).unwrap())
        .collect();
    heap.free(h[0]).unwrap();
    heap.free(h[2]).unwrap();
    // The top block fills [0, 1K) exactly; the next one down is too big for
    // the 512-byte hole, so the rest slides into it.
    let plan = heap.plan_full();
    let moved: Vec<_> = plan.moves().iter().map(|m| (m.handle, m.dst)).collect();
    assert_eq!(moved, [(h[5], 0), (h[3], 2 * KIB), (h[4], 3 * KIB)]);
    assert!(!plan.moves()[0].overlapping);
    // Sliding everything would copy 4 KiB.
    assert_eq!(plan.bytes_moved(), 3 * KIB);
    heap.commit(plan).unwrap();
    assert_eq!(heap.offset(h[1]), Ok(KIB));
    assert!(heap.plan_full().is_empty());
}

#[test]
fn overlap_flag_marks_copies_that_need_memmove() {
    let mut heap = heap(64 * KIB);
    let gap = heap.allocate(KIB, 1, movable()).unwrap();
    let far = heap.allocate(4 * KIB, 1, movable()).unwrap();
    heap.free(gap).unwrap();
    let plan = heap.plan_full();
    let m = plan.moves()[0];
    assert_eq!((m.handle, m.src, m.dst, m.len), (far, KIB, 0, 4 * KIB));
    assert!(m.overlapping);

    let mut heap = self::heap(64 * KIB);
    let gap = heap.allocate(4 * KIB, 1, movable()).unwrap();
    let near = heap.allocate(KIB, 1, movable()).unwrap();
    heap.free(gap).unwrap();
    let m = heap.plan_full().moves()[0];
    assert_eq!((m.handle, m.src, m.dst), (near, 4 * KIB, 0));
    assert!(!m.overlapping);
}

#[test]
fn stale_plan_is_rejected_and_changes_nothing() {
    let mut heap = heap(64 * KIB);
    let a = heap.allocate(KIB, 1, movable()).unwrap();
    let b = heap.allocate(KIB, 1, movable()).unwrap();
    heap.free(a).unwrap();
    let plan = heap.plan_full();
    let pinned_since = plan.clone();
    let c = heap.allocate(KIB, 1, movable()).unwrap();
    assert_eq!(heap.commit(plan), Err(Error::StalePlan));
    assert_eq!(heap.offset(b), Ok(KIB));
    assert_eq!(heap.offset(c), Ok(0));

    // Pinning a block makes earlier plans stale too.
    heap.free(c).unwrap();
    let plan = heap.plan_full();
    heap.set_flags(b, BlockFlags::PINNED).unwrap();
    assert_eq!(heap.commit(plan), Err(Error::StalePlan));
    assert!(heap.plan_full().is_empty());

    // A plan commits once.
    heap.set_flags(b, movable()).unwrap();
    let plan = heap.plan_full();
    heap.commit(plan.clone()).unwrap();
    assert_eq!(heap.commit(plan), Err(Error::StalePlan));
    assert_eq!(heap.commit(pinned_since), Err(Error::StalePlan));
    assert_eq!(heap.offset(b), Ok(0));
}

#[test]
fn room_plan_evicts_the_cheapest_window() {
    let mut heap = heap(16 * KIB);
    let blocks: Vec<Handle> = (0..16)
        .map(|_| heap.allocate(KIB, KIB, movable()).unwrap())
        .collect();
    // Every other block freed: 8 KiB free, in 1 KiB holes.
    for h in blocks.iter().step_by(2) {
        heap.free(*h).unwrap();
    }
    assert!(heap.allocate(2 * KIB, KIB, movable()).is_err());
    let plan = heap.plan_room(2 * KIB, KIB).unwrap();
    assert_eq!(plan.bytes_moved(), KIB);
    assert!(plan.moves().iter().all(|m| !m.overlapping));
    heap.commit(plan).unwrap();
    assert!(heap.allocate(2 * KIB, KIB, movable()).is_ok());
}

#[test]
fn room_plan_is_empty_when_it_fits() {
    let mut heap = heap(16 * KIB);
    assert_eq!(heap.plan_room(16 * KIB, 1).map(|p| p.is_empty()), Ok(true));
    let _a = heap.allocate(KIB, 1, movable()).unwrap();
    assert_eq!(heap.plan_room(15 * KIB, 1).map(|p| p.is_empty()), Ok(true));
    assert_eq!(heap.plan_room(0, 1).err(), Some(Error::ZeroSize));
    assert!(matches!(
        heap.plan_room(1, 3),
        Err(Error::InvalidAlignment { .. })
    ));
}

#[test]
fn room_plan_keeps_alignment_and_avoids_pins() {
    let mut heap = heap(16 * KIB);
    let pin = heap.allocate(KIB, 1, BlockFlags::PINNED).unwrap();
    let filler = heap.allocate(7 * KIB, 1, movable()).unwrap();
    let a = heap.allocate(KIB, 1, movable()).unwrap();
    heap.free(filler).unwrap();
    assert_eq!(heap.offset(a), Ok(8 * KIB));
    // 14 KiB free, but 15 KiB asked.
    assert!(matches!(
        heap.plan_room(15 * KIB, 1),
        Err(Error::OutOfMemory { .. })
    ));
    // 14 KiB at a 2 KiB boundary: the window [2K, 16K) holds only a,
    // which goes to the one hole left, [1K, 2K).
    let plan = heap.plan_room(14 * KIB, 2 * KIB).unwrap();
    let moved: Vec<_> = plan.moves().iter().map(|m| (m.handle, m.dst)).collect();
    assert_eq!(moved, [(a, KIB)]);
    heap.commit(plan).unwrap();
    assert_eq!(heap.offset(pin), Ok(0));
    assert!(heap.allocate(14 * KIB, 2 * KIB, movable()).is_ok());
}

#[test]
fn room_plan_fails_when_pins_split_the_space() {
    let mut heap = heap(16 * KIB);
    let filler = heap.allocate(8 * KIB, 1, movable()).unwrap();
    let _pin = heap.allocate(KIB, 1, BlockFlags::PINNED).unwrap();
    heap.free(filler).unwrap();
    // 15 KiB free, but every window over 8 KiB contains the pin.
    assert!(heap.plan_room(8 * KIB, 1).unwrap().is_empty());
    assert!(matches!(
        heap.plan_room(8 * KIB + 1, 1),
        Err(Error::OutOfMemory { .. })
    ));
}

#[test]
fn region_changes_bump_the_epoch() {
    let mut heap = heap(16 * KIB);
    let plan = heap.plan_full();
    heap.add_region(16 * KIB, 16 * KIB).unwrap();
    assert_eq!(heap.commit(plan), Err(Error::StalePlan));
    let plan = heap.plan_full();
    assert_eq!(heap.release_tail(0), Some(Extent::new(0, 32 * KIB)));
    assert_eq!(heap.commit(plan), Err(Error::StalePlan));
    // A failed change is no change.
    let plan = heap.plan_full();
    assert_eq!(heap.release_tail(0), None);
    assert!(heap.add_region(u64::MAX, 2).is_err());
    heap.commit(plan).unwrap();
}

#[test]
fn fitting_request_commits_without_relayout() {
    // TLSF keeps a free block under its 256-byte granule only until a
    // relayout, which folds it into a neighbour's padding; a "fits already"
    // plan must not relayout, or the room it counted on is gone.
    let mut heap = Heap::new(crate::Tlsf::new());
    heap.add_region(0, 4096 + 81).unwrap();
    let a0 = heap.allocate(1024, 256, movable()).unwrap();
    let b = heap.allocate(81, 256, movable()).unwrap();
    let _a = heap.allocate(2816, 256, movable()).unwrap();
    heap.free(a0).unwrap();
    let plan = heap.plan_room(1280, 256).unwrap();
    heap.commit(plan).unwrap();
    assert_eq!(heap.offset(b), Ok(4096));
    heap.free(b).unwrap();
    assert!(heap.allocate(1280, 256, movable()).is_ok());
    assert_eq!(heap.allocator().free_extents(), [Extent::new(4096, 81)]);
    let plan = heap.plan_room(81, 256).unwrap();
    assert!(plan.is_empty());
    heap.commit(plan).unwrap();
    assert_eq!(heap.allocator().free_extents(), [Extent::new(4096, 81)]);
    assert_eq!(
        heap.allocate(81, 256, movable()).map(|h| heap.offset(h)),
        Ok(Ok(4096))
    );
}

#[test]
fn plans_count_the_blocks_and_holes_they_look_at_found_room_or_not() {
    let mut heap = Heap::new(FreeList::new(Fit::First));
    heap.add_region(0, 64 * 1024).unwrap();
    let blocks: Vec<_> = (0..64)
        .map(|_| heap.allocate(1024, 256, BlockFlags::empty()).unwrap())
        .collect();
    for block in blocks.iter().step_by(2) {
        heap.free(*block).unwrap();
    }
    assert_eq!(heap.plan_steps(), 0);
    // 32 holes of 1 KiB: 2 KiB fits nowhere until blocks move.
    let plan = heap.plan_room(2048, 256).unwrap();
    let after_room = heap.plan_steps();
    assert!(after_room >= 32 + 32, "{after_room}");
    drop(plan);
    // A request past the free bytes is told so from the counters: no walk.
    assert!(heap.plan_room(64 * 1024, 256).is_err());
    assert_eq!(heap.plan_steps(), after_room);
    let _ = heap.plan_full();
    assert!(heap.plan_steps() >= after_room + 32);
}
