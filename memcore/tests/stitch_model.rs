//! Property test of memcore's stitching allocator: random allocate/free
//! sequences under random configurations; after every step the virtual
//! blocks, the handles and the mapping table must agree.
//!
//! Invariants: no two live blocks share a virtual byte; every live byte is
//! mapped; no two live blocks share a physical byte (virtual byte ->
//! handle and offset through the mapping table); no two mapped handles
//! overlap in virtual space; the physical bytes counted are the bytes in
//! created handles; the allocator's own walk finds nothing wrong; the logged
//! driver operations, carried out on a strict mirror of the driver, leave
//! exactly the handles and mappings the allocator reports; a pool with a
//! capacity never holds more and refuses what would need more. At the end,
//! freeing everything and trimming leaves no handle. (The real traces go
//! through it in harness's tests/stitch_real_traces.rs.)

use std::collections::BTreeMap;

use memcore::{
    DriverOp, Error, Extent, HUGE_REQUEST_BYTES, PAGE_BYTES, STITCH_ALIGN, Stitch, StitchBlock,
    StitchConfig,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// One step of a test case.
#[derive(Debug, Clone)]
enum Step {
    /// Allocate this many bytes.
    Alloc(u64),
    /// Free the live block at this index (modulo the live count).
    Free(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        // Small, page-sized and large requests, so boundary pages are
        // shared and large handles made, hit and split up.
        3 => (1u64..4 * MIB).prop_map(Step::Alloc),
        2 => (1u64..80 * MIB).prop_map(Step::Alloc),
        1 => (1u64..8).prop_map(|pages| Step::Alloc(pages * 16 * PAGE_BYTES)),
        // Huge requests (one handle of their own), beside the others in
        // one arena.
        1 => (0u64..3 * 16 * PAGE_BYTES)
            .prop_map(|extra| Step::Alloc(HUGE_REQUEST_BYTES + extra)),
        // Past the page table's dense low 8 TiB: the blocks after it are
        // in its leaves.
        1 => Just(Step::Alloc(9 << 40)),
        4 => any::<usize>().prop_map(Step::Free),
    ]
}

fn config() -> impl Strategy<Value = StitchConfig> {
    (
        prop_oneof![Just(0u32), Just(2), Just(4), Just(16)],
        any::<bool>(),
        prop_oneof![Just(0u32), Just(20), Just(1000)],
        prop_oneof![Just(0u32), Just(500), Just(1000)],
        prop_oneof![Just(0u64), Just(8 * MIB), Just(u64::MAX)],
        prop_oneof![Just(u64::MAX), Just(16 * MIB)],
        prop_oneof![3 => Just(u64::MAX), 1 => Just(160 * MIB)],
        any::<bool>(),
    )
        .prop_map(
            |(
                large_pages,
                align_large,
                slack,
                overshoot,
                keep_idle_bytes,
                max_idle_bytes,
                capacity_bytes,
                grow_in_large,
            )| {
                StitchConfig {
                    large_pages,
                    align_large,
                    slack_permille: slack,
                    overshoot_permille: overshoot,
                    keep_idle_bytes,
                    max_idle_bytes,
                    capacity_bytes,
                    grow_in_large,
                    log_ops: true,
                    ..StitchConfig::default()
                }
            },
        )
}

/// Every invariant, with the step number in the message.
fn assert_sound(pool: &Stitch, live: &[StitchBlock], step: usize) {
    pool.check()
        .unwrap_or_else(|err| panic!("step {step}: {err}"));
    // Virtual: sorted live blocks do not overlap, and are aligned.
    let mut blocks = live.to_vec();
    blocks.sort_by_key(|block| block.offset);
    for pair in blocks.windows(2) {
        assert!(
            pair[0].offset + pair[0].size <= pair[1].offset,
            "step {step}: blocks {:?} and {:?} share a virtual byte",
            pair[0],
            pair[1]
        );
    }
    assert!(blocks.iter().all(|block| block.offset % STITCH_ALIGN == 0));
    // Handles: bytes add up, mapped ranges do not overlap.
    let handles: Vec<_> = pool.handles().collect();
    let stats = pool.stats();
    assert_eq!(
        handles.iter().map(|handle| handle.bytes).sum::<u64>(),
        stats.physical_bytes,
        "step {step}: physical bytes"
    );
    assert!(stats.peak_physical_bytes >= stats.physical_bytes);
    assert_eq!(
        stats.live_bytes,
        live.iter().map(|block| block.size).sum::<u64>()
    );
    let mut ranges: Vec<_> = handles.iter().filter_map(|h| h.mapped_at).collect();
    ranges.sort();
    for pair in ranges.windows(2) {
        assert!(
            !pair[0].overlaps(&pair[1]),
            "step {step}: handles mapped over {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    // Physical: each live block's bytes, piece by piece (a page, or the rest
    // of the handle under it), through the mapping table; no piece
    // unmapped, no two pieces sharing a byte.
    let by_number: BTreeMap<u32, _> = handles.iter().map(|info| (info.handle, info)).collect();
    let mut pieces = Vec::new();
    for block in &blocks {
        let end = block.offset + block.size;
        let mut at = block.offset;
        while at < end {
            let (handle, inside) = pool
                .physical(at)
                .unwrap_or_else(|| panic!("step {step}: live byte {at} of {block:?} unmapped"));
            let info = by_number
                .get(&handle)
                .unwrap_or_else(|| panic!("step {step}: byte {at} maps to a released handle"));
            let mapped = info.mapped_at.expect("a page names an unmapped handle");
            let piece_end = if inside == 0 && mapped.offset + info.bytes >= end {
                end
            } else {
                ((at / PAGE_BYTES + 1) * PAGE_BYTES).min(end)
            };
            assert_eq!(mapped.offset + inside, at, "step {step}: wrong offset");
            assert!(
                inside + (piece_end - at) <= info.bytes,
                "step {step}: piece runs past its handle"
            );
            assert!(
                info.in_use,
                "step {step}: a handle under a live block is idle"
            );
            pieces.push((handle, inside, inside + (piece_end - at)));
            at = piece_end;
        }
    }
    pieces.sort();
    for pair in pieces.windows(2) {
        assert!(
            pair[0].0 != pair[1].0 || pair[0].2 <= pair[1].1,
            "step {step}: two live pieces share physical bytes: {:?} {:?}",
            pair[0],
            pair[1]
        );
    }
}

/// What the driver holds after the logged operations: handle number ->
/// (bytes, where mapped). Refuses what the real driver would: a second
/// create of a live number, mapping a mapped handle or over a mapped byte,
/// unmapping from the wrong place, releasing a mapped handle.
#[derive(Default)]
struct DriverMirror {
    handles: BTreeMap<u32, (u64, Option<Extent>)>,
}

impl DriverMirror {
    fn apply(&mut self, ops: &[DriverOp], step: usize) {
        for &op in ops {
            match op {
                DriverOp::Create { handle, bytes } => {
                    let fresh = self.handles.insert(handle, (bytes, None)).is_none();
                    assert!(fresh, "step {step}: {op:?} of a live handle");
                }
                DriverOp::Map { handle, at, bytes } => {
                    let range = Extent::new(at, bytes);
                    assert!(
                        self.handles
                            .values()
                            .filter_map(|(_, mapped)| *mapped)
                            .all(|other| !other.overlaps(&range)),
                        "step {step}: {op:?} over mapped bytes"
                    );
                    let entry = self.handles.get_mut(&handle);
                    let (size, mapped) =
                        entry.unwrap_or_else(|| panic!("step {step}: {op:?} of no handle"));
                    assert_eq!((*size, *mapped), (bytes, None), "step {step}: {op:?}");
                    *mapped = Some(range);
                }
                DriverOp::Unmap { handle, at, bytes } => {
                    let entry = self.handles.get_mut(&handle);
                    let (_, mapped) =
                        entry.unwrap_or_else(|| panic!("step {step}: {op:?} of no handle"));
                    assert_eq!(*mapped, Some(Extent::new(at, bytes)), "step {step}: {op:?}");
                    *mapped = None;
                }
                DriverOp::Release { handle, bytes } => {
                    let gone = self.handles.remove(&handle);
                    assert_eq!(gone, Some((bytes, None)), "step {step}: {op:?}");
                }
            }
        }
    }

    fn assert_matches(&self, pool: &Stitch, step: usize) {
        let reported: BTreeMap<u32, (u64, Option<Extent>)> = pool
            .handles()
            .map(|info| (info.handle, (info.bytes, info.mapped_at)))
            .collect();
        assert_eq!(
            self.handles, reported,
            "step {step}: driver and pool disagree"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn stitched_blocks_never_share_a_physical_byte(
        config in config(),
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let mut pool = Stitch::new(config);
        let mut live: Vec<StitchBlock> = Vec::new();
        let mut driver = DriverMirror::default();
        for (index, step) in steps.iter().enumerate() {
            match *step {
                Step::Alloc(size) => match pool.allocate(size) {
                    Ok(block) => live.push(block),
                    // A full device refuses; the pool stays whole (checked
                    // below) and within its capacity.
                    Err(Error::OutOfMemory { .. }) if config.capacity_bytes != u64::MAX => {}
                    Err(err) => panic!("step {index}: {err}"),
                },
                Step::Free(pick) => {
                    if !live.is_empty() {
                        let block = live.swap_remove(pick % live.len());
                        pool.free(block).unwrap();
                        prop_assert!(pool.free(block).is_err(), "double free accepted");
                    }
                }
            }
            assert_sound(&pool, &live, index);
            prop_assert!(pool.stats().physical_bytes <= config.capacity_bytes);
            driver.apply(&pool.take_ops(), index);
            driver.assert_matches(&pool, index);
        }
        for block in live.drain(..) {
            pool.free(block).unwrap();
        }
        pool.trim();
        assert_sound(&pool, &live, steps.len());
        driver.apply(&pool.take_ops(), steps.len());
        prop_assert!(driver.handles.is_empty(), "handles left after trim");
        prop_assert_eq!(pool.stats().physical_bytes, 0);
        prop_assert_eq!(pool.handles().count(), 0);
        let calls = pool.stats().calls;
        prop_assert_eq!(calls.create.calls, calls.release.calls);
        prop_assert_eq!(calls.map.calls, calls.unmap.calls);
        prop_assert_eq!(calls.map.calls, calls.set_access.calls);
    }
}
