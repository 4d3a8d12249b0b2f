//! One allocate + free pair on a heap that already holds N live blocks.
//!
//! The heap is prefilled by allocating 2N blocks of random size and
//! freeing every other one, so N blocks stay live with about N free holes
//! between them: the free lists are long and varied, as in a pool that has
//! run for a while. Each iteration then allocates a random size in the same
//! range and frees it, which puts the heap back as it was.
//!
//! Sizes are 256 B..64 KiB in steps of 256 B: [`FreeList`] does not round,
//! and odd sizes would leave a sub-256-byte sliver before every aligned
//! block for first fit to wade through, making its prefill quadratic.
//!
//! Run: `cargo bench -p memcore --bench alloc_free`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use memcore::{Allocation, Allocator, Fit, FreeList, Tlsf};

#[path = "support/sizes.rs"]
mod sizes;

use sizes::{MAX_SIZE, XorShift};

const ALIGN: u64 = 256;

/// A heap of `allocator` with `live` blocks live and about as many holes.
fn prefilled<A: Allocator>(mut allocator: A, live: usize, rng: &mut XorShift) -> A {
    let region = 2 * live as u64 * MAX_SIZE + MAX_SIZE;
    allocator.add_region(0, region).expect("fresh region");
    let blocks: Vec<Allocation> = (0..2 * live)
        .map(|_| {
            allocator
                .allocate(rng.size(), ALIGN)
                .expect("region fits 2N blocks")
        })
        .collect();
    for block in blocks.into_iter().step_by(2) {
        allocator.free(block).expect("live block");
    }
    allocator
}

fn pair<A: Allocator>(allocator: &mut A, rng: &mut XorShift) {
    let a = allocator
        .allocate(black_box(rng.size()), ALIGN)
        .expect("room");
    allocator.free(black_box(a)).expect("live block");
}

fn alloc_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for live in [1_000usize, 65_536, 1_048_576] {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut tlsf = prefilled(Tlsf::with_capacity(4 * live), live, &mut rng);
        group.bench_with_input(BenchmarkId::new("tlsf", live), &live, |b, _| {
            b.iter(|| pair(&mut tlsf, &mut rng))
        });
        drop(tlsf);
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut first_fit = prefilled(FreeList::new(Fit::First), live, &mut rng);
        group.bench_with_input(BenchmarkId::new("first_fit", live), &live, |b, _| {
            b.iter(|| pair(&mut first_fit, &mut rng))
        });
    }
    group.finish();
}

criterion_group!(benches, alloc_free);
criterion_main!(benches);
