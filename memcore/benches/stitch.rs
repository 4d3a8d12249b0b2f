//! One allocate + free pair on a stitched pool that already holds N live
//! blocks, and one pair of a request far larger than any device.
//!
//! The pool is prefilled by allocating 2N blocks of 256 B..64 KiB and
//! freeing every other one, so N blocks stay live with holes between them
//! and every page they touch stays backed: each measured pair lands on
//! mapped pages and makes no driver call (the warm path a training loop
//! takes). The large pair measures what a request of terabytes costs the
//! model, which must not grow with its size.
//!
//! Run: `cargo bench -p memcore --bench stitch`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use memcore::{Stitch, StitchBlock, StitchConfig};

#[path = "support/sizes.rs"]
mod sizes;

use sizes::XorShift;

/// A pool with `live` blocks live and about as many holes, and the blocks.
fn prefilled(live: usize, rng: &mut XorShift) -> (Stitch, Vec<StitchBlock>) {
    let mut pool = Stitch::new(StitchConfig::default());
    let blocks: Vec<StitchBlock> = (0..2 * live)
        .map(|_| pool.allocate(rng.size()).expect("the arena fits 2N blocks"))
        .collect();
    let mut kept = Vec::with_capacity(live);
    for (index, block) in blocks.into_iter().enumerate() {
        if index % 2 == 0 {
            pool.free(block).expect("live block");
        } else {
            kept.push(block);
        }
    }
    (pool, kept)
}

fn pair(pool: &mut Stitch, size: u64) {
    let block = pool.allocate(black_box(size)).expect("room");
    pool.free(black_box(block)).expect("live block");
}

fn stitch(c: &mut Criterion) {
    let mut group = c.benchmark_group("stitch_pair");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for live in [1_000usize, 65_536] {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let (mut pool, _blocks) = prefilled(live, &mut rng);
        group.bench_with_input(BenchmarkId::new("small", live), &live, |b, _| {
            b.iter(|| {
                let size = rng.size();
                pair(&mut pool, size)
            })
        });
        group.bench_with_input(BenchmarkId::new("1MiB", live), &live, |b, _| {
            b.iter(|| pair(&mut pool, 1 << 20))
        });
    }
    for (name, size) in [("64GiB", 64u64 << 30), ("100TiB", 100u64 << 40)] {
        let mut pool = Stitch::new(StitchConfig::default());
        group.bench_function(BenchmarkId::new("empty", name), |b| {
            b.iter(|| pair(&mut pool, size))
        });
    }
    group.finish();
}

criterion_group!(benches, stitch);
criterion_main!(benches);
