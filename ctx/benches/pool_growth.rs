//! A pool that only grows: `N` blocks of 4 MiB allocated with no frees, so
//! every request maps more (2 MiB pages, VMM growth, compaction before
//! growth). Each growth should cost the same whatever the pool holds: the
//! time per block for 40,000 and 400,000 blocks should match, i.e. the
//! whole fill scales linearly.
//!
//! The pool runs on an unbacked [`SimDevice`] (no host memory behind the
//! 1.6 TB it maps). One iteration builds a pool, fills it and drops it.
//!
//! Run: `cargo bench -p ctx --bench pool_growth`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ctx::{Pool, PoolConfig, SimConfig, SimDevice};

/// Block size, bytes: two 2 MiB pages, so each request grows the pool.
const BLOCK: u64 = 4 << 20;
const PAGE: u64 = memcore::PAGE_BYTES;
const COUNTS: [u64; 2] = [40_000, 400_000];

fn fill(count: u64) {
    let reserve = count * BLOCK;
    let device = SimDevice::new(SimConfig {
        capacity_bytes: reserve,
        granularity_bytes: PAGE,
        context_reserved_bytes: 0,
        vmm: true,
        backed: false,
    });
    let pool = Pool::new(device, PoolConfig::vmm(reserve)).expect("a VMM pool");
    let mut guard = pool.lock();
    for _ in 0..count {
        black_box(
            guard
                .allocate(black_box(BLOCK), 256, None)
                .expect("room left"),
        );
    }
    assert_eq!(guard.stats().grows, count);
}

fn pool_growth(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool_growth");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(5));
    for count in COUNTS {
        group.throughput(Throughput::Elements(count));
        group.bench_with_input(BenchmarkId::from_parameter(count), &count, |b, &count| {
            b.iter(|| fill(count));
        });
    }
    group.finish();
}

criterion_group!(benches, pool_growth);
criterion_main!(benches);
