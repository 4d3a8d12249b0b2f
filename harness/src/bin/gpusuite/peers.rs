//! (p) Peer access to a pool's memory, on two GPUs of one host: a pool on
//! GPU 0 that grants GPU 1 every mapping (`PoolConfig::peers`), used
//! directly by kernels running on GPU 1; and the bandwidth of GPU 1 reading
//! GPU 0's pool memory, against the same kernel reading `cuMemAlloc` memory
//! of GPU 0 that `cuCtxEnablePeerAccess` opened, in the same run. Fewer than
//! two GPUs is a failure, not a skip: the section exists to run on two.

use std::time::Duration;

use anyhow::{Result, bail};
use ctx::{CudaContext, CudaDevice, DeviceMemory as _, LaunchConfig, PeerSet, Pool, PoolConfig};
use kernels::moves::{BlockMove, MOVE_BLOCKS, MoveBlocksParams};
use kernels::pattern;

use crate::gpu::Gpu;
use crate::report::Checks;
use memcore::bytes::mib;

/// Address space the pool reserves, bytes.
const RESERVE_BYTES: u64 = 8 << 30;
/// The block kernels on GPU 1 write and read, bytes: not a whole page, so
/// the last page is part used.
const PATTERN_BYTES: u64 = (64 << 20) + 4096 + 123;
/// What the bandwidth copy reads, bytes.
const COPY_BYTES: u64 = 1 << 30;
/// Timed copies of each kind; the median counts.
const REPEATS: usize = 9;
/// Peer bandwidth over pool memory that passes, as a share of the bandwidth
/// over `cuMemAlloc` memory.
const GOAL_RATIO: f64 = 0.97;

const SEED_PATTERN: u64 = 0x9e37_0001;
const SEED_POOL: u64 = 0x9e37_0002;
const SEED_PLAIN: u64 = 0x9e37_0003;

pub fn run(out: &mut Checks) -> Result<()> {
    let count = CudaContext::device_count()?;
    if count < 2 {
        bail!("peer access needs two GPUs; this host has {count}");
    }
    let reach = CudaContext::can_access_peer(1, 0)?;
    out.check(
        "GPU 1 can access GPU 0's memory (cuDeviceCanAccessPeer)",
        reach,
        format!("{count} devices"),
    );
    if !reach {
        bail!("GPU 1 cannot access GPU 0's memory; nothing else to measure");
    }
    let gpu0 = CudaContext::new(0)?;
    let gpu1 = CudaContext::new(1)?;
    let pool = Pool::new(
        CudaDevice::new(&gpu0)?,
        PoolConfig::vmm(RESERVE_BYTES).with_peers(PeerSet::of(&[1])?),
    )?;
    let small = pool.allocate(PATTERN_BYTES, 256, None)?;
    let big = pool.allocate(COPY_BYTES, 256, None)?;
    let small_at = pool.pin(small)?.hold_until_freed();
    let big_at = pool.pin(big)?.hold_until_freed();
    let stats = pool.stats();
    out.check(
        "every growth is granted to GPU 1, once",
        stats.grows >= 2 && stats.peer_access.calls == stats.grows,
        format!(
            "{} grows, {} mapped; {} grants of {} in {:.1} us",
            stats.grows,
            mib(stats.mapped_bytes),
            stats.peer_access.calls,
            mib(stats.peer_access.bytes),
            stats.peer_access.time.as_secs_f64() * 1e6
        ),
    );

    // (a) Before any cuCtxEnablePeerAccess: the grant alone lets GPU 1 in.
    let mut on_gpu1 = Gpu::with_context(gpu1.clone())?;
    on_gpu1.fill(small_at, PATTERN_BYTES, SEED_PATTERN)?;
    let device_mismatches = on_gpu1.mismatches(&[(small_at, PATTERN_BYTES, SEED_PATTERN)])?;
    let mut host = vec![0u8; PATTERN_BYTES as usize];
    pool.read(small, 0, &mut host)?;
    let host_mismatches = pattern::mismatches(SEED_PATTERN, 0, &host);
    out.check(
        "a kernel on GPU 1 writes and reads GPU 0's pool memory",
        device_mismatches == 0 && host_mismatches == 0,
        format!(
            "{} written and read back by GPU 1: {device_mismatches} bytes differ on GPU 1, \
             {host_mismatches} on the host (every byte read through GPU 0)",
            mib(PATTERN_BYTES)
        ),
    );

    // (b) GPU 1 copies 1 GiB of GPU 0's memory into its own, pool memory
    // against cuMemAlloc memory with peer access enabled, alternating.
    let on_gpu0 = Gpu::with_context(gpu0.clone())?;
    let mut plain_memory = CudaDevice::new(&gpu0)?;
    let plain_at = plain_memory.alloc_chunk(COPY_BYTES)?;
    gpu1.enable_peer_access(&gpu0)?;
    let destination = on_gpu1.memory.alloc_chunk(COPY_BYTES)?;
    on_gpu0.fill(big_at, COPY_BYTES, SEED_POOL)?;
    on_gpu0.fill(plain_at, COPY_BYTES, SEED_PLAIN)?;
    gpu0.synchronize()?;
    let moves = on_gpu1.load(&kernels::moves::MODULE)?;
    let copy = moves.function(MOVE_BLOCKS.name())?;
    let copy_from = |src: u64| -> Result<Duration> {
        let move_ = BlockMove {
            src,
            dst: destination,
            len: COPY_BYTES,
        };
        let Some(params) = MoveBlocksParams::new(&[move_]) else {
            bail!("one move of {COPY_BYTES} bytes does not fit a launch");
        };
        let shape = params.launch_shape();
        Ok(copy.launch_timed(
            &LaunchConfig::linear(shape.grid, shape.block),
            MOVE_BLOCKS.param_bytes(&params),
        )?)
    };
    // One untimed copy of each warms the links and the page tables.
    copy_from(plain_at)?;
    copy_from(big_at)?;
    let mut pool_times = Vec::new();
    let mut plain_times = Vec::new();
    for _ in 0..REPEATS {
        pool_times.push(copy_from(big_at)?);
        plain_times.push(copy_from(plain_at)?);
    }
    let plain_copied = on_gpu1.mismatches(&[(destination, COPY_BYTES, SEED_PLAIN)])?;
    copy_from(big_at)?;
    let pool_copied = on_gpu1.mismatches(&[(destination, COPY_BYTES, SEED_POOL)])?;
    out.check(
        "GPU 1's copies of GPU 0's memory are exact",
        plain_copied == 0 && pool_copied == 0,
        format!(
            "{} copied: {pool_copied} bytes differ from pool memory, {plain_copied} from \
             cuMemAlloc memory",
            mib(COPY_BYTES)
        ),
    );
    let pool_rate = rate(COPY_BYTES, median(&mut pool_times));
    let plain_rate = rate(COPY_BYTES, median(&mut plain_times));
    let ratio = pool_rate / plain_rate;
    out.check(
        "peer read bandwidth over pool memory is at least 0.97 of cuMemAlloc memory's",
        ratio >= GOAL_RATIO,
        format!(
            "GPU 1 reading {} of GPU 0 (move_blocks, median of {REPEATS}): pool (VMM, \
             cuMemSetAccess) {pool_rate:.1} GB/s, cuMemAlloc (cuCtxEnablePeerAccess) \
             {plain_rate:.1} GB/s, ratio {ratio:.3}",
            mib(COPY_BYTES)
        ),
    );
    on_gpu1.memory.free_chunk(destination, COPY_BYTES)?;
    plain_memory.free_chunk(plain_at, COPY_BYTES)?;
    Ok(())
}

/// The middle time (the upper middle of an even count).
fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// Gigabytes (10^9 bytes) a second.
fn rate(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64().max(1e-12) / 1e9
}
