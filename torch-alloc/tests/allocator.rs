//! The Rust API on the simulated device, on both backings: allocation, stream order,
//! out of memory and recovery, bad frees, `empty_cache`, the memory fraction, the
//! largest block, the ledger, many threads.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ctx::{SimConfig, StreamId};
use cudamem_torch::{Backing, Error, Request};
use support::{Case, MIB, Make, S1, S2, S3, next};

on_both! {
    blocks_are_distinct_aligned_and_counted => distinct_aligned_counted;
    the_same_stream_reuses_a_free_at_once => same_stream_reuse;
    another_stream_waits_for_the_event => other_stream_waits;
    a_second_stream_first_waits_for_the_first => second_stream_waits;
    a_recorded_stream_holds_the_block_back => recorded_stream_holds;
    out_of_memory_first_waits_for_pending_frees => oom_waits_for_pending;
    out_of_memory_is_an_error_with_the_ledger_then_recovers => oom_then_recovery;
    bad_frees_are_errors_and_change_nothing => bad_frees;
    the_memory_fraction_caps_the_pool => memory_fraction;
    the_largest_block_is_what_could_be_handed_out => largest_block;
    the_ledger_names_every_term => ledger_terms;
    eight_threads_allocate_and_free_without_overlap => eight_threads;
    a_blocks_mappings_cover_it_side_by_side => mappings_cover_blocks;
}

fn distinct_aligned_counted<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let a = case.take(1000, S1);
    let b = case.take(1, S1);
    let c = case.take(0, S1);
    assert!(a != 0 && b != 0 && c != 0);
    assert!([a, b, c].iter().all(|p| p % 512 == 0));
    assert!(b >= a + 1024 || a >= b + 512, "{a:#x} {b:#x}");
    let stats = case.alloc.stats();
    assert_eq!(stats.allocations, 3);
    assert_eq!(stats.live_bytes, 1024 + 512 + 512);
    for ptr in [a, b, c] {
        case.give(ptr);
    }
    let stats = case.alloc.stats();
    assert_eq!((stats.live_bytes, stats.frees), (0, 3));
    assert_eq!(stats.peak_live_bytes, 2048);
    assert_eq!(stats.pending_bytes, 0, "one stream: frees go straight back");
}

fn same_stream_reuse<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let a = case.take(MIB, S1);
    let _other = case.take(MIB, S2); // two streams: frees now wait
    case.streams.launch(S1);
    case.give(a);
    assert_eq!(case.alloc.stats().pending_bytes, MIB);
    assert_eq!(case.take(MIB, S1), a, "S1's work is ordered");
    assert!(!case.streams.is_idle(S1), "nothing waited for S1");
}

fn other_stream_waits<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let a = case.take(MIB, S1);
    let _keep = case.take(MIB, S2);
    case.streams.launch(S1);
    case.give(a);
    let b = case.take(MIB, S2);
    assert_ne!(b, a, "S1's kernel may still use it");
    assert!(!case.streams.is_idle(S1), "asking never waits");
    case.streams.complete(S1);
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(case.take(MIB, S2));
    }
    assert_eq!(case.alloc.stats().pending_bytes, 0, "the event completed");
    assert!(
        got.contains(&a),
        "S2 may have S1's block once its event completed: {a:#x} {got:x?}"
    );
}

fn second_stream_waits<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let a = case.take(MIB, S1);
    case.streams.launch(S1);
    case.give(a); // one stream: straight to the pool
    assert!(!case.streams.is_idle(S1));
    case.take(MIB, S2);
    assert!(case.streams.is_idle(S1), "S2's first request waited for S1");
}

fn recorded_stream_holds<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let a = case.take(MIB, S1);
    case.alloc.record_stream(a, S3).unwrap();
    case.streams.launch(S3); // S3 reads `a`
    case.give(a);
    for _ in 0..3 {
        assert_ne!(case.take(MIB, S1), a, "not even S1 before S3 is done");
    }
    case.streams.complete(S3);
    case.streams.complete(S1);
    let again: Vec<u64> = (0..3).map(|_| case.take(MIB, S2)).collect();
    assert!(again.contains(&a), "{a:#x} {again:x?}");
    assert!(matches!(
        case.alloc.record_stream(0x1234, S3),
        Err(Error::UnknownPointer { ptr: 0x1234 })
    ));
}

fn oom_waits_for_pending<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(8 * MIB));
    let a = case.take(4 * MIB, S1);
    let _b = case.take(2 * MIB, S2);
    case.streams.launch(S1);
    case.give(a);
    // The device is full; the only room is S1's pending block.
    let c = case.take(4 * MIB, S2);
    assert!(case.streams.is_idle(S1), "it waited for S1's event");
    let stats = case.alloc.device_stats();
    assert_eq!(stats.num_ooms, 0);
    assert_eq!(stats.num_alloc_retries, 1);
    assert!(stats.num_sync_all_streams >= 1);
    case.give(c);
}

fn oom_then_recovery<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(16 * MIB));
    let blocks: Vec<u64> = (0..6).map(|_| case.take(2 * MIB, S1)).collect();
    let error = case.alloc.allocate(Request::new(64 * MIB, S1)).unwrap_err();
    let Error::OutOfMemory {
        device,
        requested,
        headline,
        report,
    } = &error
    else {
        panic!("expected out of memory, got {error}");
    };
    assert_eq!((*device, *requested), (0, 64 * MIB));
    assert!(
        headline.starts_with("CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has"),
        "{headline}"
    );
    assert!(
        headline.contains("Of the allocated memory 12.00 MiB is allocated by PyTorch"),
        "{headline}"
    );
    assert!(error.to_string().starts_with(headline.as_str()));
    for term in ["cudamem pool (physical)", "driver + context", "live"] {
        assert!(report.contains(term), "{term}: {report}");
    }
    let too_much = case.alloc.allocate(Request::new(12 * MIB, S1));
    assert!(
        matches!(too_much, Err(Error::OutOfMemory { .. })),
        "{too_much:?}"
    );
    let stats = case.alloc.device_stats();
    assert_eq!(stats.num_ooms, 2);
    assert_eq!(
        case.alloc.stats().errors,
        0,
        "out of memory is not a bad call"
    );
    // Nothing was lost: after frees, the same request fits.
    for ptr in &blocks[..4] {
        case.give(*ptr);
    }
    let big = case.take(8 * MIB, S1);
    assert!(big != 0);
    let stats = case.alloc.device_stats();
    assert_eq!(
        stats.allocated_bytes.aggregate.current,
        i64::try_from(12 * MIB).unwrap()
    );
}

fn bad_frees<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let a = case.take(4096, S1);
    let unknown = case.alloc.free(a + 512, 0).unwrap_err();
    assert!(
        matches!(unknown, Error::UnknownPointer { ptr } if ptr == a + 512),
        "{unknown}"
    );
    assert!(
        unknown.to_string().contains("not a live allocation"),
        "{unknown}"
    );
    case.give(a);
    let double = case.alloc.free(a, 0).unwrap_err();
    assert!(matches!(double, Error::UnknownPointer { .. }), "{double}");
    let stats = case.alloc.stats();
    assert_eq!((stats.frees, stats.errors, stats.live_bytes), (1, 2, 0));
    assert_eq!(case.alloc.device_stats().allocation.aggregate.current, 0);
}

fn memory_fraction<B: Backing>(make: Make<B>) {
    let case = make(SimConfig {
        backed: false,
        ..SimConfig::small(1 << 30)
    });
    assert_eq!(case.alloc.memory_fraction(), 1.0);
    case.alloc.set_memory_fraction(0.25).unwrap();
    assert_eq!(case.alloc.memory_fraction(), 0.25);
    let a = case.take(64 * MIB, S1);
    let refused = case.alloc.allocate(Request::new(300 * MIB, S1));
    assert!(
        matches!(refused, Err(Error::OutOfMemory { .. })),
        "{refused:?}"
    );
    let refused = case.alloc.allocate(Request::new(200 * MIB, S1));
    assert!(
        matches!(refused, Err(Error::OutOfMemory { .. })),
        "{refused:?}"
    );
    let stats = case.alloc.stats();
    assert!(
        stats.mapped_bytes <= 256 * MIB,
        "the cap holds after the refusals: {stats:?}"
    );
    let fits = case.take(128 * MIB, S1);
    case.alloc.set_memory_fraction(1.0).unwrap();
    let b = case.take(300 * MIB, S1);
    for bad in [-0.5, 1.5, f64::NAN] {
        assert!(matches!(
            case.alloc.set_memory_fraction(bad),
            Err(Error::BadFraction { .. })
        ));
    }
    for ptr in [a, fits, b] {
        case.give(ptr);
    }
    // A cap set below what is mapped: the mapped memory serves on, growth is refused.
    case.alloc.set_memory_fraction(0.1).unwrap();
    let reused = case.take(200 * MIB, S1);
    let grown = case.alloc.allocate(Request::new(400 * MIB, S1));
    assert!(matches!(grown, Err(Error::OutOfMemory { .. })), "{grown:?}");
    case.give(reused);
}

fn largest_block<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let empty = case.alloc.largest_block().unwrap();
    assert_eq!(empty, 64 * MIB, "nothing mapped: the whole device");
    let a = case.take(8 * MIB, S1);
    let largest = case.alloc.largest_block().unwrap();
    assert!((32 * MIB..=56 * MIB).contains(&largest), "{largest}");
    let b = case.take(largest, S1); // what it says can be had, can be had
    case.give(a);
    case.give(b);
    assert_eq!(
        case.alloc.largest_block().unwrap(),
        64 * MIB,
        "all of it, mapped or not"
    );
    case.alloc.set_memory_fraction(0.25).unwrap();
    assert!(
        case.alloc.largest_block().unwrap() >= 32 * MIB,
        "what is mapped serves on"
    );
    let capped = make(SimConfig::small(64 * MIB));
    capped.alloc.set_memory_fraction(0.5).unwrap();
    assert_eq!(capped.alloc.largest_block().unwrap(), 32 * MIB);
}

fn ledger_terms<B: Backing>(make: Make<B>) {
    let config = SimConfig {
        context_reserved_bytes: 3 * MIB,
        ..SimConfig::small(64 * MIB)
    };
    let case = make(config);
    let _a = case.take(5 * MIB, S1);
    let text = case.alloc.explain().unwrap();
    for term in [
        "total",
        "used by this process",
        "driver + context",
        "local memory",
        "malloc heap",
        "printf FIFO",
        "cudamem pool (physical)",
        "live",
        "free inside the pool",
        "outside the pool",
    ] {
        assert!(text.contains(term), "{term} missing:\n{text}");
    }
    let line = |item: &str| {
        text.lines()
            .find(|line| line.trim_start().starts_with(item))
            .unwrap_or_else(|| panic!("no {item} line:\n{text}"))
    };
    assert!(line("outside the pool").contains(" 0 B "), "{text}");
}

fn mappings_cover_blocks<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(256 * MIB));
    let small = case.take(4096, S1);
    let big = case.take(40 * MIB, S1);
    for (ptr, bytes) in [(small, 4096), (big, 40 * MIB)] {
        let mappings = case.alloc.block_mappings(ptr).unwrap();
        assert!(!mappings.is_empty());
        let (first, _) = mappings[0];
        let (last, last_bytes) = *mappings.last().unwrap();
        assert!(
            first <= ptr && last + last_bytes >= ptr + bytes,
            "{mappings:x?}"
        );
        for pair in mappings.windows(2) {
            assert_eq!(
                pair[0].0 + pair[0].1,
                pair[1].0,
                "side by side: {mappings:x?}"
            );
        }
    }
    assert!(matches!(
        case.alloc.block_mappings(big + 512),
        Err(Error::UnknownPointer { .. })
    ));
}

fn eight_threads<B: Backing + 'static>(make: Make<B>) {
    let config = SimConfig {
        backed: false,
        ..SimConfig::small(4 << 30)
    };
    let Case { alloc, streams } = make(config);
    let alloc = Arc::new(alloc);
    let taken: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (alloc, taken, streams) = (alloc.clone(), taken.clone(), streams.clone());
            std::thread::spawn(move || {
                let stream = StreamId(t % 3);
                let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                let mut mine: Vec<u64> = Vec::new();
                for _ in 0..5_000 {
                    if mine.is_empty() || next(&mut rng) % 3 != 0 {
                        let size = 1 + next(&mut rng) % (256 << 10);
                        let ptr = alloc.allocate(Request::new(size, stream)).unwrap().ptr;
                        let mut map = taken.lock().unwrap();
                        let end = ptr + size;
                        if let Some((&start, &prev_end)) = map.range(..end).next_back() {
                            assert!(
                                prev_end <= ptr,
                                "[{ptr:#x},{end:#x}) overlaps [{start:#x},{prev_end:#x})"
                            );
                        }
                        map.insert(ptr, end);
                        mine.push(ptr);
                    } else {
                        let i = (next(&mut rng) % mine.len() as u64) as usize;
                        let ptr = mine.swap_remove(i);
                        taken.lock().unwrap().remove(&ptr);
                        streams.launch(stream);
                        alloc.free(ptr, 0).unwrap();
                        if next(&mut rng) % 16 == 0 {
                            streams.complete(stream);
                        }
                    }
                    if next(&mut rng) % 512 == 0 {
                        let s = alloc.device_stats();
                        assert!(
                            s.allocated_bytes.aggregate.current <= s.active_bytes.aggregate.current
                        );
                        assert!(
                            s.active_bytes.aggregate.current <= s.reserved_bytes.aggregate.current
                        );
                    }
                }
                for ptr in mine {
                    taken.lock().unwrap().remove(&ptr);
                    alloc.free(ptr, 0).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = alloc.stats();
    assert_eq!(stats.live_bytes, 0);
    assert_eq!(stats.allocations, stats.frees);
    assert!(stats.allocations > 8 * 2_500, "{stats:?}");
    assert_eq!((stats.errors, stats.ooms), (0, 0));
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().pending_bytes, 0);
    assert_eq!(alloc.device_stats().active_bytes.aggregate.current, 0);
}

/// Frees a large block between two small live ones and empties the cache; then frees
/// the top one and empties again. Returns what the two calls gave back, and the mapped
/// bytes before.
fn hole_then_top<B: Backing>(case: &Case<B>) -> (u64, u64, u64) {
    let low = case.take(MIB, S1);
    let middle = case.take(96 * MIB, S1);
    let high = case.take(MIB, S1);
    let before = case.alloc.stats().mapped_bytes;
    case.give(middle);
    let hole = case.alloc.empty_cache().unwrap();
    assert_eq!(case.alloc.stats().mapped_bytes, before - hole);
    case.give(high);
    let top = case.alloc.empty_cache().unwrap();
    case.give(low);
    (hole, top, before)
}

#[test]
fn empty_cache_frees_a_hole_only_in_the_stitched_pool() {
    let (hole, top, before) = hole_then_top(&support::tlsf(SimConfig::small(256 * MIB)));
    assert_eq!(hole, 0, "the top of the TLSF pool is live");
    assert!(
        top >= 96 * MIB,
        "with the top free, it gives back: {top} of {before}"
    );
    let (hole, _, before) = hole_then_top(&support::stitch(SimConfig::small(256 * MIB)));
    assert!(
        hole >= 64 * MIB,
        "every handle under the hole only goes back: {hole} of {before}"
    );
}

#[test]
fn empty_cache_gives_the_top_pages_back_from_the_tlsf_pool() {
    let case = support::tlsf(SimConfig::small(64 * MIB));
    let _b = case.take(MIB, S2);
    let a = case.take(8 * MIB, S1); // at the top
    case.streams.launch(S1);
    case.give(a);
    let before = case.alloc.stats().mapped_bytes;
    assert_eq!(case.alloc.stats().pending_bytes, 8 * MIB);
    let given_back = case.alloc.empty_cache().unwrap();
    assert!(case.streams.is_idle(S1));
    let after = case.alloc.stats();
    assert_eq!(after.pending_bytes, 0);
    assert_eq!(after.mapped_bytes, before - given_back);
    assert_eq!(
        after.mapped_bytes,
        2 * MIB,
        "the page of the live block stays"
    );
}
