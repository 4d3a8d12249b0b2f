//! Copying many blocks in one launch (`moves.cu`): the independent moves of
//! a compaction.
//!
//! A launch takes up to [`MAX_MOVES`] moves by value in its parameter
//! struct. They must not depend on each other: no move may write a byte that
//! another move of the launch reads or writes, and no move may overlap
//! itself, because all of them run at once. The launcher (ctx's CUDA
//! backend) groups a plan's moves into such batches and lets the stream
//! order one batch after the next.
//!
//! ```
//! use kernels::moves::{BlockMove, MoveBlocksParams, CHUNK_BYTES, MOVE_BLOCKS};
//!
//! let moves = [
//!     BlockMove { src: 0x7f00_0020_0000, dst: 0x7f00_0000_0000, len: 3 * CHUNK_BYTES },
//!     BlockMove { src: 0x7f00_0040_0000, dst: 0x7f00_0010_0000, len: 100 },
//! ];
//! let params = MoveBlocksParams::new(&moves).unwrap();
//! assert_eq!((params.count, params.chunks), (2, 4));
//! assert_eq!(&params.first_chunk[..2], &[0, 3]);
//! assert_eq!(params.launch_shape().grid, 4);
//! assert_eq!(MOVE_BLOCKS.param_bytes(&params).len(), 3600);
//! ```

use bytemuck::{Pod, Zeroable};

use crate::kernel::{Kernel, LaunchShape};
use crate::module::{KernelInfo, Module};

/// The record of a copy, the most moves one launch takes
/// (`MOVE_MAX_MOVES` in `moves.cu`) and the alignment a slide needs: the
/// rules every copy path plans by, memcore's.
pub use memcore::moves::{BlockMove, MAX_MOVES, SLIDE_ALIGN};

/// Bytes of a move that one thread block copies per step, the last chunk of
/// a move being shorter; `MOVE_CHUNK_BYTES` in `moves.cu`. [`MOVE_THREADS`]
/// threads loading eight 16-byte words each hold one chunk in flight; at
/// four blocks an SM (the kernel's register budget) that is 128 KiB an SM.
pub const CHUNK_BYTES: u64 = 32 << 10;

/// Threads of a `move_blocks` block (`MOVE_BLOCK_THREADS` in `moves.cu`);
/// the crate's other kernels use [`crate::BLOCK_THREADS`].
pub const MOVE_THREADS: u32 = 256;

/// Threads of a [`SLIDE_BLOCKS`] block (`SLIDE_BLOCK_THREADS`): two chunks
/// a block, each held by [`MOVE_THREADS`] threads.
pub const SLIDE_THREADS: u32 = 2 * MOVE_THREADS;

/// Most blocks of a [`SLIDE_BLOCKS`] launch. Blocks take chunks from a
/// counter until none is left, so a grid the device holds at once (an H200
/// holds 132 SMs x 2) is enough; more would start only to find nothing left.
pub const MAX_SLIDE_GRID: u32 = 1024;

/// Most thread blocks of one launch; beyond it each block copies several
/// chunks.
pub const MAX_GRID: u32 = 1 << 16;

/// Parameters of [`MOVE_BLOCKS`]; matches `MoveBlocksParams` in
/// `moves.cu` (3,600 bytes). Build it with [`MoveBlocksParams::new`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct MoveBlocksParams {
    /// Moves used, at most [`MAX_MOVES`].
    pub count: u64,
    /// Chunks of all moves together.
    pub chunks: u64,
    /// Source device address of each move.
    pub src: [u64; MAX_MOVES],
    /// Destination device address of each move.
    pub dst: [u64; MAX_MOVES],
    /// Bytes of each move.
    pub len: [u64; MAX_MOVES],
    /// Index of each move's first chunk, ascending from 0.
    pub first_chunk: [u32; MAX_MOVES],
}

impl MoveBlocksParams {
    /// The parameters of one launch copying `moves`; moves of zero bytes are
    /// left out. `None` if more than [`MAX_MOVES`] moves remain, or their
    /// chunks do not fit the `u32` chunk index (2^32 chunks, 64 TiB).
    ///
    /// Whether the moves may run together is the caller's to ensure.
    pub fn new(moves: &[BlockMove]) -> Option<Self> {
        let mut params = Self::zeroed();
        let mut count = 0usize;
        let mut chunks = 0u64;
        for m in moves.iter().filter(|m| m.len > 0) {
            if count == MAX_MOVES {
                return None;
            }
            params.src[count] = m.src;
            params.dst[count] = m.dst;
            params.len[count] = m.len;
            params.first_chunk[count] = u32::try_from(chunks).ok()?;
            chunks = chunks.checked_add(m.len.div_ceil(CHUNK_BYTES))?;
            count += 1;
        }
        u32::try_from(chunks).ok()?;
        params.count = count as u64;
        params.chunks = chunks;
        Some(params)
    }

    /// Bytes the launch copies.
    pub fn bytes(&self) -> u64 {
        self.len.iter().take(self.count as usize).sum()
    }

    /// One [`MOVE_THREADS`]-thread block per chunk, at most [`MAX_GRID`]
    /// (at least one block, which does nothing when there are no chunks).
    /// The kernel is built for blocks of [`MOVE_THREADS`] (its launch
    /// bounds); it copies correctly with smaller ones, only slower.
    pub fn launch_shape(&self) -> LaunchShape {
        LaunchShape {
            grid: u32::try_from(self.chunks.min(u64::from(MAX_GRID)))
                .unwrap_or(MAX_GRID)
                .max(1),
            block: MOVE_THREADS,
        }
    }
}

/// Copies every move of its parameters, all at once.
pub const MOVE_BLOCKS: Kernel<MoveBlocksParams> = Kernel::new(&MODULE, 0);

/// Parameters of [`SLIDE_BLOCKS`]; matches `SlideBlocksParams` in
/// `moves.cu` (3,608 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct SlideBlocksParams {
    /// The moves, numbered into chunks as for [`MOVE_BLOCKS`].
    pub moves: MoveBlocksParams,
    /// Device address of [`SlideBlocksParams::sync_words`] `u32` words,
    /// zero before the launch: the next chunk to take, then one mark per
    /// chunk set once its bytes are read.
    pub sync: u64,
}

impl SlideBlocksParams {
    /// `u32` words the buffer at `sync` needs, all zero before the launch.
    pub fn sync_words(&self) -> u64 {
        1 + self.moves.chunks
    }

    /// [`SLIDE_THREADS`]-thread blocks, one per pair of chunks up to
    /// [`MAX_SLIDE_GRID`] (at least one).
    pub fn launch_shape(&self) -> LaunchShape {
        let pairs = self.moves.chunks.div_ceil(2);
        LaunchShape {
            grid: u32::try_from(pairs.clamp(1, u64::from(MAX_SLIDE_GRID))).unwrap_or(1),
            block: SLIDE_THREADS,
        }
    }

    /// Whether `moves` (in order) form a slide the kernel may take: each
    /// goes down, [`SLIDE_ALIGN`]-aligned at both ends
    /// ([`BlockMove::may_slide`]); sources ascend without overlapping, and so
    /// do destinations ([`BlockMove::slides_on_to`]). (Then no destination
    /// reaches a later move's source: it ends below its own move's source
    /// end.) Moves of no bytes are not allowed.
    pub fn is_slide(moves: &[BlockMove]) -> bool {
        memcore::moves::is_slide(moves)
    }
}

/// Slides the moves of its parameters down, in one launch: the moves must
/// form a slide ([`SlideBlocksParams::is_slide`]), and may depend on each
/// other as a slide's do (a destination covering earlier sources, a move
/// overlapping itself). Launch it with [`SLIDE_THREADS`]-thread blocks only
/// (other shapes copy nothing); any number of blocks
/// ([`SlideBlocksParams::launch_shape`]).
pub const SLIDE_BLOCKS: Kernel<SlideBlocksParams> = Kernel::new(&MODULE, 1);

/// `moves.ptx`.
pub static MODULE: Module = Module {
    name: "moves",
    ptx: include_str!("../ptx/moves.ptx"),
    kernels: &[
        KernelInfo {
            name: "move_blocks",
            param_bytes: size_of::<MoveBlocksParams>(),
            local_bytes_per_thread: 0,
            uses_device_heap: false,
        },
        KernelInfo {
            name: "slide_blocks",
            param_bytes: size_of::<SlideBlocksParams>(),
            local_bytes_per_thread: 0,
            uses_device_heap: false,
        },
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(src: u64, len: u64) -> BlockMove {
        BlockMove {
            src,
            dst: src + (1 << 40),
            len,
        }
    }

    #[test]
    fn slides_are_told_apart() {
        let m = |src, dst, len| BlockMove { src, dst, len };
        // Blocks of 256 bytes sliding down by 128: each overlaps itself and
        // covers the source of the one before.
        let slide: Vec<BlockMove> = (1..5).map(|k| m(256 * k, 256 * k - 128, 256)).collect();
        assert!(SlideBlocksParams::is_slide(&slide));
        assert!(SlideBlocksParams::is_slide(&[]));
        let mut reversed = slide.clone();
        reversed.reverse();
        assert!(!SlideBlocksParams::is_slide(&reversed), "sources descend");
        assert!(!SlideBlocksParams::is_slide(&[m(0, 256, 16)]), "moves up");
        assert!(!SlideBlocksParams::is_slide(&[m(264, 0, 16)]), "misaligned");
        assert!(!SlideBlocksParams::is_slide(&[m(256, 0, 0)]), "empty");
        // Sources overlapping.
        assert!(!SlideBlocksParams::is_slide(&[
            m(512, 256, 512),
            m(768, 0, 16)
        ]));
        // Destinations out of order (a block that jumped a pinned one).
        assert!(!SlideBlocksParams::is_slide(&[
            m(1024, 512, 256),
            m(2048, 0, 256)
        ]));
    }

    #[test]
    fn layout_is_what_the_kernel_reads() {
        assert_eq!(size_of::<SlideBlocksParams>(), 3608);
        assert_eq!(core::mem::offset_of!(SlideBlocksParams, sync), 3600);
        assert_eq!(size_of::<MoveBlocksParams>(), 3600);
        assert_eq!(core::mem::offset_of!(MoveBlocksParams, src), 16);
        assert_eq!(core::mem::offset_of!(MoveBlocksParams, dst), 1040);
        assert_eq!(core::mem::offset_of!(MoveBlocksParams, len), 2064);
        assert_eq!(core::mem::offset_of!(MoveBlocksParams, first_chunk), 3088);
    }

    #[test]
    fn chunks_are_numbered_move_after_move() {
        let moves = [
            mv(0, CHUNK_BYTES),
            mv(1 << 30, 0),
            mv(2 << 30, CHUNK_BYTES + 1),
            mv(3 << 30, 1),
        ];
        let p = MoveBlocksParams::new(&moves).unwrap();
        assert_eq!(p.count, 3, "the empty move is left out");
        assert_eq!(p.chunks, 4);
        assert_eq!(&p.first_chunk[..3], &[0, 1, 3]);
        assert_eq!(&p.src[..3], &[0, 2 << 30, 3 << 30]);
        assert_eq!(p.bytes(), 2 * CHUNK_BYTES + 2);
        assert_eq!(p.launch_shape().grid, 4);
    }

    #[test]
    fn limits_are_refused() {
        let full: Vec<BlockMove> = (0..MAX_MOVES as u64).map(|i| mv(i << 32, 256)).collect();
        assert!(MoveBlocksParams::new(&full).is_some());
        let mut over = full.clone();
        over.push(mv(1 << 50, 256));
        assert!(MoveBlocksParams::new(&over).is_none());
        assert!(MoveBlocksParams::new(&[mv(0, CHUNK_BYTES << 32)]).is_none());
        let huge = MoveBlocksParams::new(&[mv(0, CHUNK_BYTES << 31)]).unwrap();
        assert_eq!(huge.launch_shape().grid, MAX_GRID);
        let empty = MoveBlocksParams::new(&[]).unwrap();
        assert_eq!(
            (empty.count, empty.chunks, empty.launch_shape().grid),
            (0, 0, 1)
        );
    }
}
