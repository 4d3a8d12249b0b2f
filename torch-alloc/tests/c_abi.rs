//! The C functions on simulated devices, called as PyTorch calls them. All tests of
//! this binary share one process-wide registry, so each uses its own device number.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use ctx::{SimConfig, StreamId};
use cudamem_torch::ffi::{
    cudamem_empty_cache, cudamem_explain, cudamem_free, cudamem_malloc, cudamem_stats,
    cudamem_stats_fields,
};
use cudamem_torch::{AllocatorStats, SimStreams, registry};

const MIB: isize = 1 << 20;

/// Simulated devices of 64 MiB each, installed before any C call.
fn devices() -> &'static [SimStreams] {
    static STREAMS: OnceLock<Vec<SimStreams>> = OnceLock::new();
    STREAMS.get_or_init(|| {
        registry::install_simulated(SimConfig::small(64 << 20), 8)
            .expect("the first call of the process installs the simulated devices")
    })
}

fn stream(id: usize) -> *mut c_void {
    id as *mut c_void
}

fn malloc(size: isize, device: i32, s: usize) -> *mut c_void {
    devices();
    // SAFETY: the simulated backend only compares stream handles.
    unsafe { cudamem_malloc(size, device, stream(s)) }
}

fn free(ptr: *mut c_void, size: isize, device: i32, s: usize) {
    devices();
    // SAFETY: as in `malloc`.
    unsafe { cudamem_free(ptr, size, device, stream(s)) }
}

fn stats(device: i32) -> AllocatorStats {
    let mut out = AllocatorStats::default();
    // SAFETY: `out` is a live, writable AllocatorStats.
    assert_eq!(unsafe { cudamem_stats(device, &mut out) }, 0);
    out
}

#[test]
fn malloc_and_free_round_trip() {
    let a = malloc(1000, 0, 0);
    let b = malloc(1000, 0, 0);
    assert!(!a.is_null() && !b.is_null() && a != b);
    assert_eq!(stats(0).live_bytes, 2048);
    free(a, 1000, 0, 0);
    free(b, 1000, 0, 0);
    let s = stats(0);
    assert_eq!((s.allocations, s.frees, s.live_bytes), (2, 2, 0));
    assert_eq!(cudamem_stats_fields() * 8, size_of::<AllocatorStats>());
}

#[test]
fn stream_order_holds_through_the_c_calls() {
    let sim = &devices()[1];
    let a = malloc(MIB, 1, 0x10);
    let _keep = malloc(MIB, 1, 0x20);
    sim.launch(StreamId(0x10));
    free(a, MIB, 1, 0x10);
    assert_eq!(malloc(MIB, 1, 0x10), a, "same stream: at once");
    free(a, MIB, 1, 0x10);
    assert_ne!(
        malloc(MIB, 1, 0x20),
        a,
        "other stream: not before the event"
    );
    sim.complete(StreamId(0x10));
    assert_eq!(malloc(MIB, 1, 0x20), a, "other stream: after the event");
}

#[test]
fn out_of_memory_returns_null_and_explains_once() {
    let a = malloc(60 * MIB, 2, 0);
    assert!(!a.is_null());
    assert!(malloc(8 * MIB, 2, 0).is_null());
    assert!(malloc(8 * MIB, 2, 0).is_null());
    assert_eq!(registry::oom_messages(2), 1, "the ledger is printed once");
    assert_eq!(stats(2).ooms, 2);
    free(a, 60 * MIB, 2, 0);
    assert!(
        !malloc(8 * MIB, 2, 0).is_null(),
        "room again after the free"
    );
}

#[test]
fn bad_arguments_are_refused_without_harm() {
    assert!(malloc(-1, 3, 0).is_null());
    assert!(malloc(16, 64, 0).is_null(), "device out of range");
    assert!(malloc(16, -1, 0).is_null());
    let a = malloc(4096, 3, 0);
    free(std::ptr::null_mut(), 4096, 3, 0);
    free(a, -4096, 3, 0);
    free(a, 4096, 3, 0);
    free(a, 4096, 3, 0); // double free
    free(0xdead_0000 as *mut c_void, 16, 3, 0); // never ours
    let s = stats(3);
    assert_eq!((s.frees, s.live_bytes), (1, 0));
    assert_eq!(
        s.errors, 3,
        "null, double and foreign frees; the negative size is refused before"
    );
    // SAFETY: a null `out` is checked, not written.
    assert_eq!(unsafe { cudamem_stats(3, std::ptr::null_mut()) }, -1);
    let mut out = AllocatorStats::default();
    // SAFETY: `out` is writable; the device is out of range.
    assert_eq!(unsafe { cudamem_stats(99, &mut out) }, -1);
}

#[test]
fn explain_fills_a_buffer_like_snprintf() {
    let _a = malloc(3 * MIB, 4, 0);
    // SAFETY: a null buffer asks for the length only.
    let len = unsafe { cudamem_explain(4, std::ptr::null_mut(), 0) };
    assert!(len > 100, "{len}");
    let mut small = [0x55 as c_char; 16];
    // SAFETY: `small` holds 16 writable bytes.
    assert_eq!(unsafe { cudamem_explain(4, small.as_mut_ptr(), 16) }, len);
    assert_eq!(small[15], 0, "NUL-terminated within the buffer");
    let mut buf = vec![0 as c_char; len as usize + 1];
    // SAFETY: `buf` holds `len + 1` writable bytes.
    assert_eq!(
        unsafe { cudamem_explain(4, buf.as_mut_ptr(), buf.len()) },
        len
    );
    let text: String = buf[..len as usize]
        .iter()
        .map(|c| *c as u8 as char)
        .collect();
    assert!(text.starts_with("cudamem: device 4"), "{text}");
    assert!(text.contains("cudamem pool (physical)"), "{text}");
    // SAFETY: null buffer; the device is out of range.
    assert_eq!(unsafe { cudamem_explain(-3, std::ptr::null_mut(), 0) }, -1);
}

#[test]
fn eight_threads_through_the_c_calls() {
    devices();
    let threads: Vec<_> = (0..8usize)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (t as u64 + 1);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut mine: Vec<(*mut c_void, isize)> = Vec::new();
                for _ in 0..10_000 {
                    if mine.is_empty() || next() % 2 == 0 {
                        let size = 1 + (next() % 8192) as isize;
                        let ptr = malloc(size, 5, t % 2);
                        assert!(!ptr.is_null());
                        mine.push((ptr, size));
                    } else {
                        let i = (next() % mine.len() as u64) as usize;
                        let (ptr, size) = mine.swap_remove(i);
                        free(ptr, size, 5, t % 2);
                    }
                }
                for (ptr, size) in mine {
                    free(ptr, size, 5, t % 2);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let s = stats(5);
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.allocations, s.frees);
    assert_eq!((s.errors, s.ooms), (0, 0));
    cudamem_empty_cache();
    assert_eq!(stats(5).pending_bytes, 0);
}
