//! (s) The stitched pool on the driver: contents written through a random
//! allocate/free/trim sequence read back intact while idle handles are
//! unmapped from freed places and mapped under new blocks; the device's
//! own memory figure (cuMemGetInfo) against the model's physical bytes; a
//! huge block (one handle of its own) written, read back and given back,
//! timed next to cuMemAlloc of the same size; and a warm allocate+free on
//! the host next to the moving pool, cuMemAlloc and cuMemAllocAsync.

use std::time::Instant;

use anyhow::Result;
use ctx::{
    CudaContext, CudaDevice, DeviceMemory, StitchConfig, StitchedConfig, StitchedPool, Stream,
};
use kernels::pattern;

use cudamem::replay::device::{warm_moving_pair_ns, warm_stitched_pair_ns};
use memcore::bytes::{MIB, mib};

use crate::gpu::Gpu;
use crate::report::{Checks, mib_signed};

/// Steps of the random sequence.
const STEPS: u64 = 400;
/// Warm pairs timed per pool, and per driver call pair.
const PAIRS: u32 = 100_000;
const DRIVER_PAIRS: u32 = 2_000;
/// The host cost per warm pair aimed for, ns.
const PAIR_GOAL_NS: f64 = 100.0;

fn filled(seed: u64, len: u64) -> Vec<u8> {
    let mut bytes = vec![0; len as usize];
    pattern::fill(seed, 0, &mut bytes);
    bytes
}

fn used(pool: &StitchedPool<CudaDevice>) -> Result<u64> {
    let info = pool.with_device(|d| d.mem_info())?;
    Ok(info.total - info.free)
}

pub fn run(out: &mut Checks) -> Result<()> {
    let gpu = Gpu::open()?;
    contents_and_footprint(out, &gpu.context)?;
    huge_block(out, &gpu.context)?;
    host_pairs(out, &gpu.context)
}

fn contents_and_footprint(out: &mut Checks, context: &CudaContext) -> Result<()> {
    // The tightest budget, so idle handles are taken off their pages and
    // mapped under other blocks: the contents check then covers remapping.
    let stitch = StitchConfig {
        keep_idle_bytes: 0,
        slack_permille: 0,
        overshoot_permille: 0,
        grow_in_large: false,
        ..StitchConfig::default()
    };
    let pool = StitchedPool::new(
        CudaDevice::new(context)?,
        StitchedConfig {
            reservation_bytes: 0,
            stitch,
            peers: ctx::PeerSet::NONE,
        },
    )?;
    let start_used = used(&pool)?;
    let mut rng = fastrand::Rng::with_seed(0x5717_c4ed_0000_0001);
    let mut live: Vec<(u64, u64, u64)> = Vec::new();
    let mut bad = 0u64;
    let mut worst_gap = 0i64;
    let verify = |pool: &StitchedPool<CudaDevice>, ptr: u64, seed: u64, len: u64| -> Result<u64> {
        let mut back = vec![0; len as usize];
        pool.with_device(|d| d.read(ptr, &mut back))?;
        Ok(pattern::mismatches(seed, 0, &back))
    };
    for step in 0..STEPS {
        match rng.u64(..10) {
            0..=4 => {
                let len = match rng.u64(..4) {
                    0 => 1 + rng.u64(..4096),
                    1 | 2 => 1 + rng.u64(..3 * MIB),
                    _ => 32 * MIB + rng.u64(..64 * MIB),
                };
                let ptr = pool.allocate(len)?;
                pool.with_device(|d| d.write(ptr, &filled(step, len)))?;
                live.push((ptr, step, len));
            }
            5..=8 if !live.is_empty() => {
                let (ptr, seed, len) = live.swap_remove(rng.usize(..live.len()));
                bad += verify(&pool, ptr, seed, len)?;
                pool.free(ptr)?;
            }
            _ => pool.trim()?,
        }
        pool.check()?;
        let gap =
            used(&pool)? as i64 - start_used as i64 - pool.stats().model.physical_bytes as i64;
        if gap.abs() > worst_gap.abs() {
            worst_gap = gap;
        }
    }
    for &(ptr, seed, len) in &live {
        bad += verify(&pool, ptr, seed, len)?;
    }
    let stats = pool.stats();
    out.check(
        &format!("stitched pool contents through {STEPS} random steps"),
        bad == 0 && stats.calls.map.calls > stats.calls.create.calls,
        format!(
            "{bad} bytes differ; {} live blocks; {} cuMemCreate, {} cuMemMap (handles moved: {}), {} cuMemUnmap, {} cuMemRelease",
            live.len(),
            stats.calls.create.calls,
            stats.calls.map.calls,
            stats.calls.map.calls.saturating_sub(stats.calls.create.calls),
            stats.calls.unmap.calls,
            stats.calls.release.calls
        ),
    );
    // The driver keeps a little memory of its own per mapping (page
    // tables); a gap beyond 1/32 of the footprint plus 64 MiB is a leak or
    // a miscount.
    let allowed = (stats.model.peak_physical_bytes / 32 + 64 * MIB) as i64;
    out.check(
        "stitched pool footprint: cuMemGetInfo against the model",
        worst_gap.abs() <= allowed,
        format!(
            "largest gap (device used above the start - model physical) {} over {STEPS} steps; model peak {}",
            mib_signed(i128::from(worst_gap)),
            mib(stats.model.peak_physical_bytes)
        ),
    );
    for (ptr, _, _) in live {
        pool.free(ptr)?;
    }
    pool.trim()?;
    let left = used(&pool)?.saturating_sub(start_used);
    out.check(
        "stitched pool gives its memory back on trim",
        pool.stats().model.physical_bytes == 0 && left <= 64 * MIB,
        format!("{} used above the start after trim", mib(left)),
    );
    Ok(())
}

/// Bytes of the huge block: past `HUGE_REQUEST_BYTES`, within an H200.
const HUGE_BLOCK_BYTES: u64 = memcore::HUGE_REQUEST_BYTES + 8 * 1024 * MIB + 512;

fn huge_block(out: &mut Checks, context: &CudaContext) -> Result<()> {
    let pool = StitchedPool::new(CudaDevice::new(context)?, StitchedConfig::default())?;
    let small = pool.allocate(MIB)?;
    let start_used = used(&pool)?;
    let before = pool.stats().calls;
    let start = Instant::now();
    let ptr = pool.allocate(HUGE_BLOCK_BYTES)?;
    let allocate_ms = start.elapsed().as_secs_f64() * 1e3;
    let grown = used(&pool)?.saturating_sub(start_used);
    let calls = pool.stats().calls;
    let creates = calls.create.calls - before.create.calls;
    let maps = calls.map.calls - before.map.calls;
    // A piece at the start, the middle and the end, written and read back.
    let piece = 4 * MIB;
    let spots = [0, HUGE_BLOCK_BYTES / 2, HUGE_BLOCK_BYTES - piece];
    let mut bad = 0;
    for (seed, &at) in spots.iter().enumerate() {
        pool.with_device(|d| d.write(ptr + at, &filled(seed as u64, piece)))?;
    }
    for (seed, &at) in spots.iter().enumerate() {
        let mut back = vec![0; piece as usize];
        pool.with_device(|d| d.read(ptr + at, &mut back))?;
        bad += pattern::mismatches(seed as u64, 0, &back);
    }
    let start = Instant::now();
    pool.free(ptr)?;
    let free_ms = start.elapsed().as_secs_f64() * 1e3;
    let left = used(&pool)?.saturating_sub(start_used);
    pool.free(small)?;
    let start = Instant::now();
    let plain = context.mem_alloc(HUGE_BLOCK_BYTES)?;
    let plain_allocate_ms = start.elapsed().as_secs_f64() * 1e3;
    let start = Instant::now();
    context.mem_free(plain)?;
    let plain_free_ms = start.elapsed().as_secs_f64() * 1e3;
    let span = memcore::align_up(HUGE_BLOCK_BYTES, 32 * MIB).unwrap_or(u64::MAX);
    out.check(
        "stitched pool: a huge block is one handle of its own, given back at its free",
        bad == 0
            && creates == 1
            && maps == 1
            && grown.abs_diff(span) <= 64 * MIB
            && left <= 64 * MIB,
        format!(
            "{} requested: {creates} cuMemCreate, {maps} cuMemMap, device used +{} (handle {}), \
             {bad} bytes differ, {} left after its free; allocate {allocate_ms:.2} ms, free \
             {free_ms:.2} ms; cuMemAlloc of the same size {plain_allocate_ms:.2} ms, cuMemFree \
             {plain_free_ms:.2} ms",
            mib(HUGE_BLOCK_BYTES),
            mib(grown),
            mib(span),
            mib(left)
        ),
    );
    Ok(())
}

fn host_pairs(out: &mut Checks, context: &CudaContext) -> Result<()> {
    let stream = Stream::new(context)?;
    context.keep_default_pool_warm()?;
    for size in [256, MIB] {
        let stitched = StitchedPool::new(CudaDevice::new(context)?, StitchedConfig::default())?;
        let stitched_ns = warm_stitched_pair_ns(&stitched, size, PAIRS)?;
        let moving_ns = warm_moving_pair_ns(CudaDevice::new(context)?, size, PAIRS)?;

        let start = Instant::now();
        for _ in 0..DRIVER_PAIRS {
            let address = context.mem_alloc(size)?;
            context.mem_free(address)?;
        }
        let driver_ns = start.elapsed().as_nanos() as f64 / f64::from(DRIVER_PAIRS);
        let start = Instant::now();
        for _ in 0..DRIVER_PAIRS {
            let address = context.mem_alloc_async(size, &stream)?;
            context.mem_free_async(address, &stream)?;
        }
        stream.synchronize()?;
        let async_ns = start.elapsed().as_nanos() as f64 / f64::from(DRIVER_PAIRS);
        out.check(
            &format!("stitched allocate+free pair, {size} B, no driver call"),
            true,
            format!(
                "stitched {stitched_ns:.0} ns (goal <= {PAIR_GOAL_NS:.0}: {}); moving pool {moving_ns:.0} ns; \
                 cuMemAlloc+cuMemFree {driver_ns:.0} ns; cuMemAllocAsync+cuMemFreeAsync {async_ns:.0} ns",
                if stitched_ns <= PAIR_GOAL_NS { "met" } else { "not met" }
            ),
        );
    }
    Ok(())
}
