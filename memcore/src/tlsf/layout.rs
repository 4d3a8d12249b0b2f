//! Changing what the allocator manages: adding regions, giving back the
//! free tail, and laying everything out anew after compaction.

use alloc::vec::Vec;

use super::class::GRANULE;
use super::node::{NONE, State};
use super::{Region, Tlsf};
use crate::alloc_api::check_layout;
use crate::{Allocation, Error, Extent, Result};

impl Tlsf {
    pub(super) fn add_region_impl(&mut self, offset: u64, size: u64) -> Result<()> {
        let (new, end) = Extent::region(offset, size)?;
        // The first region that ends after `offset`; only it can overlap.
        let at = self.region_of(offset);
        if self
            .regions
            .get(at)
            .is_some_and(|r| r.extent.overlaps(&new))
        {
            return Err(Error::RegionOverlap { offset, size });
        }
        if !self.nodes.can_take(1) {
            return Err(Error::OutOfMemory {
                requested: size,
                align: 1,
                free_bytes: self.free_bytes(),
                largest_free: self.largest_free(),
            });
        }
        let block = self.nodes.take(offset, size);
        self.managed_bytes += size;
        // Hook the block into the region table, merging with a region that
        // ends at `offset` and one that starts at `end`.
        let below = at
            .checked_sub(1)
            .filter(|&i| self.regions[i].extent.end() == offset);
        let index = match below {
            Some(i) => {
                let last = self.regions[i].last;
                self.nodes[last].next_phys = block;
                self.nodes[block].prev_phys = last;
                self.regions[i].extent.size += size;
                self.regions[i].last = block;
                i
            }
            None => {
                self.regions.insert(
                    at,
                    Region {
                        extent: new,
                        first: block,
                        last: block,
                    },
                );
                at
            }
        };
        if self
            .regions
            .get(index + 1)
            .is_some_and(|r| r.extent.offset == end)
        {
            let above = self.regions.remove(index + 1);
            self.nodes[block].next_phys = above.first;
            self.nodes[above.first].prev_phys = block;
            self.regions[index].extent.size += above.extent.size;
            self.regions[index].last = above.last;
        }
        // Free space on either side of a seam coalesces with the new block.
        self.release_block(block);
        Ok(())
    }

    pub(super) fn release_tail_impl(&mut self, min_bytes: u64) -> Option<Extent> {
        let region = *self.regions.last()?;
        let tail = region.last;
        let node = &self.nodes[tail];
        if node.state != State::Free || node.size < min_bytes {
            return None;
        }
        let node = *node;
        let (extent, prev) = (Extent::new(node.offset, node.size), node.prev_phys);
        self.unlink_free(tail, &node);
        self.nodes.give_back(tail);
        self.managed_bytes -= extent.size;
        if prev == NONE {
            self.regions.pop();
        } else {
            self.nodes[prev].next_phys = NONE;
            let top = self.regions.len() - 1;
            self.regions[top].extent.size -= extent.size;
            self.regions[top].last = prev;
        }
        Some(extent)
    }

    /// Lay the regions out with exactly `used` live. A gap under a granule
    /// between blocks stays with the block below it (with the block above
    /// at the start of a region), as an allocation would have left it.
    pub(super) fn rebuild_impl(&mut self, used: &[Extent]) -> Result<Vec<Allocation>> {
        check_layout(used, |e| {
            self.regions
                .get(self.region_of(e.offset))
                .is_some_and(|r| r.extent.contains(e))
        })?;
        // At most a free block before each used one, plus one per region.
        if !self.nodes.can_take(2 * used.len() + self.regions.len()) {
            return Err(Error::OutOfMemory {
                requested: used.iter().map(|e| e.size).sum(),
                align: 1,
                free_bytes: self.free_bytes(),
                largest_free: self.largest_free(),
            });
        }
        self.nodes.give_back_all();
        self.bins.clear();
        self.live_bytes = 0;
        self.live_blocks = 0;
        self.padding_bytes = 0;
        self.free_blocks = 0;
        let mut allocations = Vec::with_capacity(used.len());
        let mut rest = used;
        for r in 0..self.regions.len() {
            let region = self.regions[r].extent;
            let inside = rest.partition_point(|e| e.offset < region.end());
            let (mine, later) = rest.split_at(inside);
            rest = later;
            let mut cursor = region.offset;
            let mut last = NONE;
            for (k, e) in mine.iter().enumerate() {
                if e.offset - cursor >= GRANULE {
                    last = self.append_block(r, last, cursor, e.offset - cursor);
                    self.link_free(last, e.offset - cursor);
                    cursor = e.offset;
                }
                let next_start = mine.get(k + 1).map_or(region.end(), |n| n.offset);
                let held_end = if next_start - e.end() < GRANULE {
                    next_start
                } else {
                    e.end()
                };
                last = self.append_block(r, last, cursor, held_end - cursor);
                allocations.push(self.mark_used(last, e.offset, e.size)?);
                cursor = held_end;
            }
            if cursor < region.end() {
                last = self.append_block(r, last, cursor, region.end() - cursor);
                self.link_free(last, region.end() - cursor);
            }
        }
        Ok(allocations)
    }

    /// A new block `[offset, offset + size)` physically after `prev` (the
    /// first of region `r` when `prev` is [`NONE`]), not yet on any list.
    fn append_block(&mut self, r: usize, prev: u32, offset: u64, size: u64) -> u32 {
        let block = self.nodes.take(offset, size);
        self.nodes[block].prev_phys = prev;
        if prev == NONE {
            self.regions[r].first = block;
        } else {
            self.nodes[prev].next_phys = block;
        }
        self.regions[r].last = block;
        block
    }
}
