//! Out of memory through the C functions on a simulated device, under each
//! `CUDAMEM_POLICY`: a device exhausted in chunks answers `CUDAMEM_OUT_OF_MEMORY` (what
//! the C++ backend raises as `torch.cuda.OutOfMemoryError`) with the ledger, blocks
//! freed on another stream come back before the refusal, and after the frees the
//! device serves again. The outer test runs the inner one in a child process per
//! policy, since the environment and the registry are process-wide.

use std::ffi::{c_int, c_void};
use std::process::Command;

#[path = "support/c_abi.rs"]
mod c_abi;

use c_abi::last_error;
use ctx::{SimConfig, StreamId};
use cudamem_torch::ffi::{
    CUDAMEM_OK, CUDAMEM_OUT_OF_MEMORY, cudamem_device_stats, cudamem_empty_cache, cudamem_free,
};
use cudamem_torch::{DeviceStats, registry};

const MIB: u64 = 1 << 20;

fn allocate(size: u64, stream: usize) -> (c_int, u64) {
    let (code, out) = c_abi::allocate_with(0, c_abi::request(size, stream));
    (code, out.ptr)
}
const DEVICE_BYTES: u64 = 64 * MIB;
const CHUNK: u64 = 4 * MIB;

fn free(ptr: u64) {
    // SAFETY: a pointer the device handed out; a null out is allowed.
    let code = unsafe { cudamem_free(ptr as *mut c_void, 0, std::ptr::null_mut()) };
    assert_eq!(code, CUDAMEM_OK, "{}", last_error());
}

fn device_stats() -> DeviceStats {
    let mut out = DeviceStats::default();
    // SAFETY: `out` is a live DeviceStats.
    assert_eq!(unsafe { cudamem_device_stats(0, &mut out) }, CUDAMEM_OK);
    out
}

/// Exhausts the device in chunks on stream 1, then: a refusal with the ledger; the
/// frees of a second stream come back for a request before it is refused; after the
/// frees a large block fits. Prints `chunks N`, `retried R`, `ooms O`,
/// `recovered`, or panics saying what went wrong.
#[test]
fn inner_exhaust_refuse_recover() {
    let streams = registry::install_simulated(SimConfig::small(DEVICE_BYTES), 1)
        .expect("first C call")
        .remove(0);
    let (code, _) = allocate(2 * DEVICE_BYTES, 1);
    assert_eq!(
        code,
        CUDAMEM_OUT_OF_MEMORY,
        "twice the device: {}",
        last_error()
    );
    let message = last_error();
    assert!(
        message.starts_with("CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has"),
        "PyTorch's first line: {message}"
    );
    assert!(
        message.contains("cudamem pool (physical)"),
        "the ledger: {message}"
    );

    // Stream 2 holds one chunk it frees at once: with two streams in use it waits for
    // the stream's work, which the retry before a refusal waits for.
    let (code, on_two) = allocate(CHUNK, 2);
    assert_eq!(code, CUDAMEM_OK, "{}", last_error());
    let mut held = Vec::new();
    let refused = loop {
        assert!(
            held.len() as u64 <= DEVICE_BYTES / CHUNK,
            "more chunks than fit"
        );
        match allocate(CHUNK, 1) {
            (CUDAMEM_OK, ptr) => held.push(ptr),
            (code, _) => break code,
        }
        if held.len() == 4 {
            // Work queued on stream 2 before the free: the block waits for it.
            streams.launch(StreamId(2));
            free(on_two);
        }
    };
    assert_eq!(
        refused,
        CUDAMEM_OUT_OF_MEMORY,
        "the exhausted device's refusal is out of memory: {}",
        last_error()
    );
    let message = last_error();
    assert!(
        message.contains("cudamem pool (physical)"),
        "the ledger: {message}"
    );
    println!("chunks {}", held.len());
    let stats = device_stats();
    let mapped = u64::try_from(stats.reserved_bytes.aggregate.current).unwrap_or(u64::MAX);
    println!("free {}", DEVICE_BYTES.saturating_sub(mapped));
    println!("retried {}", stats.num_alloc_retries);
    println!("ooms {}", stats.num_ooms);

    for ptr in held.drain(..) {
        free(ptr);
    }
    let (code, big) = allocate(DEVICE_BYTES / 2, 1);
    assert_eq!(code, CUDAMEM_OK, "after the frees: {}", last_error());
    free(big);
    let mut given_back = 0;
    // SAFETY: `given_back` is a live u64.
    assert_eq!(
        unsafe { cudamem_empty_cache(0, &mut given_back) },
        CUDAMEM_OK
    );
    assert!(given_back > 0, "empty_cache gave nothing back");
    let (code, again) = allocate(DEVICE_BYTES / 2, 1);
    assert_eq!(code, CUDAMEM_OK, "after empty_cache: {}", last_error());
    free(again);
    println!("recovered");
}

fn run(policy: &str) -> String {
    let exe = std::env::current_exe().expect("the test binary");
    let output = Command::new(exe)
        .args(["--exact", "inner_exhaust_refuse_recover", "--nocapture"])
        .env("CUDAMEM_POLICY", policy)
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{policy}: {stdout}\n{stderr}");
    stdout
}

fn figure(out: &str, label: &str) -> u64 {
    out.lines()
        .find_map(|line| line.strip_prefix(label)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{label}` line in {out}"))
}

fn check(policy: &str) -> String {
    let out = run(policy);
    let chunks = figure(&out, "chunks");
    let fit = DEVICE_BYTES / CHUNK;
    // The freed chunk of stream 2 was used again: the device was filled to its end
    // but for what the pool's growth rounding leaves.
    assert!(
        chunks + 2 >= fit,
        "{policy}: only {chunks} of {fit} chunks: {out}"
    );
    assert_eq!(figure(&out, "ooms"), 2, "{policy}: {out}");
    assert!(
        figure(&out, "retried") >= 1,
        "{policy}: no retry before the refusal: {out}"
    );
    assert!(out.contains("recovered"), "{policy}: {out}");
    out
}

#[test]
fn tlsf_refuses_as_out_of_memory_and_recovers() {
    check("tlsf");
}

#[test]
fn stitch_refuses_as_out_of_memory_and_recovers() {
    let out = check("stitch");
    // Exhausted, the stitched pool still leaves the context its headroom.
    let headroom = DEVICE_BYTES / cudamem_torch::backing::STITCHED_HEADROOM_DIVISOR;
    assert!(figure(&out, "free") >= headroom, "stitch: {out}");
}
