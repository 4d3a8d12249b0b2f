//! Blocks and plans as the planners' tests write them.

use alloc::vec::Vec;

use super::{Move, Placed};
use crate::Handle;

/// A block with slot `slot` (generation 0).
pub(crate) fn block(slot: u32, offset: u64, size: u64, align: u64, pinned: bool) -> Placed {
    Placed {
        handle: Handle {
            heap: 0,
            slot,
            generation: 0,
        },
        offset,
        size,
        align,
        pinned,
    }
}

/// (slot, destination) of each move, in order.
pub(crate) fn dsts(moves: &[Move]) -> Vec<(u32, u64)> {
    moves.iter().map(|m| (m.handle.slot, m.dst)).collect()
}
