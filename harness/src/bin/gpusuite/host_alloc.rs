//! (f) What an allocation costs the host: the pool's allocate+free pair
//! against cuMemAlloc/cuMemFree and cuMemAllocAsync/cuMemFreeAsync on a warm
//! pool, VMM growth against cuMemAlloc of the same size, and filling a fresh
//! pool block by block with and without a growth step.
//!
//! Growth is timed on one pool (the first growth of a fresh reservation,
//! then several warm ones, alternating with as many cuMemAllocs) and split
//! into the driver calls the pool made (`PoolStats::calls`): one cuMemCreate, cuMemMap and
//! cuMemSetAccess per growth, the reservation once when the pool is made.

use std::time::{Duration, Instant};

use anyhow::Result;
use ctx::DriverCalls;
use ctx::Handle;
use ctx::{CudaContext, CudaDevice, Stream};
use ctx::{Pool, PoolConfig};

use crate::gpu::Gpu;
use crate::report::Checks;

const RESERVE_BYTES: u64 = 64 << 30;
/// (request bytes, pool pairs, driver pairs)
const SIZES: [(u64, u32, u32); 2] = [(256, 200_000, 2_000), (1 << 20, 100_000, 1_000)];
const ASYNC_PAIRS: u32 = 20_000;
const GROWTH_BYTES: [u64; 2] = [64 << 20, 1 << 30];
/// Growths and cuMemAllocs timed after the first of each.
const GROWTH_ROUNDS: usize = 7;

fn micros_per(seconds: f64, n: u32) -> f64 {
    seconds * 1e6 / f64::from(n)
}

pub fn run(out: &mut Checks) -> Result<()> {
    let gpu = Gpu::open()?;
    let context = &gpu.context;
    let pool = Pool::new(CudaDevice::new(context)?, PoolConfig::vmm(RESERVE_BYTES))?;
    let stream = Stream::new(context)?;
    context.keep_default_pool_warm()?;

    for (size, pool_pairs, driver_pairs) in SIZES {
        // Warm: the pool maps its first pages, the driver pool its first block.
        pool.free(pool.allocate(size, 256, None)?)?;
        let start = Instant::now();
        for _ in 0..pool_pairs {
            let handle = pool.allocate(size, 256, None)?;
            pool.free(handle)?;
        }
        let pool_us = micros_per(start.elapsed().as_secs_f64(), pool_pairs);

        let start = Instant::now();
        for _ in 0..driver_pairs {
            let address = context.mem_alloc(size)?;
            context.mem_free(address)?;
        }
        let driver_us = micros_per(start.elapsed().as_secs_f64(), driver_pairs);

        let warm = context.mem_alloc_async(size, &stream)?;
        context.mem_free_async(warm, &stream)?;
        stream.synchronize()?;
        let start = Instant::now();
        for _ in 0..ASYNC_PAIRS {
            let address = context.mem_alloc_async(size, &stream)?;
            context.mem_free_async(address, &stream)?;
        }
        stream.synchronize()?;
        let async_us = micros_per(start.elapsed().as_secs_f64(), ASYNC_PAIRS);

        out.check(
            &format!("allocate+free pair, {size} B"),
            true,
            format!(
                "pool {pool_us:.3} us; cuMemAlloc+cuMemFree {driver_us:.2} us ({:.0}x); \
                 cuMemAllocAsync+cuMemFreeAsync {async_us:.2} us ({:.0}x)",
                driver_us / pool_us,
                async_us / pool_us
            ),
        );
    }

    for bytes in GROWTH_BYTES {
        growth(out, context, bytes)?;
    }
    fill_by_steps(out, context)
}

/// Blocks a fresh pool is filled with, and their size.
const FILL_BLOCKS: usize = 2048;
const FILL_BLOCK: u64 = 2 << 20;
/// The growth step set against growing by each request.
const FILL_STEP: u64 = 64 << 20;

/// Fills a fresh VMM pool with [`FILL_BLOCKS`] blocks of [`FILL_BLOCK`]
/// bytes, growing by what each request needs and by [`FILL_STEP`]
/// (`PoolConfig::min_growth_bytes`), against as many cuMemAllocs.
fn fill_by_steps(out: &mut Checks, context: &CudaContext) -> Result<()> {
    let start = Instant::now();
    let mut addresses = Vec::with_capacity(FILL_BLOCKS);
    for _ in 0..FILL_BLOCKS {
        addresses.push(context.mem_alloc(FILL_BLOCK)?);
    }
    let driver = start.elapsed();
    for address in addresses {
        context.mem_free(address)?;
    }
    let mut line = Vec::new();
    let mut grows = Vec::new();
    for step in [0, FILL_STEP] {
        let config = PoolConfig {
            min_growth_bytes: step,
            growth_divisor: 0,
            ..PoolConfig::vmm(RESERVE_BYTES)
        };
        let pool = Pool::new(CudaDevice::new(context)?, config)?;
        let start = Instant::now();
        let mut handles = Vec::with_capacity(FILL_BLOCKS);
        for _ in 0..FILL_BLOCKS {
            handles.push(pool.allocate(FILL_BLOCK, 256, None)?);
        }
        let filled = start.elapsed();
        let stats = pool.stats();
        for handle in handles {
            pool.free(handle)?;
        }
        grows.push(stats.grows);
        line.push(format!(
            "step {} MiB: {:.1} ms ({} growths, {} MiB mapped)",
            step >> 20,
            filled.as_secs_f64() * 1e3,
            stats.grows,
            stats.mapped_bytes >> 20
        ));
    }
    let steps = (FILL_BLOCKS as u64 * FILL_BLOCK).div_ceil(FILL_STEP);
    out.check(
        &format!(
            "filling a pool with {FILL_BLOCKS} blocks of {} MiB",
            FILL_BLOCK >> 20
        ),
        grows == [FILL_BLOCKS as u64, steps],
        format!(
            "{}; {FILL_BLOCKS} cuMemAlloc {:.1} ms",
            line.join("; "),
            driver.as_secs_f64() * 1e3
        ),
    );
    Ok(())
}

/// `bytes` in GiB, for rates per GiB.
fn gib(bytes: u64) -> f64 {
    bytes as f64 / memcore::bytes::GIB as f64
}

fn us(time: Duration) -> f64 {
    time.as_secs_f64() * 1e6
}

/// One pool growth by `bytes`: host time in all, and in the VMM calls.
struct Growth {
    total: Duration,
    calls: DriverCalls,
}

impl Growth {
    fn describe(&self, bytes: u64) -> String {
        let c = &self.calls;
        format!(
            "{:.0} us = {:.0} us/GiB (cuMemCreate {:.0} us x{}, cuMemMap {:.0} us x{}, \
             cuMemSetAccess {:.0} us x{}, the pool's own work {:.0} us)",
            us(self.total),
            us(self.total) / gib(bytes),
            us(c.create.time),
            c.create.calls,
            us(c.map.time),
            c.map.calls,
            us(c.set_access.time),
            c.set_access.calls,
            us(self.total.saturating_sub(c.growth_time())),
        )
    }
}

/// Allocates `bytes` from `pool`, which has to grow by them.
fn grow(pool: &Pool<CudaDevice>, bytes: u64) -> Result<(Handle, Growth)> {
    let before = pool.stats().calls;
    let start = Instant::now();
    let handle = pool.allocate(bytes, 256, None)?;
    let total = start.elapsed();
    let calls = pool.stats().calls.since(&before);
    Ok((handle, Growth { total, calls }))
}

/// The middle value of `values` (the upper of the two middle ones for an
/// even count).
fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// VMM growth by `bytes` against cuMemAlloc of the same size, and where the
/// time goes. The pool's first growth (a fresh reservation) and the first
/// cuMemAlloc are reported apart; then [`GROWTH_ROUNDS`] more of each,
/// alternating, and their medians compared.
fn growth(out: &mut Checks, context: &CudaContext, bytes: u64) -> Result<()> {
    let pool = Pool::new(CudaDevice::new(context)?, PoolConfig::vmm(RESERVE_BYTES))?;
    let reserve = pool.stats().calls.reserve;
    let mut handles = Vec::with_capacity(GROWTH_ROUNDS + 1);
    let mut addresses = Vec::with_capacity(GROWTH_ROUNDS + 1);
    let start = Instant::now();
    addresses.push(context.mem_alloc(bytes)?);
    let first_alloc = start.elapsed();
    let (handle, first_growth) = grow(&pool, bytes)?;
    handles.push(handle);
    let mut allocs = Vec::with_capacity(GROWTH_ROUNDS);
    let mut growths = Vec::with_capacity(GROWTH_ROUNDS);
    for _ in 0..GROWTH_ROUNDS {
        let start = Instant::now();
        addresses.push(context.mem_alloc(bytes)?);
        allocs.push(start.elapsed());
        let (handle, growth) = grow(&pool, bytes)?;
        handles.push(handle);
        growths.push(growth);
    }
    let stats = pool.stats();
    for handle in handles {
        pool.free(handle)?;
    }
    drop(pool);
    for address in addresses {
        context.mem_free(address)?;
    }

    let one_call_each = std::iter::once(&first_growth).chain(&growths).all(|g| {
        let c = &g.calls;
        c.create.calls == 1 && c.map.calls == 1 && c.set_access.calls == 1 && c.reserve.calls == 0
    });
    growths.sort_unstable_by_key(|g| g.total);
    let middle = &growths[growths.len() / 2];
    let alloc_median = median(allocs.clone());
    let ratio = middle.total.as_secs_f64() / alloc_median.as_secs_f64().max(1e-9);
    let list = |times: &mut dyn Iterator<Item = Duration>| {
        times
            .map(|t| format!("{:.0}", us(t)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    out.check(
        &format!("growth by {} MiB", bytes >> 20),
        one_call_each
            && reserve.calls == 1
            && stats.mapped_bytes >= (GROWTH_ROUNDS as u64 + 1) * bytes,
        format!(
            "reserve {} GiB once up front ({:.0} us, not timed below); first growth {}; first \
             cuMemAlloc {:.0} us = {:.0} us/GiB; then {GROWTH_ROUNDS} of each, alternating: \
             growth {} us, cuMemAlloc {} us; median growth {}; median cuMemAlloc {:.0} us = \
             {:.0} us/GiB; median growth / median cuMemAlloc {ratio:.2} (goal at most 1: {})",
            RESERVE_BYTES >> 30,
            us(reserve.time),
            first_growth.describe(bytes),
            us(first_alloc),
            us(first_alloc) / gib(bytes),
            list(&mut growths.iter().map(|g| g.total)),
            list(&mut allocs.iter().copied()),
            middle.describe(bytes),
            us(alloc_median),
            us(alloc_median) / gib(bytes),
            if ratio <= 1.0 { "met" } else { "not met" },
        ),
    );
    Ok(())
}
