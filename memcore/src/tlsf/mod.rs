//! Two-level segregated fit (TLSF): O(1) allocate and free with immediate
//! coalescing, the policy for long-running device pools.
//!
//! Free blocks sit in one list per size class ([`class`]); two bitmaps find
//! the first non-empty list at or above a class in O(1). A request first
//! looks at a few blocks of its own class and takes the smallest that holds
//! it; failing that it is rounded up to the next class boundary ("good
//! fit"), so any block found fits without scanning. The first step keeps
//! TLSF's footprint at best fit's on real traces, where good fit alone
//! wastes memory whenever request sizes vary. Block metadata lives in a node
//! table beside the memory ([`node`]), recycled through a spare list, so an
//! allocator that has warmed up allocates nothing on the host per
//! operation.

mod check;
mod class;
mod layout;
mod node;
#[cfg(test)]
mod tests;

use alloc::vec::Vec;

use crate::alloc_api::tail_growth;
use crate::{
    Allocation, Allocator, Error, Extent, NewRegion, Result, Stats, align_up, check_align,
};
use class::{Bins, Class, GRANULE};
use node::{NONE, Node, Nodes, State};

/// A managed region: its extent and the nodes of its lowest and highest
/// blocks. Regions that touch are merged into one.
#[derive(Debug, Clone, Copy)]
struct Region {
    extent: Extent,
    first: u32,
    last: u32,
}

/// How many blocks of the request's own class an allocation looks at before
/// it takes good fit's larger block.
const OWN_CLASS_PROBES: usize = 8;

/// Two-level segregated fit allocator over an abstract address space.
///
/// - Sizes are rounded up to 256 bytes ([`DEFAULT_ALIGN`](crate::DEFAULT_ALIGN))
///   and every offset it hands out is at least 256-aligned; a split never
///   leaves a free block under 256 bytes (such a sliver stays with the
///   allocation and counts as padding).
/// - Allocate and free are O(1): a request first takes the smallest block
///   that holds it among the first [`OWN_CLASS_PROBES`] of its own class;
///   else it is rounded up to the next class
///   boundary (plus the worst alignment gap) and the head of the first
///   non-empty list at or above it always fits. When that finds nothing,
///   the allocator scans the lists that do not promise a fit (the
///   request's own class, and the classes a large alignment spans) before
///   reporting out-of-memory, so it never fails a request that one free
///   block could hold. That scan only runs near exhaustion or when the
///   only block that fits sits in the request's own class.
/// - Within a class the most recently freed block is used first (LIFO), so
///   placement is deterministic.
/// - Regions need not touch; ones that do are merged, and free space
///   coalesces across the seam. Blocks never coalesce across a gap.
/// - An [`Allocation::id`] names the block's node and its generation:
///   freeing a stale, forged or already freed allocation is
///   [`Error::UnknownAllocation`] and changes nothing.
/// - `stats()` keeps running counters; only `largest_free` (a walk of the
///   highest non-empty list) and `top` (a look at each region's top two
///   blocks) are not O(1).
///
/// ```
/// use memcore::{Allocator, Tlsf};
///
/// let mut tlsf = Tlsf::new();
/// tlsf.add_region(0, 1 << 20)?;
/// let a = tlsf.allocate(1000, 256)?;
/// let b = tlsf.allocate(4096, 4096)?;
/// assert_eq!(a.offset % 256, 0);
/// assert_eq!(b.offset % 4096, 0);
/// tlsf.free(a)?;
/// tlsf.free(b)?;
/// assert_eq!(tlsf.free_extents().len(), 1);
/// tlsf.check()?;
/// # Ok::<(), memcore::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Tlsf {
    nodes: Nodes,
    bins: Bins,
    /// Sorted by offset, none touching.
    regions: Vec<Region>,
    managed_bytes: u64,
    live_bytes: u64,
    live_blocks: u64,
    padding_bytes: u64,
    free_blocks: u64,
    high_water: u64,
    /// [`Tlsf::preferring_low_addresses`]: among the blocks a request looks
    /// at, the smallest and then the lowest-addressed wins.
    prefer_low: bool,
}

impl Default for Tlsf {
    fn default() -> Self {
        Self::new()
    }
}

impl Tlsf {
    /// An allocator with no region yet.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An allocator with room for `nodes` blocks (live plus free) before
    /// its node table grows.
    pub fn with_capacity(nodes: usize) -> Self {
        Self {
            nodes: Nodes::with_capacity(nodes),
            bins: Bins::new(),
            regions: Vec::new(),
            managed_bytes: 0,
            live_bytes: 0,
            live_blocks: 0,
            padding_bytes: 0,
            free_blocks: 0,
            high_water: 0,
            prefer_low: false,
        }
    }

    /// An allocator with no region yet that places closer to best fit:
    /// among the blocks a request looks at (the first
    /// [`OWN_CLASS_PROBES`] of its own class, then as many of the good-fit
    /// class) it takes the smallest and, among equals, the lowest-addressed,
    /// where the default takes the first exact fit or the good-fit list's
    /// head (the most recently freed). Still O(1), with a few more blocks
    /// looked at per request. For users whose cost depends on where a
    /// block lands, such as the stitching pool, whose footprint is the
    /// pages its blocks touch.
    pub fn preferring_low_addresses() -> Self {
        Self {
            prefer_low: true,
            ..Self::new()
        }
    }

    /// Whether free block `a` (`a_size` bytes) beats the best so far, `best`:
    /// smaller, or (preferring low addresses) as small and lower.
    #[inline(always)]
    fn better(&self, a: u32, a_size: u64, best: Option<(u64, u32)>) -> bool {
        best.is_none_or(|(best_size, best)| {
            a_size < best_size
                || (self.prefer_low
                    && a_size == best_size
                    && self.nodes[a].offset < self.nodes[best].offset)
        })
    }

    /// Bytes in free blocks: what no live block holds.
    #[inline]
    fn free_bytes(&self) -> u64 {
        self.managed_bytes - self.live_bytes - self.padding_bytes
    }

    /// Put block `index` of `size` bytes at the head of its class's list and
    /// mark it free.
    #[inline(always)]
    fn link_free(&mut self, index: u32, size: u64) {
        let class = Class::of(size);
        let head = self.bins.head(class);
        let node = &mut self.nodes[index];
        debug_assert_eq!(node.size, size);
        node.state = State::Free;
        node.prev_free = NONE;
        node.next_free = head;
        if head == NONE {
            self.bins.set_first(class, index);
        } else {
            debug_assert_eq!(self.nodes[head].prev_free, NONE);
            self.nodes[head].prev_free = index;
            self.bins.set_head(class, index);
        }
        self.free_blocks += 1;
    }

    /// Take free block `index`, described by `node`, off its class's list.
    #[inline(always)]
    fn unlink_free(&mut self, index: u32, node: &Node) {
        debug_assert_eq!(node.state, State::Free);
        let (prev, next) = (node.prev_free, node.next_free);
        if prev == NONE {
            let class = Class::of(node.size);
            debug_assert_eq!(self.bins.head(class), index);
            self.bins.replace_head(class, next);
        } else {
            self.nodes[prev].next_free = next;
        }
        if next != NONE {
            self.nodes[next].prev_free = prev;
        }
        self.free_blocks -= 1;
    }

    /// Take the head of `class`'s list, block `index`, off the list.
    #[inline(always)]
    fn pop_head(&mut self, class: Class, index: u32) {
        let next = self.nodes[index].next_free;
        debug_assert_eq!(self.nodes[index].prev_free, NONE);
        if next != NONE {
            self.nodes[next].prev_free = NONE;
        }
        self.bins.replace_head(class, next);
        self.free_blocks -= 1;
    }

    /// The index of the region holding byte `offset`.
    #[inline]
    fn region_of(&self, offset: u64) -> usize {
        self.regions.partition_point(|r| r.extent.end() <= offset)
    }

    /// Record `index`, the block holding byte `offset`, as the last block
    /// of its region. Most pools have one region, so look at the highest
    /// first.
    #[inline(always)]
    fn set_region_last(&mut self, offset: u64, index: u32) {
        let top = self.regions.len().wrapping_sub(1);
        let region = match self.regions.get(top) {
            Some(r) if r.extent.offset <= offset => top,
            _ => self.region_of(offset),
        };
        self.regions[region].last = index;
    }

    /// Cut block `index` at `at`: it keeps `[offset, at)` and a new node
    /// takes `[at, end)`, which is returned. Neither is on a free list.
    #[inline(always)]
    fn split(&mut self, index: u32, at: u64) -> u32 {
        let lower = self.nodes[index];
        debug_assert!(lower.offset < at && at < lower.end());
        let upper = self.nodes.take(at, lower.end() - at);
        let next = lower.next_phys;
        let node = &mut self.nodes[index];
        node.size = at - lower.offset;
        node.next_phys = upper;
        let node = &mut self.nodes[upper];
        node.prev_phys = index;
        node.next_phys = next;
        if next == NONE {
            self.set_region_last(at, upper);
        } else {
            self.nodes[next].prev_phys = upper;
        }
        upper
    }

    /// Make block `index` (live, or new and on no list) free: coalesce it
    /// with free physical neighbours, keeping the lowest node and giving
    /// the others back, and list the result.
    #[inline(always)]
    fn release_block(&mut self, index: u32) {
        let node = self.nodes[index];
        let (mut block, mut size) = (index, node.size);
        let prev = node.prev_phys;
        if let Some(below) = self.nodes.get(prev).copied()
            && below.state == State::Free
        {
            self.unlink_free(prev, &below);
            self.nodes.give_back(index);
            block = prev;
            size += below.size;
        }
        let mut next = node.next_phys;
        if let Some(above) = self.nodes.get(next).copied()
            && above.state == State::Free
        {
            self.unlink_free(next, &above);
            self.nodes.give_back(next);
            size += above.size;
            next = above.next_phys;
        }
        let merged = &mut self.nodes[block];
        merged.size = size;
        merged.next_phys = next;
        if next == NONE {
            let offset = merged.offset;
            self.set_region_last(offset, block);
        } else {
            self.nodes[next].prev_phys = block;
        }
        self.link_free(block, size);
    }

    /// Where a `size`-byte request aligned to `align` (>= the granule)
    /// would start inside block `index`, if it fits there.
    #[inline(always)]
    fn fit_in(&self, index: u32, size: u64, align: u64) -> Option<u64> {
        let node = &self.nodes[index];
        let at = align_up(node.offset, align)?;
        (at.checked_add(size)? <= node.end()).then_some(at)
    }

    /// A free block that holds the request, taken off its list. Good fit
    /// first: the list at or above the request rounded up to a class
    /// boundary (plus the worst alignment gap) is non-empty only if its
    /// head fits. If that finds nothing, scan the lists from the request's
    /// own class upward, which may hold a block that fits even though its
    /// class does not promise it.
    #[inline(always)]
    fn take_block(&mut self, size: u64, rounded: u64, align: u64) -> Option<u32> {
        if let Some(index) = self.own_class_fit(size, rounded, align) {
            let node = self.nodes[index];
            self.unlink_free(index, &node);
            return Some(index);
        }
        let good_fit = rounded
            .checked_add(align - GRANULE)
            .and_then(Class::at_least)
            .and_then(|class| self.bins.first_nonempty_from(class));
        if let Some(class) = good_fit {
            let head = self.bins.head(class);
            if self.prefer_low {
                if let Some(index) = self.lowest_of(head, size, align) {
                    let node = self.nodes[index];
                    self.unlink_free(index, &node);
                    return Some(index);
                }
            } else if self.fit_in(head, size, align).is_some() {
                self.pop_head(class, head);
                return Some(head);
            }
        }
        let index = self.scan(size, align)?;
        let node = self.nodes[index];
        self.unlink_free(index, &node);
        Some(index)
    }

    /// The smallest block that holds the request among the first
    /// [`OWN_CLASS_PROBES`] of the request's own class. Good fit alone skips
    /// that class, whose blocks may or may not hold the request, and takes a
    /// larger block from the class above, which wastes memory when request
    /// sizes vary; probing a bounded number keeps allocation O(1).
    #[inline(always)]
    fn own_class_fit(&self, size: u64, rounded: u64, align: u64) -> Option<u32> {
        let head = self.bins.head(Class::of(rounded));
        self.best_of(head, size, align, (!self.prefer_low).then_some(rounded))
    }

    /// The smallest, then lowest-addressed, block that holds the request
    /// among the first [`OWN_CLASS_PROBES`] of the list starting at `head`.
    #[inline(always)]
    fn lowest_of(&self, head: u32, size: u64, align: u64) -> Option<u32> {
        self.best_of(head, size, align, None)
    }

    /// The best block (smallest, by [`Self::better`]) that holds the request
    /// among the first [`OWN_CLASS_PROBES`] of the list starting at `head`;
    /// a block of exactly `exact` bytes ends the search at once.
    #[inline(always)]
    fn best_of(&self, head: u32, size: u64, align: u64, exact: Option<u64>) -> Option<u32> {
        let mut index = head;
        let mut best: Option<(u64, u32)> = None;
        for _ in 0..OWN_CLASS_PROBES {
            if index == NONE {
                break;
            }
            let node = &self.nodes[index];
            if self.fit_in(index, size, align).is_some() && self.better(index, node.size, best) {
                if Some(node.size) == exact {
                    return Some(index);
                }
                best = Some((node.size, index));
            }
            index = node.next_free;
        }
        best.map(|(_, index)| index)
    }

    /// Any free block that holds the request, from the request's own class
    /// upward: the fallback when good fit finds nothing.
    #[cold]
    fn scan(&self, size: u64, align: u64) -> Option<u32> {
        let mut class = Some(Class::of(size));
        while let Some(from) = class {
            let found = self.bins.first_nonempty_from(from)?;
            let mut index = self.bins.head(found);
            while index != NONE {
                if self.fit_in(index, size, align).is_some() {
                    return Some(index);
                }
                index = self.nodes[index].next_free;
            }
            class = found.next();
        }
        None
    }

    /// Turn free, unlisted block `index` into an allocation of `size` bytes
    /// at an `align`-aligned offset, splitting off a leading gap and a tail
    /// of at least a granule as free blocks.
    #[inline(always)]
    fn carve(&mut self, index: u32, size: u64, rounded: u64, align: u64) -> Result<Allocation> {
        let mut block = index;
        let offset = self.nodes[block].offset;
        let at = align_up(offset, align).unwrap_or(u64::MAX);
        if at - offset >= GRANULE {
            let lower = block;
            block = self.split(lower, at);
            // Its neighbour below is live or absent: it was part of a
            // coalesced free block.
            self.link_free(lower, at - offset);
        }
        let end = self.nodes[block].end();
        let held_end = at.saturating_add(rounded).min(end);
        if end - held_end >= GRANULE {
            let tail = self.split(block, held_end);
            self.link_free(tail, end - held_end);
        }
        self.mark_used(block, at, size)
    }

    /// Mark block `index` live with `size` bytes at `offset`.
    #[inline(always)]
    fn mark_used(&mut self, index: u32, offset: u64, size: u64) -> Result<Allocation> {
        let node = &mut self.nodes[index];
        let padding = node.size - size;
        // Carving and rebuilding never leave a lead of a granule or a trail
        // of two; were that broken, say so rather than truncate.
        let (Ok(lead), Ok(trail)) = (
            u8::try_from(offset - node.offset),
            u16::try_from(node.end() - (offset + size)),
        ) else {
            return Err(Error::Corrupt("padding too wide for a node"));
        };
        node.state = State::Used;
        node.lead = lead;
        node.trail = trail;
        let generation = node.generation;
        self.live_bytes += size;
        self.live_blocks += 1;
        self.padding_bytes += padding;
        self.high_water = self.high_water.max(offset + size);
        Ok(Allocation {
            offset,
            size,
            id: u64::from(generation) << 32 | u64::from(index),
        })
    }

    /// Move block `index` (live, on no list) to a fresh entry, relinking
    /// its neighbours and region, retire `index`, and return the new entry.
    #[cold]
    fn renew_node(&mut self, index: u32) -> Result<u32> {
        if !self.nodes.can_take(1) {
            return Err(Error::Corrupt("node table full while retiring a node"));
        }
        let old = self.nodes[index];
        let fresh = self.nodes.take(old.offset, old.size);
        let generation = self.nodes[fresh].generation;
        self.nodes[fresh] = Node { generation, ..old };
        if old.prev_phys == NONE {
            let region = self.region_of(old.offset);
            self.regions[region].first = fresh;
        } else {
            self.nodes[old.prev_phys].next_phys = fresh;
        }
        if old.next_phys == NONE {
            self.set_region_last(old.offset, fresh);
        } else {
            self.nodes[old.next_phys].prev_phys = fresh;
        }
        self.nodes.retire(index);
        Ok(fresh)
    }

    #[cold]
    fn out_of_memory(&self, requested: u64, align: u64) -> Error {
        Error::OutOfMemory {
            requested,
            align,
            free_bytes: self.free_bytes(),
            largest_free: self.largest_free(),
        }
    }

    /// Size of the largest free block, bytes: the largest in the highest
    /// non-empty class.
    fn largest_free(&self) -> u64 {
        let Some(class) = self.bins.highest_nonempty() else {
            return 0;
        };
        let mut largest = 0;
        let mut index = self.bins.head(class);
        while index != NONE {
            largest = largest.max(self.nodes[index].size);
            index = self.nodes[index].next_free;
        }
        largest
    }

    /// One past the highest byte a live allocation occupies now. Free
    /// blocks never touch, so each region's top two blocks decide.
    fn top(&self) -> u64 {
        for region in self.regions.iter().rev() {
            let mut index = region.last;
            while index != NONE {
                let node = &self.nodes[index];
                if node.state == State::Used {
                    return node.alloc_end();
                }
                index = node.prev_phys;
            }
        }
        0
    }
}

impl Allocator for Tlsf {
    // Inline across the crate boundary, so a caller's loop over allocate
    // and free compiles as one piece, as generic allocators' do, and the
    // allocation comes back in registers rather than through memory.
    #[inline(always)]
    fn allocate(&mut self, size: u64, align: u64) -> Result<Allocation> {
        check_align(align)?;
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        let effective_align = align.max(GRANULE);
        let rounded = align_up(size, GRANULE).unwrap_or(u64::MAX);
        if !self.nodes.can_take(2) {
            return Err(self.out_of_memory(size, align));
        }
        match self.take_block(size, rounded, effective_align) {
            Some(index) => self.carve(index, size, rounded, effective_align),
            None => Err(self.out_of_memory(size, align)),
        }
    }

    #[inline(always)]
    fn free(&mut self, allocation: Allocation) -> Result<()> {
        let index = allocation.id as u32;
        let generation = (allocation.id >> 32) as u32;
        let live = self.nodes.get(index).filter(|node| {
            node.state == State::Used
                && node.generation == generation
                && node.alloc_offset() == allocation.offset
                && node.alloc_end() - node.alloc_offset() == allocation.size
        });
        let Some(node) = live else {
            return Err(Error::UnknownAllocation {
                offset: allocation.offset,
            });
        };
        let padding = node.size - allocation.size;
        self.live_bytes -= allocation.size;
        self.live_blocks -= 1;
        self.padding_bytes -= padding;
        let node = &mut self.nodes[index];
        let index = match node.generation.checked_add(1) {
            Some(generation) => {
                node.generation = generation;
                index
            }
            // The entry's generations have run out: the block moves to
            // another entry and this one is retired, so the ids it handed
            // out stay stale for the life of the allocator.
            None => self.renew_node(index)?,
        };
        self.release_block(index);
        Ok(())
    }

    fn add_region(&mut self, offset: u64, size: u64) -> Result<()> {
        self.add_region_impl(offset, size)
    }

    fn release_tail(&mut self, min_bytes: u64) -> Option<Extent> {
        self.release_tail_impl(min_bytes)
    }

    fn rebuild(&mut self, used: &[Extent]) -> Result<Vec<Allocation>> {
        self.rebuild_impl(used)
    }

    fn regions(&self) -> Vec<Extent> {
        self.regions.iter().map(|r| r.extent).collect()
    }

    fn free_extents(&self) -> Vec<Extent> {
        let mut free = Vec::with_capacity(self.free_blocks as usize);
        for region in &self.regions {
            let mut index = region.first;
            while index != NONE {
                let node = &self.nodes[index];
                if node.state == State::Free {
                    free.push(Extent::new(node.offset, node.size));
                }
                index = node.next_phys;
            }
        }
        free
    }

    fn free_tail(&self) -> Option<Extent> {
        let node = &self.nodes[self.regions.last()?.last];
        (node.state == State::Free).then_some(Extent::new(node.offset, node.size))
    }

    fn growth_needed(&self, size: u64, align: u64, at: NewRegion) -> Result<u64> {
        check_align(align)?;
        let top = self.regions.last().map(|r| r.extent.end());
        // Every offset handed out is a multiple of the granule.
        tail_growth(top, self.free_tail(), size, align.max(GRANULE), at)
    }

    fn stats(&self) -> Stats {
        Stats {
            managed_bytes: self.managed_bytes,
            live_bytes: self.live_bytes,
            live_blocks: self.live_blocks,
            padding_bytes: self.padding_bytes,
            free_bytes: self.free_bytes(),
            free_blocks: self.free_blocks,
            largest_free: self.largest_free(),
            high_water: self.high_water,
            top: self.top(),
        }
    }
}
