//! (b) Compaction on the device keeps every byte, and how fast it moves them
//! against one plain device-to-device copy of the same number of bytes.

use std::time::Instant;

use anyhow::Result;
use ctx::cuda::CudaDevice;
use ctx::{Pool, PoolConfig};

use crate::gpu::{Gpu, Rng};
use crate::report::{Checks, mib};

const BLOCKS: usize = 2048;
/// Block sizes are uniform in [1, 3) MiB: about 4 GiB allocated, 2 GiB kept.
const MIN_BLOCK: u64 = 1 << 20;
const RESERVE_BYTES: u64 = 64 << 30;

fn gb_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

pub fn run(out: &mut Checks) -> Result<()> {
    let mut gpu = Gpu::open()?;
    let pool = Pool::new(
        CudaDevice::new(&gpu.context)?,
        PoolConfig::vmm(RESERVE_BYTES),
    )?;
    let mut rng = Rng::new(0xc0_4ac7);
    let mut blocks = Vec::with_capacity(BLOCKS);
    for i in 0..BLOCKS {
        let size = MIN_BLOCK + rng.below(2 * MIN_BLOCK);
        let handle = pool.allocate(size, 256, None)?;
        let seed = i as u64 ^ 0xb10c;
        gpu.fill(pool.device_ptr(handle)?, size, seed)?;
        blocks.push((handle, size, seed));
    }
    // Free every other block: the survivors are spread over the whole pool.
    let mut kept = Vec::with_capacity(BLOCKS / 2);
    for (i, block) in blocks.into_iter().enumerate() {
        if i % 2 == 0 {
            pool.free(block.0)?;
        } else {
            kept.push(block);
        }
    }
    gpu.context.synchronize()?;
    let kept_bytes: u64 = kept.iter().map(|b| b.1).sum();

    let start = Instant::now();
    let report = pool.compact()?;
    gpu.context.synchronize()?;
    let compact_seconds = start.elapsed().as_secs_f64();

    let mut ranges = Vec::with_capacity(kept.len());
    for &(handle, size, seed) in &kept {
        ranges.push((pool.device_ptr(handle)?, size, seed));
    }
    let bad = gpu.mismatches(&ranges)?;
    out.check(
        "compaction keeps every byte",
        bad == 0 && report.moves > 0,
        format!(
            "{} blocks ({}) checked after {} moves of {}: {bad} bytes differ",
            kept.len(),
            mib(kept_bytes),
            report.moves,
            mib(report.bytes_moved)
        ),
    );

    // The same number of bytes in one copy between two plain allocations,
    // timed on the device.
    let copy = gpu.context.copy_bandwidth(report.bytes_moved.max(1), 5)?;
    let compact_rate = gb_per_s(report.bytes_moved, compact_seconds);
    let copy_rate = copy.copy_bytes_per_second() / 1e9;
    out.check(
        "compaction bandwidth against one plain copy",
        true,
        format!(
            "compaction {} in {:.2} ms (host clock, planning included) = {compact_rate:.0} GB/s \
             in {} moves; one cuMemcpyDtoD of the same bytes {:.2} ms = {copy_rate:.0} GB/s; \
             ratio {:.2} (GB/s counts bytes moved once)",
            mib(report.bytes_moved),
            compact_seconds * 1e3,
            report.moves,
            copy.seconds_per_copy * 1e3,
            compact_rate / copy_rate
        ),
    );
    out.note(&format!(
        "largest free block {} before, {} after; {} free",
        mib(report.largest_free_before),
        mib(report.largest_free_after),
        mib(report.free_bytes)
    ));
    for (handle, _, _) in kept {
        pool.free(handle)?;
    }
    Ok(())
}
