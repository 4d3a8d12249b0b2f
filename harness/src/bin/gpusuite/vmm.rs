//! (c) A VMM pool takes device memory as it grows and gives it back when it
//! shrinks: `cuMemGetInfo` deltas against the pool's own figures.

use anyhow::Result;
use ctx::CudaDevice;
use ctx::{Pool, PoolConfig};

use crate::gpu::Gpu;
use crate::report::{Checks, mib_signed};
use memcore::bytes::mib;

const BLOCKS: u64 = 16;
const BLOCK_BYTES: u64 = 256 << 20;
const RESERVE_BYTES: u64 = 64 << 30;
/// What a delta may differ by: one 2 MiB page for the driver's own books.
const TOLERANCE: u64 = 2 << 20;

fn within(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= TOLERANCE
}

pub fn run(out: &mut Checks) -> Result<()> {
    let gpu = Gpu::open()?;
    let pool = Pool::new(
        CudaDevice::new(&gpu.context)?,
        PoolConfig::vmm(RESERVE_BYTES),
    )?;
    let free0 = gpu.free_bytes()?;
    let mut handles = Vec::new();
    for _ in 0..BLOCKS {
        handles.push(pool.allocate(BLOCK_BYTES, 256, None)?);
    }
    gpu.context.synchronize()?;
    let free1 = gpu.free_bytes()?;
    let grown = pool.stats();
    let taken = free0.saturating_sub(free1);
    out.check(
        "growth takes what the pool mapped",
        within(taken, grown.mapped_bytes) && grown.mapped_bytes >= BLOCKS * BLOCK_BYTES,
        format!(
            "{} allocated; pool mapped {} in {} grows; free memory fell by {} ({})",
            mib(BLOCKS * BLOCK_BYTES),
            mib(grown.mapped_bytes),
            grown.grows,
            mib(taken),
            mib_signed(i128::from(taken) - i128::from(grown.mapped_bytes))
        ),
    );

    for handle in handles {
        pool.free(handle)?;
    }
    let released = pool.shrink()?;
    gpu.context.synchronize()?;
    let free2 = gpu.free_bytes()?;
    let returned = free2.saturating_sub(free1);
    out.check(
        "shrinking gives the pages back",
        within(returned, released) && within(free2, free0) && pool.stats().mapped_bytes == 0,
        format!(
            "shrink released {}; free memory rose by {}; {} against before growth",
            mib(released),
            mib(returned),
            mib_signed(i128::from(free2) - i128::from(free0))
        ),
    );
    Ok(())
}
