//! The device allocator's algorithm (`kernels::cm_model`, the steps of
//! `cuda/cm_alloc.cuh`) raced by CPU threads: no two live blocks overlap, a
//! freed block is found again, every chunk is free again after all frees,
//! growth keeps the blocks handed out before it, bad requests get NULL
//! with their reason, and a request gets NULL only when no window of its
//! class is free anywhere in the heap.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kernels::cm_heap::{CHUNK_BYTES, MAX_REQUEST_BYTES, Reason, class_bytes, class_of};
use kernels::cm_model::HostHeap;
use proptest::prelude::*;

/// Live blocks by address; inserting one that overlaps another fails.
#[derive(Default)]
struct Live(Mutex<BTreeMap<u64, u64>>);

impl Live {
    fn insert(&self, address: u64, bytes: u64) -> Result<(), String> {
        let mut live = self.0.lock().unwrap();
        if let Some((&a, &n)) = live.range(..=address).next_back() {
            if a + n > address {
                return Err(format!("{address:#x}+{bytes} overlaps {a:#x}+{n}"));
            }
        }
        if let Some((&a, _)) = live.range(address..).next() {
            if address + bytes > a {
                return Err(format!("{address:#x}+{bytes} overlaps {a:#x}"));
            }
        }
        live.insert(address, bytes);
        Ok(())
    }

    fn remove(&self, address: u64) {
        self.0.lock().unwrap().remove(&address);
    }
}

/// One thread's script: requests of (bytes, group size), and whether to
/// free each group right away.
fn script() -> impl Strategy<Value = Vec<(u64, u32, bool)>> {
    let bytes = prop_oneof![
        1u64..=256,
        257u64..=8192,
        (16u32..=20).prop_map(|s| 1u64 << s)
    ];
    proptest::collection::vec((bytes, 1u32..=32, any::<bool>()), 1..40)
}

const BASE: u64 = 1 << 40;

fn heap(chunks: &[u32]) -> HostHeap {
    let mut heap = HostHeap::new();
    for (i, &n) in chunks.iter().enumerate() {
        assert!(heap.add_region(BASE + ((i as u64) << 36), n));
    }
    heap
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn racing_threads_never_share_a_block_and_all_memory_returns(
        scripts in proptest::collection::vec(script(), 2..=4),
        chunks in proptest::collection::vec(1u32..=3, 1..=3),
    ) {
        let heap = heap(&chunks);
        let live = Live::default();
        let kept: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
            let workers: Vec<_> = scripts.iter().enumerate().map(|(t, script)| {
                let (heap, live) = (&heap, &live);
                s.spawn(move || -> Result<Vec<(u64, u64)>, String> {
                    let mut kept = Vec::new();
                    for (step, &(bytes, n, free_now)) in script.iter().enumerate() {
                        let hash = (t * 7 + step) as u32;
                        let got = heap.allocate_group(bytes, n, hash);
                        for &a in &got {
                            let size = heap.block_bytes(a).ok_or("no class")?;
                            if size < class_bytes(class_of(bytes)) || size > CHUNK_BYTES {
                                return Err(format!("{size} B block for {bytes} B"));
                            }
                            live.insert(a, size)?;
                        }
                        for a in got {
                            if free_now {
                                live.remove(a);
                                heap.free(a);
                            } else {
                                kept.push((a, heap.block_bytes(a).ok_or("no class")?));
                            }
                        }
                    }
                    Ok(kept)
                })
            }).collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect::<Result<_, _>>()
        }).map_err(TestCaseError::fail)?;
        heap.check().map_err(|c| TestCaseError::fail(c.0))?;
        let c = heap.counters();
        let held: u64 = kept.iter().flatten().map(|&(_, n)| n).sum();
        prop_assert_eq!(c.live_bytes, held);
        prop_assert!(c.peak_bytes >= held);
        prop_assert_eq!(c.bad_frees, 0);
        prop_assert_eq!(c.failures, c.failed(Reason::Exhausted));
        for &(a, _) in kept.iter().flatten() {
            heap.free(a);
        }
        heap.check().map_err(|c| TestCaseError::fail(c.0))?;
        let c = heap.counters();
        prop_assert_eq!(c.live_bytes, 0);
        prop_assert_eq!(c.allocations, c.frees);
        prop_assert_eq!(heap.free_chunks(), heap.regions().chunks, "chunks lost after all frees");
    }

    #[test]
    fn a_heap_serves_every_block_of_its_chunks(k in 8usize..=16, chunks in 1u32..=4) {
        // Classes of 4 KiB and up: a whole chunk of blocks in a few steps.
        let heap = heap(&[chunks]);
        let size = class_bytes(k);
        let per_chunk = CHUNK_BYTES / size;
        let mut got = Vec::new();
        while let Some(a) = heap.allocate(size, got.len() as u32) {
            got.push(a);
        }
        prop_assert_eq!(got.len() as u64, per_chunk * u64::from(chunks));
        prop_assert_eq!(heap.counters().failed(Reason::Exhausted), 1);
        prop_assert_eq!(heap.counters().failed_bytes, size);
    }
}

#[test]
fn a_freed_block_is_handed_out_again() {
    let heap = heap(&[1]);
    let size = 64 << 10;
    let blocks: Vec<u64> = (0..16).map(|i| heap.allocate(size, i).unwrap()).collect();
    assert_eq!(heap.allocate(size, 0), None);
    heap.free(blocks[5]);
    assert_eq!(heap.allocate(size, 3), Some(blocks[5]));
    heap.check().unwrap();
}

#[test]
fn an_emptied_chunk_serves_another_class() {
    let heap = heap(&[1]);
    let small: Vec<u64> = heap.allocate_group(16, 32, 0);
    assert_eq!(small.len(), 32);
    assert_eq!(heap.allocate(1 << 20, 0), None);
    for a in small {
        heap.free(a);
    }
    assert_eq!(heap.free_chunks(), 1);
    assert_eq!(heap.allocate(1 << 20, 0), Some(BASE));
    heap.check().unwrap();
}

#[test]
fn growth_keeps_the_blocks_handed_out_before_it() {
    let mut heap = heap(&[2]);
    let size = 256 << 10;
    let before: Vec<u64> = heap.allocate_group(size, 12, 1);
    assert_eq!(before.len(), 8);
    let c = heap.counters();
    assert_eq!(c.failed(Reason::Exhausted), 4);
    let grow = kernels::cm_heap::growth_chunks(heap.regions().chunks, c.failed_bytes);
    assert!(grow >= 1);
    assert!(heap.add_region(BASE + (1 << 36), grow));
    let after = heap.allocate_group(size, 4, 1);
    assert_eq!(after.len(), 4);
    assert!(after.iter().all(|&a| a >= BASE + (1 << 36)));
    for a in before.into_iter().chain(after) {
        heap.free(a);
    }
    let c = heap.counters();
    assert_eq!((c.bad_frees, c.live_bytes, c.frees), (0, 0, 12));
    assert_eq!(heap.free_chunks(), 2 + grow);
    heap.check().unwrap();
}

#[test]
fn bad_requests_and_bad_frees_are_counted_not_served() {
    let heap = heap(&[1]);
    assert_eq!(heap.allocate(0, 0), None);
    assert_eq!(heap.allocate(MAX_REQUEST_BYTES + 1, 0), None);
    let c = heap.counters();
    assert_eq!((c.failed(Reason::Zero), c.failed(Reason::TooLarge)), (1, 1));
    assert_eq!(c.largest_failed, MAX_REQUEST_BYTES + 1);
    let a = heap.allocate(100, 0).unwrap();
    heap.free(a + 16);
    heap.free(a);
    heap.free(a);
    heap.free(BASE - 16);
    assert_eq!(heap.counters().bad_frees, 3);
    heap.check().unwrap();
}

#[test]
fn threads_started_together_on_one_chunk_never_share_a_block() {
    // Few blocks (64 KiB ones: 16 per chunk, 2 chunks), many threads at
    // once: every claim races.
    let heap = heap(&[2]);
    let live = Live::default();
    let start = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (heap, live, start) = (&heap, &live, &start);
            s.spawn(move || {
                start.wait();
                for i in 0..40_000u32 {
                    let got = heap.allocate_group(64 << 10, 1 + (i + t) % 4, t);
                    for &a in &got {
                        live.insert(a, 64 << 10).unwrap();
                    }
                    for a in got {
                        live.remove(a);
                        heap.free(a);
                    }
                }
            });
        }
    });
    heap.check().unwrap();
    let c = heap.counters();
    assert_eq!((c.live_bytes, c.bad_frees), (0, 0));
    assert!(c.allocations > 0);
    assert_eq!(heap.free_chunks(), 2);
}

/// Warps that start together on a heap whose active slots are empty (a cold
/// launch) or stale (a warm one) all reach the free map at once: the first
/// takes a chunk, the others must find it (or another) instead of NULL.
/// Every request here fits many times over, so any NULL is a false one.
#[test]
fn a_stampede_on_a_cold_or_warm_heap_gets_no_false_null() {
    const THREADS: u32 = 8;
    for round in 0..400u32 {
        let heap = heap(&[2]);
        heap.set_transit_yields(round % 4);
        if round % 2 == 1 {
            // Warm: every slot of class 0 names a chunk that emptied again.
            let got = heap.allocate_group(16, 32, 0);
            got.into_iter().for_each(|a| heap.free(a));
        }
        let start = std::sync::Barrier::new(THREADS as usize);
        let nulls: u32 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (heap, start) = (&heap, &start);
                    s.spawn(move || {
                        start.wait();
                        let mut nulls = 0;
                        for i in 0..8 {
                            let got = heap.allocate_group(16, 32, t * 8 + i);
                            nulls += 32 - got.len() as u32;
                            got.into_iter().for_each(|a| heap.free(a));
                        }
                        nulls
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(
            nulls, 0,
            "round {round}: {nulls} NULL with 2 MiB of 16 B blocks free"
        );
        heap.check().unwrap();
    }
}

/// A class that is out takes blocks of the two classes above it, then (the
/// slow path) of any larger class; each block frees as its own class.
#[test]
fn a_class_that_is_out_takes_blocks_two_classes_up_then_any_larger() {
    let heap = heap(&[3]);
    // One chunk each of 4 KiB, 8 KiB and 32 KiB blocks, one block held in each.
    let held: Vec<u64> = [4u64 << 10, 8 << 10, 32 << 10]
        .iter()
        .map(|&b| heap.allocate(b, 0).unwrap())
        .collect();
    assert_eq!(heap.free_chunks(), 0);
    // 2 KiB: its class has no chunk; 4 KiB and 8 KiB blocks serve it.
    let small = heap.allocate_group(2 << 10, 32, 1);
    assert_eq!(small.len(), 32);
    assert!(
        small
            .iter()
            .all(|&a| matches!(heap.block_bytes(a), Some(b) if b == 4 << 10 || b == 8 << 10))
    );
    let c = heap.counters();
    let bytes: u64 = small
        .iter()
        .chain(&held)
        .map(|&a| heap.block_bytes(a).unwrap())
        .sum();
    assert_eq!(c.live_bytes, bytes);
    // 512 B requests reach 1 and 2 KiB first, which have none; the slow
    // path then takes a block of any larger class: 4 KiB, the smallest.
    let far = heap.allocate(512, 0).unwrap();
    assert_eq!(heap.block_bytes(far), Some(4 << 10));
    assert_eq!(heap.counters().failed(Reason::Exhausted), 0);
    for a in small.into_iter().chain(held).chain([far]) {
        heap.free(a);
    }
    heap.check().unwrap();
    assert_eq!((heap.counters().live_bytes, heap.free_chunks()), (0, 3));
}

/// One step of a single-threaded script: a group of requests, or the free
/// of a live block picked by index.
#[derive(Clone, Debug)]
enum Step {
    Allocate(u64, u32),
    Free(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    // Log-uniform sizes, small ones most: their chunks leave the holes that
    // larger requests must use.
    let bytes = (0u32..=20).prop_flat_map(|s| (1u64 << s)..=(2u64 << s).min(MAX_REQUEST_BYTES));
    let step = prop_oneof![
        3 => (bytes, 1u32..=32).prop_map(|(b, n)| Step::Allocate(b, n)),
        2 => any::<usize>().prop_map(Step::Free),
    ];
    proptest::collection::vec(step, 1..160)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The rule: a request of class k gets NULL only when no
    /// class_bytes(k)-aligned window of that size is free (in a free chunk,
    /// a free block of class k or larger, or a run of free blocks of a
    /// smaller class). Checked at every NULL of a random script, with the
    /// invariants after every step and after all frees.
    #[test]
    fn a_null_comes_only_when_no_window_of_its_class_is_free(
        script in steps(),
        chunks in 1u32..=3,
    ) {
        let heap = heap(&[chunks]);
        let live = Live::default();
        let mut held: Vec<u64> = Vec::new();
        for (i, step) in script.iter().enumerate() {
            match *step {
                Step::Allocate(bytes, n) => {
                    let got = heap.allocate_group(bytes, n, i as u32);
                    for &a in &got {
                        let size = heap.block_bytes(a).ok_or("no class").map_err(TestCaseError::fail)?;
                        prop_assert!(size >= class_bytes(class_of(bytes)), "{size} B for {bytes} B");
                        live.insert(a, size).map_err(TestCaseError::fail)?;
                    }
                    held.extend(&got);
                    if (got.len() as u32) < n {
                        let image = heap.image();
                        let window = image.free_window(class_of(bytes));
                        prop_assert!(
                            window.is_none(),
                            "step {i}: NULL for {bytes} B with {} B free and a free window at {window:?}",
                            image.free_bytes()
                        );
                    }
                }
                Step::Free(pick) if !held.is_empty() => {
                    let a = held.swap_remove(pick % held.len());
                    live.remove(a);
                    heap.free(a);
                }
                Step::Free(_) => {}
            }
            heap.check().map_err(|c| TestCaseError::fail(c.0))?;
        }
        let c = heap.counters();
        let bytes: u64 = held.iter().map(|&a| heap.block_bytes(a).unwrap()).sum();
        prop_assert_eq!(c.live_bytes, bytes);
        prop_assert_eq!(heap.image().free_bytes(), heap.regions().block_bytes() - bytes);
        for a in held {
            heap.free(a);
        }
        heap.check().map_err(|c| TestCaseError::fail(c.0))?;
        prop_assert_eq!((heap.counters().live_bytes, heap.counters().bad_frees), (0, 0));
        prop_assert_eq!(heap.free_chunks(), chunks, "chunks lost after all frees");
    }
}

/// What no allocator that leaves blocks in place can promise: "no NULL
/// while free bytes are at least twice the request". Every other 16 B block
/// free leaves half the chunk free and no two free bytes runs of 32; the
/// first aligned pair freed serves the 32 B request.
#[test]
fn half_a_chunk_free_in_16_byte_holes_cannot_serve_32_bytes() {
    let heap = heap(&[1]);
    let mut blocks: Vec<u64> = (0..2048)
        .flat_map(|i| heap.allocate_group(16, 32, i))
        .collect();
    blocks.sort_unstable();
    assert_eq!(blocks.len(), 65_536);
    assert_eq!(heap.allocate(16, 0), None);
    for &a in blocks.iter().skip(1).step_by(2) {
        heap.free(a);
    }
    let image = heap.image();
    assert_eq!(image.free_bytes(), 512 << 10);
    assert_eq!(image.free_window(1), None);
    assert_eq!(heap.allocate(32, 0), None);
    heap.free(blocks[40]);
    let pair = heap.allocate(32, 0).unwrap();
    assert_eq!((pair, heap.block_bytes(pair)), (blocks[40], Some(32)));
    assert_eq!(
        heap.block_bytes(pair + 16),
        None,
        "a span's tail is no block"
    );
    heap.free(pair + 16);
    assert_eq!(heap.counters().bad_frees, 1);
    heap.check().unwrap();
}

/// The H200 fragmentation check's shape: 4 KiB blocks, runs of them freed;
/// 16 KiB requests take every aligned run of four, and a 512 KiB request a
/// run of 128 (two map words); each frees as one block.
#[test]
fn runs_of_freed_small_blocks_serve_larger_requests_and_free_as_one() {
    let heap = heap(&[2]);
    let mut blocks: Vec<u64> = (0..16)
        .flat_map(|i| heap.allocate_group(4096, 32, i))
        .collect();
    blocks.sort_unstable();
    assert_eq!(blocks.len(), 512);
    assert_eq!(heap.free_chunks(), 0);
    // Blocks 0..256 are chunk 0: free 4 of every 8 there; in chunk 1 free
    // the 128 blocks of its second half.
    let freed: Vec<u64> = (0..256usize)
        .filter(|i| i % 8 >= 4)
        .chain(384..512)
        .map(|i| blocks[i])
        .collect();
    freed.iter().for_each(|&a| heap.free(a));
    let big = heap.allocate(512 << 10, 0).unwrap();
    assert_eq!((big, heap.block_bytes(big)), (blocks[384], Some(512 << 10)));
    let mut spans = Vec::new();
    while let Some(a) = heap.allocate(16 << 10, spans.len() as u32) {
        assert_eq!(heap.block_bytes(a), Some(16 << 10));
        spans.push(a);
    }
    assert_eq!(spans.len(), 32, "every run of four 4 KiB blocks in chunk 0");
    assert_eq!(heap.image().free_window(class_of(16 << 10)), None);
    assert_eq!(heap.image().free_bytes(), 0);
    heap.check().unwrap();
    for a in spans.into_iter().chain([big]) {
        heap.free(a);
    }
    assert_eq!(heap.image().free_bytes(), freed.len() as u64 * 4096);
    heap.check().unwrap();
    blocks
        .iter()
        .filter(|a| !freed.contains(a))
        .for_each(|&a| heap.free(a));
    heap.check().unwrap();
    let c = heap.counters();
    assert_eq!((c.live_bytes, c.bad_frees, heap.free_chunks()), (0, 0, 2));
}
