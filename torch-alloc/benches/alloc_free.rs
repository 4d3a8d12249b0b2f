//! The host cost of PyTorch's requests on a warm allocator, per operation (an
//! allocation or a free), for both policies: a ring of live blocks of a conv net's
//! sizes where each step frees the oldest block and allocates the next, on one stream
//! (as a training loop runs) and on two (frees then wait for their stream, in stream
//! order); `pair/<policy>/<bytes>` is one allocation and its free again and again
//! (no driver call: the bench fails if one was made).
//!
//! `allocator/<policy>/<streams>` calls the Rust API (`DeviceAllocator`) on each
//! backing; `c_abi/<policy>/<streams>` goes through the C functions the C++ backend
//! calls, with the policy the C functions read from `CUDAMEM_POLICY` (default tlsf),
//! so run it once per policy. Everything runs on an unbacked simulated device of 2 MiB
//! pages; the ring is warmed first, so the timed steps reuse mapped memory where the
//! policy lets them (each `allocator` line is followed by the memory driver calls its
//! timed steps made: the stitching policy recycles idle handles past its budget).
//!
//! Run: `cargo bench -p cudamem-torch --bench alloc_free` and
//! `CUDAMEM_POLICY=stitch cargo bench -p cudamem-torch --bench alloc_free -- c_abi`.

use std::ffi::c_void;
use std::hint::black_box;
use std::time::Duration;

#[path = "../tests/support/c_abi.rs"]
mod c_abi;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ctx::{SimConfig, SimDevice, StreamId};
use cudamem_torch::ffi::{CUDAMEM_OK, CudamemOutcome, cudamem_free};
use cudamem_torch::{Backing, DeviceAllocator, Request, Settings, SimStreams, backing, registry};

/// Request sizes, bytes, in the order the ring asks for them: activations,
/// workspaces and small tensors of a ResNet-style step.
const SIZES: [u64; 12] = [
    512,
    25 << 20,
    4096,
    6 << 20,
    1 << 20,
    98 << 20,
    8192,
    3 << 20,
    200_704,
    12 << 20,
    2048,
    49 << 20,
];
/// Live blocks in the ring.
const RING: usize = 48;

fn device() -> SimConfig {
    SimConfig {
        capacity_bytes: 64 << 30,
        granularity_bytes: memcore::PAGE_BYTES,
        context_reserved_bytes: 0,
        vmm: true,
        backed: false,
    }
}

/// The ring's state: live pointers and the next size.
struct Ring {
    live: std::collections::VecDeque<u64>,
    next: usize,
    step: u64,
}

impl Ring {
    fn new() -> Self {
        Self {
            live: std::collections::VecDeque::with_capacity(RING + 1),
            next: 0,
            step: 0,
        }
    }

    /// The size of the next request and its stream (of `streams`).
    fn request(&mut self, streams: u64) -> (u64, u64) {
        let size = SIZES[self.next % SIZES.len()];
        self.next += 1;
        self.step += 1;
        (size, 1 + self.step % streams)
    }
}

fn on_allocator<B: Backing>(c: &mut Criterion, name: &str, pool: B, streams: u64) {
    let events = SimStreams::default();
    let alloc = DeviceAllocator::new(0, pool, events.clone()).expect("an allocator");
    let mut ring = Ring::new();
    let step = |ring: &mut Ring| {
        let (size, stream) = ring.request(streams);
        let out = alloc
            .allocate(Request::new(black_box(size), StreamId(stream)))
            .expect("fits");
        ring.live.push_back(out.ptr);
        if ring.live.len() > RING {
            let oldest = ring.live.pop_front().expect("a live block");
            alloc.free(black_box(oldest), 0).expect("live");
        }
        // The streams run: freed blocks come back at the next request.
        events.complete(StreamId(stream));
    };
    for _ in 0..(RING * 8) {
        step(&mut ring);
    }
    let mut group = c.benchmark_group("allocator");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(2));
    let calls = alloc.backing().memory_driver_calls();
    let steps = ring.step;
    group.bench_function(BenchmarkId::new(name, streams), |b| {
        b.iter(|| step(&mut ring))
    });
    group.finish();
    // The policies differ in when they map: say how often the timed steps did.
    eprintln!(
        "allocator/{name}/{streams}: {} memory driver calls in {} steps",
        alloc.backing().memory_driver_calls() - calls,
        ring.step - steps
    );
}

fn allocator(c: &mut Criterion) {
    let settings = Settings::default();
    for streams in [1, 2] {
        let tlsf = backing::tlsf_pool(SimDevice::new(device()), &settings).expect("a TLSF pool");
        on_allocator(c, "tlsf", tlsf, streams);
        let stitch =
            backing::stitched_pool(SimDevice::new(device()), &settings).expect("a stitched pool");
        on_allocator(c, "stitch", stitch, streams);
    }
}

/// One allocation and its free, again and again, on a warm allocator: the host cost
/// with no driver call (a training loop's repeating request), both policies.
fn pair(c: &mut Criterion) {
    let settings = Settings::default();
    let mut group = c.benchmark_group("pair");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(2));
    for size in [512, 1 << 20, 25 << 20] {
        let tlsf = backing::tlsf_pool(SimDevice::new(device()), &settings).expect("a TLSF pool");
        pair_on(&mut group, "tlsf", tlsf, size);
        let stitch =
            backing::stitched_pool(SimDevice::new(device()), &settings).expect("a stitched pool");
        pair_on(&mut group, "stitch", stitch, size);
    }
    group.finish();
}

fn pair_on<B: Backing>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    pool: B,
    size: u64,
) {
    let alloc = DeviceAllocator::new(0, pool, SimStreams::default()).expect("an allocator");
    let step = || {
        let out = alloc
            .allocate(Request::new(black_box(size), StreamId(1)))
            .expect("fits");
        alloc.free(black_box(out.ptr), 0).expect("live");
    };
    step();
    let calls = alloc.backing().memory_driver_calls();
    group.bench_function(BenchmarkId::new(name, size), |b| b.iter(step));
    assert_eq!(
        alloc.backing().memory_driver_calls(),
        calls,
        "a warm pair made driver calls"
    );
}

fn c_allocate(size: u64, stream: u64) -> u64 {
    let (code, out) = c_abi::allocate_with(0, c_abi::request(size, stream as usize));
    assert_eq!(code, CUDAMEM_OK, "the simulated device has room");
    out.ptr
}

fn c_free(ptr: u64) {
    let mut out = CudamemOutcome::default();
    // SAFETY: `out` is live; the pointer is one the device handed out.
    let code = unsafe { cudamem_free(ptr as *mut c_void, 0, &mut out) };
    assert_eq!(code, CUDAMEM_OK, "a live block");
}

fn c_abi(c: &mut Criterion) {
    let policy = std::env::var("CUDAMEM_POLICY").unwrap_or_else(|_| "tlsf".to_owned());
    let events = registry::install_simulated(device(), 2)
        .expect("the first C call of the process")
        .remove(0);
    let mut group = c.benchmark_group("c_abi");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(2));
    // One stream first: a second stream, once seen, stays.
    for streams in [1, 2] {
        let mut ring = Ring::new();
        let step = |ring: &mut Ring| {
            let (size, stream) = ring.request(streams);
            ring.live.push_back(c_allocate(black_box(size), stream));
            if ring.live.len() > RING {
                c_free(black_box(ring.live.pop_front().expect("a live block")));
            }
            events.complete(StreamId(stream));
        };
        for _ in 0..(RING * 8) {
            step(&mut ring);
        }
        group.bench_function(BenchmarkId::new(&policy, streams), |b| {
            b.iter(|| step(&mut ring))
        });
        for ptr in ring.live.drain(..) {
            c_free(ptr);
        }
    }
    group.finish();
}

criterion_group!(benches, allocator, pair, c_abi);
criterion_main!(benches);
