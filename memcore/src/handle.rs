//! Relocatable handles: blocks named by a [`Handle`] rather than an offset,
//! so compaction can move them.

use crate::{Allocation, Allocator, Extent, Result, Stats};

bitflags::bitflags! {
    /// Per-block flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct BlockFlags: u32 {
        /// Compaction never moves this block (the caller holds its raw
        /// address, e.g. a kernel argument in flight).
        const PINNED = 1 << 0;
    }
}

/// A name for a live block that stays valid when the block moves.
///
/// Carries a generation, so a handle kept after its block was freed is
/// rejected rather than aliasing the next block in the same slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
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

/// PLACEHOLDER (being written): relocatable heap.
#[derive(Debug)]
pub struct Heap<A: Allocator> { allocator: A }
impl<A: Allocator> Heap<A> {
    /// New heap.
    pub fn new(allocator: A) -> Self { Self { allocator } }
    /// Allocate.
    pub fn allocate(&mut self, _size: u64, _align: u64, _flags: BlockFlags) -> Result<Handle> { todo!() }
    /// Free.
    pub fn free(&mut self, _h: Handle) -> Result<BlockInfo> { todo!() }
    /// Look up.
    pub fn get(&self, _h: Handle) -> Option<BlockInfo> { todo!() }
    /// Offset.
    pub fn offset(&self, _h: Handle) -> Result<u64> { todo!() }
    /// Flags.
    pub fn set_flags(&mut self, _h: Handle, _f: BlockFlags) -> Result<()> { todo!() }
    /// Blocks.
    pub fn blocks(&self) -> impl Iterator<Item = (Handle, BlockInfo)> + '_ { core::iter::empty() }
    /// Count.
    pub fn len(&self) -> usize { todo!() }
    /// Empty.
    pub fn is_empty(&self) -> bool { todo!() }
    /// Region.
    pub fn add_region(&mut self, o: u64, s: u64) -> Result<()> { self.allocator.add_region(o, s) }
    /// Tail.
    pub fn release_tail(&mut self, m: u64) -> Option<Extent> { self.allocator.release_tail(m) }
    /// Stats.
    pub fn stats(&self) -> Stats { self.allocator.stats() }
    /// Allocator.
    pub fn allocator(&self) -> &A { &self.allocator }
    /// Full plan.
    pub fn plan_full(&self) -> crate::CompactionPlan { todo!() }
    /// Room plan.
    pub fn plan_room(&self, _s: u64, _a: u64) -> Result<crate::CompactionPlan> { todo!() }
    /// Commit.
    pub fn commit(&mut self, _p: crate::CompactionPlan) -> Result<()> { let _ = Allocation { offset: 0, size: 0, id: 0 }; todo!() }
}
