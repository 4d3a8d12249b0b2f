//! The C functions on simulated devices, called as the C++ backend calls them. All
//! tests of this binary share one process-wide registry, so each uses its own device.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

#[path = "support/c_abi.rs"]
mod c_abi;
use c_abi::{last_error, request};

use ctx::{SimConfig, StreamId};
use cudamem_torch::ffi::{
    CUDAMEM_ERROR, CUDAMEM_OK, CUDAMEM_OUT_OF_MEMORY, CudamemBlockInfo, CudamemOutcome,
    CudamemRequest, CudamemSegment, CudamemSnapshotSink, CudamemTraceEntry, cudamem_allocate,
    cudamem_begin_allocate_to_pool, cudamem_block, cudamem_block_mappings, cudamem_check_pool_live,
    cudamem_checkpoint_pool, cudamem_device_stats, cudamem_device_stats_size,
    cudamem_drop_checkpoint, cudamem_empty_cache, cudamem_end_allocate_to_pool, cudamem_explain,
    cudamem_free, cudamem_incref_pool, cudamem_largest_block, cudamem_pool_use_count,
    cudamem_record_history, cudamem_record_stream, cudamem_release_pool, cudamem_reset_peak_stats,
    cudamem_restore_checkpoint, cudamem_set_no_split, cudamem_set_use_on_oom, cudamem_snapshot,
    cudamem_stats, cudamem_stats_fields, cudamem_take_dead_contexts,
};
use cudamem_torch::{AllocatorStats, DeviceStats, SimStreams, registry};

const MIB: u64 = 1 << 20;

/// Simulated devices of 256 MiB each, installed before any C call.
fn devices() -> &'static [SimStreams] {
    static STREAMS: OnceLock<Vec<SimStreams>> = OnceLock::new();
    STREAMS.get_or_init(|| {
        registry::install_simulated(SimConfig::small(256 * MIB), 16)
            .expect("the first call of the process installs the simulated devices")
    })
}

fn allocate_with(device: c_int, r: CudamemRequest) -> (c_int, CudamemOutcome) {
    devices();
    c_abi::allocate_with(device, r)
}

fn allocate(device: c_int, size: u64, stream: usize) -> u64 {
    let (code, out) = allocate_with(device, request(size, stream));
    assert_eq!(code, CUDAMEM_OK, "{}", last_error());
    out.ptr
}

fn free(ptr: u64) -> c_int {
    devices();
    let mut out = CudamemOutcome::default();
    // SAFETY: `out` is live; the pointer is only compared.
    unsafe { cudamem_free(ptr as *mut c_void, 0, &mut out) }
}

fn device_stats(device: c_int) -> DeviceStats {
    let mut out = DeviceStats::default();
    // SAFETY: `out` is a live DeviceStats.
    assert_eq!(
        unsafe { cudamem_device_stats(device, &mut out) },
        CUDAMEM_OK
    );
    out
}

fn stats(device: c_int) -> AllocatorStats {
    let mut out = AllocatorStats::default();
    // SAFETY: `out` is a live AllocatorStats.
    assert_eq!(unsafe { cudamem_stats(device, &mut out) }, CUDAMEM_OK);
    out
}

#[test]
fn allocate_and_free_round_trip_with_totals() {
    let (code, a) = allocate_with(0, request(1000, 0));
    assert_eq!(code, CUDAMEM_OK);
    assert_eq!((a.bytes, a.allocated_bytes, a.device), (1024, 1024, 0));
    assert!(a.reserved_bytes >= 1024);
    let b = allocate(0, 3 * MIB, 0);
    assert_eq!(
        device_stats(0).allocated_bytes.aggregate.current,
        (1024 + 3 * MIB) as i64
    );
    let (mut device, mut base, mut bytes) = (-1, 0, 0);
    // SAFETY: the out-pointers are live.
    let code = unsafe { cudamem_block(b as *mut c_void, &mut device, &mut base, &mut bytes) };
    assert_eq!((code, device, base, bytes), (CUDAMEM_OK, 0, b, 3 * MIB));
    let mut pairs = [0u64; 2];
    // SAFETY: `pairs` holds one pair; the pointer is only compared.
    let n = unsafe { cudamem_block_mappings(b as *mut c_void, pairs.as_mut_ptr(), 1) };
    assert!(n >= 1, "{}", last_error());
    assert!(pairs[0] <= b && pairs[1] > 0);
    // SAFETY: a null `out` with no room asks the count only.
    let again = unsafe { cudamem_block_mappings(b as *mut c_void, std::ptr::null_mut(), 0) };
    assert_eq!(again, n);
    // SAFETY: as above; the pointer is no block.
    assert_eq!(
        unsafe { cudamem_block_mappings(12 as *mut c_void, std::ptr::null_mut(), 0) },
        -1
    );
    assert_eq!(free(a.ptr), CUDAMEM_OK);
    assert_eq!(free(b), CUDAMEM_OK);
    let s = stats(0);
    assert_eq!((s.allocations, s.frees, s.live_bytes), (2, 2, 0));
    assert_eq!(cudamem_stats_fields() * 8, size_of::<AllocatorStats>());
    assert_eq!(cudamem_device_stats_size(), size_of::<DeviceStats>());
    assert_eq!(
        cudamem_device_stats_size(),
        9 * 3 * 32 + 2 * 8 + 2 * 32 + 4 * 8
    );
}

#[test]
fn stream_order_holds_through_the_c_calls() {
    let sim = &devices()[1];
    let a = allocate(1, MIB, 0x10);
    let _keep = allocate(1, MIB, 0x20);
    sim.launch(StreamId(0x10));
    assert_eq!(free(a), CUDAMEM_OK);
    assert_eq!(allocate(1, MIB, 0x10), a, "same stream: at once");
    // SAFETY: the simulated backend only compares stream handles.
    assert_eq!(
        unsafe { cudamem_record_stream(a as *mut c_void, 0x30 as *mut c_void) },
        CUDAMEM_OK
    );
    sim.launch(StreamId(0x30));
    assert_eq!(free(a), CUDAMEM_OK);
    assert_ne!(
        allocate(1, MIB, 0x20),
        a,
        "not before both streams are done"
    );
    sim.complete(StreamId(0x10));
    sim.complete(StreamId(0x30));
    let later: Vec<u64> = (0..3).map(|_| allocate(1, MIB, 0x20)).collect();
    assert!(later.contains(&a), "{a:#x} {later:x?}");
}

#[test]
fn out_of_memory_fails_at_once_with_the_ledger_and_recovers() {
    let held: Vec<u64> = (0..3).map(|_| allocate(2, 64 * MIB, 0)).collect();
    let start = std::time::Instant::now();
    let (code, _) = allocate_with(2, request(1 << 40, 0));
    assert_eq!(code, CUDAMEM_OUT_OF_MEMORY);
    let message = last_error();
    let first = message.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("CUDA out of memory. Tried to allocate 1024.00 GiB. GPU 2 has a total capacity of 256.00 MiB of which "),
        "PyTorch's first line, which tools match on: {message}"
    );
    assert!(
        first.contains("Of the allocated memory 192.00 MiB is allocated by PyTorch, and "),
        "{first}"
    );
    assert!(message.contains("cudamem pool (physical)"), "{message}");
    let (code, _) = allocate_with(2, request(128 * MIB, 0));
    assert_eq!(code, CUDAMEM_OUT_OF_MEMORY, "past what is left");
    assert!(
        start.elapsed().as_secs() < 5,
        "no waiting: {:?}",
        start.elapsed()
    );
    assert_eq!(device_stats(2).num_ooms, 2);
    assert_eq!(free(held[0]), CUDAMEM_OK);
    assert_eq!(free(held[1]), CUDAMEM_OK);
    let again = allocate(2, 128 * MIB, 0);
    assert!(again != 0, "the same request fits after the frees");
}

#[test]
fn bad_arguments_are_refused_without_harm() {
    devices();
    let mut out = CudamemOutcome::default();
    // SAFETY: a null request is checked, not read.
    assert_eq!(
        unsafe { cudamem_allocate(3, std::ptr::null(), &mut out) },
        CUDAMEM_ERROR
    );
    assert!(last_error().contains("null pointer"), "{}", last_error());
    let r = request(16, 0);
    // SAFETY: a null out is checked, not written.
    assert_eq!(
        unsafe { cudamem_allocate(3, &r, std::ptr::null_mut()) },
        CUDAMEM_ERROR
    );
    assert_eq!(allocate_with(64, r).0, CUDAMEM_ERROR, "device out of range");
    assert!(last_error().contains("out of range"));
    assert_eq!(allocate_with(-1, r).0, CUDAMEM_ERROR);
    let a = allocate(3, 4096, 0);
    assert_eq!(free(0), CUDAMEM_ERROR);
    assert_eq!(free(a), CUDAMEM_OK);
    assert_eq!(free(a), CUDAMEM_ERROR, "double free");
    assert!(
        last_error().contains("not a live allocation"),
        "{}",
        last_error()
    );
    assert_eq!(free(0xdead_0000), CUDAMEM_ERROR, "never ours");
    let s = stats(3);
    assert_eq!((s.frees, s.live_bytes), (1, 0));
    // SAFETY: a null `out` is checked, not written.
    assert_eq!(
        unsafe { cudamem_stats(3, std::ptr::null_mut()) },
        CUDAMEM_ERROR
    );
    let mut out = AllocatorStats::default();
    // SAFETY: `out` is writable; the device is out of range.
    assert_eq!(unsafe { cudamem_stats(99, &mut out) }, CUDAMEM_ERROR);
    // SAFETY: the out-pointer is checked.
    assert_eq!(
        unsafe { cudamem_largest_block(3, std::ptr::null_mut()) },
        CUDAMEM_ERROR
    );
    let mut largest = 0;
    // SAFETY: `largest` is writable.
    assert_eq!(
        unsafe { cudamem_largest_block(3, &mut largest) },
        CUDAMEM_OK
    );
    assert!(largest > 200 * MIB);
}

extern "C" fn collect(user: *mut c_void, allocated: c_int, ptr: u64) {
    // SAFETY: `user` is the `Vec` the test passed, alive for the call.
    let seen = unsafe { &mut *user.cast::<Vec<(c_int, u64)>>() };
    seen.push((allocated, ptr));
}

#[test]
fn graph_pools_work_through_the_c_calls() {
    devices();
    let (first, second) = (5, 0);
    assert_eq!(cudamem_begin_allocate_to_pool(4, first, second), CUDAMEM_OK);
    let in_pool = |size| CudamemRequest {
        pool_first: first,
        pool_second: second,
        capturing: 1,
        ..request(size, 0x77)
    };
    let a = allocate_with(4, in_pool(MIB)).1.ptr;
    let b = allocate_with(4, in_pool(4096)).1.ptr;
    assert_eq!(cudamem_end_allocate_to_pool(4, first, second), CUDAMEM_OK);
    let mut matches = -1;
    // SAFETY: `ptrs` holds 2 values; `matches` is writable.
    let code =
        unsafe { cudamem_check_pool_live(4, first, second, [b, a].as_ptr(), 2, &mut matches) };
    assert_eq!((code, matches), (CUDAMEM_OK, 1));
    let mut checkpoint = 0;
    // SAFETY: `checkpoint` is writable.
    assert_eq!(
        unsafe { cudamem_checkpoint_pool(4, first, second, &mut checkpoint) },
        CUDAMEM_OK
    );
    assert_eq!(free(a), CUDAMEM_OK);
    // SAFETY: as above, one value.
    unsafe { cudamem_check_pool_live(4, first, second, [b].as_ptr(), 1, &mut matches) };
    assert_eq!(matches, 1);
    let mut seen: Vec<(c_int, u64)> = Vec::new();
    // SAFETY: `collect` reads `user` as the live `Vec`.
    let code =
        unsafe { cudamem_restore_checkpoint(4, checkpoint, Some(collect), (&raw mut seen).cast()) };
    assert_eq!(code, CUDAMEM_OK, "{}", last_error());
    let freed: BTreeSet<u64> = seen
        .iter()
        .filter(|(k, _)| *k == 0)
        .map(|(_, p)| *p)
        .collect();
    let back: BTreeSet<u64> = seen
        .iter()
        .filter(|(k, _)| *k == 1)
        .map(|(_, p)| *p)
        .collect();
    assert_eq!(freed, BTreeSet::from([b]));
    assert_eq!(back, BTreeSet::from([a, b]));
    assert_eq!(free(a), CUDAMEM_OK);
    assert_eq!(free(b), CUDAMEM_OK);
    assert_eq!(cudamem_release_pool(4, first, second), CUDAMEM_OK);
    assert_eq!(cudamem_release_pool(4, first, second), CUDAMEM_ERROR);
    assert!(last_error().contains("released"), "{}", last_error());
    let mut given_back = 0;
    // SAFETY: `given_back` is writable.
    assert_eq!(
        unsafe { cudamem_empty_cache(4, &mut given_back) },
        CUDAMEM_OK
    );
    assert_eq!(stats(4).private_pool_bytes, 0);
}

#[derive(Default)]
struct Seen {
    segments: Vec<CudamemSegment>,
    blocks: Vec<CudamemBlockInfo>,
    trace: Vec<CudamemTraceEntry>,
}

extern "C" fn on_segment(user: *mut c_void, s: *const CudamemSegment) {
    // SAFETY: `user` is the test's live `Seen`; `s` is valid for the call.
    unsafe { (*user.cast::<Seen>()).segments.push(*s) };
}
extern "C" fn on_block(user: *mut c_void, b: *const CudamemBlockInfo) {
    // SAFETY: as above.
    unsafe { (*user.cast::<Seen>()).blocks.push(*b) };
}
extern "C" fn on_trace(user: *mut c_void, t: *const CudamemTraceEntry) {
    // SAFETY: as above.
    unsafe { (*user.cast::<Seen>()).trace.push(*t) };
}

#[test]
fn history_and_snapshots_go_through_the_sink() {
    devices();
    assert_eq!(cudamem_record_history(5, 1, 3, 100, 0, 0), CUDAMEM_OK);
    assert_eq!(
        cudamem_record_history(5, 1, 9, 100, 0, 0),
        CUDAMEM_ERROR,
        "no such level"
    );
    let a = allocate_with(
        5,
        CudamemRequest {
            context: 41,
            ..request(4096, 0)
        },
    )
    .1
    .ptr;
    let b = allocate(5, 3 * MIB, 0);
    let mut seen = Seen::default();
    let sink = CudamemSnapshotSink {
        user: (&raw mut seen).cast(),
        segment: Some(on_segment),
        block: Some(on_block),
        trace: Some(on_trace),
    };
    // SAFETY: the sink's functions read `user` as the live `Seen`.
    assert_eq!(unsafe { cudamem_snapshot(5, 0, 0, 1, &sink) }, CUDAMEM_OK);
    let listed: u64 = seen.segments.iter().map(|s| s.blocks).sum();
    assert_eq!(listed as usize, seen.blocks.len());
    let total: u64 = seen.segments.iter().map(|s| s.total_size).sum();
    assert_eq!(total, stats(5).mapped_bytes);
    let live: Vec<&CudamemBlockInfo> = seen.blocks.iter().filter(|b| b.state == 1).collect();
    assert_eq!(live.len(), 2);
    assert!(live.iter().any(|blk| blk.address == a && blk.context == 41));
    assert!(seen.trace.iter().any(|t| t.action == 0 && t.addr == b));
    assert_eq!(free(a), CUDAMEM_OK);
    let mut dead = [0u64; 8];
    // SAFETY: `dead` holds 8 writable values.
    let n = unsafe { cudamem_take_dead_contexts(dead.as_mut_ptr(), dead.len()) };
    assert_eq!(n, 0, "the trace still names 41");
    assert_eq!(cudamem_record_history(5, 0, 0, 1, 1, 0), CUDAMEM_OK);
    // SAFETY: as above.
    let n = unsafe { cudamem_take_dead_contexts(dead.as_mut_ptr(), dead.len()) };
    assert_eq!(&dead[..n], &[41]);
    assert_eq!(free(b), CUDAMEM_OK);
    assert_eq!(cudamem_reset_peak_stats(5), CUDAMEM_OK);
    let s = device_stats(5);
    assert_eq!(s.allocated_bytes.aggregate.peak, 0);
}

#[test]
fn explain_fills_a_buffer_like_snprintf() {
    let _a = allocate(6, 3 * MIB, 0);
    // SAFETY: a null buffer is only measured.
    let n = unsafe { cudamem_explain(6, std::ptr::null_mut(), 0) };
    assert!(n > 100);
    let mut small = [0x55u8; 16];
    // SAFETY: `small` holds 16 writable bytes.
    let m = unsafe { cudamem_explain(6, small.as_mut_ptr().cast::<c_char>(), small.len()) };
    assert_eq!(m, n);
    assert_eq!(small[15], 0, "cut and terminated");
    let mut buf = vec![0u8; n as usize + 1];
    // SAFETY: `buf` holds `n + 1` writable bytes.
    unsafe { cudamem_explain(6, buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    let text = String::from_utf8_lossy(&buf[..n as usize]);
    assert!(text.starts_with("cudamem: device 6"), "{text}");
    // SAFETY: the device is out of range; the buffer is not touched.
    assert_eq!(
        unsafe { cudamem_explain(99, buf.as_mut_ptr().cast::<c_char>(), buf.len()) },
        -1
    );
}

#[test]
fn eight_threads_share_a_device_through_the_c_calls() {
    devices();
    let taken: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let threads: Vec<_> = (0..8usize)
        .map(|t| {
            let taken = taken.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..2_000u64 {
                    if i % 3 == 2 {
                        if let Some(ptr) = mine.pop() {
                            taken.lock().unwrap().remove(&ptr);
                            assert_eq!(free(ptr), CUDAMEM_OK);
                        }
                    } else {
                        let ptr = allocate(7, 512 + (i * 4096 + t as u64) % (64 << 10), t % 2);
                        assert!(taken.lock().unwrap().insert(ptr), "handed out twice");
                        mine.push(ptr);
                    }
                }
                for ptr in mine {
                    taken.lock().unwrap().remove(&ptr);
                    assert_eq!(free(ptr), CUDAMEM_OK);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let s = stats(7);
    assert_eq!((s.live_bytes, s.errors, s.ooms), (0, 0, 0));
    assert_eq!(s.allocations, s.frees);
    // SAFETY: a null out is allowed.
    assert_eq!(
        unsafe { cudamem_empty_cache(-1, std::ptr::null_mut()) },
        CUDAMEM_OK
    );
}

#[test]
fn a_device_argument_for_every_device_is_minus_one_only() {
    devices();
    let mut given_back = 0;
    // SAFETY: `given_back` is writable.
    assert_eq!(
        unsafe { cudamem_empty_cache(-5, &mut given_back) },
        CUDAMEM_ERROR
    );
    assert!(last_error().contains("device -5"), "{}", last_error());
    // SAFETY: as above.
    assert_eq!(
        unsafe { cudamem_empty_cache(-1, &mut given_back) },
        CUDAMEM_OK
    );
    assert_eq!(cudamem_record_history(-7, 0, 0, 0, 0, 0), CUDAMEM_ERROR);
}

#[test]
fn dropping_an_unknown_checkpoint_is_an_error() {
    devices();
    let (first, second) = (9, 1);
    assert_eq!(cudamem_incref_pool(6, first, second), CUDAMEM_OK);
    let mut checkpoint = 0;
    // SAFETY: `checkpoint` is writable.
    assert_eq!(
        unsafe { cudamem_checkpoint_pool(6, first, second, &mut checkpoint) },
        CUDAMEM_OK
    );
    assert_eq!(cudamem_drop_checkpoint(6, checkpoint), CUDAMEM_OK);
    assert_eq!(
        cudamem_drop_checkpoint(6, checkpoint),
        CUDAMEM_ERROR,
        "twice"
    );
    assert!(last_error().contains("no checkpoint"), "{}", last_error());
    assert_eq!(cudamem_drop_checkpoint(6, 12345), CUDAMEM_ERROR);
    assert_eq!(cudamem_release_pool(6, first, second), CUDAMEM_OK);
}

/// A `MemPool(use_on_oom=True)`: when the device's own pool finds no memory, the
/// request is placed in the pool's free space instead of failing.
#[test]
fn a_pool_used_on_out_of_memory_serves_what_the_device_cannot() {
    devices();
    let (first, second) = (0, 21);
    assert_eq!(
        cudamem_set_use_on_oom(10, first, second, 1),
        CUDAMEM_ERROR,
        "no such pool yet"
    );
    assert_eq!(cudamem_incref_pool(10, first, second), CUDAMEM_OK);
    // 64 MiB of pool memory on stream 0, freed again: the pool keeps its segment.
    assert_eq!(
        cudamem_begin_allocate_to_pool(10, first, second),
        CUDAMEM_OK
    );
    let in_pool = CudamemRequest {
        pool_first: first,
        pool_second: second,
        ..request(64 * MIB, 0)
    };
    let pooled = allocate_with(10, in_pool).1.ptr;
    assert_eq!(cudamem_end_allocate_to_pool(10, first, second), CUDAMEM_OK);
    assert_eq!(free(pooled), CUDAMEM_OK);
    // The rest of the device, taken by the device's own pool.
    let mut held = Vec::new();
    loop {
        let (code, out) = allocate_with(10, request(16 * MIB, 0));
        if code != CUDAMEM_OK {
            break;
        }
        held.push(out.ptr);
    }
    let ooms = device_stats(10).num_ooms;
    assert_eq!(cudamem_set_use_on_oom(10, first, second, 1), CUDAMEM_OK);
    // Out of device memory, a request fits in the pool's free segment.
    let (code, out) = allocate_with(10, request(32 * MIB, 0));
    assert_eq!(code, CUDAMEM_OK, "{}", last_error());
    assert!(out.ptr >= pooled && out.ptr < pooled + 64 * MIB);
    assert_eq!(device_stats(10).num_ooms, ooms, "served, not refused");
    assert_eq!(free(out.ptr), CUDAMEM_OK);
    // Off again: the same request is refused.
    assert_eq!(cudamem_set_use_on_oom(10, first, second, 0), CUDAMEM_OK);
    assert_eq!(
        allocate_with(10, request(32 * MIB, 0)).0,
        CUDAMEM_OUT_OF_MEMORY
    );
    for ptr in held {
        assert_eq!(free(ptr), CUDAMEM_OK);
    }
    // The MemPool and the `use_mem_pool` span each hold the pool once, as in PyTorch.
    assert_eq!(cudamem_release_pool(10, first, second), CUDAMEM_OK);
    assert_eq!(cudamem_release_pool(10, first, second), CUDAMEM_OK);
    let mut count = 9;
    // SAFETY: `count` is writable.
    assert_eq!(
        unsafe { cudamem_pool_use_count(10, first, second, &mut count) },
        CUDAMEM_OK
    );
    assert_eq!(count, 0);
}

/// A pool that splits no segment hands each block whole segments of its own.
#[test]
fn a_pool_that_splits_nothing_gives_each_block_its_own_segments() {
    devices();
    let (first, second) = (0, 22);
    assert_eq!(
        cudamem_begin_allocate_to_pool(11, first, second),
        CUDAMEM_OK
    );
    assert_eq!(cudamem_set_no_split(11, first, second), CUDAMEM_OK);
    let in_pool = |size| CudamemRequest {
        pool_first: first,
        pool_second: second,
        ..request(size, 0)
    };
    let (code, a) = allocate_with(11, in_pool(4096));
    assert_eq!(code, CUDAMEM_OK, "{}", last_error());
    let b = allocate_with(11, in_pool(4096)).1;
    assert_eq!((a.bytes, b.bytes), (2 * MIB, 2 * MIB), "whole segments");
    assert!(a.ptr.abs_diff(b.ptr) >= 2 * MIB, "never the same page");
    assert_eq!(cudamem_end_allocate_to_pool(11, first, second), CUDAMEM_OK);
    assert_eq!(free(a.ptr), CUDAMEM_OK);
    assert_eq!(free(b.ptr), CUDAMEM_OK);
    assert_eq!(cudamem_release_pool(11, first, second), CUDAMEM_OK);
}
