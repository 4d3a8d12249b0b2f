//! What must hold after every step, checked against the model.

use memcore::{Allocator, CompactionPlan, Extent, Heap};
use proptest::prelude::*;

use crate::device::Device;
use crate::model::Model;

/// The heap agrees with the model block for block, and its allocator's
/// figures and free ranges are sound.
pub fn heap_matches<A: Allocator>(heap: &Heap<A>, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(heap.len(), model.blocks.len());
    prop_assert_eq!(heap.is_empty(), model.blocks.is_empty());
    for (&h, block) in &model.blocks {
        prop_assert_eq!(heap.get(h), Some(block.info()), "block {:?}", h);
    }
    for (h, info) in heap.blocks() {
        prop_assert_eq!(model.blocks.get(&h).map(|b| b.info()), Some(info));
    }
    for &h in &model.dead {
        prop_assert_eq!(heap.get(h), None, "dead handle {:?} came back", h);
    }
    prop_assert_eq!(heap.allocator().regions(), model.regions.clone());

    let extents = model.extents();
    for pair in extents.windows(2) {
        prop_assert!(
            pair[0].end() <= pair[1].offset,
            "blocks overlap: {:?}",
            pair
        );
    }
    for block in model.blocks.values() {
        prop_assert_eq!(block.offset % block.align, 0, "misaligned {:?}", block);
        prop_assert!(
            model.regions.iter().any(|r| r.contains(&block.extent())),
            "block outside the regions: {:?}",
            block
        );
    }
    allocator_is_sound(heap.allocator(), model)
}

fn allocator_is_sound<A: Allocator>(allocator: &A, model: &Model) -> Result<(), TestCaseError> {
    let stats = allocator.stats();
    let free = allocator.free_extents();
    prop_assert_eq!(stats.managed_bytes, model.managed_bytes());
    prop_assert_eq!(stats.live_bytes, model.live_bytes());
    prop_assert_eq!(stats.live_blocks, model.blocks.len() as u64);
    prop_assert_eq!(
        stats.live_bytes + stats.free_bytes + stats.padding_bytes,
        stats.managed_bytes,
        "live + free + padding != managed: {:?}",
        stats
    );
    prop_assert_eq!(stats.free_bytes, free.iter().map(|e| e.size).sum::<u64>());
    prop_assert_eq!(stats.free_blocks, free.len() as u64);
    prop_assert_eq!(
        stats.largest_free,
        free.iter().map(|e| e.size).max().unwrap_or(0)
    );
    let top = model.extents().iter().map(Extent::end).max().unwrap_or(0);
    prop_assert_eq!(stats.top, top);
    prop_assert!(stats.high_water >= top);

    for pair in free.windows(2) {
        // Touching regions are merged, so touching free ranges are always
        // a missed coalesce.
        prop_assert!(
            pair[0].end() < pair[1].offset,
            "uncoalesced free ranges {:?}",
            pair
        );
    }
    let live = model.extents();
    for e in &free {
        prop_assert!(e.size > 0);
        prop_assert!(
            model.regions.iter().any(|r| r.contains(e)),
            "free {:?} outside",
            e
        );
        prop_assert!(
            !live.iter().any(|b| b.overlaps(e)),
            "free {:?} over a live block",
            e
        );
    }
    if stats.padding_bytes == 0 {
        prop_assert_eq!(free, model.holes());
    }
    Ok(())
}

/// Every live block holds the bytes it was filled with.
pub fn contents_kept(device: &Device, model: &Model) -> Result<(), TestCaseError> {
    for (h, block) in &model.blocks {
        let bad = device.first_mismatch(block.extent(), block.seed);
        prop_assert_eq!(bad, None, "block {:?} {:?} corrupted at byte", h, block);
    }
    Ok(())
}

/// A plan only moves live, unpinned blocks, each once, from where they are
/// to an aligned place inside a region, and flags overlaps truthfully.
pub fn plan_is_sound(plan: &CompactionPlan, model: &Model) -> Result<(), TestCaseError> {
    let mut seen = std::collections::BTreeSet::new();
    for m in plan.moves() {
        let block = model.blocks.get(&m.handle);
        prop_assert!(block.is_some(), "move of a dead block {:?}", m);
        let block = block.unwrap();
        prop_assert!(!block.pinned, "pinned block moved: {:?}", m);
        prop_assert!(seen.insert(m.handle), "block moved twice: {:?}", m);
        prop_assert_eq!((m.src, m.len), (block.offset, block.size));
        prop_assert_ne!(m.src, m.dst, "a move that goes nowhere");
        prop_assert_eq!(m.dst % block.align, 0, "misaligned destination {:?}", m);
        let dst = Extent::new(m.dst, m.len);
        prop_assert!(
            model.regions.iter().any(|r| r.contains(&dst)),
            "{:?} leaves the regions",
            m
        );
        let overlapping = Extent::new(m.src, m.len).overlaps(&dst);
        prop_assert_eq!(m.overlapping, overlapping, "wrong overlap flag {:?}", m);
    }
    prop_assert_eq!(
        plan.bytes_moved(),
        plan.moves().iter().map(|m| m.len).sum::<u64>()
    );
    prop_assert_eq!(plan.is_empty(), plan.moves().is_empty());
    Ok(())
}
