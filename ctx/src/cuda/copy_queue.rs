//! How a [`super::CudaDevice`] copies device memory: a batch of moves queued on the
//! legacy default stream without waiting between them, and one wait at the end.
//!
//! Runs of moves that may go together ([`crate::copy::batches`]) are one launch of the
//! `move_blocks` kernel each (`kernels::moves`), up to [`MAX_MOVES`] moves a launch;
//! runs that form a slide are one launch of `slide_blocks` each, which orders the
//! moves inside the launch through a small buffer of marks (zeroed by a
//! `cuMemsetD32Async` before each launch); every other move is `cuMemcpyDtoDAsync`,
//! cut into steps by [`crate::copy::steps`] when it overlaps itself. Queuing
//! everything before waiting once lets the device run the copies back to back, and
//! the kernels copy many small blocks at the bandwidth of one large copy. When the
//! kernels cannot be loaded (the driver refuses the PTX), everything goes through
//! `cuMemcpyDtoDAsync`; [`super::CudaDevice::move_kernel_error`] says why.

use std::time::{Duration, Instant};

use cust::sys::CUdeviceptr;
use kernels::moves::{
    BlockMove, MAX_MOVES, MOVE_BLOCKS, MoveBlocksParams, SLIDE_BLOCKS, SlideBlocksParams,
};

use super::{
    CudaContext, Function, LaunchConfig,
    driver::{self, check},
    stream::EventTimer,
};
use crate::copy::{self, Batch, CopyStep, SCRATCH_BYTES};
use crate::{Error, Result};

/// Fewest `u32` marks the slide kernel's buffer is allocated for (1 MiB of chunks
/// is 32 GiB of moves), so it is rarely allocated twice.
const SLIDE_SYNC_WORDS: u64 = 1 << 18;

/// What the copies of a [`super::CudaDevice`] have been so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CopyCalls {
    /// Batches handed over (`copy_moves` calls; `copy_within` is a batch of one).
    pub batches: u64,
    /// Moves in them.
    pub moves: u64,
    /// Bytes the moves copied.
    pub bytes: u64,
    /// Launches of the `move_blocks` kernel.
    pub launches: u64,
    /// Moves those launches copied.
    pub launched_moves: u64,
    /// Launches of the `slide_blocks` kernel.
    pub slide_launches: u64,
    /// Moves those launches copied.
    pub slid_moves: u64,
    /// `cuMemcpyDtoDAsync` calls (a bounce through the scratch buffer is two).
    pub memcpys: u64,
    /// Pieces of self-overlapping moves bounced through the scratch buffer.
    pub bounces: u64,
    /// Host time spent loading the kernel's module (its PTX is compiled then),
    /// microseconds.
    pub kernel_load_micros: u64,
    /// Host time of the batches, from the call until the device reported them done,
    /// nanoseconds.
    pub host_nanos: u64,
    /// Of that, the time until the last copy was queued (checking the ranges,
    /// grouping the moves, building parameters, launching), nanoseconds.
    pub queue_nanos: u64,
    /// Device time of the batches, between an event recorded before the first copy
    /// and one after the last, nanoseconds; 0 for a batch whose events failed.
    pub device_nanos: u64,
}

impl CopyCalls {
    /// What happened between `earlier` (a snapshot of the same device) and `self`.
    pub fn since(&self, earlier: &CopyCalls) -> CopyCalls {
        CopyCalls {
            batches: self.batches.saturating_sub(earlier.batches),
            moves: self.moves.saturating_sub(earlier.moves),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            launches: self.launches.saturating_sub(earlier.launches),
            launched_moves: self.launched_moves.saturating_sub(earlier.launched_moves),
            slide_launches: self.slide_launches.saturating_sub(earlier.slide_launches),
            slid_moves: self.slid_moves.saturating_sub(earlier.slid_moves),
            memcpys: self.memcpys.saturating_sub(earlier.memcpys),
            bounces: self.bounces.saturating_sub(earlier.bounces),
            kernel_load_micros: self
                .kernel_load_micros
                .saturating_sub(earlier.kernel_load_micros),
            host_nanos: self.host_nanos.saturating_sub(earlier.host_nanos),
            queue_nanos: self.queue_nanos.saturating_sub(earlier.queue_nanos),
            device_nanos: self.device_nanos.saturating_sub(earlier.device_nanos),
        }
    }
}

/// The copy kernels, loaded on first need.
#[derive(Debug)]
enum MoveKernel {
    NotLoaded,
    Ready {
        /// `move_blocks`.
        moves: Function,
        /// `slide_blocks`.
        slide: Function,
    },
    /// Loading or launching failed; the error, returned by later loads and kept for
    /// reports.
    Unavailable(Error),
}

/// The copying half of a [`super::CudaDevice`]: its kernel, its scratch buffer and
/// its counts.
#[derive(Debug)]
pub(crate) struct CopyQueue {
    context: CudaContext,
    kernel: MoveKernel,
    /// The bounce buffer for overlapping copies, once allocated.
    scratch: Option<CUdeviceptr>,
    /// The slide kernel's counter and marks, once allocated: address and `u32`
    /// words.
    slide_sync: Option<(CUdeviceptr, u64)>,
    /// Events timing each batch, made at the first.
    timer: BatchTimer,
    calls: CopyCalls,
}

/// The events that time a copy batch on the device.
#[derive(Debug)]
enum BatchTimer {
    /// No batch yet: the events are made at the first.
    Unmade,
    /// The driver refused them: batches are waited for without timing.
    Refused,
    /// Made; each batch is timed.
    Ready(EventTimer),
}

fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}

fn to_usize(bytes: u64) -> Result<usize> {
    driver::size_t("cuMemcpyDtoDAsync", bytes)
}

impl CopyQueue {
    pub(crate) fn new(context: &CudaContext) -> Self {
        CopyQueue {
            context: context.clone(),
            kernel: MoveKernel::NotLoaded,
            scratch: None,
            slide_sync: None,
            timer: BatchTimer::Unmade,
            calls: CopyCalls::default(),
        }
    }

    pub(crate) fn calls(&self) -> CopyCalls {
        self.calls
    }

    /// Why the kernel is not used, once loading (or a launch) failed.
    pub(crate) fn kernel_error(&self) -> Option<&Error> {
        match &self.kernel {
            MoveKernel::Unavailable(error) => Some(error),
            _ => None,
        }
    }

    /// Loads the kernel now unless that was tried before; the error if it is not
    /// usable.
    pub(crate) fn load_kernel(&mut self) -> Result<()> {
        if let MoveKernel::NotLoaded = self.kernel {
            let start = Instant::now();
            let loaded = self
                .context
                .load_ptx(kernels::moves::MODULE.name, kernels::moves::MODULE.ptx)
                .and_then(|module| {
                    let moves = module.function(MOVE_BLOCKS.name())?;
                    let slide = module.function(SLIDE_BLOCKS.name())?;
                    // Under lazy loading (the driver's default) the code reaches the
                    // device at its first launch; empty launches now keep that out of
                    // the first compaction (its cost is in `kernel_load_micros`).
                    let empty = MoveBlocksParams::new(&[]).ok_or_else(|| {
                        Error::Inconsistent(
                            "move_blocks has no parameters for an empty launch".into(),
                        )
                    })?;
                    let empty_slide = SlideBlocksParams {
                        moves: empty,
                        sync: 0,
                    };
                    let config =
                        |shape: kernels::LaunchShape| LaunchConfig::linear(shape.grid, shape.block);
                    moves.launch(
                        &config(empty.launch_shape()),
                        MOVE_BLOCKS.param_bytes(&empty),
                        None,
                    )?;
                    slide.launch(
                        &config(empty_slide.launch_shape()),
                        SLIDE_BLOCKS.param_bytes(&empty_slide),
                        None,
                    )?;
                    self.context.synchronize()?;
                    Ok(MoveKernel::Ready { moves, slide })
                });
            self.calls.kernel_load_micros += start.elapsed().as_micros() as u64;
            self.kernel = match loaded {
                Ok(ready) => ready,
                Err(error) => MoveKernel::Unavailable(error),
            };
        }
        match &self.kernel {
            MoveKernel::Ready { .. } => Ok(()),
            MoveKernel::Unavailable(error) => Err(error.clone()),
            MoveKernel::NotLoaded => Err(Error::Inconsistent(
                "the move_blocks kernel was neither loaded nor refused".into(),
            )),
        }
    }

    /// Queues `moves` (memmove semantics, in order) and waits until the device has
    /// done them. The caller has checked that every range lies in memory the device
    /// owns (from `started`, which the host time counts from); the context is current.
    ///
    /// Each batch is queued as soon as it is formed, so the device starts copying
    /// while the host still groups the rest. Events around the copies time them on
    /// the device ([`CopyCalls::device_nanos`]).
    pub(crate) fn copy(&mut self, moves: &[BlockMove], started: Instant) -> Result<()> {
        self.calls.batches += 1;
        self.calls.moves += moves.len() as u64;
        self.calls.bytes += moves.iter().map(|m| m.len).sum::<u64>();
        if matches!(self.timer, BatchTimer::Unmade) {
            self.timer =
                EventTimer::new(&self.context).map_or(BatchTimer::Refused, BatchTimer::Ready);
        }
        // Out of `self` while the copies are queued, back in before returning.
        let timer = match std::mem::replace(&mut self.timer, BatchTimer::Refused) {
            BatchTimer::Ready(timer) => Some(timer),
            BatchTimer::Unmade | BatchTimer::Refused => None,
        };
        let timed = timer
            .as_ref()
            .is_some_and(|t| t.start(std::ptr::null_mut()).is_ok());
        let queued = self.queue(moves);
        self.calls.queue_nanos += nanos(started.elapsed());
        let waited = match (queued, &timer) {
            (Err(error), _) => Err(error),
            (Ok(()), Some(timer)) if timed => timer.stop(std::ptr::null_mut()).map(|device| {
                self.calls.device_nanos += nanos(device);
            }),
            // SAFETY: the null stream is the context's legacy default stream, always
            // valid; the context is current.
            (Ok(()), _) => check("cuStreamSynchronize", unsafe {
                driver::cuStreamSynchronize(std::ptr::null_mut())
            }),
        };
        self.timer = timer.map_or(BatchTimer::Refused, BatchTimer::Ready);
        self.calls.host_nanos += nanos(started.elapsed());
        waited
    }

    /// Queues every copy of `moves`, batch after batch.
    fn queue(&mut self, moves: &[BlockMove]) -> Result<()> {
        for batch in copy::batches(moves, MAX_MOVES) {
            match batch {
                Batch::Together(run) => {
                    if !self.launch(&run)? {
                        for m in &run {
                            self.copy_disjoint(m.src, m.dst, m.len)?;
                        }
                    }
                }
                Batch::Slide(run) => {
                    if !self.launch_slide(&run)? {
                        for m in run {
                            self.copy_alone(m)?;
                        }
                    }
                }
                Batch::Alone(m) => self.copy_alone(m)?,
            }
        }
        Ok(())
    }

    /// One launch of the slide kernel for `run` (at most [`MAX_MOVES`] moves that
    /// form a slide), after zeroing its marks; `false` if the kernel is not usable or
    /// its buffer cannot be had, so the caller copies the moves itself.
    fn launch_slide(&mut self, run: &[BlockMove]) -> Result<bool> {
        if self.load_kernel().is_err() {
            return Ok(false);
        }
        if !SlideBlocksParams::is_slide(run) {
            return Ok(false);
        }
        let Some(moves) = MoveBlocksParams::new(run) else {
            return Ok(false);
        };
        let mut params = SlideBlocksParams { moves, sync: 0 };
        let words = params.sync_words();
        let Some(sync) = self.slide_sync(words)? else {
            return Ok(false);
        };
        params.sync = sync;
        let MoveKernel::Ready { slide, .. } = &self.kernel else {
            return Ok(false);
        };
        // SAFETY: `sync` is a buffer of at least `words` u32 words we allocated; the
        // null stream is the legacy default stream, which orders the memset after
        // earlier launches that used the buffer and before this one.
        check("cuMemsetD32Async", unsafe {
            driver::cuMemsetD32Async(sync, 0, to_usize(words)?, std::ptr::null_mut())
        })?;
        let shape = params.launch_shape();
        let config = LaunchConfig::linear(shape.grid, shape.block);
        match slide.launch(&config, SLIDE_BLOCKS.param_bytes(&params), None) {
            Ok(()) => {
                self.calls.slide_launches += 1;
                self.calls.slid_moves += params.moves.count;
                Ok(true)
            }
            Err(error) => {
                self.kernel = MoveKernel::Unavailable(error);
                Ok(false)
            }
        }
    }

    /// The slide kernel's buffer, with room for `words` marks: allocated (or
    /// replaced by a larger one) now if need be; `None` if the device cannot spare
    /// it.
    fn slide_sync(&mut self, words: u64) -> Result<Option<CUdeviceptr>> {
        if let Some((address, have)) = self.slide_sync {
            if have >= words {
                return Ok(Some(address));
            }
            // Launches queued before may still use it.
            // SAFETY: the null stream is the legacy default stream; the context is
            // current.
            check("cuStreamSynchronize", unsafe {
                driver::cuStreamSynchronize(std::ptr::null_mut())
            })?;
            // SAFETY: a buffer cuMemAlloc gave us, no longer in use.
            check("cuMemFree", unsafe { driver::cuMemFree_v2(address) })?;
            self.slide_sync = None;
        }
        let want = words.max(SLIDE_SYNC_WORDS);
        let mut address: CUdeviceptr = 0;
        // SAFETY: `address` is a valid out-pointer; the context is current.
        let code = unsafe { driver::cuMemAlloc_v2(&mut address, to_usize(want * 4)?) };
        if check("cuMemAlloc", code).is_err() {
            return Ok(None);
        }
        self.slide_sync = Some((address, want));
        Ok(Some(address))
    }

    /// One launch of the kernel for `run` (at most [`MAX_MOVES`] independent moves);
    /// `false` if the kernel is not usable, so the caller copies them itself.
    fn launch(&mut self, run: &[BlockMove]) -> Result<bool> {
        if self.load_kernel().is_err() {
            return Ok(false);
        }
        let MoveKernel::Ready {
            moves: function, ..
        } = &self.kernel
        else {
            return Ok(false);
        };
        let Some(params) = MoveBlocksParams::new(run) else {
            // More chunks than one launch numbers (tens of TiB): copy them one by one.
            return Ok(false);
        };
        let shape = params.launch_shape();
        let config = LaunchConfig::linear(shape.grid, shape.block);
        // Launch errors are reported when queuing, before anything of this run ran:
        // the copies can still go another way. Faults inside the kernel surface at the
        // final synchronization.
        match function.launch(&config, MOVE_BLOCKS.param_bytes(&params), None) {
            Ok(()) => {
                self.calls.launches += 1;
                self.calls.launched_moves += params.count;
                Ok(true)
            }
            Err(error) => {
                self.kernel = MoveKernel::Unavailable(error);
                Ok(false)
            }
        }
    }

    /// The scratch buffer, allocated now if need be; `None` when the device cannot
    /// spare it, in which case overlapping copies go in distance-sized pieces instead.
    fn scratch(&mut self) -> Option<CUdeviceptr> {
        if self.scratch.is_none() {
            let mut address: CUdeviceptr = 0;
            // SAFETY: `address` is a valid out-pointer; the context is current (the
            // caller bound it).
            let code = unsafe { driver::cuMemAlloc_v2(&mut address, SCRATCH_BYTES as usize) };
            if check("cuMemAlloc", code).is_ok() {
                self.scratch = Some(address);
            }
        }
        self.scratch
    }

    /// One move that may overlap itself, in the steps [`copy::steps`] cuts.
    fn copy_alone(&mut self, m: BlockMove) -> Result<()> {
        let mut steps = copy::steps(m.src, m.dst, m.len, SCRATCH_BYTES);
        let needs_scratch = steps
            .iter()
            .any(|s| matches!(s, CopyStep::ViaScratch { .. }));
        let scratch = if needs_scratch { self.scratch() } else { None };
        if needs_scratch && scratch.is_none() {
            steps = copy::steps(m.src, m.dst, m.len, 0);
        }
        for step in steps {
            match (step, scratch) {
                (CopyStep::Direct { src, dst, len }, _) => self.copy_disjoint(src, dst, len)?,
                (CopyStep::ViaScratch { src, dst, len }, Some(scratch)) => {
                    self.copy_disjoint(src, scratch, len)?;
                    self.copy_disjoint(scratch, dst, len)?;
                    self.calls.bounces += 1;
                }
                (CopyStep::ViaScratch { .. }, None) => {
                    return Err(Error::Inconsistent(
                        "a copy plan bounces through a scratch buffer that does not exist".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// One `cuMemcpyDtoDAsync` on the legacy default stream between ranges that do
    /// not overlap.
    fn copy_disjoint(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        let bytes = to_usize(len)?;
        // SAFETY: both ranges lie in memory this device owns (checked by the caller, or
        // the scratch buffer, which it also owns) and do not overlap; the null stream is
        // the legacy default stream; the memory stays allocated until the final
        // synchronization, since freeing it synchronizes first.
        check("cuMemcpyDtoDAsync", unsafe {
            driver::cuMemcpyDtoDAsync_v2(dst, src, bytes, std::ptr::null_mut())
        })?;
        self.calls.memcpys += 1;
        Ok(())
    }
}

impl Drop for CopyQueue {
    fn drop(&mut self) {
        let buffers: Vec<CUdeviceptr> = self
            .scratch
            .take()
            .into_iter()
            .chain(self.slide_sync.take().map(|(address, _)| address))
            .collect();
        // Copies using the buffers may still be queued after a failed batch.
        if buffers.is_empty() || self.context.synchronize().is_err() {
            return;
        }
        for buffer in buffers {
            // SAFETY: a buffer cuMemAlloc gave us; the device is idle. Drop cannot
            // report a failure.
            let _ = unsafe { driver::cuMemFree_v2(buffer) };
        }
    }
}
