//! Events recorded on streams that other code created (PyTorch's `cudaStream_t`), so an
//! allocator can tell, without blocking, when the work queued on a stream before a
//! point has completed.

use std::ffi::c_void;

use cust::sys::{CUevent, CUstream};

use super::{
    CudaContext,
    driver::{self, check},
};
use crate::{Result, StreamId};

/// `CU_EVENT_DISABLE_TIMING`: events that only order work are cheaper to record.
const EVENT_DISABLE_TIMING: u32 = 2;

/// A stream handle made by other code in the process (a `cudaStream_t` is a
/// `CUstream`), or one of the special handles: null for the legacy default stream,
/// `CU_STREAM_PER_THREAD`.
///
/// Only [`ForeignStream::from_raw`] makes one, and it is `unsafe`: the handle cannot be
/// checked, so whoever passes it vouches for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ForeignStream {
    /// The handle as an integer, so the type is `Send` and hashable.
    raw: usize,
}

impl ForeignStream {
    /// Wraps a stream handle received from other code.
    ///
    /// # Safety
    ///
    /// `raw` is null, a special stream handle, or a stream of the device's primary
    /// context that stays alive for as long as events may be recorded on it through this
    /// value (PyTorch's pluggable allocator passes such handles: a tensor's stream lives
    /// until its memory is freed).
    pub unsafe fn from_raw(raw: *mut c_void) -> Self {
        ForeignStream { raw: raw as usize }
    }

    /// The handle as a [`StreamId`], to name the stream in maps and reports.
    pub fn id(self) -> StreamId {
        StreamId(self.raw as u64)
    }

    fn raw(self) -> CUstream {
        self.raw as CUstream
    }
}

/// A CUDA event without timing, of one context; destroyed on drop.
///
/// Recorded on a stream, it completes once all work queued on that stream before the
/// record has completed: [`Event::query`] asks without blocking, [`Event::synchronize`]
/// waits.
#[derive(Debug)]
pub struct Event {
    context: CudaContext,
    raw: CUevent,
}

// SAFETY: a CUevent is a driver handle the driver accepts from any thread that has its
// context current; every use binds the context first.
unsafe impl Send for Event {}

impl Event {
    /// Creates an event in `context` (it completes at once until first recorded).
    pub fn new(context: &CudaContext) -> Result<Self> {
        context.bind()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the flags are a declared value.
        check("cuEventCreate", unsafe {
            driver::cuEventCreate(&mut raw, EVENT_DISABLE_TIMING)
        })?;
        Ok(Event {
            context: context.clone(),
            raw,
        })
    }

    /// Records the event on `stream`: it completes once the work queued there so far has.
    pub fn record(&self, stream: ForeignStream) -> Result<()> {
        self.context.bind()?;
        // SAFETY: `raw` is a live event of the current context; `stream` is a live stream
        // of that context or a special handle, as `ForeignStream::from_raw` requires.
        check("cuEventRecord", unsafe {
            driver::cuEventRecord(self.raw, stream.raw())
        })
    }

    /// Whether the work before the last record has completed; never blocks.
    pub fn query(&self) -> Result<bool> {
        self.context.bind()?;
        // SAFETY: `raw` is a live event of the current context.
        let code = unsafe { driver::cuEventQuery(self.raw) };
        match code {
            driver::SUCCESS => Ok(true),
            driver::NOT_READY => Ok(false),
            code => check("cuEventQuery", code).map(|()| false),
        }
    }

    /// Waits until the work before the last record has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.context.bind()?;
        // SAFETY: `raw` is a live event of the current context.
        check("cuEventSynchronize", unsafe {
            driver::cuEventSynchronize(self.raw)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.context.bind().is_ok() {
            // SAFETY: a live event we created; the driver lets a pending record finish
            // first. Drop cannot report a failure.
            let _ = unsafe { driver::cuEventDestroy_v2(self.raw) };
        }
    }
}
