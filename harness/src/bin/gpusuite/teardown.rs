//! (g) Dropping the context gives all its memory back, as another process
//! sees it: this binary started again with `probe-free` reports free memory
//! before, during and after this process holds a context with allocations.

use std::process::Command;

use anyhow::{Context as _, Result, bail};
use ctx::DeviceMemory as _;
use ctx::{CudaContext, CudaDevice};
use ctx::{Pool, PoolConfig};

use crate::report::{Checks, mib_signed};
use memcore::bytes::mib;

/// The argument that makes this binary print free memory and exit.
pub const PROBE_ARG: &str = "probe-free";
const CHUNK_BYTES: u64 = 4 << 30;
const POOL_BYTES: u64 = 1 << 30;
const TOLERANCE: u64 = 2 << 20;

/// The child's side: open a context, print `free=<bytes>`.
pub fn probe() -> Result<()> {
    let context = CudaContext::new(0)?;
    println!("free={}", context.mem_info()?.free);
    Ok(())
}

/// Free device memory as a fresh process sees it (after its own context).
fn probe_from_child() -> Result<u64> {
    let exe = std::env::current_exe()?;
    let output = Command::new(exe).arg(PROBE_ARG).output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "probe process failed ({}): {text}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    text.lines()
        .find_map(|l| l.strip_prefix("free="))
        .context("probe printed no free=")?
        .trim()
        .parse()
        .context("probe's free= is not a number")
}

pub fn run(out: &mut Checks) -> Result<()> {
    let before = probe_from_child()?;

    let context = CudaContext::new(0)?;
    let mut memory = CudaDevice::new(&context)?;
    let chunk = memory.alloc_chunk(CHUNK_BYTES)?;
    let pool = Pool::new(CudaDevice::new(&context)?, PoolConfig::vmm(64 << 30))?;
    let handle = pool.allocate(POOL_BYTES, 256, None)?;
    let during = probe_from_child()?;
    let held = before.saturating_sub(during);
    out.check(
        "another process sees this context's memory in use",
        held >= CHUNK_BYTES + POOL_BYTES,
        format!(
            "{} allocated ({} chunk + {} pool); free fell by {} (the rest: this context)",
            mib(CHUNK_BYTES + POOL_BYTES),
            mib(CHUNK_BYTES),
            mib(POOL_BYTES),
            mib(held)
        ),
    );

    // Dropped with the block and the chunk still allocated: teardown, not
    // explicit frees, must give them back.
    let _ = (handle, chunk);
    drop(pool);
    drop(memory);
    drop(context);
    let after = probe_from_child()?;
    out.check(
        "dropping the context gives everything back",
        after.abs_diff(before) <= TOLERANCE,
        format!(
            "free before {}, after {} ({})",
            mib(before),
            mib(after),
            mib_signed(i128::from(after) - i128::from(before))
        ),
    );
    Ok(())
}
