//! The real driver (feature `cuda`): [`DeviceFacts`] for ctx's [`CudaDevice`] and
//! [`StreamEvents`] on the streams PyTorch passes in.

use ctx::DeviceMemory;
use ctx::{CudaContext, CudaDevice, Event, ForeignStream};

use crate::Result;
use crate::events::StreamEvents;
use crate::facts::{ContextFacts, DeviceFacts};

/// Events kept for reuse at most, per device: creating one is a driver call.
const SPARE_EVENTS: usize = 1024;

impl DeviceFacts for CudaDevice {
    fn device_count(&self) -> Result<u32> {
        Ok(CudaContext::device_count()?)
    }

    fn context_facts(&self) -> Result<ContextFacts> {
        let context = self.context();
        Ok(ContextFacts {
            profile: context.profile()?,
            limits: context.limits()?,
            mem: self.mem_info()?,
        })
    }

    fn keeping_current<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
        CudaContext::keeping_current(work)?
    }
}

/// CUDA events on the streams of a device's primary context, reused once done.
#[derive(Debug)]
pub struct CudaStreams {
    context: CudaContext,
    spare: Vec<Event>,
    calls: u64,
}

impl CudaStreams {
    /// Events in `context`.
    pub fn new(context: &CudaContext) -> Self {
        Self {
            context: context.clone(),
            spare: Vec::new(),
            calls: 0,
        }
    }
}

impl StreamEvents for CudaStreams {
    type Stream = ForeignStream;
    type Event = Event;

    fn number(stream: ForeignStream) -> u64 {
        stream.id().0
    }

    fn record(&mut self, stream: ForeignStream) -> Result<Event> {
        let event = match self.spare.pop() {
            Some(event) => event,
            None => {
                self.calls += 1;
                Event::new(&self.context)?
            }
        };
        self.calls += 1;
        event.record(stream)?;
        Ok(event)
    }

    fn is_complete(&mut self, event: &Event) -> Result<bool> {
        self.calls += 1;
        Ok(event.query()?)
    }

    fn wait(&mut self, event: &Event) -> Result<()> {
        self.calls += 1;
        Ok(event.synchronize()?)
    }

    fn synchronize_all(&mut self) -> Result<()> {
        self.calls += 1;
        Ok(self.context.synchronize()?)
    }

    fn recycle(&mut self, event: Event) {
        if self.spare.len() < SPARE_EVENTS {
            self.spare.push(event);
        }
    }

    fn calls(&self) -> u64 {
        self.calls
    }
}
