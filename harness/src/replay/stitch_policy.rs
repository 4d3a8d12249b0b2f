//! The two stitched policies: memcore's [`Stitch`] (virtual placement,
//! physical handles per chunk or page) and a model of PyTorch's expandable segments,
//! so a user sees both in one replay. Their footprint is physical memory:
//! bytes in created handles, at its most.

use anyhow::Result;
use memcore::{
    Allocation, Allocator, DriverCalls, Fit, FreeList, H200_DRIVER_COSTS, NewRegion, Stitch,
    StitchBlock, StitchConfig, StitchStats, pytorch,
};

use crate::replay::policy::{Arena, ArenaState, Policy};

/// memcore's stitching allocator as a replay policy. Offsets are virtual
/// addresses, which may lie above the physical footprint: holes between
/// blocks cost no memory once their pages are unmapped. A fixed arena is
/// the device's capacity: the pool creates no handle past it.
#[derive(Debug)]
pub struct StitchPolicy {
    stitch: Stitch,
    /// A fixed arena's bytes.
    capacity: Option<u64>,
}

impl StitchPolicy {
    /// A stitched pool with `config`, limited by `arena`.
    pub fn new(config: StitchConfig, arena: Arena) -> Self {
        let capacity = match arena {
            Arena::Growable => None,
            Arena::Fixed(bytes) => Some(bytes),
        };
        let config = StitchConfig {
            capacity_bytes: capacity.unwrap_or(config.capacity_bytes),
            ..config
        };
        Self {
            stitch: Stitch::new(config),
            capacity,
        }
    }
}

impl Policy for StitchPolicy {
    type Block = StitchBlock;

    fn allocate(&mut self, size: u64) -> Result<Option<StitchBlock>> {
        match self.stitch.allocate(size) {
            Ok(block) => Ok(Some(block)),
            Err(memcore::Error::OutOfMemory { .. }) if self.capacity.is_some() => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    fn free(&mut self, block: StitchBlock) -> Result<()> {
        Ok(self.stitch.free(block)?)
    }

    fn offset(&self, block: StitchBlock) -> Result<u64> {
        Ok(block.offset)
    }

    fn mapped_bytes(&self) -> Result<u64> {
        Ok(self.stitch.stats().physical_bytes)
    }

    fn peak_mapped_bytes(&self) -> Result<u64> {
        Ok(self.stitch.stats().peak_physical_bytes)
    }

    fn driver_calls(&self) -> Result<DriverCalls> {
        Ok(self.stitch.stats().calls)
    }

    fn peak_live_in_full_bandwidth_handles(&self) -> Result<Option<u64>> {
        Ok(Some(
            self.stitch.stats().peak_live_in_full_bandwidth_handles,
        ))
    }

    fn state(&self) -> Result<ArenaState> {
        Ok(stitched_state(&self.stitch.stats(), self.capacity))
    }
}

/// Where the large pool's segment starts in reported offsets, bytes
/// (1 TiB): each segment has its own reservation.
const LARGE_SEGMENT_BASE: u64 = 1 << 40;

/// One expandable segment: a virtual range mapped page by page from its
/// start, and best fit over the mapped part.
#[derive(Debug)]
struct Segment {
    free_list: FreeList,
    page: u64,
    mapped: u64,
}

impl Segment {
    fn new(page: u64) -> Self {
        Self {
            free_list: FreeList::new(Fit::Best),
            page,
            mapped: 0,
        }
    }

    fn allocate(&mut self, size: u64, calls: &mut DriverCalls) -> Result<Allocation> {
        if let Ok(block) = self.free_list.allocate(size, pytorch::MIN_BLOCK_BYTES) {
            return Ok(block);
        }
        let need = self.free_list.growth_needed(
            size,
            pytorch::MIN_BLOCK_BYTES,
            NewRegion::At(self.mapped),
        )?;
        let grow = need.max(1).div_ceil(self.page) * self.page;
        let mapped = self
            .mapped
            .checked_add(grow)
            .ok_or(memcore::Error::Overflow {
                offset: self.mapped,
                size: grow,
            })?;
        self.free_list.add_region(self.mapped, grow)?;
        self.mapped = mapped;
        calls.grow_many(grow / self.page, self.page, &H200_DRIVER_COSTS);
        Ok(self.free_list.allocate(size, pytorch::MIN_BLOCK_BYTES)?)
    }
}

/// A model of PyTorch's caching allocator with
/// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (c10/cuda's
/// CUDACachingAllocator.cpp), for one stream, which is all a trace names:
///
/// - requests are rounded up to whole blocks; small ones go to the small
///   pool, the rest to the large pool, one expandable segment each (per
///   stream), whose pages are the small and the large segment sizes
///   ([`memcore::pytorch`] holds the sizes);
/// - a request takes the smallest free mapped block that holds it, the
///   lowest-addressed among equals, and splits off the rest (with
///   expandable segments PyTorch splits whenever a block remains);
/// - failing that, the segment maps whole pages after its mapped end, the
///   free block there joining them, each page one handle (create, map,
///   grant access);
/// - freed blocks merge with free neighbours and stay mapped: PyTorch
///   unmaps only in `empty_cache` or when the device is out of memory, which
///   a replay never is.
///
/// Its footprint is the pages mapped in both segments, at their most: what
/// PyTorch reports as `max_memory_reserved`.
#[derive(Debug)]
pub struct ExpandablePolicy {
    small: Segment,
    large: Segment,
    capacity: Option<u64>,
    live_bytes: u64,
    calls: DriverCalls,
}

/// A block of [`ExpandablePolicy`].
#[derive(Debug, Clone, Copy)]
pub struct ExpandableBlock {
    /// The segment's block (size rounded up).
    allocation: Allocation,
    /// Whether it is in the large pool.
    large: bool,
    /// Bytes requested.
    size: u64,
}

impl ExpandablePolicy {
    /// Both segments empty; with a fixed `arena`, growth past it fails.
    pub fn new(arena: Arena) -> Self {
        Self {
            small: Segment::new(pytorch::SMALL_BUFFER_BYTES),
            large: Segment::new(pytorch::LARGE_BUFFER_BYTES),
            capacity: match arena {
                Arena::Growable => None,
                Arena::Fixed(bytes) => Some(bytes),
            },
            live_bytes: 0,
            calls: DriverCalls::default(),
        }
    }

    fn mapped(&self) -> u64 {
        self.small.mapped + self.large.mapped
    }
}

impl Policy for ExpandablePolicy {
    type Block = ExpandableBlock;

    fn allocate(&mut self, size: u64) -> Result<Option<ExpandableBlock>> {
        let rounded = pytorch::round_size(size);
        let is_large = !pytorch::is_small(size);
        let segment = if is_large {
            &mut self.large
        } else {
            &mut self.small
        };
        let before = segment.mapped;
        let block = segment.allocate(rounded, &mut self.calls)?;
        if self
            .capacity
            .is_some_and(|capacity| self.small.mapped + self.large.mapped > capacity)
        {
            // The pages just mapped go back unused; nothing was recorded
            // for a request that fails.
            let segment = if is_large {
                &mut self.large
            } else {
                &mut self.small
            };
            segment.free_list.free(block)?;
            if segment.mapped > before {
                segment
                    .free_list
                    .release_tail(segment.mapped - before)
                    .ok_or_else(|| anyhow::anyhow!("expandable segment lost its new pages"))?;
                segment.mapped = before;
            }
            return Ok(None);
        }
        self.live_bytes += size;
        Ok(Some(ExpandableBlock {
            allocation: block,
            large: is_large,
            size,
        }))
    }

    fn free(&mut self, block: ExpandableBlock) -> Result<()> {
        let segment = if block.large {
            &mut self.large
        } else {
            &mut self.small
        };
        segment.free_list.free(block.allocation)?;
        self.live_bytes -= block.size;
        Ok(())
    }

    fn offset(&self, block: ExpandableBlock) -> Result<u64> {
        let base = if block.large { LARGE_SEGMENT_BASE } else { 0 };
        Ok(base + block.allocation.offset)
    }

    fn mapped_bytes(&self) -> Result<u64> {
        Ok(self.mapped())
    }

    fn driver_calls(&self) -> Result<DriverCalls> {
        Ok(self.calls)
    }

    fn state(&self) -> Result<ArenaState> {
        let small = self.small.free_list.stats();
        let large = self.large.free_list.stats();
        Ok(ArenaState {
            mapped_bytes: self.mapped(),
            live_bytes: self.live_bytes,
            free_bytes: small.free_bytes + large.free_bytes,
            largest_free_bytes: small.largest_free.max(large.largest_free),
        })
    }
}

/// The arena of a stitching model (`stats`), within `capacity` bytes when
/// one is set: idle pages and unused capacity can back any request, so
/// they are free and, pages being stitched anywhere, in one piece.
pub(super) fn stitched_state(stats: &StitchStats, capacity: Option<u64>) -> ArenaState {
    let mapped = capacity.unwrap_or(stats.physical_bytes);
    let free = mapped.saturating_sub(stats.physical_bytes) + stats.idle_bytes;
    ArenaState {
        mapped_bytes: mapped,
        live_bytes: stats.live_bytes,
        free_bytes: free,
        largest_free_bytes: free,
    }
}
