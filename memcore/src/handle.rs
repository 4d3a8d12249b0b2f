//! Relocatable handles: blocks named by a [`Handle`] rather than an offset,
//! so compaction can move them.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::cell::Cell;
use core::sync::atomic::{AtomicU64, Ordering};

use slab::Slab;

use crate::compact::{self, CompactionPlan, Placed};
use crate::{Allocation, Allocator, Error, Extent, Result, Stats, check_align};

bitflags::bitflags! {
    /// Per-block flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct BlockFlags: u32 {
        /// Compaction never moves this block (the caller holds its raw
        /// address, e.g. a kernel argument in flight).
        const PINNED = 1 << 0;
    }
}

/// The identity of the next heap made: every [`Heap`] takes its own, so a
/// handle or plan can say which heap it came from.
static NEXT_HEAP_ID: AtomicU64 = AtomicU64::new(0);

/// A name for a live block that stays valid when the block moves.
///
/// Carries a generation, so a handle kept after its block was freed is
/// rejected rather than aliasing the next block in the same slot, and the
/// identity of its heap, so another heap rejects it
/// ([`Error::ForeignHandle`]) rather than freeing its own block in that slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle {
    pub(crate) heap: u64,
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

impl Handle {
    /// Index of the handle's slot: unique among live handles, reused after
    /// a free (with a new generation). Lets callers keep per-block data in a
    /// `Vec` indexed by it.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

/// What a heap knows of one live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    /// Current offset in bytes.
    pub offset: u64,
    /// Requested length in bytes.
    pub size: u64,
    /// Alignment it was allocated with, in bytes; moves keep it.
    pub align: u64,
    /// Its flags.
    pub flags: BlockFlags,
}

/// What the heap keeps per live block.
#[derive(Debug, Clone, Copy)]
struct Entry {
    allocation: Allocation,
    align: u64,
    flags: BlockFlags,
}

impl Entry {
    fn info(&self) -> BlockInfo {
        BlockInfo {
            offset: self.allocation.offset,
            size: self.allocation.size,
            align: self.align,
            flags: self.flags,
        }
    }
}

/// A slot of the slab. A slot whose generation counter has run out is kept
/// `Retired` forever, so its handles can never come back to life.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Live(Entry),
    Retired,
}

/// Relocatable blocks over any [`Allocator`]: callers hold [`Handle`]s, and
/// compaction may move the bytes behind them.
///
/// The heap never touches memory. Compaction is a three-step protocol: make a
/// [`CompactionPlan`] ([`plan_full`](Heap::plan_full) or
/// [`plan_room`](Heap::plan_room)), copy each of its moves on the device in
/// order, then [`commit`](Heap::commit) it, after which every handle reports
/// its block's new offset. Any change to the heap in between makes the plan
/// stale, so a plan cannot be applied to a layout it was not made for.
///
/// ```
/// use memcore::{BlockFlags, Fit, FreeList, Heap};
///
/// let mut heap = Heap::new(FreeList::new(Fit::First));
/// heap.add_region(0, 1 << 20)?;
/// let a = heap.allocate(1000, 256, BlockFlags::empty())?;
/// let b = heap.allocate(1000, 256, BlockFlags::PINNED)?;
/// assert_eq!(heap.offset(b)?, 1024);
/// heap.free(a)?;
/// assert_eq!(heap.free(a), Err(memcore::Error::StaleHandle(a)));
/// assert_eq!(heap.len(), 1);
/// # Ok::<(), memcore::Error>(())
/// ```
#[derive(Debug)]
pub struct Heap<A: Allocator> {
    /// This heap's identity, carried by its handles and plans.
    id: u64,
    allocator: A,
    slots: Slab<Slot>,
    /// Current generation of each slot ever used, indexed by slot.
    generations: Vec<u32>,
    /// Live blocks (the slab also holds retired slots).
    live: usize,
    /// Bumped by every change, so plans can tell they are stale.
    epoch: u64,
    /// Blocks and holes the plans made so far looked at.
    plan_steps: Cell<u64>,
}

impl<A: Allocator> Heap<A> {
    /// A heap over `allocator`, with no blocks. Regions the allocator
    /// already manages are used as they are.
    pub fn new(allocator: A) -> Self {
        Self {
            // Only uniqueness matters, not order with other memory.
            id: NEXT_HEAP_ID.fetch_add(1, Ordering::Relaxed),
            allocator,
            slots: Slab::new(),
            generations: Vec::new(),
            live: 0,
            epoch: 0,
            plan_steps: Cell::new(0),
        }
    }

    /// Reserve `size` bytes at a multiple of `align` bytes (a power of two up
    /// to [`crate::MAX_ALIGN`]); the block keeps that alignment when it moves.
    ///
    /// Errors are the allocator's: [`Error::ZeroSize`],
    /// [`Error::InvalidAlignment`], [`Error::OutOfMemory`].
    pub fn allocate(&mut self, size: u64, align: u64, flags: BlockFlags) -> Result<Handle> {
        check_align(align)?;
        let key = self.slots.vacant_key();
        let slot = u32::try_from(key).map_err(|_| Error::Corrupt("more than 2^32 handle slots"))?;
        if key == self.generations.len() {
            self.generations.push(0);
        }
        let generation = *self
            .generations
            .get(key)
            .ok_or(Error::Corrupt("slab slot without a generation"))?;
        let allocation = self.allocator.allocate(size, align)?;
        self.slots.insert(Slot::Live(Entry {
            allocation,
            align,
            flags,
        }));
        self.live += 1;
        self.epoch += 1;
        Ok(Handle {
            heap: self.id,
            slot,
            generation,
        })
    }

    /// Give the block back and return what it was. A handle from another
    /// heap is [`Error::ForeignHandle`], one whose block is freed already
    /// [`Error::StaleHandle`]; either changes nothing.
    pub fn free(&mut self, handle: Handle) -> Result<BlockInfo> {
        let entry = *self.entry(handle)?;
        self.allocator.free(entry.allocation)?;
        let key = handle.slot as usize;
        match self.generations.get_mut(key) {
            Some(generation) if *generation < u32::MAX => {
                *generation += 1;
                self.slots.remove(key);
            }
            _ => {
                if let Some(slot) = self.slots.get_mut(key) {
                    *slot = Slot::Retired;
                }
            }
        }
        self.live -= 1;
        self.epoch += 1;
        Ok(entry.info())
    }

    /// The block behind `handle`, or `None` if the handle is not live.
    pub fn get(&self, handle: Handle) -> Option<BlockInfo> {
        self.entry(handle).ok().map(Entry::info)
    }

    /// The block behind `handle`; [`Error::StaleHandle`] if the handle is
    /// not live, [`Error::ForeignHandle`] if it is another heap's.
    pub fn info(&self, handle: Handle) -> Result<BlockInfo> {
        self.entry(handle).map(Entry::info)
    }

    /// The block's current offset in bytes; [`Error::StaleHandle`] if the
    /// handle is not live, [`Error::ForeignHandle`] if it is another heap's.
    pub fn offset(&self, handle: Handle) -> Result<u64> {
        self.entry(handle).map(|e| e.allocation.offset)
    }

    /// Replace the block's flags, e.g. pin it while a kernel holds its
    /// address. Plans made before are stale afterwards.
    pub fn set_flags(&mut self, handle: Handle, flags: BlockFlags) -> Result<()> {
        self.check_owner(handle)?;
        let live = self.generations.get(handle.slot as usize) == Some(&handle.generation);
        match self.slots.get_mut(handle.slot as usize) {
            Some(Slot::Live(entry)) if live => {
                entry.flags = flags;
                self.epoch += 1;
                Ok(())
            }
            _ => Err(Error::StaleHandle(handle)),
        }
    }

    /// Every live block, in no particular order.
    pub fn blocks(&self) -> impl Iterator<Item = (Handle, BlockInfo)> + '_ {
        self.slots.iter().filter_map(|(key, slot)| match slot {
            Slot::Live(entry) => Some((
                Handle {
                    heap: self.id,
                    slot: u32::try_from(key).ok()?,
                    generation: *self.generations.get(key)?,
                },
                entry.info(),
            )),
            Slot::Retired => None,
        })
    }

    /// Number of live blocks.
    pub fn len(&self) -> usize {
        self.live
    }

    /// The work all plans made so far did ([`Heap::plan_full`],
    /// [`Heap::plan_room`], those that found no room included), in blocks and
    /// free holes looked at: a plan's cost grows with the blocks live when
    /// it is made, and a model bounds its planning by this count.
    pub fn plan_steps(&self) -> u64 {
        self.plan_steps.get()
    }

    fn add_plan_steps(&self, steps: u64) {
        self.plan_steps
            .set(self.plan_steps.get().saturating_add(steps));
    }

    /// Whether no block is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Manage `[offset, offset + size)` too (bytes); see
    /// [`Allocator::add_region`].
    pub fn add_region(&mut self, offset: u64, size: u64) -> Result<()> {
        self.allocator.add_region(offset, size)?;
        self.epoch += 1;
        Ok(())
    }

    /// Stop managing the free tail of the highest region if it is at least
    /// `min_bytes` long, and return it; see [`Allocator::release_tail`].
    pub fn release_tail(&mut self, min_bytes: u64) -> Option<Extent> {
        let released = self.allocator.release_tail(min_bytes)?;
        self.epoch += 1;
        Some(released)
    }

    /// The allocator's figures (bytes).
    pub fn stats(&self) -> Stats {
        self.allocator.stats()
    }

    /// The allocator underneath, to inspect it.
    pub fn allocator(&self) -> &A {
        &self.allocator
    }

    /// Compact every region toward its low end, keeping each block's
    /// alignment (and at least 256 bytes' for a block on such a boundary, see
    /// [`CompactionPlan`]). Pinned blocks stay.
    ///
    /// First the lowest holes are filled, each exactly to its last byte,
    /// with the topmost blocks: those moves go to space that is free now, so
    /// they are independent of one another and overwrite no live bytes. Then
    /// what is left slides down: a block that does not fit before the next
    /// pinned block goes past it, and a later block that fits there fills the
    /// gap. Blocks that stay produce no move, no block moves twice, and the
    /// plan never copies more bytes than sliding every block down would (it
    /// is that slide where filling would cost more). Once committed, the
    /// next `plan_full` is empty.
    ///
    /// ```
    /// use memcore::{BlockFlags, Fit, FreeList, Heap};
    ///
    /// let mut heap = Heap::new(FreeList::new(Fit::First));
    /// heap.add_region(0, 1 << 20)?;
    /// let a = heap.allocate(512, 256, BlockFlags::empty())?;
    /// let pin = heap.allocate(512, 256, BlockFlags::PINNED)?;
    /// let b = heap.allocate(512, 256, BlockFlags::empty())?;
    /// let c = heap.allocate(512, 256, BlockFlags::empty())?;
    /// heap.free(a)?;
    /// let plan = heap.plan_full();
    /// // The top block fills the hole; sliding would have moved b and c.
    /// assert_eq!(plan.moves().len(), 1);
    /// heap.commit(plan)?;
    /// assert_eq!(heap.offset(c)?, 0);
    /// assert_eq!((heap.offset(pin)?, heap.offset(b)?), (512, 1024));
    /// assert!(heap.plan_full().is_empty());
    /// # Ok::<(), memcore::Error>(())
    /// ```
    pub fn plan_full(&self) -> CompactionPlan {
        // Nothing free or padded below the top's free tail: every block
        // already sits where a plan would put it, so skip the walk (this
        // keeps a compact-then-grow policy O(1) while nothing is freed).
        let stats = self.allocator.stats();
        let tail = self.allocator.free_tail().map_or(0, |tail| tail.size);
        if stats.managed_bytes - stats.live_bytes == tail {
            return CompactionPlan {
                relayout: false,
                moves: Vec::new(),
                heap: self.id,
                epoch: self.epoch,
            };
        }
        let layout = compact::by_region(&self.allocator.regions(), self.placed());
        // Packing walks each region's blocks a few times.
        self.add_plan_steps(4 * self.live as u64);
        let moves = layout
            .iter()
            .flat_map(|(region, blocks)| compact::pack(*region, blocks))
            .collect::<Vec<_>>();
        CompactionPlan {
            relayout: !moves.is_empty(),
            moves,
            heap: self.id,
            epoch: self.epoch,
        }
    }

    /// The cheapest plan (fewest bytes copied) after which a `size`-byte,
    /// `align`-aligned request fits. Empty if it fits already.
    ///
    /// The room made is `size` rounded up to 256 bytes at a multiple of 256
    /// bytes (or of `align` if larger), which any allocator here can use;
    /// "fits already" is judged the same way.
    ///
    /// [`Error::OutOfMemory`] if fewer than `size` bytes are free, or no plan
    /// was found: pinned blocks in the way, or the evicted blocks not fitting
    /// in the holes left.
    ///
    /// ```
    /// use memcore::{BlockFlags, Fit, FreeList, Heap};
    ///
    /// let mut heap = Heap::new(FreeList::new(Fit::First));
    /// heap.add_region(0, 4096)?;
    /// let blocks: Vec<_> = (0..4)
    ///     .map(|_| heap.allocate(1024, 1024, BlockFlags::empty()))
    ///     .collect::<Result<_, _>>()?;
    /// heap.free(blocks[0])?;
    /// heap.free(blocks[2])?;
    /// assert!(heap.allocate(2048, 1024, BlockFlags::empty()).is_err());
    /// let plan = heap.plan_room(2048, 1024)?;
    /// assert_eq!(plan.bytes_moved(), 1024);
    /// heap.commit(plan)?;
    /// assert!(heap.allocate(2048, 1024, BlockFlags::empty()).is_ok());
    /// # Ok::<(), memcore::Error>(())
    /// ```
    pub fn plan_room(&self, size: u64, align: u64) -> Result<CompactionPlan> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        check_align(align)?;
        let stats = self.allocator.stats();
        let out_of_memory = Error::OutOfMemory {
            requested: size,
            align,
            free_bytes: stats.free_bytes,
            largest_free: stats.largest_free,
        };
        let (window, window_align) =
            compact::request_window(size, align).ok_or(out_of_memory.clone())?;
        // Padding counts as free: the commit lays the allocator out anew,
        // so even a plan without moves makes room by giving padding back.
        let slack = stats.managed_bytes.saturating_sub(stats.live_bytes);
        // Judged first from the counters: a heap too full for the request
        // to fit anywhere (a pool that only grows) is told so without a walk.
        if slack < size {
            return Err(out_of_memory);
        }
        let holes = self.allocator.free_extents();
        self.add_plan_steps(holes.len() as u64);
        let fits_now = holes
            .into_iter()
            .any(|hole| compact::fit_in(hole, size, window_align).is_some());
        if fits_now {
            return Ok(CompactionPlan {
                moves: Vec::new(),
                heap: self.id,
                epoch: self.epoch,
                relayout: false,
            });
        }
        if slack < window {
            return Err(out_of_memory);
        }
        let layout = compact::by_region(&self.allocator.regions(), self.placed());
        let mut steps = 0;
        let moves = compact::make_room(&layout, window, window_align, &mut steps);
        self.add_plan_steps(steps);
        let moves = moves.ok_or(out_of_memory)?;
        Ok(CompactionPlan {
            moves,
            heap: self.id,
            epoch: self.epoch,
            relayout: true,
        })
    }

    /// Record that the caller has executed `plan`'s moves: every moved block
    /// now lives at its destination, and the allocator is laid out anew with
    /// exactly the live blocks in use (which also gives back alignment
    /// padding). Handles stay valid. A plan that neither moves nor frees
    /// anything leaves the allocator as it is. Either way the plan is used
    /// up: committing it again is [`Error::StalePlan`].
    ///
    /// [`Error::ForeignPlan`] if the plan was made for another heap,
    /// [`Error::StalePlan`] if this heap changed since the plan was made;
    /// nothing changes then.
    pub fn commit(&mut self, plan: CompactionPlan) -> Result<()> {
        if plan.heap != self.id {
            return Err(Error::ForeignPlan);
        }
        if plan.epoch != self.epoch {
            return Err(Error::StalePlan);
        }
        if !plan.relayout {
            self.epoch += 1;
            return Ok(());
        }
        let mut destinations = BTreeMap::new();
        for m in &plan.moves {
            let entry = self.entry(m.handle).map_err(|_| Error::StalePlan)?;
            let sound = entry.allocation.offset == m.src
                && entry.allocation.size == m.len
                && m.dst % entry.align == 0
                && !entry.flags.contains(BlockFlags::PINNED);
            if !sound || destinations.insert(m.handle.slot as usize, m.dst).is_some() {
                return Err(Error::StalePlan);
            }
        }
        let mut layout: Vec<(Extent, usize)> = self
            .slots
            .iter()
            .filter_map(|(key, slot)| match slot {
                Slot::Live(e) => {
                    let offset = destinations.get(&key).copied();
                    let offset = offset.unwrap_or(e.allocation.offset);
                    Some((Extent::new(offset, e.allocation.size), key))
                }
                Slot::Retired => None,
            })
            .collect();
        layout.sort_unstable_by_key(|&(extent, _)| extent);
        if let Some(pair) = layout.windows(2).find(|p| p[0].0.end() > p[1].0.offset) {
            let (extent, _) = pair[1];
            return Err(Error::InvalidLayout {
                offset: extent.offset,
                size: extent.size,
                why: "overlaps another block after the plan",
            });
        }
        let extents: Vec<Extent> = layout.iter().map(|&(extent, _)| extent).collect();
        let allocations = self.allocator.rebuild(&extents)?;
        if allocations.len() != layout.len() {
            return Err(Error::Corrupt(
                "rebuild returned a different number of blocks",
            ));
        }
        for ((_, key), allocation) in layout.into_iter().zip(allocations) {
            if let Some(Slot::Live(entry)) = self.slots.get_mut(key) {
                entry.allocation = allocation;
            }
        }
        self.epoch += 1;
        Ok(())
    }

    /// The live entry behind `handle`.
    fn entry(&self, handle: Handle) -> Result<&Entry> {
        self.check_owner(handle)?;
        let key = handle.slot as usize;
        match (self.generations.get(key), self.slots.get(key)) {
            (Some(&generation), Some(Slot::Live(entry))) if generation == handle.generation => {
                Ok(entry)
            }
            _ => Err(Error::StaleHandle(handle)),
        }
    }

    /// [`Error::ForeignHandle`] unless `handle` was made by this heap.
    fn check_owner(&self, handle: Handle) -> Result<()> {
        if handle.heap == self.id {
            Ok(())
        } else {
            Err(Error::ForeignHandle(handle))
        }
    }

    /// Every live block as the planners see it.
    fn placed(&self) -> Vec<Placed> {
        self.blocks()
            .map(|(handle, info)| Placed {
                handle,
                offset: info.offset,
                size: info.size,
                align: compact::planning_align(info.offset, info.align),
                pinned: info.flags.contains(BlockFlags::PINNED),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
