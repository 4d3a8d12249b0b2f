//! (a) Random allocate / free / compact sequences on a VMM pool on the
//! device, every live block's contents checked on the device after each
//! compaction and at checkpoints, and sampled on the host.

use anyhow::Result;
use ctx::CudaDevice;
use ctx::Handle;
use ctx::{Pool, PoolConfig};

use crate::gpu::{Gpu, Rng};
use crate::report::Checks;
use memcore::bytes::mib;

const OPS: usize = 3000;
/// Largest request, bytes.
const MAX_REQUEST: u64 = 32 << 20;
const RESERVE_BYTES: u64 = 64 << 30;
const CHECKPOINT_EVERY: usize = 500;
/// Bytes of a block compared on the host at each checkpoint.
const HOST_SAMPLE_BYTES: u64 = 64 << 10;

struct Live {
    handle: Handle,
    size: u64,
    seed: u64,
}

/// Whether any two live blocks share a byte.
fn overlapping(pool: &Pool<CudaDevice>, live: &[Live]) -> Result<bool> {
    let mut ranges = Vec::with_capacity(live.len());
    for block in live {
        ranges.push((pool.device_ptr(block.handle)?, block.size));
    }
    ranges.sort_unstable();
    Ok(ranges.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0))
}

fn device_mismatches(gpu: &mut Gpu, pool: &Pool<CudaDevice>, live: &[Live]) -> Result<u64> {
    let mut ranges = Vec::with_capacity(live.len());
    for block in live {
        ranges.push((pool.device_ptr(block.handle)?, block.size, block.seed));
    }
    gpu.mismatches(&ranges)
}

/// Reads the start of one block back to the host and compares it with the
/// host's own pattern: proves the two sides generate the same bytes.
fn host_mismatches(pool: &Pool<CudaDevice>, block: &Live) -> Result<u64> {
    let mut bytes = vec![0u8; block.size.min(HOST_SAMPLE_BYTES) as usize];
    pool.read(block.handle, 0, &mut bytes)?;
    Ok(kernels::pattern::mismatches(block.seed, 0, &bytes))
}

pub fn run(out: &mut Checks) -> Result<()> {
    let mut gpu = Gpu::open()?;
    let pool = Pool::new(
        CudaDevice::new(&gpu.context)?,
        PoolConfig::vmm(RESERVE_BYTES),
    )?;
    let mut rng = Rng::new(0x5eed_a11c);
    let mut live: Vec<Live> = Vec::new();
    let (mut allocations, mut frees, mut compactions, mut refused) = (0u64, 0u64, 0u64, 0u64);
    let (mut device_bad, mut host_bad, mut checked_blocks) = (0u64, 0u64, 0u64);
    let mut overlaps = false;

    for op in 0..OPS {
        let roll = rng.below(100);
        if roll < 55 || live.is_empty() {
            let size = rng.size(MAX_REQUEST);
            let align = 256u64 << rng.below(9);
            match pool.allocate(size, align, None) {
                Ok(handle) => {
                    let seed = rng.next_u64();
                    gpu.fill(pool.device_ptr(handle)?, size, seed)?;
                    live.push(Live { handle, size, seed });
                    allocations += 1;
                }
                Err(ctx::Error::OutOfMemory { .. }) => refused += 1,
                Err(e) => return Err(e.into()),
            }
        } else if roll < 97 {
            let block = live.swap_remove(rng.below(live.len() as u64) as usize);
            pool.free(block.handle)?;
            frees += 1;
        } else {
            pool.compact()?;
            compactions += 1;
            device_bad += device_mismatches(&mut gpu, &pool, &live)?;
            checked_blocks += live.len() as u64;
        }
        if (op + 1) % CHECKPOINT_EVERY == 0 {
            device_bad += device_mismatches(&mut gpu, &pool, &live)?;
            checked_blocks += live.len() as u64;
            overlaps |= overlapping(&pool, &live)?;
            if !live.is_empty() {
                let block = &live[rng.below(live.len() as u64) as usize];
                host_bad += host_mismatches(&pool, block)?;
            }
            let stats = pool.stats();
            out.note(&format!(
                "after {} ops: {} live blocks, {} live, {} mapped, {} moved by compaction",
                op + 1,
                live.len(),
                mib(stats.heap.live_bytes),
                mib(stats.mapped_bytes),
                mib(stats.bytes_moved)
            ));
        }
    }
    let final_report = pool.compact()?;
    device_bad += device_mismatches(&mut gpu, &pool, &live)?;
    checked_blocks += live.len() as u64;
    overlaps |= overlapping(&pool, &live)?;
    let stats = pool.stats();

    out.check(
        "contents intact through the sequence",
        device_bad == 0,
        format!(
            "{OPS} ops: {allocations} allocations ({refused} refused), {frees} frees, \
             {} compactions, {} moved; {checked_blocks} block checks, {device_bad} bytes differ",
            compactions + 1,
            mib(stats.bytes_moved)
        ),
    );
    out.check(
        "live blocks never overlap",
        !overlaps,
        format!("{} live blocks at the end", live.len()),
    );
    out.check(
        "host and device patterns agree",
        host_bad == 0,
        format!(
            "{host_bad} bytes differ in {} sampled blocks",
            OPS / CHECKPOINT_EVERY
        ),
    );
    // Alignment gaps between slid blocks stay free, so the largest free
    // block need not be all of the free bytes; it must not get smaller.
    out.check(
        "a final compaction gathers the free bytes",
        final_report.largest_free_after >= final_report.largest_free_before,
        format!(
            "largest free block {} before, {} after, of {} free",
            mib(final_report.largest_free_before),
            mib(final_report.largest_free_after),
            mib(final_report.free_bytes)
        ),
    );

    for block in live.drain(..) {
        pool.free(block.handle)?;
    }
    let released = pool.shrink()?;
    let after = pool.stats();
    out.check(
        "freeing everything and shrinking unmaps everything",
        after.mapped_bytes == 0,
        format!(
            "shrink released {}, {} still mapped, peak {}",
            mib(released),
            mib(after.mapped_bytes),
            mib(after.peak_mapped_bytes)
        ),
    );
    Ok(())
}
