//! The allocator interface shared by every policy, and the plain data it
//! returns.

use alloc::vec::Vec;

use crate::{Error, Result};

/// The largest alignment any allocator accepts, in bytes (1 GiB).
pub const MAX_ALIGN: u64 = 1 << 30;

/// The alignment `cudaMalloc` guarantees and the default here, in bytes.
pub const DEFAULT_ALIGN: u64 = 256;

/// A contiguous range of the address space: `[offset, offset + size)`, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Extent {
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
}

impl Extent {
    /// A range starting at `offset` of `size` bytes.
    pub const fn new(offset: u64, size: u64) -> Self {
        Self { offset, size }
    }

    /// One past the last byte, clipped to the 64-bit address space: an
    /// extent that runs past it ends at `u64::MAX`, and [`checked_end`]
    /// says so. Never panics.
    ///
    /// Allocators never hand out such an extent: regions and layouts that
    /// would overflow are refused with [`Error::Overflow`] or
    /// [`Error::InvalidLayout`].
    ///
    /// ```
    /// use memcore::Extent;
    ///
    /// assert_eq!(Extent::new(4096, 256).end(), 4352);
    /// let past = Extent::new(u64::MAX, 2);
    /// assert_eq!((past.end(), past.checked_end()), (u64::MAX, None));
    /// ```
    ///
    /// [`checked_end`]: Extent::checked_end
    pub const fn end(&self) -> u64 {
        self.offset.saturating_add(self.size)
    }

    /// A region to add to an allocator: `size` bytes at `offset`, and its
    /// end; [`Error::ZeroSize`] or [`Error::Overflow`] where it has no
    /// bytes or runs past the 64-bit address space.
    pub(crate) fn region(offset: u64, size: u64) -> crate::Result<(Self, u64)> {
        if size == 0 {
            return Err(crate::Error::ZeroSize);
        }
        let end = offset
            .checked_add(size)
            .ok_or(crate::Error::Overflow { offset, size })?;
        Ok((Self::new(offset, size), end))
    }

    /// One past the last byte, or `None` if that overflows the 64-bit
    /// address space.
    pub const fn checked_end(&self) -> Option<u64> {
        self.offset.checked_add(self.size)
    }

    /// Whether the two ranges share a byte.
    pub const fn overlaps(&self, other: &Extent) -> bool {
        self.offset < other.end() && other.offset < self.end()
    }

    /// Whether `other` lies wholly inside `self`.
    pub const fn contains(&self, other: &Extent) -> bool {
        other.offset >= self.offset && other.end() <= self.end()
    }
}

/// Where a growth would add its region, for [`Allocator::growth_needed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NewRegion {
    /// Starting at this offset, bytes. If the highest region ends there,
    /// the new one extends it, and the free block at its end (if any)
    /// joins the new bytes.
    At(u64),
    /// At an offset not known yet, a multiple of [`DEFAULT_ALIGN`] that no
    /// region ends at (a fresh device chunk). The answer holds wherever it
    /// lands; it is exact where that offset is the worst case for the
    /// alignment asked (`DEFAULT_ALIGN` past a multiple of it).
    Anywhere,
}

/// A live allocation as an allocator hands it out.
///
/// `offset` and `size` are what the caller asked for (the offset honours the
/// requested alignment); `id` is the allocator's own token for the block,
/// opaque to callers, which makes [`Allocator::free`] O(1) and lets it reject
/// a stale or forged allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// Aligned start of the usable bytes.
    pub offset: u64,
    /// Requested length in bytes.
    pub size: u64,
    /// Allocator-private token.
    pub id: u64,
}

impl Allocation {
    /// The usable bytes as an [`Extent`].
    pub const fn extent(&self) -> Extent {
        Extent::new(self.offset, self.size)
    }
}

/// A snapshot of an allocator's state. All sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Bytes in all managed regions.
    pub managed_bytes: u64,
    /// Requested bytes of all live allocations.
    pub live_bytes: u64,
    /// Number of live allocations.
    pub live_blocks: u64,
    /// Bytes held by live allocations beyond what was requested: alignment
    /// gaps and rounding. `live + padding + free == managed`.
    pub padding_bytes: u64,
    /// Bytes in free blocks.
    pub free_bytes: u64,
    /// Number of free blocks.
    pub free_blocks: u64,
    /// Size of the largest free block.
    pub largest_free: u64,
    /// One past the highest byte any live allocation has ever occupied.
    pub high_water: u64,
    /// One past the highest byte a live allocation occupies now (0 if none).
    pub top: u64,
}

impl Stats {
    /// External fragmentation: `1 - largest_free / free_bytes`, 0 when
    /// nothing is free.
    pub fn external_fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free as f64 / self.free_bytes as f64
        }
    }
}

/// A free-list allocator over an abstract address space.
///
/// Implementations manage one or more regions added with
/// [`add_region`](Allocator::add_region); they never touch memory, they only
/// hand out offsets.
pub trait Allocator {
    /// Reserve `size` bytes at an offset that is a multiple of `align`
    /// (a power of two up to [`MAX_ALIGN`]).
    fn allocate(&mut self, size: u64, align: u64) -> Result<Allocation>;

    /// Give a live allocation back. Freeing one that is not live (already
    /// freed, from another allocator, or forged) is
    /// [`Error::UnknownAllocation`] and changes nothing.
    fn free(&mut self, allocation: Allocation) -> Result<()>;

    /// Manage `[offset, offset + size)` too. A region that starts where an
    /// existing one ends extends it, and the free space on both sides of the
    /// seam coalesces.
    fn add_region(&mut self, offset: u64, size: u64) -> Result<()>;

    /// Stop managing the free block at the very end of the highest region,
    /// if there is one of at least `min_bytes`, and return it. This is how a
    /// pool shrinks: the caller gives the range back to the device.
    fn release_tail(&mut self, min_bytes: u64) -> Option<Extent>;

    /// Forget every allocation and lay the managed regions out anew with
    /// exactly `used` in use. `used` is sorted by offset, its extents do not
    /// overlap and lie inside managed regions; each extent's own bytes are
    /// what the new allocation covers (offset and size). Returns one
    /// allocation per extent, in order. Compaction commits through this.
    fn rebuild(&mut self, used: &[Extent]) -> Result<Vec<Allocation>>;

    /// The managed regions, sorted by offset, adjacent ones merged.
    fn regions(&self) -> Vec<Extent>;

    /// Free blocks, sorted by offset.
    fn free_extents(&self) -> Vec<Extent>;

    /// Current figures.
    fn stats(&self) -> Stats;

    /// The free block at the very end of the highest region, if there is
    /// one: what [`release_tail`](Allocator::release_tail) would give back
    /// and what a growth at the top extends. O(1) or O(log n).
    fn free_tail(&self) -> Option<Extent>;

    /// How many bytes a region added at `at` must span so that a
    /// `size`-byte request aligned to `align` then fits: at the top, in the
    /// new bytes together with the free block they join (see
    /// [`NewRegion`]). 0 if that free block holds the request already.
    /// O(1) or O(log n).
    ///
    /// Exact: with that many bytes the request fits, with one byte fewer it
    /// does not fit at the top. Since no allocator here fails a request
    /// that one free block can hold, a caller whose request was refused
    /// grows by this much (or more) and the retry succeeds: no loop, no
    /// guess at the allocator's rounding.
    ///
    /// [`Error::ZeroSize`], [`Error::InvalidAlignment`], or
    /// [`Error::Overflow`] when the answer passes the 64-bit address space.
    ///
    /// ```
    /// use memcore::{Allocator, NewRegion, Tlsf};
    ///
    /// let mut tlsf = Tlsf::new();
    /// tlsf.add_region(0, 4096)?;
    /// tlsf.allocate(1000, 256)?; // held as [0, 1024); [1024, 4096) free
    /// let need = tlsf.growth_needed(8192, 4096, NewRegion::At(4096))?;
    /// assert_eq!(need, 8192); // the block lands at 4096
    /// assert!(tlsf.allocate(8192, 4096).is_err());
    /// tlsf.add_region(4096, need)?;
    /// assert_eq!(tlsf.allocate(8192, 4096)?.offset, 4096);
    /// # Ok::<(), memcore::Error>(())
    /// ```
    fn growth_needed(&self, size: u64, align: u64, at: NewRegion) -> Result<u64>;
}

/// [`Allocator::growth_needed`] for an allocator that places a request at
/// the first multiple of `align` in a free block and needs `size` bytes
/// from there: `top` is the end of its highest region, `tail` the free
/// block ending there.
pub(crate) fn tail_growth(
    top: Option<u64>,
    tail: Option<Extent>,
    size: u64,
    align: u64,
    at: NewRegion,
) -> Result<u64> {
    if size == 0 {
        return Err(Error::ZeroSize);
    }
    check_align(align)?;
    let overflow = |offset| Error::Overflow { offset, size };
    match at {
        NewRegion::At(at) => {
            let start = match (top, tail) {
                (Some(top), Some(tail)) if top == at && tail.end() == at => tail.offset,
                _ => at,
            };
            let end = align_up(start, align)
                .and_then(|placed| placed.checked_add(size))
                .ok_or(overflow(start))?;
            Ok(end.saturating_sub(at))
        }
        NewRegion::Anywhere => size
            .checked_add(align.saturating_sub(DEFAULT_ALIGN))
            .ok_or(overflow(0)),
    }
}

/// Check an alignment: a power of two no larger than [`MAX_ALIGN`].
pub fn check_align(align: u64) -> Result<()> {
    if align.is_power_of_two() && align <= MAX_ALIGN {
        Ok(())
    } else {
        Err(Error::InvalidAlignment {
            align,
            max: MAX_ALIGN,
        })
    }
}

/// Round `value` up to a multiple of `align` (a power of two), or `None` on
/// overflow.
pub const fn align_up(value: u64, align: u64) -> Option<u64> {
    match value.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

/// Check a layout against the rules of [`Allocator::rebuild`]: every extent
/// non-empty, sorted, not overlapping the one before, and inside a managed
/// region as `inside` judges.
pub(crate) fn check_layout(used: &[Extent], inside: impl Fn(&Extent) -> bool) -> Result<()> {
    let mut prev_end = 0;
    for (i, e) in used.iter().enumerate() {
        let invalid = |why| Error::InvalidLayout {
            offset: e.offset,
            size: e.size,
            why,
        };
        if e.size == 0 {
            return Err(invalid("is empty"));
        }
        let end = e
            .offset
            .checked_add(e.size)
            .ok_or(invalid("overflows the address space"))?;
        if i > 0 && e.offset < prev_end {
            return Err(invalid("overlaps or precedes the block before it"));
        }
        if !inside(e) {
            return Err(invalid("lies outside the managed regions"));
        }
        prev_end = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fit, FreeList, Tlsf};

    /// After each refused request of a random workload, growing by
    /// `growth_needed` makes it fit and one byte less does not, at the top
    /// (`At`) and in a fresh region at the worst offset (`Anywhere`).
    fn growth_is_exact<A: Allocator + Clone>(fresh: impl Fn() -> A) {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let mut checked = 0;
        for _ in 0..20 {
            let mut a = fresh();
            let mut top = 1 << 20;
            a.add_region(0, top).unwrap();
            let mut live = Vec::new();
            for _ in 0..300 {
                if !live.is_empty() && next(3) == 0 {
                    let victim = live.swap_remove(next(live.len() as u64) as usize);
                    a.free(victim).unwrap();
                    continue;
                }
                let size = 1 + next(64 << 10);
                let align = 1 << next(14);
                if let Ok(block) = a.allocate(size, align) {
                    live.push(block);
                    continue;
                }
                checked += 1;
                let need = a.growth_needed(size, align, NewRegion::At(top)).unwrap();
                assert!(need > 0, "refused, yet the tail holds it");
                if need > 1 {
                    let mut short = a.clone();
                    short.add_region(top, need - 1).unwrap();
                    assert!(
                        short.allocate(size, align).is_err(),
                        "{need} is not the least"
                    );
                }
                let far = 1 << 40;
                // The worst multiple of 256 for the alignment: just past one.
                let worst = far
                    + if align > DEFAULT_ALIGN {
                        DEFAULT_ALIGN
                    } else {
                        0
                    };
                let anywhere = a.growth_needed(size, align, NewRegion::Anywhere).unwrap();
                let mut apart = a.clone();
                apart.add_region(worst, anywhere).unwrap();
                assert!(apart.allocate(size, align).is_ok(), "Anywhere: {anywhere}");
                if anywhere > 1 {
                    let mut short = a.clone();
                    short.add_region(worst, anywhere - 1).unwrap();
                    assert!(short.allocate(size, align).is_err(), "Anywhere: {anywhere}");
                }
                a.add_region(top, need).unwrap();
                top += need;
                live.push(a.allocate(size, align).expect("grown by growth_needed"));
            }
        }
        assert!(checked > 100, "only {checked} refusals checked");
    }

    #[test]
    fn growth_needed_is_exact_for_every_allocator() {
        growth_is_exact(Tlsf::new);
        growth_is_exact(|| FreeList::new(Fit::First));
        growth_is_exact(|| FreeList::new(Fit::Best));
    }

    #[test]
    fn growth_needed_refuses_bad_requests() {
        let mut tlsf = Tlsf::new();
        tlsf.add_region(0, 4096).unwrap();
        assert_eq!(
            tlsf.growth_needed(0, 256, NewRegion::At(4096)),
            Err(Error::ZeroSize)
        );
        assert!(matches!(
            tlsf.growth_needed(1, 3, NewRegion::At(4096)),
            Err(Error::InvalidAlignment { .. })
        ));
        assert!(matches!(
            tlsf.growth_needed(u64::MAX, 1 << 20, NewRegion::Anywhere),
            Err(Error::Overflow { .. })
        ));
        // A region that does not touch the top starts fresh.
        assert_eq!(tlsf.growth_needed(100, 256, NewRegion::At(8192)), Ok(100));
        // The free tail [0, 4096) joins a region added at 4096.
        assert_eq!(tlsf.growth_needed(5000, 256, NewRegion::At(4096)), Ok(904));
    }

    #[test]
    fn an_extent_past_the_address_space_is_clipped_not_wrapped() {
        let past = Extent::new(u64::MAX, 2);
        assert_eq!(past.end(), u64::MAX);
        assert_eq!(past.checked_end(), None);
        assert_eq!(Extent::new(7, 9).checked_end(), Some(16));
        // Wrapped, its end would be 1 and it would contain [0, 1).
        assert!(!past.contains(&Extent::new(0, 1)));
        assert!(!past.overlaps(&Extent::new(0, 1)));
        assert!(Extent::new(u64::MAX - 4, 8).overlaps(&Extent::new(u64::MAX - 1, 1)));
    }
}
