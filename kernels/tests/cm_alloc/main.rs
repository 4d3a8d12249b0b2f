//! `cm_malloc` / `cm_free` (`cuda/cm_alloc.cuh`, the device code itself,
//! compiled for the host) raced by host threads: each warp's 32 lanes are
//! threads that meet in every warp function, and several warps run at once.
//! No two live blocks overlap, a freed block is found again, every chunk is
//! free again after all frees, growth keeps the blocks handed out before
//! it, bad requests get NULL with their reason, and a request gets NULL only
//! when no window of its class is free anywhere in the heap
//! (`HeapImage::free_window`).
//!
//! Needs a C++20 compiler (`$CXX`, else `c++`) with threads; fails if there
//! is none.

mod heap;
mod host;
mod live;

use kernels::cm_heap::{
    CHUNK_BYTES, MAX_REQUEST_BYTES, Reason, class_bytes, class_of, growth_chunks,
};
use proptest::prelude::*;

use heap::Heap;
use host::{LANES, Warp};
use live::Live;

/// Lanes `0..n`.
fn first_lanes(n: u32) -> u32 {
    if n >= 32 { u32::MAX } else { (1 << n) - 1 }
}

fn lanes_of(mask: u32) -> impl Iterator<Item = usize> {
    (0..LANES).filter(move |&l| mask >> l & 1 == 1)
}

/// Lanes `0..n` of `warp` ask for `bytes` each, in one step: the blocks
/// they got, in lane order.
fn allocate_group(warp: &Warp, heap: &Heap, bytes: u64, n: u32) -> Vec<u64> {
    let got = warp.malloc(heap, first_lanes(n), &[bytes; LANES]);
    got.into_iter().filter(|&a| a != 0).collect()
}

fn allocate(warp: &Warp, heap: &Heap, bytes: u64) -> Option<u64> {
    allocate_group(warp, heap, bytes, 1).pop()
}

/// Frees `blocks`, up to 32 lanes a step.
fn free_all(warp: &Warp, heap: &Heap, blocks: &[u64]) {
    for group in blocks.chunks(LANES) {
        let mut ptrs = [0u64; LANES];
        ptrs[..group.len()].copy_from_slice(group);
        warp.free(heap, first_lanes(group.len() as u32), &ptrs);
    }
}

fn free(warp: &Warp, heap: &Heap, block: u64) {
    free_all(warp, heap, &[block]);
}

/// One warp step of requests: the lanes taking part, and each lane's bytes
/// (from a palette of one to three sizes, so that lanes of one step ask for
/// one class or several).
#[derive(Clone, Debug)]
struct Request {
    lanes: u32,
    bytes: [u64; LANES],
}

fn request(size: impl Strategy<Value = u64>) -> impl Strategy<Value = Request> {
    let lanes = prop_oneof![
        Just(u32::MAX),
        (0u32..32).prop_map(|l| 1 << l),
        (1u32..=32).prop_map(first_lanes),
        any::<u32>().prop_filter("a lane", |&m| m != 0),
    ];
    (
        proptest::collection::vec(size, 1..=3),
        lanes,
        any::<[u8; LANES]>(),
    )
        .prop_map(|(palette, lanes, picks)| Request {
            lanes,
            bytes: picks.map(|p| palette[p as usize % palette.len()]),
        })
}

/// Sizes of the racing scripts: small, medium, and whole classes up to a
/// chunk.
fn racing_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..=256,
        257u64..=8192,
        (16u32..=20).prop_map(|s| 1u64 << s)
    ]
}

/// The blocks a step's lanes got, each checked against what its lane asked
/// and recorded in `live`: `(lane, address, block bytes)`.
fn take(
    heap: &Heap,
    live: &Live,
    request: &Request,
    got: &[u64; LANES],
) -> Result<Vec<(usize, u64, u64)>, String> {
    let mut taken = Vec::new();
    for lane in lanes_of(request.lanes).filter(|&l| got[l] != 0) {
        let (address, asked) = (got[lane], request.bytes[lane]);
        let size = heap
            .block_bytes(address)
            .ok_or_else(|| format!("lane {lane}: {address:#x} is no live block"))?;
        if size < class_bytes(class_of(asked)) || size > CHUNK_BYTES {
            return Err(format!("lane {lane}: a {size} B block for {asked} B"));
        }
        live.insert(address, size)?;
        taken.push((lane, address, size));
    }
    Ok(taken)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Warps run scripts at once; a step's lanes free what they got right
    /// away (together, in one step) or keep it to the end.
    #[test]
    fn racing_warps_never_share_a_block_and_all_memory_returns(
        scripts in proptest::collection::vec(
            proptest::collection::vec((request(racing_size()), any::<bool>()), 1..24),
            2..=4,
        ),
        chunks in proptest::collection::vec(1u32..=3, 1..=3),
    ) {
        let heap = Heap::new(&chunks);
        let live = Live::default();
        let kept: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
            let workers: Vec<_> = scripts.iter().enumerate().map(|(t, script)| {
                let (heap, live) = (&heap, &live);
                s.spawn(move || -> Result<Vec<(u64, u64)>, String> {
                    let mut warp = Warp::new(0);
                    let mut kept = Vec::new();
                    for (step, (request, free_now)) in script.iter().enumerate() {
                        warp.slot = (t * 7 + step) as u32;
                        let got = warp.malloc(heap, request.lanes, &request.bytes);
                        let taken = take(heap, live, request, &got)?;
                        if *free_now {
                            let mut ptrs = [0u64; LANES];
                            let mut lanes = 0;
                            for &(lane, address, _) in &taken {
                                live.remove(address);
                                ptrs[lane] = address;
                                lanes |= 1 << lane;
                            }
                            warp.free(heap, lanes, &ptrs);
                        } else {
                            kept.extend(taken.iter().map(|&(_, a, n)| (a, n)));
                        }
                    }
                    Ok(kept)
                })
            }).collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect::<Result<_, _>>()
        }).map_err(TestCaseError::fail)?;
        heap.check().map_err(TestCaseError::fail)?;
        let c = heap.counters();
        let held: u64 = kept.iter().flatten().map(|&(_, n)| n).sum();
        prop_assert_eq!(c.live_bytes, held);
        prop_assert!(c.peak_bytes >= held);
        prop_assert_eq!(c.bad_frees, 0);
        prop_assert_eq!(c.failures, c.failed(Reason::Exhausted));
        let warp = Warp::new(0);
        let blocks: Vec<u64> = kept.iter().flatten().map(|&(a, _)| a).collect();
        free_all(&warp, &heap, &blocks);
        heap.check().map_err(TestCaseError::fail)?;
        let c = heap.counters();
        prop_assert_eq!(c.live_bytes, 0);
        prop_assert_eq!(c.allocations, c.frees);
        prop_assert_eq!(heap.free_chunks(), heap.regions().chunks, "chunks lost after all frees");
    }

    #[test]
    fn a_heap_serves_every_block_of_its_chunks(
        k in 8usize..=16,
        chunks in 1u32..=4,
        n in 1u32..=32,
    ) {
        // Classes of 4 KiB and up: a whole chunk of blocks in a few steps.
        let heap = Heap::new(&[chunks]);
        let mut warp = Warp::new(0);
        let size = class_bytes(k);
        let mut got = Vec::new();
        let mut asked = 0;
        loop {
            warp.slot = asked;
            let step = allocate_group(&warp, &heap, size, n);
            asked += n;
            let full = step.len() < n as usize;
            got.extend(step);
            if full {
                break;
            }
        }
        let per_chunk = CHUNK_BYTES / size;
        prop_assert_eq!(got.len() as u64, per_chunk * u64::from(chunks));
        let failed = u64::from(asked) - got.len() as u64;
        prop_assert_eq!(heap.counters().failed(Reason::Exhausted), failed);
        prop_assert_eq!(heap.counters().failed_bytes, failed * size);
        heap.check().map_err(TestCaseError::fail)?;
    }
}

#[test]
fn a_freed_block_is_handed_out_again() {
    let heap = Heap::new(&[1]);
    let mut warp = Warp::new(0);
    let size = 64 << 10;
    let blocks: Vec<u64> = (0..16)
        .map(|i| {
            warp.slot = i;
            allocate(&warp, &heap, size).unwrap()
        })
        .collect();
    assert_eq!(allocate(&warp, &heap, size), None);
    free(&warp, &heap, blocks[5]);
    warp.slot = 3;
    assert_eq!(allocate(&warp, &heap, size), Some(blocks[5]));
    heap.check().unwrap();
}

#[test]
fn an_emptied_chunk_serves_another_class() {
    let heap = Heap::new(&[1]);
    let warp = Warp::new(0);
    let small = allocate_group(&warp, &heap, 16, 32);
    assert_eq!(small.len(), 32);
    assert_eq!(allocate(&warp, &heap, 1 << 20), None);
    free_all(&warp, &heap, &small);
    assert_eq!(heap.free_chunks(), 1);
    assert_eq!(allocate(&warp, &heap, 1 << 20), Some(heap.base(0)));
    heap.check().unwrap();
}

#[test]
fn growth_keeps_the_blocks_handed_out_before_it() {
    let mut heap = Heap::new(&[2]);
    let warp = Warp::new(1);
    let size = 256 << 10;
    let before = allocate_group(&warp, &heap, size, 12);
    assert_eq!(before.len(), 8);
    let c = heap.counters();
    assert_eq!(c.failed(Reason::Exhausted), 4);
    let grow = growth_chunks(heap.regions().chunks, c.failed_bytes);
    assert!(grow >= 1);
    assert!(heap.add_region(grow));
    let after = allocate_group(&warp, &heap, size, 4);
    assert_eq!(after.len(), 4);
    let new_region = heap.base(1);
    assert!(
        after
            .iter()
            .all(|&a| a.wrapping_sub(new_region) < u64::from(grow) * CHUNK_BYTES)
    );
    free_all(&warp, &heap, &[before, after].concat());
    let c = heap.counters();
    assert_eq!((c.bad_frees, c.live_bytes, c.frees), (0, 0, 12));
    assert_eq!(heap.free_chunks(), 2 + grow);
    heap.check().unwrap();
}

#[test]
fn bad_requests_and_bad_frees_are_counted_not_served() {
    let heap = Heap::new(&[1]);
    let warp = Warp::new(0);
    assert_eq!(allocate(&warp, &heap, 0), None);
    assert_eq!(allocate(&warp, &heap, MAX_REQUEST_BYTES + 1), None);
    let c = heap.counters();
    assert_eq!((c.failed(Reason::Zero), c.failed(Reason::TooLarge)), (1, 1));
    assert_eq!(c.largest_failed, MAX_REQUEST_BYTES + 1);
    let a = allocate(&warp, &heap, 100).unwrap();
    free(&warp, &heap, a + 16);
    free(&warp, &heap, a);
    free(&warp, &heap, a);
    free(&warp, &heap, heap.base(0).wrapping_sub(16));
    assert_eq!(heap.counters().bad_frees, 3);
    heap.check().unwrap();
}

/// Lanes whose requests are bad return before the warp functions; the
/// others meet without them and are served.
#[test]
fn bad_requests_beside_good_ones_in_one_step() {
    let heap = Heap::new(&[1]);
    let warp = Warp::new(0);
    let mut bytes = [100u64; LANES];
    bytes[0] = 0;
    bytes[7] = MAX_REQUEST_BYTES + 1;
    bytes[31] = 0;
    let got = warp.malloc(&heap, u32::MAX, &bytes);
    assert_eq!((got[0], got[7], got[31]), (0, 0, 0));
    let served: Vec<u64> = got.iter().copied().filter(|&a| a != 0).collect();
    assert_eq!(served.len(), 29);
    let live = Live::default();
    for &a in &served {
        live.insert(a, heap.block_bytes(a).unwrap()).unwrap();
    }
    let c = heap.counters();
    assert_eq!((c.failed(Reason::Zero), c.failed(Reason::TooLarge)), (2, 1));
    assert_eq!((c.allocations, c.live_bytes), (29, 29 * 128));
    // Frees in one step: NULL, a pointer off every region, a block's
    // inside, and the good ones.
    let mut ptrs = got;
    ptrs[0] = 0;
    ptrs[7] = 8;
    ptrs[31] = got[3] + 64;
    warp.free(&heap, u32::MAX, &ptrs);
    let c = heap.counters();
    assert_eq!((c.frees, c.bad_frees, c.live_bytes), (29, 2, 0));
    assert_eq!(heap.free_chunks(), 1);
    heap.check().unwrap();
}

/// Lanes that free one pointer in the same step free it once; the others
/// are bad frees, as they would be one step after another. Blocks alone and
/// spans (of 64 and of 128 blocks) alike.
#[test]
fn lanes_freeing_one_pointer_at_once_free_it_once() {
    let heap = Heap::new(&[1]);
    let warp = Warp::new(0);
    // The only chunk takes 16 B blocks; 1 KiB and 2 KiB requests then
    // borrow runs of 64 and 128 of them.
    let small = allocate(&warp, &heap, 16).unwrap();
    let span_64 = allocate(&warp, &heap, 1 << 10).unwrap();
    let span_128 = allocate(&warp, &heap, 2 << 10).unwrap();
    assert_eq!(heap.block_bytes(span_64), Some(1 << 10));
    assert_eq!(heap.block_bytes(span_128), Some(2 << 10));
    let mut ptrs = [0u64; LANES];
    ptrs[..7].copy_from_slice(&[
        span_64, span_64, span_128, small, span_128, span_128, span_64,
    ]);
    warp.free(&heap, first_lanes(7), &ptrs);
    let c = heap.counters();
    assert_eq!((c.frees, c.bad_frees, c.live_bytes), (3, 4, 0));
    assert_eq!(heap.free_chunks(), 1);
    heap.check().unwrap();
}

/// One step, lanes of four classes: a leader per class, each chunk its own.
#[test]
fn lanes_of_several_classes_in_one_step_each_get_their_class() {
    let heap = Heap::new(&[4]);
    let warp = Warp::new(5);
    let classes = [16u64, 100, 4096, 64 << 10];
    let bytes: [u64; LANES] = std::array::from_fn(|l| classes[l % 4]);
    let got = warp.malloc(&heap, u32::MAX, &bytes);
    let live = Live::default();
    for l in 0..LANES {
        let size = heap.block_bytes(got[l]).unwrap();
        assert_eq!(size, class_bytes(class_of(bytes[l])), "lane {l}");
        live.insert(got[l], size).unwrap();
    }
    assert_eq!(heap.free_chunks(), 0);
    warp.free(&heap, u32::MAX, &got);
    let c = heap.counters();
    assert_eq!((c.allocations, c.frees, c.live_bytes), (32, 32, 0));
    assert_eq!(heap.free_chunks(), 4);
    heap.check().unwrap();
}

#[test]
fn warps_started_together_on_two_chunks_never_share_a_block() {
    // Few blocks (64 KiB ones: 16 per chunk, 2 chunks), four warps at once:
    // every claim races.
    let heap = Heap::new(&[2]);
    let live = Live::default();
    let start = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (heap, live, start) = (&heap, &live, &start);
            s.spawn(move || {
                let warp = Warp::new(t);
                start.wait();
                for i in 0..300u32 {
                    let got = allocate_group(&warp, heap, 64 << 10, 1 + (i + t) % 12);
                    for &a in &got {
                        live.insert(a, 64 << 10).unwrap();
                    }
                    for &a in &got {
                        live.remove(a);
                    }
                    free_all(&warp, heap, &got);
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
    const WARPS: u32 = 6;
    for round in 0..40u32 {
        let heap = Heap::new(&[2]);
        if round % 2 == 1 {
            // Warm: every slot of class 0 names a chunk that emptied again.
            let warp = Warp::new(0);
            let got = allocate_group(&warp, &heap, 16, 32);
            free_all(&warp, &heap, &got);
        }
        let start = std::sync::Barrier::new(WARPS as usize);
        let nulls: u32 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..WARPS)
                .map(|t| {
                    let (heap, start) = (&heap, &start);
                    s.spawn(move || {
                        let mut warp = Warp::new(t * 8);
                        warp.transit_yields = round % 4;
                        start.wait();
                        let mut nulls = 0;
                        for i in 0..4 {
                            warp.slot = t * 8 + i;
                            let got = allocate_group(&warp, heap, 16, 32);
                            nulls += 32 - got.len() as u32;
                            free_all(&warp, heap, &got);
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
    let heap = Heap::new(&[3]);
    let mut warp = Warp::new(0);
    // One chunk each of 4 KiB, 8 KiB and 32 KiB blocks, one block held in each.
    let held: Vec<u64> = [4u64 << 10, 8 << 10, 32 << 10]
        .iter()
        .map(|&b| allocate(&warp, &heap, b).unwrap())
        .collect();
    assert_eq!(heap.free_chunks(), 0);
    // 2 KiB: its class has no chunk; 4 KiB and 8 KiB blocks serve it.
    warp.slot = 1;
    let small = allocate_group(&warp, &heap, 2 << 10, 32);
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
    warp.slot = 0;
    let far = allocate(&warp, &heap, 512).unwrap();
    assert_eq!(heap.block_bytes(far), Some(4 << 10));
    assert_eq!(heap.counters().failed(Reason::Exhausted), 0);
    free_all(&warp, &heap, &[small, held, vec![far]].concat());
    heap.check().unwrap();
    assert_eq!((heap.counters().live_bytes, heap.free_chunks()), (0, 3));
}

/// One step of a single-warp script: a step of requests, or the frees of
/// `count` live blocks picked from `pick` on, in one step.
#[derive(Clone, Debug)]
enum Step {
    Allocate(Box<Request>),
    Free(usize, usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    // Log-uniform sizes, small ones most: their chunks leave the holes that
    // larger requests must use.
    let bytes = (0u32..=20).prop_flat_map(|s| (1u64 << s)..=(2u64 << s).min(MAX_REQUEST_BYTES));
    let step = prop_oneof![
        3 => request(bytes).prop_map(|r| Step::Allocate(Box::new(r))),
        2 => (any::<usize>(), 1usize..=32).prop_map(|(pick, n)| Step::Free(pick, n)),
    ];
    proptest::collection::vec(step, 1..100)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The rule: a request of class k gets NULL only when no
    /// class_bytes(k)-aligned window of that size is free (in a free chunk,
    /// a free block of class k or larger, or a run of free blocks of a
    /// smaller class). Checked after every step in which a lane got NULL,
    /// for each class that did (a step only takes blocks, so a window free
    /// after it was free when the NULL came), with the invariants after
    /// every step and after all frees.
    #[test]
    fn a_null_comes_only_when_no_window_of_its_class_is_free(
        script in steps(),
        chunks in 1u32..=3,
    ) {
        let heap = Heap::new(&[chunks]);
        let mut warp = Warp::new(0);
        let live = Live::default();
        let mut held: Vec<u64> = Vec::new();
        for (i, step) in script.iter().enumerate() {
            warp.slot = i as u32;
            match step {
                Step::Allocate(request) => {
                    let got = warp.malloc(&heap, request.lanes, &request.bytes);
                    let taken = take(&heap, &live, request, &got).map_err(TestCaseError::fail)?;
                    held.extend(taken.iter().map(|&(_, a, _)| a));
                    let image = heap.image();
                    for lane in lanes_of(request.lanes).filter(|&l| got[l] == 0) {
                        let bytes = request.bytes[lane];
                        let window = image.free_window(class_of(bytes));
                        prop_assert!(
                            window.is_none(),
                            "step {}: NULL for {} B with {} B free and a free window at {:?}",
                            i, bytes, image.free_bytes(), window
                        );
                    }
                }
                &Step::Free(pick, n) => {
                    let mut picked = Vec::new();
                    while picked.len() < n && !held.is_empty() {
                        let a = held.swap_remove((pick + picked.len()) % held.len());
                        live.remove(a);
                        picked.push(a);
                    }
                    free_all(&warp, &heap, &picked);
                }
            }
            heap.check().map_err(|e| TestCaseError::fail(format!("after step {i} ({step:?}): {e}")))?;
        }
        let c = heap.counters();
        let bytes: u64 = held.iter().map(|&a| heap.block_bytes(a).unwrap()).sum();
        prop_assert_eq!(c.live_bytes, bytes);
        prop_assert_eq!(heap.image().free_bytes(), heap.regions().block_bytes() - bytes);
        free_all(&warp, &heap, &held);
        heap.check().map_err(|e| TestCaseError::fail(format!("after all frees: {e}")))?;
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
    let heap = Heap::new(&[1]);
    let mut warp = Warp::new(0);
    let mut blocks: Vec<u64> = (0..2048)
        .flat_map(|i| {
            warp.slot = i;
            allocate_group(&warp, &heap, 16, 32)
        })
        .collect();
    blocks.sort_unstable();
    assert_eq!(blocks.len(), 65_536);
    assert_eq!(allocate(&warp, &heap, 16), None);
    let odd: Vec<u64> = blocks.iter().copied().skip(1).step_by(2).collect();
    free_all(&warp, &heap, &odd);
    let image = heap.image();
    assert_eq!(image.free_bytes(), 512 << 10);
    assert_eq!(image.free_window(1), None);
    assert_eq!(allocate(&warp, &heap, 32), None);
    free(&warp, &heap, blocks[40]);
    let pair = allocate(&warp, &heap, 32).unwrap();
    assert_eq!((pair, heap.block_bytes(pair)), (blocks[40], Some(32)));
    assert_eq!(
        heap.block_bytes(pair + 16),
        None,
        "a span's tail is no block"
    );
    free(&warp, &heap, pair + 16);
    assert_eq!(heap.counters().bad_frees, 1);
    heap.check().unwrap();
}

/// The H200 fragmentation check's shape: 4 KiB blocks, runs of them freed;
/// 16 KiB requests take every aligned run of four, and a 512 KiB request a
/// run of 128 (two map words); each frees as one block.
#[test]
fn runs_of_freed_small_blocks_serve_larger_requests_and_free_as_one() {
    let heap = Heap::new(&[2]);
    let mut warp = Warp::new(0);
    let mut blocks: Vec<u64> = (0..16)
        .flat_map(|i| {
            warp.slot = i;
            allocate_group(&warp, &heap, 4096, 32)
        })
        .collect();
    blocks.sort_unstable();
    assert_eq!(blocks.len(), 512);
    assert_eq!(heap.free_chunks(), 0);
    // The lower 256 blocks are one chunk: free 4 of every 8 there; in the
    // other free the 128 blocks of its second half.
    let freed: Vec<u64> = (0..256usize)
        .filter(|i| i % 8 >= 4)
        .chain(384..512)
        .map(|i| blocks[i])
        .collect();
    free_all(&warp, &heap, &freed);
    warp.slot = 0;
    let big = allocate(&warp, &heap, 512 << 10).unwrap();
    assert_eq!((big, heap.block_bytes(big)), (blocks[384], Some(512 << 10)));
    let mut spans = Vec::new();
    loop {
        warp.slot = spans.len() as u32;
        let Some(a) = allocate(&warp, &heap, 16 << 10) else {
            break;
        };
        assert_eq!(heap.block_bytes(a), Some(16 << 10));
        spans.push(a);
    }
    assert_eq!(
        spans.len(),
        32,
        "every run of four 4 KiB blocks in the lower chunk"
    );
    assert_eq!(heap.image().free_window(class_of(16 << 10)), None);
    assert_eq!(heap.image().free_bytes(), 0);
    heap.check().unwrap();
    free_all(&warp, &heap, &[spans, vec![big]].concat());
    assert_eq!(heap.image().free_bytes(), freed.len() as u64 * 4096);
    heap.check().unwrap();
    let rest: Vec<u64> = blocks
        .iter()
        .copied()
        .filter(|a| !freed.contains(a))
        .collect();
    free_all(&warp, &heap, &rest);
    heap.check().unwrap();
    let c = heap.counters();
    assert_eq!((c.live_bytes, c.bad_frees, heap.free_chunks()), (0, 0, 2));
}
