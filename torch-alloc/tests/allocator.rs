//! The Rust API on the simulated device: allocation, frees, stream order, out of
//! memory, bad frees, many threads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ctx::{SimConfig, SimDevice, StreamId};
use cudamem_torch::{DeviceAllocator, Error, Settings, SimStreams};

const S1: StreamId = StreamId(0x100);
const S2: StreamId = StreamId(0x200);
const MIB: u64 = 1 << 20;

fn allocator(config: SimConfig) -> (DeviceAllocator<SimDevice, SimStreams>, SimStreams) {
    let streams = SimStreams::default();
    let settings = Settings::parse(None, None).unwrap();
    let alloc = DeviceAllocator::new(0, SimDevice::new(config), streams.clone(), &settings)
        .expect("allocator on the simulated device");
    (alloc, streams)
}

#[test]
fn allocations_are_distinct_aligned_and_counted() {
    let (alloc, _) = allocator(SimConfig::small(64 * MIB));
    let a = alloc.allocate(1000, S1).unwrap();
    let b = alloc.allocate(1, S1).unwrap();
    let c = alloc.allocate(0, S1).unwrap();
    assert!(a != 0 && b != 0 && c != 0);
    assert_eq!(a % 512, 0);
    assert!(b >= a + 1024 || a >= b + 512, "{a:#x} {b:#x}");
    let stats = alloc.stats();
    assert_eq!(stats.allocations, 3);
    assert_eq!(stats.live_bytes, 1024 + 512 + 512);
    assert_eq!(stats.mapped_bytes, 2 * MIB, "one 2 MiB growth step");
    alloc.free(a, 1000, S1).unwrap();
    alloc.free(b, 1, S1).unwrap();
    alloc.free(c, 0, S1).unwrap();
    let stats = alloc.stats();
    assert_eq!((stats.live_bytes, stats.frees), (0, 3));
    assert_eq!(stats.peak_live_bytes, 2048);
    assert_eq!(stats.pending_bytes, 0, "one stream: frees go straight back");
}

#[test]
fn the_same_stream_reuses_a_free_at_once() {
    let (alloc, streams) = allocator(SimConfig::small(64 * MIB));
    let a = alloc.allocate(MIB, S1).unwrap();
    let _other = alloc.allocate(MIB, S2).unwrap(); // two streams: frees now wait
    streams.launch(S1);
    alloc.free(a, MIB, S1).unwrap();
    assert_eq!(alloc.stats().pending_bytes, MIB);
    assert_eq!(alloc.allocate(MIB, S1).unwrap(), a, "S1's work is ordered");
    assert!(!streams.is_idle(S1), "nothing waited for S1");
}

#[test]
fn another_stream_reuses_a_free_only_once_its_event_completed() {
    let (alloc, streams) = allocator(SimConfig::small(64 * MIB));
    let a = alloc.allocate(MIB, S1).unwrap();
    let keep = alloc.allocate(MIB, S2).unwrap();
    streams.launch(S1);
    alloc.free(a, MIB, S1).unwrap();
    let b = alloc.allocate(MIB, S2).unwrap();
    assert_ne!(b, a, "S1's kernel may still use it");
    assert!(!streams.is_idle(S1), "asking never waits");
    streams.complete(S1);
    let c = alloc.allocate(MIB, S2).unwrap();
    assert_eq!(c, a, "the event completed: the block is back in the pool");
    assert_eq!(alloc.stats().pending_bytes, 0);
    let _ = keep;
}

#[test]
fn a_second_stream_first_waits_for_the_first() {
    let (alloc, streams) = allocator(SimConfig::small(64 * MIB));
    let a = alloc.allocate(MIB, S1).unwrap();
    streams.launch(S1);
    alloc.free(a, MIB, S1).unwrap(); // one stream: straight to the pool
    assert!(!streams.is_idle(S1));
    assert_eq!(alloc.allocate(MIB, S2).unwrap(), a);
    assert!(
        streams.is_idle(S1),
        "S2 got S1's memory only after S1's work"
    );
}

#[test]
fn out_of_memory_first_waits_for_pending_frees() {
    let (alloc, streams) = allocator(SimConfig::small(4 * MIB));
    let a = alloc.allocate(2 * MIB, S1).unwrap();
    let b = alloc.allocate(2 * MIB, S2).unwrap();
    streams.launch(S1);
    alloc.free(a, 2 * MIB, S1).unwrap();
    // The device is full; the only room is S1's pending block.
    assert_eq!(alloc.allocate(2 * MIB, S2).unwrap(), a);
    assert!(streams.is_idle(S1), "it waited for S1's event");
    assert_eq!(alloc.stats().ooms, 0);
    let _ = b;
}

#[test]
fn out_of_memory_is_an_error_with_the_ledger() {
    let (alloc, _) = allocator(SimConfig::small(4 * MIB));
    let blocks: Vec<u64> = (0..4).map(|_| alloc.allocate(MIB, S1).unwrap()).collect();
    alloc.free(blocks[0], MIB, S1).unwrap();
    alloc.free(blocks[2], MIB, S1).unwrap();
    let error = alloc.allocate(2 * MIB, S1).unwrap_err();
    let Error::OutOfMemory {
        device,
        requested,
        report,
    } = &error
    else {
        panic!("expected out of memory, got {error}");
    };
    assert_eq!((*device, *requested), (0, 2 * MIB));
    assert!(
        report.contains("fragmentation: the pool has 2097152 bytes free"),
        "{report}"
    );
    assert!(report.contains("largest free block 1.0"), "{report}");
    assert!(report.contains("cudamem pool (physical)"), "{report}");
    assert!(report.contains("driver + context"), "{report}");
    assert_eq!(alloc.stats().ooms, 1);
    // Smaller requests still fit the holes: nothing was lost.
    let hole = alloc.allocate(MIB, S1).unwrap();
    assert!(hole == blocks[0] || hole == blocks[2], "{hole:#x}");
}

#[test]
fn bad_frees_are_errors_and_change_nothing() {
    let (alloc, _) = allocator(SimConfig::small(64 * MIB));
    let a = alloc.allocate(4096, S1).unwrap();
    let unknown = alloc.free(a + 512, 4096, S1).unwrap_err();
    assert!(
        matches!(unknown, Error::UnknownPointer { ptr, .. } if ptr == a + 512),
        "{unknown}"
    );
    assert!(
        unknown.to_string().contains("not a live allocation"),
        "{unknown}"
    );
    let mismatch = alloc.free(a, 100, S1).unwrap_err();
    assert!(matches!(
        mismatch,
        Error::SizeMismatch {
            allocated: 4096,
            given: 100,
            ..
        }
    ));
    alloc.free(a, 4096, S1).unwrap();
    let double = alloc.free(a, 4096, S1).unwrap_err();
    assert!(matches!(double, Error::UnknownPointer { .. }), "{double}");
    let stats = alloc.stats();
    assert_eq!((stats.frees, stats.errors, stats.live_bytes), (1, 3, 0));
}

#[test]
fn empty_cache_gives_free_pages_back() {
    let (alloc, streams) = allocator(SimConfig::small(64 * MIB));
    let _b = alloc.allocate(MIB, S2).unwrap();
    let a = alloc.allocate(8 * MIB, S1).unwrap(); // at the top
    streams.launch(S1);
    alloc.free(a, 8 * MIB, S1).unwrap();
    let before = alloc.stats().mapped_bytes;
    assert_eq!(alloc.stats().pending_bytes, 8 * MIB);
    let given_back = alloc.empty_cache().unwrap();
    assert!(streams.is_idle(S1));
    let after = alloc.stats();
    assert_eq!(after.pending_bytes, 0);
    assert_eq!(after.mapped_bytes, before - given_back);
    // Only the page the live 1 MiB block lies in stays mapped.
    assert_eq!(after.mapped_bytes, 2 * MIB, "{after:?}");
    assert!(given_back > 0);
}

#[test]
fn explain_names_every_term() {
    let config = SimConfig {
        context_reserved_bytes: 3 * MIB,
        ..SimConfig::small(64 * MIB)
    };
    let (alloc, _) = allocator(config);
    let _a = alloc.allocate(5 * MIB, S1).unwrap();
    let text = alloc.explain().unwrap();
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
    // used = 3 MiB context + 5 MiB mapped (a growth of what the request needs, over the
    // 2 MiB step); nothing outside.
    let line = |item: &str| {
        text.lines()
            .find(|line| line.trim_start().starts_with(item))
            .unwrap_or_else(|| panic!("no {item} line:\n{text}"))
    };
    assert!(
        line("used by this process").contains("8388608 (8.0 MiB)"),
        "{text}"
    );
    assert!(line("outside the pool").contains(" 0 (0.0 MiB)"), "{text}");
}

/// Deterministic pseudo-random numbers (xorshift), one stream per thread.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn eight_threads_allocate_and_free_without_overlap() {
    let config = SimConfig {
        backed: false,
        ..SimConfig::small(4 << 30)
    };
    let (alloc, streams) = allocator(config);
    let alloc = Arc::new(alloc);
    let taken: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (alloc, taken, streams) = (alloc.clone(), taken.clone(), streams.clone());
            std::thread::spawn(move || {
                let stream = StreamId(t % 3);
                let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                let mut mine: Vec<(u64, u64)> = Vec::new();
                for _ in 0..10_000 {
                    if mine.is_empty() || next(&mut rng) % 3 != 0 {
                        let size = 1 + next(&mut rng) % (256 << 10);
                        let ptr = alloc.allocate(size, stream).unwrap();
                        let mut map = taken.lock().unwrap();
                        let end = ptr + size;
                        if let Some((&start, &prev_end)) = map.range(..end).next_back() {
                            assert!(
                                prev_end <= ptr,
                                "[{ptr:#x},{end:#x}) overlaps [{start:#x},{prev_end:#x})"
                            );
                        }
                        map.insert(ptr, end);
                        mine.push((ptr, size));
                    } else {
                        let i = (next(&mut rng) % mine.len() as u64) as usize;
                        let (ptr, size) = mine.swap_remove(i);
                        taken.lock().unwrap().remove(&ptr);
                        streams.launch(stream);
                        alloc.free(ptr, size, stream).unwrap();
                        if next(&mut rng) % 16 == 0 {
                            streams.complete(stream);
                        }
                    }
                }
                for (ptr, size) in mine {
                    taken.lock().unwrap().remove(&ptr);
                    alloc.free(ptr, size, stream).unwrap();
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
    assert!(stats.allocations > 8 * 5_000, "{stats:?}");
    assert_eq!((stats.errors, stats.ooms), (0, 0));
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().pending_bytes, 0);
}
