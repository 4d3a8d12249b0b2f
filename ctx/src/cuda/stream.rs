//! Streams and the events that time work on them.

use std::time::Duration;

use cust::sys::{CUevent, CUstream};

use super::{
    CudaContext,
    driver::{self, check},
};
use crate::Result;

/// A CUDA stream of the context it was made in; destroyed on drop.
///
/// Created with default flags, so it synchronizes with the legacy default stream, which
/// is where [`super::CudaDevice`] copies run.
#[derive(Debug)]
pub struct Stream {
    context: CudaContext,
    raw: CUstream,
}

// SAFETY: a CUstream is a driver handle the driver accepts from any thread that has its
// context current; every use binds the context first.
unsafe impl Send for Stream {}
// SAFETY: as above; the handle never changes after creation.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream in `context`.
    pub fn new(context: &CudaContext) -> Result<Self> {
        context.bind()?;
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; flags 0 is CU_STREAM_DEFAULT.
        check("cuStreamCreate", unsafe {
            driver::cuStreamCreate(&mut raw, 0)
        })?;
        Ok(Stream {
            context: context.clone(),
            raw,
        })
    }

    /// Waits until all work queued on this stream is done.
    pub fn synchronize(&self) -> Result<()> {
        self.context.bind()?;
        // SAFETY: `raw` is a live stream of the current context.
        check("cuStreamSynchronize", unsafe {
            driver::cuStreamSynchronize(self.raw)
        })
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &CudaContext {
        &self.context
    }

    pub(crate) fn raw(&self) -> CUstream {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.context.bind().is_ok() {
            // SAFETY: `raw` is a live stream we created; the driver lets queued work
            // finish before it frees the stream. Drop cannot report a failure.
            let _ = unsafe { driver::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// A pair of events bracketing work on one stream, for device-side timing.
#[derive(Debug)]
pub(crate) struct EventTimer {
    context: CudaContext,
    start: CUevent,
    end: CUevent,
}

// SAFETY: CUevents are driver handles the driver accepts from any thread that has their
// context current; every use binds the context first.
unsafe impl Send for EventTimer {}

impl EventTimer {
    /// Creates both events in `context`.
    pub(crate) fn new(context: &CudaContext) -> Result<Self> {
        context.bind()?;
        let mut timer = EventTimer {
            context: context.clone(),
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
        };
        // SAFETY: valid out-pointer; flags 0 is CU_EVENT_DEFAULT (timing enabled).
        check("cuEventCreate", unsafe {
            driver::cuEventCreate(&mut timer.start, 0)
        })?;
        // SAFETY: as above.
        check("cuEventCreate", unsafe {
            driver::cuEventCreate(&mut timer.end, 0)
        })?;
        Ok(timer)
    }

    /// Records the start event on `stream` (null: the legacy default stream).
    pub(crate) fn start(&self, stream: CUstream) -> Result<()> {
        self.context.bind()?;
        // SAFETY: `start` is a live event and `stream` a live stream (or null) of this context.
        check("cuEventRecord", unsafe {
            driver::cuEventRecord(self.start, stream)
        })
    }

    /// Records the end event on `stream`, waits for it and returns the time between them.
    pub(crate) fn stop(&self, stream: CUstream) -> Result<Duration> {
        self.context.bind()?;
        // SAFETY: `end` is a live event and `stream` a live stream (or null) of this context.
        check("cuEventRecord", unsafe {
            driver::cuEventRecord(self.end, stream)
        })?;
        // SAFETY: `end` is a live, recorded event.
        check("cuEventSynchronize", unsafe {
            driver::cuEventSynchronize(self.end)
        })?;
        let mut milliseconds = 0f32;
        // SAFETY: valid out-pointer; both events are recorded and complete.
        check("cuEventElapsedTime", unsafe {
            driver::cuEventElapsedTime(&mut milliseconds, self.start, self.end)
        })?;
        Ok(Duration::from_secs_f64(
            f64::from(milliseconds.max(0.0)) / 1e3,
        ))
    }
}

impl Drop for EventTimer {
    fn drop(&mut self) {
        if self.context.bind().is_err() {
            return;
        }
        for event in [self.start, self.end] {
            if !event.is_null() {
                // SAFETY: a live event we created; drop cannot report a failure.
                let _ = unsafe { driver::cuEventDestroy_v2(event) };
            }
        }
    }
}
