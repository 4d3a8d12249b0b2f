//! One allocate + free pair on a warm pool: the host cost of a request that
//! fits, which is all a pool call costs on a GPU too (a request that fits
//! makes no driver call).
//!
//! The pool runs on an unbacked [`SimDevice`] shaped like an H200 (2 MiB
//! pages), VMM growth, and has mapped its first pages before timing starts,
//! as section f of the GPU suite does. Each iteration allocates one block
//! and frees it through [`Pool`] (one lock each), which leaves the pool as
//! it was.
//!
//! Run: `cargo bench -p ctx --bench pool_pair`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ctx::{Pool, PoolConfig, SimConfig, SimDevice};

/// Request sizes, bytes: the two of the GPU suite's section f.
const SIZES: [u64; 2] = [256, 1 << 20];
const ALIGN: u64 = 256;
const RESERVE_BYTES: u64 = 64 << 30;

fn pool_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool_pair");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for size in SIZES {
        let pool = Pool::new(
            SimDevice::new(SimConfig::h200_like()),
            PoolConfig::vmm(RESERVE_BYTES),
        )
        .expect("a VMM pool on a simulated H200");
        // Warm: the pool maps its first pages.
        pool.free(pool.allocate(size, ALIGN, None).expect("first block"))
            .expect("live block");
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let handle = pool
                    .allocate(black_box(size), ALIGN, None)
                    .expect("fits without growing");
                pool.free(black_box(handle)).expect("live block");
            });
        });
    }
    group.finish();
}

criterion_group!(benches, pool_pair);
criterion_main!(benches);
