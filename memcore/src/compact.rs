//! PLACEHOLDER (being written): compaction plans.
use alloc::vec::Vec;
use crate::Handle;
/// One copy of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// Block moved.
    pub handle: Handle,
    /// Source offset, bytes.
    pub src: u64,
    /// Destination offset, bytes.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
    /// Source and destination share bytes: copy with memmove semantics.
    pub overlapping: bool,
}
/// A list of moves in safe order.
#[derive(Debug, Clone, Default)]
pub struct CompactionPlan { pub(crate) moves: Vec<Move>, pub(crate) epoch: u64 }
impl CompactionPlan {
    /// The moves in execution order.
    pub fn moves(&self) -> &[Move] { &self.moves }
    /// Total bytes copied.
    pub fn bytes_moved(&self) -> u64 { self.moves.iter().map(|m| m.len).sum() }
    /// No moves.
    pub fn is_empty(&self) -> bool { self.moves.is_empty() }
}
