//! Stream order: what the allocator needs to know about streams, and a simulation of it
//! with manual completion for tests.
//!
//! Memory freed on a stream may still be read or written by work queued on that stream
//! before the free. The allocator records an event at the free and hands the memory to
//! another stream only once the event has completed (the rule of `cudaMallocAsync`).

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use ctx::StreamId;

use crate::Result;

/// Events on streams: record, ask without blocking, wait.
pub trait StreamEvents: Send + Debug {
    /// A stream handle.
    type Stream: Copy + Eq + Hash + Debug + Send;
    /// A recorded event.
    type Event: Send + Debug;

    /// The stream's handle as a number (what traces and snapshots show).
    fn number(stream: Self::Stream) -> u64;

    /// An event that completes once the work queued on `stream` so far has.
    fn record(&mut self, stream: Self::Stream) -> Result<Self::Event>;

    /// Whether `event` has completed; never blocks.
    fn is_complete(&mut self, event: &Self::Event) -> Result<bool>;

    /// Waits until `event` has completed.
    fn wait(&mut self, event: &Self::Event) -> Result<()>;

    /// Waits until all work queued on the device so far has completed, on every
    /// stream.
    fn synchronize_all(&mut self) -> Result<()>;

    /// Takes back an event nobody waits for any more, to record it again later.
    fn recycle(&mut self, event: Self::Event);

    /// Driver calls made for events so far.
    fn calls(&self) -> u64;
}

/// Simulated streams whose work completes only when a test says so.
///
/// Each stream counts units of work queued ([`SimStreams::launch`]) and completed
/// ([`SimStreams::complete`]); an event remembers how much was queued when it was
/// recorded. Clones share the streams, so a test keeps one and hands one to the
/// allocator.
///
/// ```
/// use cudamem_torch::{SimStreams, StreamEvents};
/// use ctx::StreamId;
/// let mut streams = SimStreams::default();
/// let s = StreamId(7);
/// streams.launch(s);
/// let event = streams.record(s)?;
/// assert!(!streams.is_complete(&event)?);
/// streams.complete(s);
/// assert!(streams.is_complete(&event)?);
/// # Ok::<(), cudamem_torch::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SimStreams {
    shared: Arc<Mutex<SimState>>,
}

#[derive(Debug, Default)]
struct SimState {
    /// Per stream: (work queued, work completed), in units.
    work: HashMap<StreamId, (u64, u64)>,
    calls: u64,
}

/// An event of [`SimStreams`]: the stream and how much work it had queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimEvent {
    stream: StreamId,
    queued: u64,
}

impl SimStreams {
    fn state(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues one unit of work on `stream`.
    pub fn launch(&self, stream: StreamId) {
        self.state().work.entry(stream).or_default().0 += 1;
    }

    /// Completes all work queued on `stream` so far.
    pub fn complete(&self, stream: StreamId) {
        let mut state = self.state();
        let work = state.work.entry(stream).or_default();
        work.1 = work.0;
    }

    /// Whether all work queued on `stream` so far has completed.
    pub fn is_idle(&self, stream: StreamId) -> bool {
        self.state()
            .work
            .get(&stream)
            .is_none_or(|(queued, done)| done >= queued)
    }
}

impl StreamEvents for SimStreams {
    type Stream = StreamId;
    type Event = SimEvent;

    fn number(stream: StreamId) -> u64 {
        stream.0
    }

    fn record(&mut self, stream: StreamId) -> Result<SimEvent> {
        let mut state = self.state();
        state.calls += 1;
        let queued = state.work.entry(stream).or_default().0;
        Ok(SimEvent { stream, queued })
    }

    fn is_complete(&mut self, event: &SimEvent) -> Result<bool> {
        let mut state = self.state();
        state.calls += 1;
        Ok(state.work.get(&event.stream).map_or(0, |w| w.1) >= event.queued)
    }

    /// Waiting lets the device run: the work before the event completes.
    fn wait(&mut self, event: &SimEvent) -> Result<()> {
        let mut state = self.state();
        state.calls += 1;
        let work = state.work.entry(event.stream).or_default();
        work.1 = work.1.max(event.queued);
        Ok(())
    }

    /// The device runs dry: every stream's work completes.
    fn synchronize_all(&mut self) -> Result<()> {
        let mut state = self.state();
        state.calls += 1;
        for work in state.work.values_mut() {
            work.1 = work.0;
        }
        Ok(())
    }

    fn recycle(&mut self, _event: SimEvent) {}

    fn calls(&self) -> u64 {
        self.state().calls
    }
}
