//! The reference allocator: an address-ordered list of free ranges.
//!
//! Simple enough to be obviously right, so the property tests use it as the
//! model for [`Tlsf`](crate::Tlsf), and trace replay uses it as the
//! "first-fit" and "best-fit" baselines. It holds exactly the bytes it was
//! asked for: an alignment gap becomes a free range of its own and sizes are
//! not rounded, so its `padding_bytes` is always 0.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use crate::alloc_api::{check_layout, tail_growth};
use crate::{
    Allocation, Allocator, Error, Extent, NewRegion, Result, Stats, align_up, check_align,
};

/// Which free range [`FreeList`] places a request in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fit {
    /// The lowest-addressed range that fits.
    First,
    /// The smallest range that fits; the lowest-addressed among equals.
    Best,
}

/// A live block: what the caller asked for, and the token that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Live {
    /// Requested length in bytes (the block holds exactly this).
    size: u64,
    /// Serial number handed out as [`Allocation::id`], so a stale
    /// allocation never frees a newer block at the same offset.
    id: u64,
}

/// The reference allocator: free ranges kept sorted by address, split on
/// allocation and coalesced with both neighbours on free.
///
/// Allocation is O(free ranges) for [`Fit::First`] and O(log n) plus the
/// ranges skipped for alignment for [`Fit::Best`]; free is O(log n).
///
/// ```
/// use memcore::{Allocator, Fit, FreeList};
///
/// let mut heap = FreeList::new(Fit::First);
/// heap.add_region(0, 4096)?;
/// let a = heap.allocate(1000, 256)?;
/// let b = heap.allocate(1000, 256)?;
/// assert_eq!((a.offset, b.offset), (0, 1024));
/// heap.free(a)?;
/// heap.free(b)?;
/// assert_eq!(heap.stats().largest_free, 4096);
/// # Ok::<(), memcore::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct FreeList {
    fit: Fit,
    /// Managed regions: start -> length in bytes; adjacent regions merged.
    regions: BTreeMap<u64, u64>,
    /// Free ranges: start -> length in bytes; never two adjacent.
    free: BTreeMap<u64, u64>,
    /// The same free ranges as `(length, start)`, for best fit and the
    /// largest free range.
    free_by_size: BTreeSet<(u64, u64)>,
    /// Live blocks by start offset.
    live: BTreeMap<u64, Live>,
    next_id: u64,
    managed_bytes: u64,
    live_bytes: u64,
    free_bytes: u64,
    high_water: u64,
}

impl FreeList {
    /// An allocator with the given placement policy and no region yet.
    pub fn new(fit: Fit) -> Self {
        Self {
            fit,
            regions: BTreeMap::new(),
            free: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
            live: BTreeMap::new(),
            next_id: 0,
            managed_bytes: 0,
            live_bytes: 0,
            free_bytes: 0,
            high_water: 0,
        }
    }

    /// The placement policy.
    pub fn fit(&self) -> Fit {
        self.fit
    }

    /// The offset a `size`-byte, `align`-aligned request lands at inside the
    /// free range `[start, start + len)`, if it fits there.
    fn place_in(start: u64, len: u64, size: u64, align: u64) -> Option<u64> {
        let at = align_up(start, align)?;
        let end = at.checked_add(size)?;
        (end <= start + len).then_some(at)
    }

    fn find(&self, size: u64, align: u64) -> Option<(u64, u64, u64)> {
        match self.fit {
            Fit::First => self.free.iter().find_map(|(&start, &len)| {
                Self::place_in(start, len, size, align).map(|at| (start, len, at))
            }),
            Fit::Best => self
                .free_by_size
                .range((size, 0)..)
                .find_map(|&(len, start)| {
                    Self::place_in(start, len, size, align).map(|at| (start, len, at))
                }),
        }
    }

    fn insert_free_raw(&mut self, start: u64, len: u64) {
        self.free.insert(start, len);
        self.free_by_size.insert((len, start));
        self.free_bytes += len;
    }

    fn remove_free_raw(&mut self, start: u64, len: u64) {
        self.free.remove(&start);
        self.free_by_size.remove(&(len, start));
        self.free_bytes -= len;
    }

    /// Mark `[start, start + len)` free, merging with free ranges that touch
    /// it on either side. Ranges only touch inside one region, since
    /// touching regions are merged.
    fn insert_free(&mut self, mut start: u64, mut len: u64) {
        let before = self.free.range(..start).next_back();
        if let Some((&prev, &prev_len)) = before.filter(|&(&o, &l)| o + l == start) {
            self.remove_free_raw(prev, prev_len);
            start = prev;
            len += prev_len;
        }
        if let Some(&next_len) = self.free.get(&(start + len)) {
            self.remove_free_raw(start + len, next_len);
            len += next_len;
        }
        self.insert_free_raw(start, len);
    }

    fn region_containing(&self, extent: &Extent) -> Option<Extent> {
        let (&start, &len) = self.regions.range(..=extent.offset).next_back()?;
        let region = Extent::new(start, len);
        region.contains(extent).then_some(region)
    }

    fn new_live(&mut self, offset: u64, size: u64) -> Allocation {
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(offset, Live { size, id });
        self.live_bytes += size;
        self.high_water = self.high_water.max(offset + size);
        Allocation { offset, size, id }
    }

    fn largest_free(&self) -> u64 {
        self.free_by_size.last().map_or(0, |&(len, _)| len)
    }
}

impl Allocator for FreeList {
    fn allocate(&mut self, size: u64, align: u64) -> Result<Allocation> {
        check_align(align)?;
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        let Some((start, len, at)) = self.find(size, align) else {
            return Err(Error::OutOfMemory {
                requested: size,
                align,
                free_bytes: self.free_bytes,
                largest_free: self.largest_free(),
            });
        };
        self.remove_free_raw(start, len);
        // The pieces left over border live blocks or region ends, so they
        // need no coalescing.
        if at > start {
            self.insert_free_raw(start, at - start);
        }
        let end = at + size;
        if end < start + len {
            self.insert_free_raw(end, start + len - end);
        }
        Ok(self.new_live(at, size))
    }

    fn free(&mut self, allocation: Allocation) -> Result<()> {
        let unknown = Error::UnknownAllocation {
            offset: allocation.offset,
        };
        let live = self.live.get(&allocation.offset).ok_or(unknown.clone())?;
        if live.size != allocation.size || live.id != allocation.id {
            return Err(unknown);
        }
        self.live.remove(&allocation.offset);
        self.live_bytes -= allocation.size;
        self.insert_free(allocation.offset, allocation.size);
        Ok(())
    }

    fn add_region(&mut self, offset: u64, size: u64) -> Result<()> {
        let (new, end) = Extent::region(offset, size)?;
        let below = self.regions.range(..end).next_back();
        if below.is_some_and(|(&o, &l)| Extent::new(o, l).overlaps(&new)) {
            return Err(Error::RegionOverlap { offset, size });
        }
        let mut start = offset;
        let mut len = size;
        let before = self.regions.range(..offset).next_back();
        if let Some((&prev, &prev_len)) = before.filter(|&(&o, &l)| o + l == offset) {
            self.regions.remove(&prev);
            start = prev;
            len += prev_len;
        }
        if let Some(next_len) = self.regions.remove(&end) {
            len += next_len;
        }
        self.regions.insert(start, len);
        self.managed_bytes += size;
        self.insert_free(offset, size);
        Ok(())
    }

    fn free_tail(&self) -> Option<Extent> {
        let (&region, &region_len) = self.regions.last_key_value()?;
        let end = region + region_len;
        let (&start, &len) = self.free.range(..end).next_back()?;
        (start + len == end).then_some(Extent::new(start, len))
    }

    fn growth_needed(&self, size: u64, align: u64, at: NewRegion) -> Result<u64> {
        let top = self.regions.last_key_value().map(|(&o, &l)| o + l);
        tail_growth(top, self.free_tail(), size, align, at)
    }

    fn release_tail(&mut self, min_bytes: u64) -> Option<Extent> {
        let (&region, &region_len) = self.regions.last_key_value()?;
        let Extent {
            offset: start,
            size: len,
        } = self.free_tail()?;
        if len < min_bytes {
            return None;
        }
        self.remove_free_raw(start, len);
        if start == region {
            self.regions.remove(&region);
        } else {
            self.regions.insert(region, region_len - len);
        }
        self.managed_bytes -= len;
        Some(Extent::new(start, len))
    }

    fn rebuild(&mut self, used: &[Extent]) -> Result<Vec<Allocation>> {
        check_layout(used, |e| self.region_containing(e).is_some())?;
        self.live.clear();
        self.free.clear();
        self.free_by_size.clear();
        self.live_bytes = 0;
        self.free_bytes = 0;
        let regions: Vec<(u64, u64)> = self.regions.iter().map(|(&o, &l)| (o, l)).collect();
        let mut rest = used;
        let mut allocations = Vec::with_capacity(used.len());
        for (start, len) in regions {
            let end = start + len;
            let mut cursor = start;
            let inside = rest.partition_point(|e| e.offset < end);
            for e in &rest[..inside] {
                if e.offset > cursor {
                    self.insert_free_raw(cursor, e.offset - cursor);
                }
                allocations.push(self.new_live(e.offset, e.size));
                cursor = e.end();
            }
            if cursor < end {
                self.insert_free_raw(cursor, end - cursor);
            }
            rest = &rest[inside..];
        }
        Ok(allocations)
    }

    fn regions(&self) -> Vec<Extent> {
        self.regions
            .iter()
            .map(|(&o, &l)| Extent::new(o, l))
            .collect()
    }

    fn free_extents(&self) -> Vec<Extent> {
        self.free.iter().map(|(&o, &l)| Extent::new(o, l)).collect()
    }

    fn stats(&self) -> Stats {
        Stats {
            managed_bytes: self.managed_bytes,
            live_bytes: self.live_bytes,
            live_blocks: self.live.len() as u64,
            padding_bytes: 0,
            free_bytes: self.free_bytes,
            free_blocks: self.free.len() as u64,
            largest_free: self.largest_free(),
            high_water: self.high_water,
            top: self
                .live
                .last_key_value()
                .map_or(0, |(&o, live)| o + live.size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn heap(fit: Fit, size: u64) -> FreeList {
        let mut h = FreeList::new(fit);
        h.add_region(0, size).unwrap();
        h
    }

    /// `live + padding + free == managed`, and the free ranges are sorted,
    /// never touching, inside regions and match the counters.
    fn assert_consistent(h: &FreeList) {
        let s = h.stats();
        assert_eq!(
            s.live_bytes + s.padding_bytes + s.free_bytes,
            s.managed_bytes
        );
        let free = h.free_extents();
        assert_eq!(free.iter().map(|e| e.size).sum::<u64>(), s.free_bytes);
        assert_eq!(free.len() as u64, s.free_blocks);
        assert_eq!(
            free.iter().map(|e| e.size).max().unwrap_or(0),
            s.largest_free
        );
        for w in free.windows(2) {
            assert!(w[0].end() < w[1].offset, "free ranges touch: {w:?}");
        }
        let regions = h.regions();
        for e in &free {
            assert!(regions.iter().any(|r| r.contains(e)));
        }
        assert_eq!(regions.iter().map(|r| r.size).sum::<u64>(), s.managed_bytes);
    }

    #[test]
    fn first_fit_takes_lowest_and_best_fit_takes_smallest() {
        for fit in [Fit::First, Fit::Best] {
            let mut h = heap(fit, 10 * KIB);
            let a = h.allocate(3 * KIB, 256).unwrap();
            let _b = h.allocate(KIB, 256).unwrap();
            let c = h.allocate(KIB, 256).unwrap();
            let _d = h.allocate(KIB, 256).unwrap();
            h.free(a).unwrap();
            h.free(c).unwrap();
            // Holes: [0, 3K) and [4K, 5K), plus the tail [6K, 10K).
            let x = h.allocate(KIB, 256).unwrap();
            let expected = match fit {
                Fit::First => 0,
                Fit::Best => 4 * KIB,
            };
            assert_eq!(x.offset, expected, "{fit:?}");
            assert_consistent(&h);
        }
    }

    #[test]
    fn free_coalesces_with_both_neighbours() {
        let mut h = heap(Fit::First, 3 * KIB);
        let a = h.allocate(KIB, 1).unwrap();
        let b = h.allocate(KIB, 1).unwrap();
        let c = h.allocate(KIB, 1).unwrap();
        h.free(a).unwrap();
        h.free(c).unwrap();
        assert_eq!(h.stats().free_blocks, 2);
        h.free(b).unwrap();
        assert_eq!(h.free_extents(), [Extent::new(0, 3 * KIB)]);
        assert_consistent(&h);
    }

    #[test]
    fn alignment_gap_becomes_free_range() {
        for align in [2 * MIB, GIB] {
            let mut h = heap(Fit::First, 4 * GIB);
            let small = h.allocate(100, 1).unwrap();
            let big = h.allocate(MIB, align).unwrap();
            assert_eq!(big.offset, align);
            assert_eq!(
                h.free_extents(),
                [
                    Extent::new(100, align - 100),
                    Extent::new(align + MIB, 4 * GIB - align - MIB)
                ]
            );
            assert_eq!(h.stats().padding_bytes, 0);
            h.free(small).unwrap();
            h.free(big).unwrap();
            assert_eq!(h.free_extents(), [Extent::new(0, 4 * GIB)]);
            assert_consistent(&h);
        }
    }

    #[test]
    fn double_and_forged_free_are_rejected() {
        let mut h = heap(Fit::First, MIB);
        let a = h.allocate(KIB, 256).unwrap();
        h.free(a).unwrap();
        assert_eq!(h.free(a), Err(Error::UnknownAllocation { offset: 0 }));
        // The same offset and size again, but a newer block: the stale
        // token must not free it.
        let b = h.allocate(KIB, 256).unwrap();
        assert_eq!(b.extent(), a.extent());
        assert_eq!(h.free(a), Err(Error::UnknownAllocation { offset: 0 }));
        let wrong_size = Allocation { size: 2 * KIB, ..b };
        assert!(h.free(wrong_size).is_err());
        assert_eq!(h.stats().live_blocks, 1);
        h.free(b).unwrap();
        assert_consistent(&h);
    }

    #[test]
    fn out_of_memory_reports_free_and_largest() {
        let mut h = heap(Fit::Best, 4 * KIB);
        let a = h.allocate(KIB, 1).unwrap();
        let _b = h.allocate(KIB, 1).unwrap();
        h.free(a).unwrap();
        assert_eq!(
            h.allocate(3 * KIB, 1),
            Err(Error::OutOfMemory {
                requested: 3 * KIB,
                align: 1,
                free_bytes: 3 * KIB,
                largest_free: 2 * KIB,
            })
        );
        assert_eq!(h.allocate(0, 1), Err(Error::ZeroSize));
        assert!(matches!(
            h.allocate(1, 3),
            Err(Error::InvalidAlignment { .. })
        ));
        assert!(matches!(
            h.allocate(1, 2 * GIB),
            Err(Error::InvalidAlignment { .. })
        ));
    }

    #[test]
    fn add_region_merges_across_the_seam_and_rejects_bad_ranges() {
        let mut h = heap(Fit::First, 4 * KIB);
        let _a = h.allocate(3 * KIB, 1).unwrap();
        h.add_region(4 * KIB, 4 * KIB).unwrap();
        assert_eq!(h.regions(), [Extent::new(0, 8 * KIB)]);
        assert_eq!(h.free_extents(), [Extent::new(3 * KIB, 5 * KIB)]);
        // A region below, touching: merges too.
        h.add_region(16 * KIB, KIB).unwrap();
        h.add_region(8 * KIB, 8 * KIB).unwrap();
        assert_eq!(h.regions(), [Extent::new(0, 17 * KIB)]);
        assert_eq!(h.free_extents(), [Extent::new(3 * KIB, 14 * KIB)]);
        assert_eq!(
            h.add_region(KIB, KIB),
            Err(Error::RegionOverlap {
                offset: KIB,
                size: KIB
            })
        );
        assert_eq!(h.add_region(20 * KIB, 0), Err(Error::ZeroSize));
        assert_eq!(
            h.add_region(u64::MAX, 2),
            Err(Error::Overflow {
                offset: u64::MAX,
                size: 2
            })
        );
        // A separate region does not coalesce with the first.
        h.add_region(32 * KIB, KIB).unwrap();
        assert_eq!(h.regions().len(), 2);
        assert_eq!(h.stats().free_blocks, 2);
        assert_consistent(&h);
    }

    #[test]
    fn release_tail_shrinks_the_highest_region() {
        let mut h = heap(Fit::First, 8 * KIB);
        h.add_region(64 * KIB, 8 * KIB).unwrap();
        let a = h.allocate(8 * KIB, 1).unwrap();
        let b = h.allocate(2 * KIB, 1).unwrap();
        assert_eq!(b.offset, 64 * KIB);
        assert_eq!(h.release_tail(7 * KIB), None);
        assert_eq!(
            h.release_tail(6 * KIB),
            Some(Extent::new(66 * KIB, 6 * KIB))
        );
        assert_eq!(
            h.regions(),
            [Extent::new(0, 8 * KIB), Extent::new(64 * KIB, 2 * KIB)]
        );
        assert_eq!(h.release_tail(0), None, "tail block is live");
        h.free(b).unwrap();
        assert_eq!(h.release_tail(0), Some(Extent::new(64 * KIB, 2 * KIB)));
        assert_eq!(h.regions(), [Extent::new(0, 8 * KIB)]);
        assert_eq!(h.release_tail(0), None);
        h.free(a).unwrap();
        assert_eq!(h.stats().managed_bytes, 8 * KIB);
        assert_consistent(&h);
    }

    #[test]
    fn rebuild_lays_out_exactly_the_used_extents() {
        let mut h = heap(Fit::First, 16 * KIB);
        h.add_region(32 * KIB, 4 * KIB).unwrap();
        let old = h.allocate(KIB, 1).unwrap();
        let used = [
            Extent::new(KIB, KIB),
            Extent::new(2 * KIB, 512),
            Extent::new(33 * KIB, KIB),
        ];
        let allocations = h.rebuild(&used).unwrap();
        assert_eq!(
            allocations.iter().map(|a| a.extent()).collect::<Vec<_>>(),
            used
        );
        assert_eq!(
            h.free_extents(),
            [
                Extent::new(0, KIB),
                Extent::new(2 * KIB + 512, 14 * KIB - 512),
                Extent::new(32 * KIB, KIB),
                Extent::new(34 * KIB, 2 * KIB),
            ]
        );
        assert!(h.free(old).is_err(), "rebuild forgets old allocations");
        assert_eq!(h.stats().top, 34 * KIB);
        for a in allocations {
            h.free(a).unwrap();
        }
        assert_eq!(h.stats().free_blocks, 2);
        assert_consistent(&h);
    }

    #[test]
    fn rebuild_rejects_bad_layouts_and_changes_nothing() {
        let mut h = heap(Fit::First, 16 * KIB);
        let a = h.allocate(KIB, 1).unwrap();
        let before = h.stats();
        let bad: [&[Extent]; 4] = [
            &[Extent::new(0, 0)],
            &[Extent::new(2 * KIB, KIB), Extent::new(0, KIB)],
            &[Extent::new(0, KIB), Extent::new(KIB - 1, KIB)],
            &[Extent::new(15 * KIB, 2 * KIB)],
        ];
        for used in bad {
            assert!(
                matches!(h.rebuild(used), Err(Error::InvalidLayout { .. })),
                "{used:?}"
            );
        }
        assert_eq!(h.stats(), before);
        h.free(a).unwrap();
    }

    #[test]
    fn stats_track_high_water_and_top() {
        let mut h = heap(Fit::First, MIB);
        let a = h.allocate(KIB, 1).unwrap();
        let b = h.allocate(KIB, 1).unwrap();
        h.free(b).unwrap();
        let s = h.stats();
        assert_eq!((s.high_water, s.top), (2 * KIB, KIB));
        h.free(a).unwrap();
        let s = h.stats();
        assert_eq!(
            (s.high_water, s.top, s.live_blocks, s.live_bytes),
            (2 * KIB, 0, 0, 0)
        );
    }
}
