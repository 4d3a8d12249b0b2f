//! The device-to-device copies a compaction becomes, and the rules every
//! copy path plans them by: how many moves one batch takes, and which moves
//! form a slide. The copy kernels (the kernels crate, `moves.cu`) launch
//! these records; ctx's backends and its simulated device group them by the
//! same rules.
//!
//! ```
//! use memcore::moves::{BlockMove, is_slide};
//!
//! let down = |src, dst| BlockMove { src, dst, len: 256 };
//! assert!(is_slide(&[down(0x1000, 0x0), down(0x2000, 0x1000)]));
//! // Sources must ascend.
//! assert!(!is_slide(&[down(0x2000, 0x1000), down(0x1000, 0x0)]));
//! assert!(down(0x1000, 0x1080).overlaps_itself());
//! ```

/// Most moves one batch takes: what one launch of the copy kernels holds
/// (`MOVE_MAX_MOVES` in `moves.cu`). At 28 bytes a move the parameters stay
/// under the 4 KiB every driver accepts.
pub const MAX_MOVES: usize = 128;

/// Alignment in bytes a slide needs of every source and destination: the
/// slide kernel copies in 16-byte words (`uint4` in `moves.cu`).
pub const SLIDE_ALIGN: u64 = 16;

/// One device-to-device copy: `len` bytes from `src` to `dst`, absolute
/// device addresses. The record every copy path shares: ctx's
/// `DeviceMemory::copy_moves` takes a list of them (memmove semantics, in
/// order), and the copy kernels' launches take them by value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockMove {
    /// Where the bytes are.
    pub src: u64,
    /// Where they go.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

impl BlockMove {
    /// Whether source and destination share a byte (the copy needs memmove
    /// semantics).
    pub fn overlaps_itself(&self) -> bool {
        self.src.abs_diff(self.dst) < self.len
    }

    /// Whether this move may be in a slide at all: it copies bytes, goes
    /// down, and is [`SLIDE_ALIGN`]-aligned at both ends.
    pub fn may_slide(&self) -> bool {
        self.len > 0 && self.dst < self.src && (self.src | self.dst) % SLIDE_ALIGN == 0
    }

    /// Whether `next` may follow `self` in a slide: `next` may slide, and
    /// sources and destinations both ascend without overlapping.
    pub fn slides_on_to(&self, next: &BlockMove) -> bool {
        next.may_slide()
            && self.src.saturating_add(self.len) <= next.src
            && self.dst.saturating_add(self.len) <= next.dst
    }
}

/// Whether `moves` (in order) form a slide the slide kernel may take: each
/// goes down, [`SLIDE_ALIGN`]-aligned at both ends
/// ([`BlockMove::may_slide`]); sources ascend without overlapping, and so do
/// destinations ([`BlockMove::slides_on_to`]). (Then no destination reaches
/// a later move's source: it ends below its own move's source end.) Moves of
/// no bytes are not allowed.
pub fn is_slide(moves: &[BlockMove]) -> bool {
    moves.first().is_none_or(BlockMove::may_slide)
        && moves.windows(2).all(|w| w[0].slides_on_to(&w[1]))
}
