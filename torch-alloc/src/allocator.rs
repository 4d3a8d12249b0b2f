//! [`DeviceAllocator`]: one device's pool behind PyTorch's malloc and free, stream
//! ordered.
//!
//! While only one stream has used the device, a free goes straight back to the pool:
//! that stream reuses it at once, in order, and there is nobody else. When a second
//! stream first shows up, the allocator waits (once) for the work queued on the first,
//! since the pool's free memory came from it; from then on a free records an event on
//! its stream and the block waits, pending, until the event has completed. A request on
//! stream S is served from S's own pending blocks first (S's later work is ordered after
//! its earlier work), then from the pool; pending blocks of any stream whose events
//! have completed go back to the pool on every request (asked, never waited for). Only
//! before reporting out of memory does the allocator wait for pending events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ctx::{DeviceMemory, Pool, PoolGuard};
use memcore::Handle;

use crate::error::{Error, Result};
use crate::events::StreamEvents;
use crate::explain::{Explanation, PoolFigures};
use crate::facts::DeviceFacts;
use crate::settings::Settings;

/// Every block is aligned to this and every request rounded up to it, bytes (what
/// PyTorch's own allocator does).
pub const BLOCK_ALIGN: u64 = 512;

/// A pending block of the request's stream serves a request of `n` bytes when it has at
/// most `n + n / SAME_STREAM_SLACK` bytes, so reuse wastes at most a quarter.
const SAME_STREAM_SLACK: u64 = 4;

/// The figures of one device's allocator, as `cudamem_stats` returns them. Bytes and
/// counts; `#[repr(C)]`, the layout of `struct cudamem_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocatorStats {
    /// Bytes handed out and not freed (each request rounded up to 512).
    pub live_bytes: u64,
    /// The most `live_bytes` has been.
    pub peak_live_bytes: u64,
    /// Device memory the pool has mapped now (physical).
    pub mapped_bytes: u64,
    /// The most device memory the pool has mapped at once: its footprint.
    pub peak_mapped_bytes: u64,
    /// Freed bytes waiting for their stream's work before other streams may reuse them.
    pub pending_bytes: u64,
    /// The largest free block inside the pool.
    pub largest_free_bytes: u64,
    /// Driver calls that took or gave device memory (VMM create, map, set access, unmap,
    /// release).
    pub memory_driver_calls: u64,
    /// Driver calls for stream order (event record, query, synchronize).
    pub event_calls: u64,
    /// Successful allocations.
    pub allocations: u64,
    /// Successful frees.
    pub frees: u64,
    /// Requests refused for lack of memory.
    pub ooms: u64,
    /// Calls refused for bad arguments (unknown pointer, size mismatch, ...).
    pub errors: u64,
    /// Grants of the pool's mappings to peer devices (`CUDAMEM_PEERS`): one
    /// `cuMemSetAccess` per mapping, covering every peer; also in
    /// `memory_driver_calls`.
    pub peer_access_calls: u64,
}

/// A block handed out.
#[derive(Debug, Clone, Copy)]
struct Live {
    handle: Handle,
    /// The block's size, bytes.
    bytes: u64,
    /// What the caller asked for, bytes.
    requested: u64,
}

/// A freed block waiting for its stream's work.
#[derive(Debug)]
struct Pending<V> {
    handle: Handle,
    ptr: u64,
    bytes: u64,
    event: V,
}

/// One stream's pending blocks.
#[derive(Debug)]
struct StreamPending<V> {
    /// By free order: events of one stream complete in this order.
    by_age: BTreeMap<u64, Pending<V>>,
    /// (bytes, age) for best fit.
    by_size: BTreeSet<(u64, u64)>,
}

impl<V> Default for StreamPending<V> {
    fn default() -> Self {
        Self {
            by_age: BTreeMap::new(),
            by_size: BTreeSet::new(),
        }
    }
}

/// Which streams have used the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Streams<S> {
    /// None yet, or only this one: frees go straight to the pool.
    One(Option<S>),
    /// Several: frees wait for their events.
    Many,
}

#[derive(Debug)]
struct State<E: StreamEvents> {
    events: E,
    streams: Streams<E::Stream>,
    live: HashMap<u64, Live>,
    pending: HashMap<E::Stream, StreamPending<E::Event>>,
    next_age: u64,
    stats: AllocatorStats,
}

/// One device's allocator; see the [module docs](self). `Send + Sync`: its state sits
/// behind one mutex, taken before the pool's.
///
/// ```
/// use cudamem_torch::{DeviceAllocator, Settings, SimStreams};
/// use ctx::{SimConfig, SimDevice, StreamId};
///
/// let streams = SimStreams::default();
/// let alloc = DeviceAllocator::new(
///     0,
///     SimDevice::new(SimConfig::small(64 << 20)),
///     streams.clone(),
///     &Settings::parse(None, None)?,
/// )?;
/// let a = alloc.allocate(1000, StreamId(0))?;
/// alloc.free(a, 1000, StreamId(0))?;
/// assert_eq!(alloc.allocate(1000, StreamId(0))?, a); // same stream: reused at once
/// # Ok::<(), cudamem_torch::Error>(())
/// ```
#[derive(Debug)]
pub struct DeviceAllocator<D: DeviceMemory, E: StreamEvents> {
    device: i32,
    pool: Pool<D>,
    state: Mutex<State<E>>,
}

impl<D: DeviceFacts, E: StreamEvents> DeviceAllocator<D, E> {
    /// An allocator for `device` (its number, for messages): a pool reserving the
    /// device's total memory, rounded up to whole pages, configured by `settings`.
    ///
    /// Every method leaves the calling thread's current context as it found it.
    pub fn new(device: i32, memory: D, events: E, settings: &Settings) -> Result<Self> {
        let page = memory.granularity().max(1);
        let total = memory.mem_info()?.total;
        let reserve = total.div_ceil(page).saturating_mul(page).max(page);
        let peers = settings
            .peers
            .resolve(memory.ordinal(), memory.device_count()?);
        let pool = Pool::new(memory, settings.pool_config(reserve, peers))?;
        Ok(Self {
            device,
            pool,
            state: Mutex::new(State {
                events,
                streams: Streams::One(None),
                live: HashMap::new(),
                pending: HashMap::new(),
                next_age: 0,
                stats: AllocatorStats::default(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State<E>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `size` bytes for use on `stream`; returns the device address (never 0).
    pub fn allocate(&self, size: u64, stream: E::Stream) -> Result<u64> {
        D::keeping_current(|| self.allocate_here(size, stream))
    }

    fn allocate_here(&self, size: u64, stream: E::Stream) -> Result<u64> {
        let bytes = size
            .max(1)
            .checked_next_multiple_of(BLOCK_ALIGN)
            .unwrap_or(u64::MAX);
        let mut state = self.state();
        let state = &mut *state;
        let mut pool = self.pool.lock();
        state.note_stream(stream)?;
        state.release_completed(&mut pool)?;
        let (handle, ptr, bytes) = match state.take_own(stream, bytes) {
            Some(found) => found,
            None => {
                let handle = match pool.allocate(bytes, BLOCK_ALIGN, None) {
                    Err(ctx::Error::OutOfMemory { .. }) if !state.pending.is_empty() => {
                        state.release_all(&mut pool)?;
                        pool.allocate(bytes, BLOCK_ALIGN, None)
                    }
                    other => other,
                };
                let handle = match handle {
                    Ok(handle) => handle,
                    Err(ctx::Error::OutOfMemory { .. }) => {
                        state.stats.ooms += 1;
                        return Err(self.out_of_memory(state, &pool, size));
                    }
                    Err(other) => return Err(other.into()),
                };
                (handle, pool.device_ptr(handle)?, bytes)
            }
        };
        state.live.insert(
            ptr,
            Live {
                handle,
                bytes,
                requested: size,
            },
        );
        let stats = &mut state.stats;
        stats.allocations += 1;
        stats.live_bytes += bytes;
        stats.peak_live_bytes = stats.peak_live_bytes.max(stats.live_bytes);
        Ok(ptr)
    }

    /// Frees `ptr`, allocated with `size` bytes, on `stream`: reusable at once on
    /// `stream`, on other streams once the work queued on `stream` so far has completed.
    pub fn free(&self, ptr: u64, size: u64, stream: E::Stream) -> Result<()> {
        D::keeping_current(|| self.free_here(ptr, size, stream))
    }

    fn free_here(&self, ptr: u64, size: u64, stream: E::Stream) -> Result<()> {
        let mut state = self.state();
        let state = &mut *state;
        let live = match state.live.get(&ptr) {
            Some(live) if live.requested == size => *live,
            found => {
                state.stats.errors += 1;
                return Err(match found {
                    Some(live) => Error::SizeMismatch {
                        device: self.device,
                        ptr,
                        allocated: live.requested,
                        given: size,
                    },
                    None => Error::UnknownPointer {
                        device: self.device,
                        ptr,
                    },
                });
            }
        };
        let mut pool = self.pool.lock();
        state.note_stream(stream)?;
        match state.streams {
            Streams::One(_) => pool.free(live.handle)?,
            Streams::Many => {
                let event = state.events.record(stream)?;
                let age = state.next_age;
                state.next_age += 1;
                let queue = state.pending.entry(stream).or_default();
                queue.by_size.insert((live.bytes, age));
                queue.by_age.insert(
                    age,
                    Pending {
                        handle: live.handle,
                        ptr,
                        bytes: live.bytes,
                        event,
                    },
                );
                state.stats.pending_bytes += live.bytes;
            }
        }
        state.live.remove(&ptr);
        state.stats.live_bytes -= live.bytes;
        state.stats.frees += 1;
        Ok(())
    }

    /// Waits for every pending block's stream, returns them to the pool and gives the
    /// pool's free pages at the top back to the device; returns the bytes given back.
    pub fn empty_cache(&self) -> Result<u64> {
        D::keeping_current(|| self.empty_cache_here())
    }

    fn empty_cache_here(&self) -> Result<u64> {
        let mut state = self.state();
        let mut pool = self.pool.lock();
        state.release_all(&mut pool)?;
        Ok(pool.shrink()?)
    }

    /// The figures now.
    pub fn stats(&self) -> AllocatorStats {
        let state = self.state();
        let pool = self.pool.lock();
        Self::stats_of(&state, &pool)
    }

    fn stats_of(state: &State<E>, pool: &PoolGuard<'_, D>) -> AllocatorStats {
        let figures = pool.stats();
        AllocatorStats {
            mapped_bytes: figures.mapped_bytes,
            peak_mapped_bytes: figures.peak_mapped_bytes,
            largest_free_bytes: figures.heap.largest_free,
            memory_driver_calls: figures.calls.total() + figures.peer_access.calls,
            event_calls: state.events.calls(),
            peer_access_calls: figures.peer_access.calls,
            ..state.stats
        }
    }

    /// The ledger of the device's context with the pool in it, as text.
    pub fn explain(&self) -> Result<String> {
        D::keeping_current(|| {
            let state = self.state();
            let pool = self.pool.lock();
            let (facts, figures) = Self::figures(&state, &pool)?;
            Ok(Explanation::new(&facts, &figures).render(self.device, &facts, &figures))
        })
    }

    fn figures(
        state: &State<E>,
        pool: &PoolGuard<'_, D>,
    ) -> Result<(crate::facts::ContextFacts, PoolFigures)> {
        let facts = pool.device().context_facts()?;
        let figures = PoolFigures {
            live_bytes: state.stats.live_bytes,
            pending_bytes: state.stats.pending_bytes,
            pool: pool.stats(),
        };
        Ok((facts, figures))
    }

    fn out_of_memory(&self, state: &State<E>, pool: &PoolGuard<'_, D>, size: u64) -> Error {
        let report = match Self::figures(state, pool) {
            Ok((facts, figures)) => {
                let ledger = Explanation::new(&facts, &figures);
                let mut text = ledger.render(self.device, &facts, &figures);
                text.push_str(&verdict(&ledger, &figures, size));
                text
            }
            Err(error) => format!("(the ledger could not be read: {error})"),
        };
        Error::OutOfMemory {
            device: self.device,
            requested: size,
            report,
        }
    }
}

/// One line saying which term is to blame.
fn verdict(ledger: &Explanation, figures: &PoolFigures, size: u64) -> String {
    let heap = &figures.pool.heap;
    if heap.free_bytes >= size && heap.largest_free < size {
        format!(
            "cudamem: fragmentation: the pool has {} bytes free but no block of {size}\n",
            heap.free_bytes
        )
    } else if ledger.outside_bytes > ledger.pool_bytes {
        "cudamem: most of the device is held outside the pool (see 'outside the pool')\n".to_owned()
    } else {
        "cudamem: the device is exhausted by live tensors\n".to_owned()
    }
}

impl<E: StreamEvents> State<E> {
    /// Notes that `stream` uses the device; the first time a second stream shows up,
    /// waits for the first one's work, whose freed memory the pool holds.
    fn note_stream(&mut self, stream: E::Stream) -> Result<()> {
        match self.streams {
            Streams::One(Some(only)) if only == stream => Ok(()),
            Streams::One(None) => {
                self.streams = Streams::One(Some(stream));
                Ok(())
            }
            Streams::One(Some(only)) => {
                let event = self.events.record(only)?;
                self.events.wait(&event)?;
                self.events.recycle(event);
                self.streams = Streams::Many;
                Ok(())
            }
            Streams::Many => Ok(()),
        }
    }

    /// Returns to the pool every pending block whose event has completed.
    fn release_completed<D: DeviceMemory>(&mut self, pool: &mut PoolGuard<'_, D>) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let streams: Vec<E::Stream> = self.pending.keys().copied().collect();
        for stream in streams {
            while let Some(done) = self.oldest_if_complete(stream)? {
                self.release(stream, done, pool)?;
            }
        }
        self.pending.retain(|_, queue| !queue.by_age.is_empty());
        Ok(())
    }

    fn oldest_if_complete(&mut self, stream: E::Stream) -> Result<Option<u64>> {
        let Some(queue) = self.pending.get(&stream) else {
            return Ok(None);
        };
        let Some((age, oldest)) = queue.by_age.first_key_value() else {
            return Ok(None);
        };
        Ok(self.events.is_complete(&oldest.event)?.then_some(*age))
    }

    /// Waits for every stream with pending blocks and returns them all to the pool.
    fn release_all<D: DeviceMemory>(&mut self, pool: &mut PoolGuard<'_, D>) -> Result<()> {
        let streams: Vec<E::Stream> = self.pending.keys().copied().collect();
        for stream in streams {
            let newest = self
                .pending
                .get(&stream)
                .and_then(|queue| queue.by_age.last_key_value())
                .map(|(age, _)| *age);
            let Some(newest) = newest else { continue };
            if let Some(p) = self
                .pending
                .get(&stream)
                .and_then(|q| q.by_age.get(&newest))
            {
                self.events.wait(&p.event)?;
            }
            let ages: Vec<u64> = self.pending[&stream].by_age.keys().copied().collect();
            for age in ages {
                self.release(stream, age, pool)?;
            }
        }
        self.pending.retain(|_, queue| !queue.by_age.is_empty());
        Ok(())
    }

    /// Takes one pending block out of its queue, back into the pool.
    fn release<D: DeviceMemory>(
        &mut self,
        stream: E::Stream,
        age: u64,
        pool: &mut PoolGuard<'_, D>,
    ) -> Result<()> {
        let Some(block) = self.take_pending(stream, age) else {
            return Ok(());
        };
        self.events.recycle(block.event);
        pool.free(block.handle)?;
        Ok(())
    }

    fn take_pending(&mut self, stream: E::Stream, age: u64) -> Option<Pending<E::Event>> {
        let queue = self.pending.get_mut(&stream)?;
        let block = queue.by_age.remove(&age)?;
        queue.by_size.remove(&(block.bytes, age));
        self.stats.pending_bytes -= block.bytes;
        Some(block)
    }

    /// The smallest pending block of `stream` that serves `bytes` without wasting more
    /// than a quarter: (handle, address, its bytes).
    fn take_own(&mut self, stream: E::Stream, bytes: u64) -> Option<(Handle, u64, u64)> {
        let queue = self.pending.get(&stream)?;
        let &(size, age) = queue.by_size.range((bytes, 0)..).next()?;
        if size > bytes.saturating_add(bytes / SAME_STREAM_SLACK) {
            return None;
        }
        let block = self.take_pending(stream, age)?;
        self.events.recycle(block.event);
        Some((block.handle, block.ptr, block.bytes))
    }
}
