//! [`StreamOrder`]: freed blocks waiting for the work queued on their streams before
//! they go back to a pool.
//!
//! A block freed on stream S, used on no other stream, joins S's queue: S may take it
//! again at once (its later work is ordered after its earlier work); it goes back to
//! its pool once a *fence* (an event recorded on S after the free) has completed.
//! Fences of one stream complete in order, so asking S's oldest fence is enough.
//! A block also used on other streams (`record_stream`) waits for an event on each of
//! them and on S, and no stream takes it before.
//!
//! While a CUDA graph may be capturing, no event is recorded or asked for: a freed
//! block joins its queue unfenced (S may still take it) and is fenced once no capture
//! is underway ([`StreamOrder::fence_unfenced`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::Result;
use crate::events::StreamEvents;

use super::{Block, Origin};

/// A pending block of the request's stream serves a request of `n` bytes when it has at
/// most `n + n / SAME_STREAM_SLACK` bytes, so reuse wastes at most a quarter.
const SAME_STREAM_SLACK: u64 = 4;

/// An event recorded on a stream after the frees it covers.
#[derive(Debug)]
struct Fence<V> {
    event: V,
    /// Every block of the stream's queue at most this old completes with the event.
    covers: u64,
}

/// One stream's freed blocks.
#[derive(Debug)]
struct Queue<T, S, V> {
    /// By free order.
    blocks: BTreeMap<u64, Block<T, S>>,
    /// `(bytes, age)` of the blocks from the device's own pool, for same-stream reuse.
    by_size: BTreeSet<(u64, u64)>,
    /// Oldest first.
    fences: VecDeque<Fence<V>>,
}

impl<T, S, V> Default for Queue<T, S, V> {
    fn default() -> Self {
        Self {
            blocks: BTreeMap::new(),
            by_size: BTreeSet::new(),
            fences: VecDeque::new(),
        }
    }
}

impl<T, S, V> Queue<T, S, V> {
    fn newest_fenced(&self) -> Option<u64> {
        self.fences.back().map(|f| f.covers)
    }

    fn has_unfenced(&self) -> bool {
        self.blocks
            .last_key_value()
            .is_some_and(|(age, _)| self.newest_fenced().is_none_or(|c| *age > c))
    }

    /// Removes the blocks at most `covers` old.
    fn take_covered(&mut self, covers: u64) -> Vec<Block<T, S>> {
        let later = self.blocks.split_off(&(covers + 1));
        let done = std::mem::replace(&mut self.blocks, later);
        done.into_iter()
            .map(|(age, block)| {
                self.by_size.remove(&(block.bytes, age));
                block
            })
            .collect()
    }
}

/// A block used on several streams, with an event on each (once fenced).
#[derive(Debug)]
struct Shared<T, S, V> {
    block: Block<T, S>,
    events: Vec<V>,
}

/// Every freed block of a device that still waits for streams.
#[derive(Debug)]
pub(super) struct StreamOrder<T, E: StreamEvents> {
    queues: HashMap<E::Stream, Queue<T, E::Stream, E::Event>>,
    /// Blocks used on several streams, fenced.
    shared: Vec<Shared<T, E::Stream, E::Event>>,
    /// Blocks used on several streams, freed while a capture was underway.
    shared_unfenced: Vec<Block<T, E::Stream>>,
    next_age: u64,
    /// Bytes of every block here.
    pub(super) bytes: u64,
}

impl<T, E: StreamEvents> Default for StreamOrder<T, E> {
    fn default() -> Self {
        Self {
            queues: HashMap::new(),
            shared: Vec::new(),
            shared_unfenced: Vec::new(),
            next_age: 0,
            bytes: 0,
        }
    }
}

impl<T, E: StreamEvents> StreamOrder<T, E> {
    /// Whether no block waits.
    pub(super) fn is_empty(&self) -> bool {
        self.bytes == 0
            && self.shared.is_empty()
            && self.shared_unfenced.is_empty()
            && self.queues.values().all(|q| q.blocks.is_empty())
    }

    /// Adds a freed block; `fence`: record the events now (no capture underway).
    pub(super) fn push(
        &mut self,
        block: Block<T, E::Stream>,
        fence: bool,
        events: &mut E,
    ) -> Result<()> {
        self.bytes += block.bytes;
        if !block.uses.is_empty() {
            if fence {
                self.fence_shared(block, events)?;
            } else {
                self.shared_unfenced.push(block);
            }
            return Ok(());
        }
        let age = self.next_age;
        self.next_age += 1;
        let stream = block.stream;
        let queue = self.queues.entry(stream).or_default();
        if matches!(block.origin, Origin::Device(_)) {
            queue.by_size.insert((block.bytes, age));
        }
        queue.blocks.insert(age, block);
        if fence {
            let event = events.record(stream)?;
            queue.fences.push_back(Fence { event, covers: age });
        }
        Ok(())
    }

    /// The smallest block of the device's own pool freed on `stream` that serves
    /// `bytes` without wasting more than a quarter.
    pub(super) fn take_own(
        &mut self,
        stream: E::Stream,
        bytes: u64,
    ) -> Option<Block<T, E::Stream>> {
        let queue = self.queues.get_mut(&stream)?;
        let &(size, age) = queue.by_size.range((bytes, 0)..).next()?;
        if size > bytes.saturating_add(bytes / SAME_STREAM_SLACK) {
            return None;
        }
        queue.by_size.remove(&(size, age));
        let block = queue.blocks.remove(&age)?;
        self.bytes -= block.bytes;
        Some(block)
    }

    /// Takes every block whose events have completed, asking (never waiting).
    pub(super) fn take_completed(&mut self, events: &mut E) -> Result<Vec<Block<T, E::Stream>>> {
        let mut done = Vec::new();
        for queue in self.queues.values_mut() {
            while let Some(oldest) = queue.fences.front() {
                if !events.is_complete(&oldest.event)? {
                    break;
                }
                if let Some(fence) = queue.fences.pop_front() {
                    done.extend(queue.take_covered(fence.covers));
                    events.recycle(fence.event);
                }
            }
        }
        let mut k = 0;
        while k < self.shared.len() {
            let mut complete = true;
            for event in &self.shared[k].events {
                if !events.is_complete(event)? {
                    complete = false;
                    break;
                }
            }
            if complete {
                let shared = self.shared.swap_remove(k);
                shared.events.into_iter().for_each(|e| events.recycle(e));
                done.push(shared.block);
            } else {
                k += 1;
            }
        }
        self.settle(&done);
        Ok(done)
    }

    /// Waits for every fenced block's events and takes those blocks; unfenced ones
    /// (freed during a capture) are fenced and waited for too.
    pub(super) fn drain(&mut self, events: &mut E) -> Result<Vec<Block<T, E::Stream>>> {
        self.fence_unfenced(events)?;
        let mut done = Vec::new();
        for queue in self.queues.values_mut() {
            if let Some(newest) = queue.fences.back() {
                events.wait(&newest.event)?;
                let covers = newest.covers;
                for fence in queue.fences.drain(..) {
                    events.recycle(fence.event);
                }
                done.extend(queue.take_covered(covers));
            }
        }
        for shared in self.shared.drain(..) {
            for event in &shared.events {
                events.wait(event)?;
            }
            shared.events.into_iter().for_each(|e| events.recycle(e));
            done.push(shared.block);
        }
        self.queues
            .retain(|_, q| !q.blocks.is_empty() || !q.fences.is_empty());
        self.settle(&done);
        Ok(done)
    }

    /// Records the fences that blocks freed during a capture lack: one event per
    /// stream, and the events of blocks used on several streams.
    pub(super) fn fence_unfenced(&mut self, events: &mut E) -> Result<()> {
        for (stream, queue) in &mut self.queues {
            if queue.has_unfenced() {
                let covers = queue.blocks.last_key_value().map_or(0, |(age, _)| *age);
                let event = events.record(*stream)?;
                queue.fences.push_back(Fence { event, covers });
            }
        }
        while let Some(block) = self.shared_unfenced.pop() {
            self.fence_shared(block, events)?;
        }
        Ok(())
    }

    /// Takes every block that `keep` refuses, whatever its events (they are dropped):
    /// what restoring a private pool's checkpoint does with the pool's freed blocks.
    pub(super) fn take_where(
        &mut self,
        mut take: impl FnMut(&Block<T, E::Stream>) -> bool,
        events: &mut E,
    ) -> Vec<Block<T, E::Stream>> {
        let mut out = Vec::new();
        for queue in self.queues.values_mut() {
            let ages: Vec<u64> = queue
                .blocks
                .iter()
                .filter(|(_, b)| take(b))
                .map(|(age, _)| *age)
                .collect();
            for age in ages {
                if let Some(block) = queue.blocks.remove(&age) {
                    queue.by_size.remove(&(block.bytes, age));
                    out.push(block);
                }
            }
        }
        let (taken, kept): (Vec<_>, Vec<_>) = self.shared.drain(..).partition(|s| take(&s.block));
        self.shared = kept;
        for shared in taken {
            shared.events.into_iter().for_each(|e| events.recycle(e));
            out.push(shared.block);
        }
        let (taken, kept): (Vec<_>, Vec<_>) = self.shared_unfenced.drain(..).partition(|b| take(b));
        self.shared_unfenced = kept;
        out.extend(taken);
        self.settle(&out);
        out
    }

    /// Every waiting block, in no particular order.
    pub(super) fn blocks(&self) -> impl Iterator<Item = &Block<T, E::Stream>> {
        self.queues
            .values()
            .flat_map(|q| q.blocks.values())
            .chain(self.shared.iter().map(|s| &s.block))
            .chain(self.shared_unfenced.iter())
    }

    /// Records `block`'s events (on its own stream and each it was used on)
    /// and keeps it until they complete; a failed record keeps it unfenced,
    /// to be fenced again after the next capture or waited for by `drain`.
    fn fence_shared(&mut self, block: Block<T, E::Stream>, events: &mut E) -> Result<()> {
        match record_all(&block, events) {
            Ok(recorded) => {
                self.shared.push(Shared {
                    block,
                    events: recorded,
                });
                Ok(())
            }
            Err(error) => {
                self.shared_unfenced.push(block);
                Err(error)
            }
        }
    }

    fn settle(&mut self, taken: &[Block<T, E::Stream>]) {
        let bytes: u64 = taken.iter().map(|b| b.bytes).sum();
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

/// An event on the block's own stream and on each stream it was used on.
fn record_all<T, E: StreamEvents>(
    block: &Block<T, E::Stream>,
    events: &mut E,
) -> Result<Vec<E::Event>> {
    let mut recorded = Vec::with_capacity(block.uses.len() + 1);
    for stream in std::iter::once(block.stream).chain(block.uses.iter().copied()) {
        match events.record(stream) {
            Ok(event) => recorded.push(event),
            Err(error) => {
                recorded.into_iter().for_each(|e| events.recycle(e));
                return Err(error);
            }
        }
    }
    Ok(recorded)
}
