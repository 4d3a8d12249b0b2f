//! `cudamem replay TRACE --gpu N`: the traces replayed through a
//! [`StitchedPool`] on the real driver, in one run per trace: footprint by
//! cuMemGetInfo against the model and the peak live bytes, host time per
//! allocate and free and in the driver, at the peak the bandwidth of the
//! `move_blocks` copy kernel over the live allocations against the same
//! kernel over cuMemAlloc buffers of the same sizes, and a warm
//! allocate+free next to the moving [`Pool`]'s.

use std::io::Write as _;
use std::time::Instant;

use anyhow::{Context as _, Result};
use ctx::{
    BlockMove, CudaContext, CudaDevice, DeviceMemory, Pool, PoolConfig, StitchConfig,
    StitchedConfig, StitchedPool,
};
use serde::Serialize;

use crate::replay::on_device::{self, DeviceReplay};
use crate::trace::Trace;

/// Timed copy runs per side; the median is reported.
const COPY_RUNS: usize = 5;
/// Warm allocate+free pairs timed per pool.
const PAIRS: u32 = 100_000;
/// The warm pair's request, bytes.
const PAIR_BYTES: u64 = 1 << 20;

/// The copy kernel over the live allocations at the peak, both ways.
#[derive(Debug, Clone, Serialize)]
struct PeakBandwidth {
    /// Allocations copied (each its first half onto its second).
    moves: usize,
    /// Bytes one run copies.
    bytes: u64,
    /// Median copy bandwidth over the pool's allocations, GB/s (bytes
    /// copied per ns).
    pool_gbps: f64,
    /// The same over cuMemAlloc buffers of the same sizes, GB/s.
    mem_alloc_gbps: f64,
    /// pool / cuMemAlloc.
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct GpuReplay {
    device: String,
    #[serde(flatten)]
    replay: DeviceReplay,
    /// The bandwidth figures, or why they could not be measured.
    bandwidth: Result<PeakBandwidth, String>,
    /// A warm allocate+free of 1 MiB on the stitched pool, host ns.
    stitched_pair_ns: f64,
    /// The same on the moving Pool (VMM growth), host ns.
    moving_pair_ns: f64,
}

/// Runs the replays on CUDA device `ordinal` and prints one block (or one
/// JSON line) per trace.
pub fn run(traces: &[Trace], ordinal: u32, stitch: StitchConfig, json: bool) -> Result<()> {
    let context = CudaContext::new(ordinal).context("opening the CUDA device")?;
    let mut out = crate::cli::output::stdout();
    for trace in traces {
        let mut device = CudaDevice::new(&context)?;
        let name = device.name();
        // Loading compiles the PTX, which no timed copy should include.
        device.load_move_kernel()?;
        let pool = StitchedPool::new(
            device,
            StitchedConfig {
                reservation_bytes: 0,
                stitch,
                peers: ctx::PeerSet::NONE,
            },
        )?;
        let mut bandwidth = Err("the trace's peak was never reached".to_string());
        let replay = on_device::replay(trace, &pool, |live| {
            bandwidth = pool
                .with_device(|device| peak_bandwidth(device, live))
                .map_err(|e| format!("{e:#}"));
            Ok(())
        })?;
        let stitched_pair_ns = on_device::warm_pair_ns(&pool, PAIR_BYTES, PAIRS)?;
        drop(pool);
        let moving_pair_ns = moving_pair_ns(&context)?;
        let result = GpuReplay {
            device: name,
            replay,
            bandwidth,
            stitched_pair_ns,
            moving_pair_ns,
        };
        if json {
            writeln!(out, "{}", serde_json::to_string(&result)?)?;
        } else {
            writeln!(out, "{} on {}", result.replay.lines()[0], result.device)?;
            for line in &result.replay.lines()[1..] {
                writeln!(out, "{line}")?;
            }
            match &result.bandwidth {
                Ok(b) => writeln!(
                    out,
                    "  copy kernel at the peak over {} allocations ({:.1} MiB): pool {:.1} GB/s, cuMemAlloc {:.1} GB/s, ratio {:.3} (median of {COPY_RUNS})",
                    b.moves,
                    b.bytes as f64 / f64::from(1 << 20),
                    b.pool_gbps,
                    b.mem_alloc_gbps,
                    b.ratio
                )?,
                Err(why) => writeln!(out, "  copy kernel at the peak: not measured: {why}")?,
            }
            writeln!(
                out,
                "  warm allocate+free of 1 MiB, no driver call: stitched {:.0} ns/pair, moving Pool {:.0} ns/pair",
                result.stitched_pair_ns, result.moving_pair_ns
            )?;
        }
        out.flush()?;
    }
    Ok(())
}

/// Each block's first half copied onto its second, in 256-byte multiples.
fn moves_within(blocks: &[(u64, u64)]) -> Vec<BlockMove> {
    blocks
        .iter()
        .filter_map(|&(ptr, bytes)| {
            let len = (bytes / 2) & !255;
            (len > 0).then_some(BlockMove {
                src: ptr,
                dst: ptr + len,
                len,
            })
        })
        .collect()
}

/// Median device time of `COPY_RUNS` runs of `moves`, after one untimed run, ns.
fn median_copy_ns(device: &mut CudaDevice, moves: &[BlockMove]) -> Result<u64> {
    device.copy_moves(moves)?;
    let mut times = Vec::with_capacity(COPY_RUNS);
    for _ in 0..COPY_RUNS {
        let before = device.copy_calls();
        device.copy_moves(moves)?;
        times.push(device.copy_calls().since(&before).device_nanos);
    }
    times.sort_unstable();
    Ok(times[COPY_RUNS / 2])
}

fn peak_bandwidth(device: &mut CudaDevice, live: &[(u64, u64)]) -> Result<PeakBandwidth> {
    let moves = moves_within(live);
    let bytes: u64 = moves.iter().map(|m| m.len).sum();
    let pool_ns = median_copy_ns(device, &moves)?;
    let mut chunks = Vec::with_capacity(live.len());
    let mut made = Ok(());
    for &(_, size) in live {
        match device.alloc_chunk(size) {
            Ok(ptr) => chunks.push((ptr, size)),
            Err(e) => {
                made = Err(e).context("cuMemAlloc buffers of the live sizes");
                break;
            }
        }
    }
    let mem_alloc_ns = made.and_then(|()| median_copy_ns(device, &moves_within(&chunks)));
    for (ptr, size) in chunks {
        device.free_chunk(ptr, size)?;
    }
    let mem_alloc_ns = mem_alloc_ns?;
    let gbps = |ns: u64| {
        if ns == 0 {
            0.0
        } else {
            bytes as f64 / ns as f64
        }
    };
    Ok(PeakBandwidth {
        moves: moves.len(),
        bytes,
        pool_gbps: gbps(pool_ns),
        mem_alloc_gbps: gbps(mem_alloc_ns),
        ratio: if mem_alloc_ns == 0 {
            0.0
        } else {
            mem_alloc_ns as f64 / pool_ns.max(1) as f64
        },
    })
}

/// A warm allocate+free of [`PAIR_BYTES`] on the moving [`Pool`], host ns.
fn moving_pair_ns(context: &CudaContext) -> Result<f64> {
    let pool = Pool::new(CudaDevice::new(context)?, PoolConfig::vmm(64 << 30))?;
    pool.free(pool.allocate(PAIR_BYTES, 512, None)?)?;
    let started = Instant::now();
    for _ in 0..PAIRS {
        let handle = pool.allocate(std::hint::black_box(PAIR_BYTES), 512, None)?;
        pool.free(std::hint::black_box(handle))?;
    }
    Ok(started.elapsed().as_nanos() as f64 / f64::from(PAIRS))
}
