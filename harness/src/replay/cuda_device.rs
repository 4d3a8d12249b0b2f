//! CUDA devices for the `stitched-pool` policy (`cudamem replay --gpu N`):
//! opening one, and what only a GPU measures at the trace's peak: the
//! bandwidth of the `move_blocks` copy kernel over the live allocations
//! against the same kernel over cuMemAlloc buffers of the same sizes.

use anyhow::{Context as _, Result};
use ctx::{BlockMove, CudaContext, CudaDevice, DeviceMemory};

use crate::replay::device::{PeakBandwidth, ReplayDevice};

/// Timed copy runs per side; the median is reported.
const COPY_RUNS: usize = 5;

/// CUDA device `ordinal`, its copy kernel loaded (loading compiles the
/// PTX, which no timed copy should include).
pub fn open(ordinal: u32) -> Result<CudaDevice> {
    let context = CudaContext::new(ordinal).context("opening the CUDA device")?;
    let mut device = CudaDevice::new(&context)?;
    device.load_move_kernel()?;
    Ok(device)
}

impl ReplayDevice for CudaDevice {
    fn peak_bandwidth(&mut self, live: &[(u64, u64)]) -> Result<Option<PeakBandwidth>> {
        let moves = moves_within(live);
        let bytes: u64 = moves.iter().map(|m| m.len).sum();
        let pool_ns = median_copy_ns(self, &moves)?;
        let mut chunks = Vec::with_capacity(live.len());
        let mut made = Ok(());
        for &(_, size) in live {
            match self.alloc_chunk(size) {
                Ok(ptr) => chunks.push((ptr, size)),
                Err(e) => {
                    made = Err(e).context("cuMemAlloc buffers of the live sizes");
                    break;
                }
            }
        }
        let mem_alloc_ns = made.and_then(|()| median_copy_ns(self, &moves_within(&chunks)));
        for (ptr, size) in chunks {
            self.free_chunk(ptr, size)?;
        }
        let mem_alloc_ns = mem_alloc_ns?;
        let gbps = |ns: u64| {
            if ns == 0 {
                0.0
            } else {
                bytes as f64 / ns as f64
            }
        };
        Ok(Some(PeakBandwidth {
            moves: moves.len(),
            bytes,
            runs: COPY_RUNS,
            pool_gbps: gbps(pool_ns),
            mem_alloc_gbps: gbps(mem_alloc_ns),
            ratio: if mem_alloc_ns == 0 {
                0.0
            } else {
                mem_alloc_ns as f64 / pool_ns.max(1) as f64
            },
        }))
    }

    fn sibling(&self) -> Result<Self> {
        Ok(CudaDevice::new(self.context())?)
    }
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
