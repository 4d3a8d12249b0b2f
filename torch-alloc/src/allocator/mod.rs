//! [`DeviceAllocator`]: one device's memory behind PyTorch's allocator interface,
//! on either [`Backing`], stream ordered, with CUDA graphs' private pools and
//! PyTorch's figures.
//!
//! Stream order. While only one stream has used the device, a free goes straight
//! back to the pool: that stream reuses it at once, in order, and there is nobody
//! else. When a second stream first shows up, the allocator waits (once) for the work
//! queued on the first, since the pool's free memory came from it; from then on a
//! freed block waits in [`order`] until its stream's work before the free has
//! completed (asked at every request, never waited for, except before reporting out
//! of memory and in [`DeviceAllocator::empty_cache`]). A free goes to the stream the
//! block was allocated on; other streams that use it say so with
//! [`DeviceAllocator::record_stream`].
//!
//! CUDA graphs. Between [`DeviceAllocator::begin_allocate_to_pool`] and
//! [`DeviceAllocator::end_allocate_to_pool`] the allocator records and asks no event
//! (a capture forbids asking for, waiting for, and recording on capturing streams);
//! blocks freed then are fenced at the end. Requests naming a private pool are served
//! from it ([`private`]); requests on a capturing stream outside any pool never wait.

mod figures;
mod graphs;
mod order;
mod private;
mod request;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use memcore::Allocation;

use crate::backing::{Backing, Figures, is_out_of_memory};
use crate::device_stats::DeviceStats;
use crate::error::{Error, Result};
use crate::events::StreamEvents;
use crate::explain::Explanation;
use crate::facts::DeviceFacts;
use crate::history::{NO_CONTEXT, TraceAction};
use crate::oom::Headline;
use crate::pool_id::PoolId;
use figures::verdict;
use graphs::Checkpoint;
use memcore::pytorch;
use order::StreamOrder;
use private::PrivatePools;

pub use figures::AllocatorStats;
pub use graphs::Restored;
pub use private::SEGMENT_BYTES;
pub use request::{Outcome, Request};

/// Where a block's memory comes from.
#[derive(Debug, Clone, Copy)]
enum Origin<T> {
    /// The backing, as one block.
    Device(T),
    /// A private pool's segment.
    Private {
        pool: PoolId,
        allocation: Allocation,
    },
}

impl<T> Origin<T> {
    fn pool(&self) -> PoolId {
        match self {
            Origin::Device(_) => PoolId::DEFAULT,
            Origin::Private { pool, .. } => *pool,
        }
    }
}

/// A block handed out, or freed and waiting for streams.
#[derive(Debug, Clone)]
struct Block<T, S> {
    origin: Origin<T>,
    ptr: u64,
    /// Its bytes.
    bytes: u64,
    /// What the caller asked for, bytes.
    requested: u64,
    /// Where it was allocated (and is freed).
    stream: S,
    /// Other streams that used it (`record_stream`).
    uses: Vec<S>,
    /// The stack it was allocated at (held in the history), or [`NO_CONTEXT`].
    context: u64,
}

/// Which streams have used the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Streams<S> {
    /// None yet, or only this one: frees go straight to the pool.
    One(Option<S>),
    /// Several: frees wait for their streams.
    Many,
}

/// Counts kept for [`AllocatorStats`], never reset.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    live_bytes: u64,
    peak_live_bytes: u64,
    allocations: u64,
    frees: u64,
    ooms: u64,
    errors: u64,
}

#[derive(Debug)]
struct State<T, E: StreamEvents> {
    events: E,
    streams: Streams<E::Stream>,
    live: HashMap<u64, Block<T, E::Stream>>,
    order: StreamOrder<T, E>,
    pools: PrivatePools<T, E::Stream>,
    /// Begin-to-end spans open: while any is, no event is recorded or asked for.
    underway: u32,
    stats: DeviceStats,
    /// The backing's peak mapped bytes at the last peak reset.
    peak_at_reset: u64,
    /// The backing's device allocations and frees at the last accumulated reset.
    device_calls_at_reset: (u64, u64),
    counts: Counts,
    /// Mapped bytes allowed (`set_memory_fraction`); `None`: the whole device.
    cap: Option<(f64, u64)>,
    history: crate::history::History,
    checkpoints: HashMap<u64, Checkpoint<E::Stream>>,
    next_checkpoint: u64,
}

/// One device's allocator; see the [module docs](self). `Send + Sync`: its state sits
/// behind one mutex, taken before the backing's.
///
/// ```
/// use cudamem_torch::{DeviceAllocator, Request, Settings, SimStreams, backing};
/// use ctx::{SimConfig, SimDevice, StreamId};
///
/// let streams = SimStreams::default();
/// let pool = backing::tlsf_pool(SimDevice::new(SimConfig::small(64 << 20)), &Settings::default())?;
/// let alloc = DeviceAllocator::new(0, pool, streams)?;
/// let a = alloc.allocate(Request::new(1000, StreamId(0)))?;
/// alloc.free(a.ptr, 0)?;
/// assert_eq!(alloc.allocate(Request::new(1000, StreamId(0)))?.ptr, a.ptr); // same stream: reused at once
/// assert_eq!(alloc.device_stats().allocated_bytes.aggregate.current, 1024);
/// # Ok::<(), cudamem_torch::Error>(())
/// ```
#[derive(Debug)]
pub struct DeviceAllocator<B: Backing, E: StreamEvents> {
    device: i32,
    backing: B,
    /// The device's memory, bytes.
    total_bytes: u64,
    state: Mutex<State<B::Token, E>>,
}

impl<B: Backing, E: StreamEvents> DeviceAllocator<B, E> {
    /// An allocator for `device` (its number, for messages) on `backing`, with
    /// `events` on the device's streams.
    ///
    /// Every method leaves the calling thread's current context as it found it.
    pub fn new(device: i32, backing: B, events: E) -> Result<Self> {
        let total_bytes = backing.mem_info()?.total;
        Ok(Self {
            device,
            backing,
            total_bytes,
            state: Mutex::new(State {
                events,
                streams: Streams::One(None),
                live: HashMap::new(),
                order: StreamOrder::default(),
                pools: PrivatePools::new(device),
                underway: 0,
                stats: DeviceStats::default(),
                peak_at_reset: 0,
                device_calls_at_reset: (0, 0),
                counts: Counts::default(),
                cap: None,
                history: crate::history::History::default(),
                checkpoints: HashMap::new(),
                next_checkpoint: 1,
            }),
        })
    }

    /// The device's number.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The pool underneath.
    pub fn backing(&self) -> &B {
        &self.backing
    }

    fn state(&self) -> MutexGuard<'_, State<B::Token, E>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current<R>(&self, work: impl FnOnce(&mut State<B::Token, E>) -> Result<R>) -> Result<R> {
        <B::Device as DeviceFacts>::keeping_current(|| work(&mut self.state()))
    }

    /// Serves `request`: a block of at least `request.size` bytes (rounded up to 512)
    /// at a device address (never 0) that stays put until freed. Out of memory is
    /// [`Error::OutOfMemory`], with the device's ledger; the allocator is intact after.
    pub fn allocate(&self, request: Request<E::Stream>) -> Result<Outcome> {
        self.current(|state| {
            state.history.received(request.context);
            let served = self.serve(state, &request);
            state.history.release(request.context);
            served
        })
    }

    fn serve(
        &self,
        state: &mut State<B::Token, E>,
        request: &Request<E::Stream>,
    ) -> Result<Outcome> {
        let quiet = state.underway > 0 || request.capturing;
        if !quiet {
            state.note_stream(request.stream)?;
            self.take_completed(state)?;
        }
        let placed = if request.pool.is_private() {
            self.place_private(state, request, quiet)
        } else {
            self.place(state, request, quiet)
        };
        let (origin, ptr, bytes) = match placed {
            Ok(placed) => placed,
            Err(error) => {
                if !matches!(error, Error::OutOfMemory { .. }) {
                    state.counts.errors += 1;
                }
                return Err(error);
            }
        };
        let context = if state.history.keeps_block_stacks() {
            state.history.hold(request.context);
            request.context
        } else {
            NO_CONTEXT
        };
        let stream = E::number(request.stream);
        state.history.record(
            TraceAction::Alloc,
            ptr,
            request.size,
            stream,
            origin.pool(),
            request.context,
        );
        state.stats.block_allocated(bytes, request.size);
        let counts = &mut state.counts;
        counts.allocations += 1;
        counts.live_bytes += bytes;
        counts.peak_live_bytes = counts.peak_live_bytes.max(counts.live_bytes);
        state.live.insert(
            ptr,
            Block {
                origin,
                ptr,
                bytes,
                requested: request.size,
                stream: request.stream,
                uses: Vec::new(),
                context,
            },
        );
        Ok(state.outcome(ptr, bytes))
    }

    /// A block of the device's own pool: a freed one of the same stream, or new.
    fn place(
        &self,
        state: &mut State<B::Token, E>,
        request: &Request<E::Stream>,
        quiet: bool,
    ) -> Result<(Origin<B::Token>, u64, u64)> {
        let bytes = pytorch::round_size(request.size);
        if let Some(block) = state.order.take_own(request.stream, bytes) {
            state.retire(&block, NO_CONTEXT);
            return Ok((block.origin, block.ptr, block.bytes));
        }
        if let Some((token, ptr)) = self.take_from_backing(state, bytes, request, quiet)? {
            return Ok((Origin::Device(token), ptr, bytes));
        }
        // As PyTorch does before it raises: pools made with `use_on_oom` serve it.
        for pool in state.pools.used_on_oom() {
            if let Some(allocation) = state.pools.try_place(pool, request.stream, bytes)? {
                return Ok((
                    Origin::Private { pool, allocation },
                    allocation.offset,
                    bytes,
                ));
            }
        }
        Err(self.refused(state, request))
    }

    /// A block of the request's private pool, which takes a segment when it is full.
    fn place_private(
        &self,
        state: &mut State<B::Token, E>,
        request: &Request<E::Stream>,
        quiet: bool,
    ) -> Result<(Origin<B::Token>, u64, u64)> {
        let pool = request.pool;
        let bytes = state
            .pools
            .block_bytes(pool, pytorch::round_size(request.size))
            .ok_or_else(|| self.refused(state, request))?;
        let placed = |state: &mut State<B::Token, E>| {
            state.pools.try_place(pool, request.stream, bytes).map(|a| {
                a.map(|allocation| {
                    (
                        Origin::Private { pool, allocation },
                        allocation.offset,
                        bytes,
                    )
                })
            })
        };
        if let Some(found) = placed(state)? {
            return Ok(found);
        }
        let segment = private::segment_bytes(bytes).ok_or_else(|| self.refused(state, request))?;
        let Some((token, ptr)) = self.take_from_backing(state, segment, request, quiet)? else {
            return Err(self.refused(state, request));
        };
        if let Err(error) = state
            .pools
            .add_segment(pool, request.stream, token, ptr, segment)
        {
            self.backing.free(token)?;
            return Err(error);
        }
        let stream = E::number(request.stream);
        state.history.record(
            TraceAction::SegmentAlloc,
            ptr,
            segment,
            stream,
            pool,
            request.context,
        );
        placed(state)?.ok_or(Error::Ctx(ctx::Error::Memcore(memcore::Error::Corrupt(
            "a private pool refused a block its new segment holds",
        ))))
    }

    /// `bytes` from the backing, under the memory fraction; refused, it tries once more
    /// (unless `quiet`) after waiting for every freed block and giving the device the
    /// idle memory (what [`Self::empty_cache`] gives back). `None`: out of memory, for
    /// the caller to report ([`Self::refused`]).
    fn take_from_backing(
        &self,
        state: &mut State<B::Token, E>,
        bytes: u64,
        request: &Request<E::Stream>,
        quiet: bool,
    ) -> Result<Option<(B::Token, u64)>> {
        let cap = state.cap.map(|(_, cap)| cap);
        if bytes > self.total_bytes {
            return Ok(None);
        }
        let cause = (E::number(request.stream), request.pool, request.context);
        let mut retried = false;
        loop {
            let before = state.held();
            match self.backing.allocate(bytes) {
                Ok((token, ptr)) => {
                    let figures = self.note_mapped(state, ptr, cause);
                    match cap {
                        // Only growth passes the cap: memory mapped before it was set
                        // serves on.
                        Some(cap)
                            if figures.mapped_bytes > cap && figures.mapped_bytes > before =>
                        {
                            self.backing.free(token)?;
                            if !quiet {
                                self.backing.give_back()?;
                            }
                            self.note_mapped(state, ptr, cause);
                        }
                        _ => return Ok(Some((token, ptr))),
                    }
                }
                Err(error) if is_out_of_memory(&error) => {}
                Err(error) => return Err(error.into()),
            }
            let more = !state.order.is_empty()
                || state.pools.has_releasable()
                || self.backing.figures().releasable_bytes > 0;
            if retried || quiet || !more {
                return Ok(None);
            }
            // As PyTorch does before it raises: every freed block back, then what
            // `empty_cache` gives back, then once more.
            self.release_everything(state)?;
            self.backing.give_back()?;
            self.note_mapped(state, 0, cause);
            state.stats.num_alloc_retries += 1;
            retried = true;
        }
    }

    /// Out of memory: counted, traced, explained.
    fn refused(&self, state: &mut State<B::Token, E>, request: &Request<E::Stream>) -> Error {
        state.stats.num_ooms += 1;
        state.counts.ooms += 1;
        let free = self.backing.mem_info().map_or(0, |m| m.free);
        let stream = E::number(request.stream);
        state.history.record(
            TraceAction::Oom,
            free,
            request.size,
            stream,
            request.pool,
            request.context,
        );
        let report = match self.figures(state) {
            Ok((facts, figures)) => {
                let ledger = Explanation::new(&facts, &figures);
                let mut text = ledger.render(self.device, &facts, &figures);
                text.push_str(&verdict(&ledger, &figures, request.size));
                text
            }
            Err(error) => format!("cudamem: (the ledger could not be read: {error})"),
        };
        let held = |v: i64| u64::try_from(v).unwrap_or(0);
        let (total, free) = self
            .backing
            .mem_info()
            .map_or((self.total_bytes, 0), |m| (m.total, m.free));
        let headline = Headline {
            device: self.device,
            requested: request.size,
            total,
            free,
            allocated: held(state.stats.allocated_bytes.aggregate.current),
            allocated_private: state
                .live
                .values()
                .filter(|b| b.origin.pool().is_private())
                .map(|b| b.bytes)
                .sum(),
            reserved: held(state.stats.reserved_bytes.aggregate.current),
            allowed: state.cap.map(|(_, cap)| cap),
        };
        Error::OutOfMemory {
            device: self.device,
            requested: request.size,
            headline: headline.render(),
            report,
        }
    }

    /// Reads what the backing holds now into the figures, tracing a change of its
    /// mapped bytes as a segment map or unmap at `near` (the block that caused it),
    /// for `cause`: the stream (as a number), pool and stack of the request.
    fn note_mapped(
        &self,
        state: &mut State<B::Token, E>,
        near: u64,
        cause: (u64, PoolId, u64),
    ) -> Figures {
        let figures = self.backing.figures();
        let before = u64::try_from(state.stats.reserved_bytes.aggregate.current).unwrap_or(0);
        if figures.mapped_bytes != before {
            let (action, delta) = if figures.mapped_bytes > before {
                (TraceAction::SegmentMap, figures.mapped_bytes - before)
            } else {
                (TraceAction::SegmentUnmap, before - figures.mapped_bytes)
            };
            let (stream, pool, context) = cause;
            state
                .history
                .record(action, near, delta, stream, pool, context);
            state.stats.reserved_bytes.set_held(figures.mapped_bytes);
        }
        state.stats.segment.set_held(figures.segments);
        figures
    }

    /// Waits for every freed block, returns them, and gives released private pools'
    /// free segments back to the backing (after a device-wide wait: a graph replay may
    /// still use them).
    fn release_everything(&self, state: &mut State<B::Token, E>) -> Result<()> {
        let drained = state.order.drain(&mut state.events)?;
        state.stats.num_sync_all_streams += 1;
        for block in drained {
            self.return_block(state, block, NO_CONTEXT)?;
        }
        if state.pools.has_releasable() {
            state.events.synchronize_all()?;
            for (pool, addr, segment) in state.pools.take_releasable() {
                self.backing.free(segment.token)?;
                let stream = E::number(segment.stream);
                state.history.record(
                    TraceAction::SegmentFree,
                    addr,
                    segment.bytes,
                    stream,
                    pool,
                    NO_CONTEXT,
                );
            }
        }
        Ok(())
    }

    /// Returns every freed block whose streams are done.
    fn take_completed(&self, state: &mut State<B::Token, E>) -> Result<()> {
        if state.order.is_empty() {
            return Ok(());
        }
        for block in state.order.take_completed(&mut state.events)? {
            self.return_block(state, block, NO_CONTEXT)?;
        }
        Ok(())
    }

    /// A freed block no stream uses any more goes back to its pool.
    fn return_block(
        &self,
        state: &mut State<B::Token, E>,
        block: Block<B::Token, E::Stream>,
        context: u64,
    ) -> Result<()> {
        match block.origin {
            Origin::Device(token) => self.backing.free(token)?,
            Origin::Private { pool, allocation } => {
                state
                    .pools
                    .give_back(pool, block.stream, allocation, block.bytes)?
            }
        }
        state.retire(&block, context);
        Ok(())
    }

    /// Frees the block at `ptr` (`context`: the stack of the free, or
    /// [`NO_CONTEXT`]). It is reusable at once on its own stream, on other streams
    /// once the work queued on it (and on the streams recorded for it) has completed.
    pub fn free(&self, ptr: u64, context: u64) -> Result<Outcome> {
        self.current(|state| {
            state.history.received(context);
            let freed = self.release_block(state, ptr, context);
            state.history.release(context);
            freed
        })
    }

    fn release_block(
        &self,
        state: &mut State<B::Token, E>,
        ptr: u64,
        context: u64,
    ) -> Result<Outcome> {
        let Some(block) = state.live.remove(&ptr) else {
            state.counts.errors += 1;
            return Err(Error::UnknownPointer { ptr });
        };
        state.stats.block_freed(block.bytes);
        state.counts.frees += 1;
        state.counts.live_bytes -= block.bytes;
        let pool = block.origin.pool();
        if pool.is_private() {
            state.pools.note_freed(pool, ptr);
        }
        let trace_context = if context != NO_CONTEXT {
            context
        } else {
            block.context
        };
        let stream = E::number(block.stream);
        state.history.record(
            TraceAction::FreeRequested,
            ptr,
            block.requested,
            stream,
            pool,
            trace_context,
        );
        let bytes = block.bytes;
        let straight = block.uses.is_empty()
            && (matches!(state.streams, Streams::One(_)) || pool.is_private());
        if straight {
            self.return_block(state, block, context)?;
        } else {
            let fence = state.underway == 0;
            state.order.push(block, fence, &mut state.events)?;
        }
        Ok(state.outcome(ptr, bytes))
    }

    /// `stream` uses the block at `ptr` too (`Tensor.record_stream`): when freed, the
    /// block waits for that stream's work as well.
    pub fn record_stream(&self, ptr: u64, stream: E::Stream) -> Result<()> {
        self.current(|state| {
            let quiet = state.underway > 0;
            let Some(block) = state.live.get_mut(&ptr) else {
                state.counts.errors += 1;
                return Err(Error::UnknownPointer { ptr });
            };
            if block.stream == stream || block.uses.contains(&stream) {
                return Ok(());
            }
            block.uses.push(stream);
            if !quiet {
                state.note_stream(stream)?;
            }
            Ok(())
        })
    }

    /// Waits for every freed block, returns them, gives released private pools'
    /// segments back, and gives the device what the pool holds and no block needs
    /// (TLSF: the free pages at the top; stitched: every idle page). Returns the mapped
    /// bytes given back. While a graph is being captured it gives nothing back.
    pub fn empty_cache(&self) -> Result<u64> {
        self.current(|state| {
            if state.underway > 0 {
                return Ok(0);
            }
            let before = self.backing.figures().mapped_bytes;
            self.release_everything(state)?;
            self.backing.give_back()?;
            let after = self
                .note_mapped(state, 0, (0, PoolId::DEFAULT, NO_CONTEXT))
                .mapped_bytes;
            Ok(before.saturating_sub(after))
        })
    }

    /// Caps the device memory the pool maps at `fraction` of the device's
    /// (`torch.cuda.set_per_process_memory_fraction`); a request that would pass it is
    /// out of memory.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::BadFraction {
                device: self.device,
                fraction,
            });
        }
        let cap = (fraction * self.total_bytes as f64) as u64;
        self.state().cap = Some((fraction, cap));
        Ok(())
    }

    /// The fraction set by [`Self::set_memory_fraction`] (1 when none).
    pub fn memory_fraction(&self) -> f64 {
        self.state().cap.map_or(1.0, |(fraction, _)| fraction)
    }

    /// The block holding `ptr`: its first byte's address and its bytes.
    pub fn block_of(&self, ptr: u64) -> Result<(u64, u64)> {
        let state = self.state();
        match state.live.get(&ptr) {
            Some(block) => Ok((block.ptr, block.bytes)),
            None => Err(Error::UnknownPointer { ptr }),
        }
    }

    /// The physical mappings that back the block starting at `ptr`, `(address, bytes)`
    /// sorted and contiguous: what sharing it with another process exports.
    pub fn block_mappings(&self, ptr: u64) -> Result<Vec<(u64, u64)>> {
        let (start, bytes) = {
            let state = self.state();
            let block = state.live.get(&ptr).ok_or(Error::UnknownPointer { ptr })?;
            (block.ptr, block.bytes)
        };
        let end = start + bytes;
        Ok(self
            .backing
            .mappings()
            .into_iter()
            .filter(|(addr, size)| *addr < end && addr + size > start)
            .collect())
    }

    /// Whether `ptr` lies in the device's reservation (is this allocator's to free).
    pub fn owns(&self, ptr: u64) -> bool {
        let (start, bytes) = self.backing.reservation();
        ptr >= start && ptr - start < bytes
    }
}

impl<T, E: StreamEvents> State<T, E> {
    /// Mapped bytes as last read from the backing (the figures follow every call that
    /// can map).
    fn held(&self) -> u64 {
        u64::try_from(self.stats.reserved_bytes.aggregate.current).unwrap_or(0)
    }

    fn outcome(&self, ptr: u64, bytes: u64) -> Outcome {
        let held = |v: i64| u64::try_from(v).unwrap_or(0);
        Outcome {
            ptr,
            bytes,
            allocated_bytes: held(self.stats.allocated_bytes.aggregate.current),
            reserved_bytes: held(self.stats.reserved_bytes.aggregate.current),
        }
    }

    /// A freed block leaves the active figures and gives up its stack.
    fn retire(&mut self, block: &Block<T, E::Stream>, context: u64) {
        self.stats.block_returned(block.bytes, block.requested);
        let trace_context = if context != NO_CONTEXT {
            context
        } else {
            block.context
        };
        self.history.record(
            TraceAction::FreeCompleted,
            block.ptr,
            block.requested,
            E::number(block.stream),
            block.origin.pool(),
            trace_context,
        );
        self.history.release(block.context);
    }

    /// Notes that `stream` uses the device; the first time a second stream shows up,
    /// waits for the first one's work, whose freed memory the pool holds.
    fn note_stream(&mut self, stream: E::Stream) -> Result<()> {
        match self.streams {
            Streams::One(Some(only)) if only == stream => Ok(()),
            Streams::One(None) => {
                self.streams = Streams::One(Some(stream));
                Ok(())
            }
            Streams::One(Some(_)) => self.go_many(),
            Streams::Many => Ok(()),
        }
    }

    /// From now on frees wait for their streams; the memory freed straight to the
    /// pool so far came from the one stream used, whose work is waited for.
    fn go_many(&mut self) -> Result<()> {
        if let Streams::One(Some(only)) = self.streams {
            let event = self.events.record(only)?;
            let waited = self.events.wait(&event);
            self.events.recycle(event);
            waited?;
        }
        self.streams = Streams::Many;
        Ok(())
    }
}
