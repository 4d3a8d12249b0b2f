//! ctx's compacting pool as a replay policy (`pool-vmm` and `tlsf-compact`,
//! which differ only in their `CompactionPolicy`): a VMM pool (2 MiB pages,
//! compaction before growth) over an unbacked simulated device, so replays
//! exercise the real allocation path (heap, planner, grow, map) without
//! holding the trace's gigabytes.

use anyhow::Result;
use ctx::{CompactionPolicy, Growth, Pool, PoolConfig, PoolGuard, SimConfig, SimDevice};
use ctx::{DEFAULT_ALIGN, Handle};
use memcore::{DriverCalls, H200_DRIVER_COSTS};

use crate::replay::policy::{ARENA_BYTES, Arena, ArenaState, GRANULE, Policy};
use crate::replay::spec::Settings;

/// A pool on a simulated device whose only limit is `arena`, moving blocks
/// as `compaction` says.
pub fn pool(arena: Arena, compaction: CompactionPolicy) -> Result<Pool<SimDevice>> {
    let bytes = match arena {
        Arena::Growable => ARENA_BYTES,
        Arena::Fixed(bytes) => bytes,
    };
    let device = SimDevice::new(SimConfig {
        capacity_bytes: bytes,
        granularity_bytes: GRANULE,
        // The arena is the pool alone; a context's own memory is `explain`'s subject.
        context_reserved_bytes: 0,
        vmm: true,
        backed: false,
    });
    let config = PoolConfig {
        growth: Growth::Vmm,
        compaction,
        reserve_bytes: bytes,
        max_bytes: bytes,
        min_growth_bytes: 0,
        growth_divisor: 0,
        peers: ctx::PeerSet::NONE,
    };
    Ok(Pool::new(device, config)?)
}

/// A locked pool under replay: one lock for the whole replay, as a
/// single-threaded caller would hold it.
pub struct PoolPolicy<'a> {
    guard: PoolGuard<'a, SimDevice>,
    /// Device address of the reservation's first byte: offsets are relative
    /// to it, like every other policy's. [`pool`] builds VMM pools only; a
    /// chunk pool has no reservation, and its offsets would be addresses.
    base: u64,
    /// A fixed arena is mapped in full at the first request, so failures are
    /// judged against the whole capacity.
    fixed: Option<u64>,
    /// [`Settings::plan_steps`].
    plan_steps: u64,
}

impl<'a> PoolPolicy<'a> {
    /// Replay through `pool`, built by [`pool`] for `settings.arena`.
    pub fn new(pool: &'a Pool<SimDevice>, settings: &Settings) -> Self {
        let guard = pool.lock();
        Self {
            base: guard.reservation_start().unwrap_or(0),
            guard,
            fixed: match settings.arena {
                Arena::Growable => None,
                Arena::Fixed(bytes) => Some(bytes),
            },
            plan_steps: settings.plan_steps,
        }
    }
}

impl Policy for PoolPolicy<'_> {
    type Block = Handle;

    fn allocate(&mut self, size: u64) -> Result<Option<Handle>> {
        let placed = match self.guard.allocate(size, DEFAULT_ALIGN, None) {
            Ok(handle) => Some(handle),
            Err(ctx::Error::OutOfMemory { .. }) => None,
            Err(err) => return Err(err.into()),
        };
        // A plan's work grows with the live blocks: past the bound, the trace
        // costs this model more than its size allows (the overshoot is one
        // plan).
        let looked_at = self.guard.compaction_plan_steps();
        if looked_at > self.plan_steps {
            return Err(memcore::Error::StepBudget {
                steps: looked_at,
                limit: self.plan_steps,
            }
            .into());
        }
        Ok(placed)
    }

    fn free(&mut self, block: Handle) -> Result<()> {
        Ok(self.guard.free(block)?)
    }

    fn offset(&self, block: Handle) -> Result<u64> {
        Ok(self.guard.device_ptr(block)? - self.base)
    }

    fn mapped_bytes(&self) -> Result<u64> {
        Ok(self.fixed.unwrap_or(self.guard.stats().mapped_bytes))
    }

    fn peak_mapped_bytes(&self) -> Result<u64> {
        Ok(self.fixed.unwrap_or(self.guard.stats().peak_mapped_bytes))
    }

    fn bytes_moved(&self) -> Result<u64> {
        Ok(self.guard.stats().bytes_moved)
    }

    fn relocations(&self) -> Result<u64> {
        Ok(self.guard.stats().compactions)
    }

    /// The pool counts its growths, not their sizes: each is priced as a
    /// handle of the mean growth (the pool never shrinks in a replay).
    fn driver_calls(&self) -> Result<DriverCalls> {
        let stats = self.guard.stats();
        let mut calls = DriverCalls::default();
        if let Some(mean) = stats.mapped_bytes.checked_div(stats.grows) {
            for _ in 0..stats.grows {
                calls.grow(mean, &H200_DRIVER_COSTS);
            }
        }
        Ok(calls)
    }

    fn state(&self) -> Result<ArenaState> {
        let stats = self.guard.stats();
        let mapped = self.fixed.unwrap_or(stats.mapped_bytes);
        // Unmapped headroom of a fixed arena is free too.
        let unmapped = mapped - stats.mapped_bytes;
        // Heap offsets are device addresses.
        let top = stats.heap.top.saturating_sub(self.base);
        let tail_free = stats.mapped_bytes.saturating_sub(top);
        Ok(ArenaState {
            mapped_bytes: mapped,
            live_bytes: stats.heap.live_bytes,
            free_bytes: stats.heap.free_bytes + unmapped,
            largest_free_bytes: stats.heap.largest_free.max(tail_free + unmapped),
        })
    }
}
