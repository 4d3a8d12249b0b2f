//! PLACEHOLDER (being written): two-level segregated fit.
use alloc::vec::Vec;
use crate::{Allocation, Allocator, Extent, Result, Stats};
/// TLSF allocator.
#[derive(Debug, Default)]
pub struct Tlsf {}
impl Tlsf {
    /// New, with no region.
    pub fn new() -> Self { Self {} }
}
impl Allocator for Tlsf {
    fn allocate(&mut self, _size: u64, _align: u64) -> Result<Allocation> { todo!() }
    fn free(&mut self, _a: Allocation) -> Result<()> { todo!() }
    fn add_region(&mut self, _o: u64, _s: u64) -> Result<()> { todo!() }
    fn release_tail(&mut self, _m: u64) -> Option<Extent> { todo!() }
    fn rebuild(&mut self, _u: &[Extent]) -> Result<Vec<Allocation>> { todo!() }
    fn regions(&self) -> Vec<Extent> { todo!() }
    fn free_extents(&self) -> Vec<Extent> { todo!() }
    fn stats(&self) -> Stats { todo!() }
}
