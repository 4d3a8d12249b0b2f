//! Other people's allocators as baselines: the `offset-allocator` crate (a
//! port of Sebastian Aaltonen's OffsetAllocator, two-level bins like TLSF)
//! and the `range-alloc` crate (wgpu's best-fit range allocator), wrapped in
//! the same [`Policy`] interface and growth rule as memcore's.

use anyhow::Result;
use memcore::{DEFAULT_ALIGN, DriverCalls, H200_DRIVER_COSTS};
use range_alloc::RangeAllocator;

use crate::replay::policy::{
    ARENA_BYTES, Arena, ArenaRefused, ArenaState, GRANULE, Policy, granules, growth,
};

/// offset-allocator counts in units; one unit is the alignment every request
/// gets, so offsets come out aligned and u32 units reach just short of 1 TiB.
const UNIT: u64 = DEFAULT_ALIGN;

/// The units a growable offset-allocator arena spans: [`ARENA_BYTES`], clear
/// of the crate's u32 arithmetic limits.
const GROWABLE_UNITS: u32 = (ARENA_BYTES / UNIT) as u32;
const _: () = assert!(ARENA_BYTES / UNIT < u32::MAX as u64);

/// The `offset-allocator` crate. Its arena cannot grow, so it gets one
/// [`ARENA_BYTES`] arena, and what it has mapped is the granule above the end
/// of the highest block it ever placed ([`crate::replay::policy::FOOTPRINT_RULE`]).
pub struct OffsetAllocatorPolicy {
    allocator: offset_allocator::Allocator,
    arena_bytes: u64,
    mapped: u64,
    growable: bool,
    live_bytes: u64,
    calls: DriverCalls,
}

impl OffsetAllocatorPolicy {
    /// A policy over `arena`.
    pub fn new(arena: Arena) -> Result<Self> {
        let (units, growable) = match arena {
            Arena::Growable => (GROWABLE_UNITS, true),
            Arena::Fixed(bytes) => match u32::try_from(bytes / UNIT) {
                Ok(units) if units < u32::MAX => (units, false),
                _ => {
                    return Err(ArenaRefused {
                        arena_bytes: bytes,
                        max_bytes: u64::from(u32::MAX - 1) * UNIT,
                    }
                    .into());
                }
            },
        };
        let arena_bytes = u64::from(units) * UNIT;
        Ok(Self {
            allocator: offset_allocator::Allocator::new(units),
            arena_bytes,
            mapped: if growable { 0 } else { arena_bytes },
            growable,
            live_bytes: 0,
            calls: DriverCalls::default(),
        })
    }
}

/// A live block of the offset-allocator policy.
#[derive(Clone, Copy)]
pub struct OffsetBlock {
    allocation: offset_allocator::Allocation,
    size: u64,
}

impl Policy for OffsetAllocatorPolicy {
    type Block = OffsetBlock;

    // Inlined into the timed replay loop, as memcore's adapters are.
    #[inline(always)]
    fn allocate(&mut self, size: u64) -> Result<Option<OffsetBlock>> {
        let Ok(units) = u32::try_from(size.div_ceil(UNIT)) else {
            return Ok(None);
        };
        let Some(allocation) = self.allocator.allocate(units) else {
            return Ok(None);
        };
        let end = (u64::from(allocation.offset) + u64::from(units)) * UNIT;
        if self.growable && end > self.mapped {
            let mapped = granules(end);
            self.calls.grow(mapped - self.mapped, &H200_DRIVER_COSTS);
            self.mapped = mapped;
        }
        self.live_bytes += size;
        Ok(Some(OffsetBlock { allocation, size }))
    }

    #[inline(always)]
    fn free(&mut self, block: OffsetBlock) -> Result<()> {
        self.allocator.free(block.allocation);
        self.live_bytes -= block.size;
        Ok(())
    }

    fn offset(&self, block: OffsetBlock) -> Result<u64> {
        Ok(u64::from(block.allocation.offset) * UNIT)
    }

    fn mapped_bytes(&self) -> Result<u64> {
        Ok(self.mapped)
    }

    fn driver_calls(&self) -> Result<DriverCalls> {
        Ok(self.calls)
    }

    fn state(&self) -> Result<ArenaState> {
        let report = self.allocator.storage_report();
        let used = self.arena_bytes - u64::from(report.total_free_space) * UNIT;
        let free_bytes = self.mapped.saturating_sub(used);
        Ok(ArenaState {
            mapped_bytes: self.mapped,
            live_bytes: self.live_bytes,
            free_bytes,
            largest_free_bytes: (u64::from(report.largest_free_region) * UNIT).min(free_bytes),
        })
    }
}

/// The `range-alloc` crate, grown with its `grow_to`.
pub struct RangeAllocPolicy {
    allocator: RangeAllocator<u64>,
    growable: bool,
    live_bytes: u64,
    calls: DriverCalls,
}

/// How many times one request may grow a range-alloc arena (it fits exactly
/// after the first, unless the request is refused for other reasons).
const RANGE_GROW_ATTEMPTS: u32 = 2;

impl RangeAllocPolicy {
    /// A policy over `arena`.
    pub fn new(arena: Arena) -> Self {
        let (end, growable) = match arena {
            Arena::Growable => (0, true),
            Arena::Fixed(bytes) => (bytes, false),
        };
        Self {
            allocator: RangeAllocator::new(0..end),
            growable,
            live_bytes: 0,
            calls: DriverCalls::default(),
        }
    }

    fn try_allocate(&mut self, size: u64) -> Option<(u64, u64)> {
        self.allocator
            .allocate_range_aligned(size, DEFAULT_ALIGN)
            .ok()
            .map(|range| (range.start, range.end))
    }

    fn mapped(&self) -> u64 {
        self.allocator.initial_range().end
    }
}

impl Policy for RangeAllocPolicy {
    type Block = (u64, u64);

    fn allocate(&mut self, size: u64) -> Result<Option<(u64, u64)>> {
        let mut block = self.try_allocate(size);
        if self.growable {
            for attempt in 0..RANGE_GROW_ATTEMPTS {
                if block.is_some() {
                    break;
                }
                // Growth is rare; walking the ranges to find the top is fine.
                let top = self
                    .allocator
                    .allocated_ranges()
                    .last()
                    .map_or(0, |range| range.end);
                let mapped = self.mapped();
                let grow = growth(mapped, top, size, attempt).max(GRANULE);
                self.allocator.grow_to(mapped + grow);
                self.calls.grow(grow, &H200_DRIVER_COSTS);
                block = self.try_allocate(size);
            }
        }
        if block.is_some() {
            self.live_bytes += size;
        }
        Ok(block)
    }

    fn free(&mut self, (start, end): (u64, u64)) -> Result<()> {
        self.allocator.free_range(start..end);
        self.live_bytes -= end - start;
        Ok(())
    }

    fn offset(&self, (start, _): (u64, u64)) -> Result<u64> {
        Ok(start)
    }

    fn mapped_bytes(&self) -> Result<u64> {
        Ok(self.mapped())
    }

    fn driver_calls(&self) -> Result<DriverCalls> {
        Ok(self.calls)
    }

    fn state(&self) -> Result<ArenaState> {
        let mapped = self.mapped();
        let live = self
            .allocator
            .allocated_ranges()
            .map(|range| range.end - range.start)
            .sum::<u64>();
        let largest = self
            .allocator
            .allocated_ranges()
            .fold((0u64, 0u64), |(largest, previous_end), range| {
                (largest.max(range.start - previous_end), range.end)
            });
        let largest_free_bytes = largest.0.max(mapped - largest.1);
        Ok(ArenaState {
            mapped_bytes: mapped,
            live_bytes: self.live_bytes,
            free_bytes: mapped - live,
            largest_free_bytes,
        })
    }
}
