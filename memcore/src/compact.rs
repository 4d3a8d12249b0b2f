//! Compaction plans: which blocks to copy where so that free space comes
//! together, worked out without touching memory.
//!
//! A plan is made from a snapshot of the heap ([`Heap::plan_full`] or
//! [`Heap::plan_room`]); the caller copies the bytes of each [`Move`] in plan
//! order on the device, then hands the plan to [`Heap::commit`], which updates
//! the bookkeeping. The planners here see only plain [`Placed`] blocks and the
//! managed regions; they know nothing of handles' storage or of allocators.
//!
//! A full plan (full.rs) fills the lowest holes exactly with the topmost
//! blocks, then slides the rest down (slide.rs); a room plan (room.rs)
//! empties one window. Each module says why its order of moves is safe.
//!
//! [`Heap::plan_full`]: crate::Heap::plan_full
//! [`Heap::plan_room`]: crate::Heap::plan_room
//! [`Heap::commit`]: crate::Heap::commit

mod full;
mod room;
mod slide;
#[cfg(test)]
mod testing;

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use crate::{DEFAULT_ALIGN, Extent, Handle};

pub(crate) use full::pack;
pub(crate) use room::make_room;
pub(crate) use slide::slide;

/// One copy of a plan: `len` bytes of block `handle` go from `src` to `dst`.
///
/// ```
/// use memcore::{BlockFlags, DEFAULT_ALIGN, Fit, FreeList, Heap};
///
/// let mut heap = Heap::new(FreeList::new(Fit::First));
/// heap.add_region(0, 4096)?;
/// let a = heap.allocate(1024, DEFAULT_ALIGN, BlockFlags::empty())?;
/// let b = heap.allocate(1024, DEFAULT_ALIGN, BlockFlags::empty())?;
/// heap.free(a)?;
/// let plan = heap.plan_full();
/// let m = plan.moves()[0];
/// assert_eq!((m.handle, m.src, m.dst, m.len), (b, 1024, 0, 1024));
/// assert!(!m.overlapping); // [1024, 2048) and [0, 1024) share no byte
/// # Ok::<(), memcore::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The block moved; it keeps this handle after [`crate::Heap::commit`].
    pub handle: Handle,
    /// Where its bytes are now, offset in bytes.
    pub src: u64,
    /// Where its bytes go, offset in bytes (a multiple of the block's
    /// alignment).
    pub dst: u64,
    /// Bytes to copy: the block's requested size.
    pub len: u64,
    /// `[src, src + len)` and `[dst, dst + len)` share bytes, so the copy
    /// needs memmove semantics (or a bounce buffer) rather than memcpy.
    pub overlapping: bool,
}

impl Move {
    /// A move of `len` bytes from `src` to `dst`, with the overlap worked out.
    pub(crate) fn new(handle: Handle, src: u64, dst: u64, len: u64) -> Self {
        let overlapping = Extent::new(src, len).overlaps(&Extent::new(dst, len));
        Self {
            handle,
            src,
            dst,
            len,
            overlapping,
        }
    }
}

/// Moves in an order that is safe to execute one after the other, each a
/// plain copy (memmove where [`Move::overlapping`]), tied to the state of the
/// heap it was made from.
///
/// Executing a move never overwrites bytes of a block that has not been moved
/// yet, nor of a block that stays. A plan can be committed once, and only to
/// the heap it came from while that heap is unchanged; otherwise
/// [`crate::Heap::commit`] answers [`crate::Error::ForeignPlan`] or
/// [`crate::Error::StalePlan`].
///
/// Plans put blocks at multiples of [`DEFAULT_ALIGN`] (256 bytes) at least,
/// whatever alignment was asked for: device code may rely on `cudaMalloc`'s
/// 256-byte guarantee, and an allocator may hand out nothing finer (TLSF's
/// granule is 256 bytes), so room made at an odd offset could be room the
/// allocator cannot use. A block that sits at a finer offset now keeps its
/// own alignment instead, so it can always stay where it is.
///
/// ```
/// use memcore::{BlockFlags, Fit, FreeList, Heap};
///
/// let mut heap = Heap::new(FreeList::new(Fit::First));
/// heap.add_region(0, 1 << 20)?;
/// let a = heap.allocate(4096, 256, BlockFlags::empty())?;
/// let b = heap.allocate(4096, 256, BlockFlags::empty())?;
/// heap.free(a)?;
/// let plan = heap.plan_full();
/// assert_eq!(plan.bytes_moved(), 4096);
/// // ... copy plan.moves() on the device, in order ...
/// heap.commit(plan)?;
/// assert_eq!(heap.offset(b)?, 0);
/// # Ok::<(), memcore::Error>(())
/// ```
#[must_use = "a plan moves nothing until its copies are done and it is committed"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionPlan {
    pub(crate) moves: Vec<Move>,
    /// The identity of the heap it was made for.
    pub(crate) heap: u64,
    /// The heap's epoch when the plan was made.
    pub(crate) epoch: u64,
    /// Whether committing lays the allocator out anew. Not when nothing
    /// moves and nothing needs freeing: a relayout drops free slivers an
    /// allocator keeps only as padding (TLSF's under 256 bytes), which may
    /// be the very room a "fits already" answer counted on.
    pub(crate) relayout: bool,
}

impl CompactionPlan {
    /// The moves, in execution order.
    pub fn moves(&self) -> &[Move] {
        &self.moves
    }

    /// Total bytes the moves copy.
    pub fn bytes_moved(&self) -> u64 {
        self.moves.iter().map(|m| m.len).sum()
    }

    /// Whether the plan copies nothing. An empty plan from
    /// [`crate::Heap::plan_room`] may still need committing: it can make room
    /// by giving back padding.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }
}

/// The alignment, in bytes, a plan keeps for a block of `align` bytes'
/// alignment now at `offset`: at least [`DEFAULT_ALIGN`], unless the block
/// does not sit on such a boundary now.
pub(crate) fn planning_align(offset: u64, align: u64) -> u64 {
    if offset % DEFAULT_ALIGN == 0 {
        align.max(DEFAULT_ALIGN)
    } else {
        align
    }
}

/// The window a plan frees for a request of `size` bytes at `align`, as
/// (length, alignment) in bytes: the length rounded up to and the alignment
/// at least [`DEFAULT_ALIGN`]. `None` if the length overflows.
pub(crate) fn request_window(size: u64, align: u64) -> Option<(u64, u64)> {
    Some((
        crate::align_up(size, DEFAULT_ALIGN)?,
        align.max(DEFAULT_ALIGN),
    ))
}

/// A live block as the planners see it. `offset` and `size` are the usable
/// bytes; padding the allocator keeps around a block counts as free, since a
/// commit lays the allocator out anew with exactly the usable bytes in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub handle: Handle,
    /// Offset in bytes.
    pub offset: u64,
    /// Length in bytes, at least 1.
    pub size: u64,
    /// Alignment in bytes a plan must keep, a power of two
    /// ([`planning_align`]).
    pub align: u64,
    /// The planners never move it.
    pub pinned: bool,
}

impl Placed {
    pub fn extent(&self) -> Extent {
        Extent::new(self.offset, self.size)
    }
}

/// The blocks of each region, in address order.
///
/// A block that sticks out of every region (a broken allocator) is kept as a
/// pinned obstacle in each region it touches, so no plan copies onto it and
/// none moves it.
pub(crate) fn by_region(regions: &[Extent], mut blocks: Vec<Placed>) -> Vec<(Extent, Vec<Placed>)> {
    blocks.sort_by_key(|b| (b.offset, b.size));
    regions
        .iter()
        .map(|&region| {
            let first = blocks.partition_point(|b| b.extent().end() <= region.offset);
            let inside = blocks[first..]
                .iter()
                .take_while(|b| b.offset < region.end())
                .map(|b| Placed {
                    pinned: b.pinned || !region.contains(&b.extent()),
                    ..*b
                })
                .collect();
            (region, inside)
        })
        .collect()
}

/// The free ranges of `region` between its `blocks` (sorted by offset).
pub(crate) fn holes(region: Extent, blocks: &[Placed]) -> Vec<Extent> {
    let mut holes = Vec::new();
    let mut cursor = region.offset;
    for b in blocks {
        if b.offset > cursor {
            holes.push(Extent::new(cursor, b.offset - cursor));
        }
        cursor = cursor.max(b.extent().end());
    }
    if region.end() > cursor {
        holes.push(Extent::new(cursor, region.end() - cursor));
    }
    holes
}

/// The first offset in `hole` that is a multiple of `align` and leaves room
/// for `size` bytes, if any.
pub(crate) fn fit_in(hole: Extent, size: u64, align: u64) -> Option<u64> {
    let at = crate::align_up(hole.offset, align)?;
    let end = at.checked_add(size)?;
    (end <= hole.end()).then_some(at)
}

/// `blocks` where they lie once `moves` ran, sorted by offset.
pub(crate) fn moved(blocks: &[Placed], moves: &[Move]) -> Vec<Placed> {
    let dst: BTreeMap<Handle, u64> = moves.iter().map(|m| (m.handle, m.dst)).collect();
    let mut after: Vec<Placed> = blocks
        .iter()
        .map(|b| Placed {
            offset: dst.get(&b.handle).copied().unwrap_or(b.offset),
            ..*b
        })
        .collect();
    after.sort_by_key(|b| b.offset);
    after
}
