//! PLACEHOLDER (being written): the reference address-ordered free list.
use alloc::vec::Vec;
use crate::{Allocation, Allocator, Extent, Result, Stats};
/// Placement policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Lowest-address block that fits.
    First,
    /// Smallest block that fits.
    Best,
}
/// Reference allocator.
#[derive(Debug)]
pub struct FreeList { _fit: Fit }
impl FreeList {
    /// New, with no region.
    pub fn new(fit: Fit) -> Self { Self { _fit: fit } }
}
impl Allocator for FreeList {
    fn allocate(&mut self, _size: u64, _align: u64) -> Result<Allocation> { todo!() }
    fn free(&mut self, _a: Allocation) -> Result<()> { todo!() }
    fn add_region(&mut self, _o: u64, _s: u64) -> Result<()> { todo!() }
    fn release_tail(&mut self, _m: u64) -> Option<Extent> { todo!() }
    fn rebuild(&mut self, _u: &[Extent]) -> Result<Vec<Allocation>> { todo!() }
    fn regions(&self) -> Vec<Extent> { todo!() }
    fn free_extents(&self) -> Vec<Extent> { todo!() }
    fn stats(&self) -> Stats { todo!() }
}
