//! One allocate + free pair on a warm stitched pool: the host cost of a
//! request whose pages are already mapped, so it makes no driver call (the
//! model's mapping cache), next to the policy alone (memcore's `Stitch`) and the same pair on the
//! moving [`Pool`].
//!
//! Both run on an unbacked [`SimDevice`] shaped like an H200. Each is warmed
//! with one pair first, which maps the pages the timed pairs reuse; the
//! bench fails if a timed pair made a driver call.
//!
//! Run: `cargo bench -p ctx --bench stitched_pair`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ctx::{Pool, PoolConfig, SimConfig, SimDevice, StitchConfig, StitchedConfig, StitchedPool};
use memcore::Stitch;

/// Request sizes, bytes: those of pool_pair and the GPU suite's section f.
const SIZES: [u64; 2] = [256, 1 << 20];

fn stitched_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("stitched_pair");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for size in SIZES {
        let pool = StitchedPool::new(
            SimDevice::new(SimConfig::h200_like()),
            StitchedConfig::default(),
        )
        .expect("a stitched pool on a simulated H200");
        pool.free(pool.allocate(size).expect("first block"))
            .expect("live block");
        let warm = pool.stats().calls;
        // The policy alone, no lock, no pointer table, no device: what the
        // pool adds is the difference.
        let mut model = Stitch::new(StitchConfig {
            log_ops: true,
            ..StitchConfig::default()
        });
        let first = model.allocate(size).expect("first block");
        model.free(first).expect("live block");
        let _ = model.take_ops();
        group.bench_with_input(BenchmarkId::new("model", size), &size, |b, &size| {
            b.iter(|| {
                let block = model.allocate(black_box(size)).expect("fits");
                model.free(black_box(block)).expect("live block");
                black_box(model.take_ops());
            });
        });
        group.bench_with_input(BenchmarkId::new("stitched", size), &size, |b, &size| {
            b.iter(|| {
                let ptr = pool
                    .allocate(black_box(size))
                    .expect("fits on mapped pages");
                pool.free(black_box(ptr)).expect("live block");
            });
        });
        let calls = pool.stats().calls.since(&warm);
        assert_eq!(
            calls.create.calls + calls.map.calls + calls.unmap.calls + calls.release.calls,
            0,
            "a warm pair made driver calls: {calls:?}"
        );
        let moving = Pool::new(
            SimDevice::new(SimConfig::h200_like()),
            PoolConfig::vmm(64 << 30),
        )
        .expect("a VMM pool on a simulated H200");
        moving
            .free(moving.allocate(size, 512, None).expect("first block"))
            .expect("live block");
        group.bench_with_input(BenchmarkId::new("moving", size), &size, |b, &size| {
            b.iter(|| {
                let handle = moving
                    .allocate(black_box(size), 512, None)
                    .expect("fits without growing");
                moving.free(black_box(handle)).expect("live block");
            });
        });
    }
    group.finish();
}

criterion_group!(benches, stitched_pair);
criterion_main!(benches);
