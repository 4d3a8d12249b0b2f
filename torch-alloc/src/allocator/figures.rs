//! What [`DeviceAllocator`] reports: PyTorch's figures and their resets, the history,
//! snapshots, the library's own figures and the ledger.

use super::{Block, DeviceAllocator, State};
use crate::backing::Backing;
use crate::device_stats::DeviceStats;
use crate::error::Result;
use crate::events::StreamEvents;
use crate::explain::{Explanation, PoolFigures};
use crate::facts::ContextFacts;
use crate::history::{HistorySettings, NO_CONTEXT, RecordContext, TraceAction};
use crate::pool_id::PoolId;
use crate::snapshot::{self, BlockState, PrivateSegment, Snapshot, SnapshotBlock};

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
    /// The largest request the pool can place without new device memory.
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
    /// Calls refused for bad arguments (unknown pointer, unknown pool, ...).
    pub errors: u64,
    /// Grants of the pool's mappings to peer devices (`CUDAMEM_PEERS`).
    pub peer_access_calls: u64,
    /// Bytes in private pools (CUDA graphs' memory), live or free.
    pub private_pool_bytes: u64,
}

impl<B: Backing, E: StreamEvents> DeviceAllocator<B, E> {
    /// The largest block the allocator could hand out now, bytes (`cacheInfo`, which
    /// cuDNN's benchmark mode sizes its workspace by): what the pool holds free, or
    /// what it could map from the device's free memory, under the memory fraction. It
    /// errs low rather than high: cuDNN backs off from a refused workspace, but each
    /// refusal costs the pool a failed attempt.
    pub fn largest_block(&self) -> Result<u64> {
        self.current(|state| {
            let figures = self.backing.figures();
            let device_free = self.backing.mem_info()?.free;
            let mut growing = device_free.saturating_add(figures.growable_bytes);
            if let Some((_, cap)) = state.cap {
                growing =
                    growing.min(cap.saturating_sub(figures.mapped_bytes) + figures.growable_bytes);
            }
            Ok(figures.largest_free_bytes.max(growing))
        })
    }

    /// PyTorch's figures now (`getDeviceStats`).
    pub fn device_stats(&self) -> DeviceStats {
        let mut state = self.state();
        let figures = self.backing.figures();
        let state = &mut *state;
        let stats = &mut state.stats;
        stats.reserved_bytes.set_held(figures.mapped_bytes);
        stats.segment.set_held(figures.segments);
        let stuck = figures.free_bytes.saturating_sub(figures.releasable_bytes);
        stats.inactive_split_bytes.set_held(stuck);
        stats.inactive_split.set_held(u64::from(stuck > 0));
        let (allocs, frees) = state.device_calls_at_reset;
        stats.num_device_alloc =
            i64::try_from(figures.device_allocs.saturating_sub(allocs)).unwrap_or(i64::MAX);
        stats.num_device_free =
            i64::try_from(figures.device_frees.saturating_sub(frees)).unwrap_or(i64::MAX);
        let mut out = *stats;
        if figures.peak_mapped_bytes > state.peak_at_reset {
            // The pool's own peak came after the last reset: it is the peak since.
            let peak = i64::try_from(figures.peak_mapped_bytes).unwrap_or(i64::MAX);
            for stat in [
                &mut out.reserved_bytes.aggregate,
                &mut out.reserved_bytes.large_pool,
            ] {
                stat.peak = stat.peak.max(peak);
            }
        }
        out
    }

    /// Every peak becomes its current value.
    pub fn reset_peak_stats(&self) {
        let mut state = self.state();
        state.peak_at_reset = self.backing.figures().peak_mapped_bytes;
        state.stats.reset_peaks();
    }

    /// Every accumulated count becomes zero.
    pub fn reset_accumulated_stats(&self) {
        let mut state = self.state();
        let figures = self.backing.figures();
        state.device_calls_at_reset = (figures.device_allocs, figures.device_frees);
        state.stats.reset_accumulated();
    }

    /// Records history as `settings` say (`_record_memory_history`); `clear` drops
    /// what was recorded.
    pub fn record_history(&self, settings: HistorySettings, clear: bool) {
        self.state().history.configure(settings, clear);
    }

    /// The stacks kept now.
    pub fn record_context(&self) -> RecordContext {
        let history = self.state().history.settings();
        if history.enabled {
            history.when
        } else {
            RecordContext::Never
        }
    }

    /// Takes up to `max` stack numbers nothing holds any more.
    pub fn take_dead_contexts(&self, max: usize) -> Vec<u64> {
        self.state().history.take_dead(max)
    }

    /// How many stack numbers died and were not taken yet.
    pub fn dead_contexts(&self) -> usize {
        self.state().history.dead_count()
    }

    /// What the device holds now, as PyTorch's snapshot shows it: every segment of
    /// `pool` (all of them for [`PoolId::DEFAULT`]) and, with `trace`, the history.
    /// Records a snapshot entry in the history.
    pub fn snapshot(&self, pool: PoolId, trace: bool) -> Snapshot {
        let mut state = self.state();
        let state = &mut *state;
        let runs = self.backing.mapped_runs();
        let private: Vec<PrivateSegment> = state
            .pools
            .segments()
            .map(|(pool, address, s)| PrivateSegment {
                address,
                bytes: s.bytes,
                pool,
                stream: E::number(s.stream),
            })
            .collect();
        let shown = |b: &Block<B::Token, E::Stream>, state| SnapshotBlock {
            address: b.ptr,
            size: b.bytes,
            requested_size: b.requested,
            state,
            context: b.context,
        };
        let blocks: Vec<SnapshotBlock> = state
            .live
            .values()
            .map(|b| shown(b, BlockState::ActiveAllocated))
            .chain(
                state
                    .order
                    .blocks()
                    .map(|b| shown(b, BlockState::ActivePendingFree)),
            )
            .collect();
        let segments = snapshot::segments(&runs, &private, &blocks, pool);
        let active: u64 = segments.iter().map(|s| s.active_size()).sum();
        state
            .history
            .record(TraceAction::Snapshot, 0, active, 0, pool, NO_CONTEXT);
        let trace = if trace {
            state.history.entries().copied().collect()
        } else {
            Vec::new()
        };
        Snapshot { segments, trace }
    }

    /// The figures behind `cudamem_stats`.
    pub fn stats(&self) -> AllocatorStats {
        let state = self.state();
        let figures = self.backing.figures();
        let private_pool_bytes = state.pools.segments().map(|(_, _, s)| s.bytes).sum();
        let counts = state.counts;
        AllocatorStats {
            live_bytes: counts.live_bytes,
            peak_live_bytes: counts.peak_live_bytes,
            mapped_bytes: figures.mapped_bytes,
            peak_mapped_bytes: figures.peak_mapped_bytes,
            pending_bytes: state.order.bytes,
            largest_free_bytes: figures.largest_free_bytes,
            memory_driver_calls: self.backing.memory_driver_calls(),
            event_calls: state.events.calls(),
            allocations: counts.allocations,
            frees: counts.frees,
            ooms: counts.ooms,
            errors: counts.errors,
            peer_access_calls: figures.peer_access_calls,
            private_pool_bytes,
        }
    }

    /// The ledger of the device's context with the pool in it, as text.
    pub fn explain(&self) -> Result<String> {
        self.current(|state| {
            let (facts, figures) = self.figures(state)?;
            Ok(Explanation::new(&facts, &figures).render(self.device, &facts, &figures))
        })
    }

    pub(super) fn figures(
        &self,
        state: &State<B::Token, E>,
    ) -> Result<(ContextFacts, PoolFigures)> {
        let facts = self.backing.context_facts()?;
        let backing = self.backing.figures();
        let figures = PoolFigures {
            live_bytes: state.counts.live_bytes,
            pending_bytes: state.order.bytes,
            mapped_bytes: backing.mapped_bytes,
            peak_mapped_bytes: backing.peak_mapped_bytes,
            free_bytes: backing.free_bytes,
            largest_free_bytes: backing.largest_free_bytes,
        };
        Ok((facts, figures))
    }
}

/// One line saying which term is to blame.
pub(super) fn verdict(ledger: &Explanation, figures: &PoolFigures, size: u64) -> String {
    if figures.free_bytes >= size && figures.largest_free_bytes < size {
        format!(
            "cudamem: fragmentation: the pool has {} bytes free but no block of {size}\n",
            figures.free_bytes
        )
    } else if ledger.outside_bytes > ledger.pool_bytes {
        "cudamem: most of the device is held outside the pool (see 'outside the pool')\n".to_owned()
    } else {
        "cudamem: the device is exhausted by live tensors\n".to_owned()
    }
}
