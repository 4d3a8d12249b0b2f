//! (f) What an allocation costs the host: the pool's allocate+free pair
//! against cuMemAlloc/cuMemFree and cuMemAllocAsync/cuMemFreeAsync on a warm
//! pool, and VMM growth against cuMemAlloc of the same size.

use std::time::Instant;

use anyhow::Result;
use ctx::cuda::{CudaDevice, Stream};
use ctx::{Pool, PoolConfig};

use crate::gpu::Gpu;
use crate::report::Checks;

const RESERVE_BYTES: u64 = 64 << 30;
/// (request bytes, pool pairs, driver pairs)
const SIZES: [(u64, u32, u32); 2] = [(256, 200_000, 2_000), (1 << 20, 100_000, 1_000)];
const ASYNC_PAIRS: u32 = 20_000;
const GROWTH_BYTES: [u64; 2] = [64 << 20, 1 << 30];

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
        let fresh = Pool::new(CudaDevice::new(context)?, PoolConfig::vmm(RESERVE_BYTES))?;
        let start = Instant::now();
        let handle = fresh.allocate(bytes, 256, None)?;
        let grow_us = start.elapsed().as_secs_f64() * 1e6;
        let mapped = fresh.stats().mapped_bytes;
        fresh.free(handle)?;
        drop(fresh);

        let start = Instant::now();
        let address = context.mem_alloc(bytes)?;
        let alloc_us = start.elapsed().as_secs_f64() * 1e6;
        context.mem_free(address)?;
        let gib = bytes as f64 / f64::from(1 << 30);
        out.check(
            &format!("growth by {} MiB", bytes >> 20),
            mapped >= bytes,
            format!(
                "pool grow (reserve once, map {} MiB) {grow_us:.0} us = {:.0} us/GiB; \
                 cuMemAlloc {alloc_us:.0} us = {:.0} us/GiB",
                mapped >> 20,
                grow_us / gib,
                alloc_us / gib
            ),
        );
    }
    Ok(())
}
