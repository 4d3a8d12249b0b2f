//! PyTorch's CUDA caching allocator, as far as the workspace models it: the
//! sizes its blocks and segments come in, its rule for splitting a cached
//! block, and the actions its allocation history records
//! ([`TraceAction`]). One home for these facts: the snapshot reader, the
//! replay models of PyTorch, the stitching allocator and the PyTorch
//! backend all read them here.
//!
//! The names follow PyTorch's `c10/cuda/CUDACachingAllocator.cpp`
//! (`kMinBlockSize`, `kSmallSize`, `kSmallBuffer`, `kLargeBuffer`,
//! `kMinLargeAlloc`, `kRoundLarge`), each constant saying which one it is.
//!
//! ```
//! use memcore::pytorch;
//!
//! assert_eq!(pytorch::round_size(1), 512);
//! assert_eq!(pytorch::round_size(1000), 1024);
//! assert!(pytorch::is_small(1 << 20) && !pytorch::is_small((1 << 20) + 1));
//! // A 3 MiB large-pool block holding a 2 MiB request keeps it whole: the
//! // 1 MiB left is not more than `kSmallSize`.
//! assert!(!pytorch::should_split(3 << 20, 2 << 20, false));
//! assert!(pytorch::should_split(2 << 20, 1 << 20, true));
//! ```

/// Every block is a multiple of this many bytes (512; `kMinBlockSize`), and
/// every request is rounded up to it.
pub const MIN_BLOCK_BYTES: u64 = 512;

/// The largest request of the small pool, bytes (1 MiB; `kSmallSize`). A
/// large-pool block is split only when more than this would remain.
pub const SMALL_SIZE_BYTES: u64 = 1 << 20;

/// A small-pool segment, bytes (2 MiB; `kSmallBuffer`); with expandable
/// segments, the page the small pool's segment grows by.
pub const SMALL_BUFFER_BYTES: u64 = 2 << 20;

/// The segment a large request below [`MIN_LARGE_ALLOC_BYTES`] gets, bytes
/// (20 MiB; `kLargeBuffer`); with expandable segments, the page the large
/// pool's segment grows by.
pub const LARGE_BUFFER_BYTES: u64 = 20 << 20;

/// Requests from [`SMALL_SIZE_BYTES`] up to this many bytes (10 MiB;
/// `kMinLargeAlloc`) share [`LARGE_BUFFER_BYTES`] segments; larger ones get a
/// segment of their own, rounded up to [`ROUND_LARGE_BYTES`].
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;

/// What a large request's own segment is rounded up to, bytes (2 MiB;
/// `kRoundLarge`).
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;

/// A request of `size` bytes as the allocator counts it: rounded up to a
/// multiple of [`MIN_BLOCK_BYTES`], at least one block (`round_size`).
/// Saturates at `u64::MAX` for sizes within a block of it.
pub fn round_size(size: u64) -> u64 {
    size.div_ceil(MIN_BLOCK_BYTES)
        .max(1)
        .saturating_mul(MIN_BLOCK_BYTES)
}

/// Whether a request of `size` bytes goes to the small pool.
pub fn is_small(size: u64) -> bool {
    size <= SMALL_SIZE_BYTES
}

/// Whether a free block of `block_bytes` that serves a request rounded to
/// `request_bytes` is split, the rest staying free (`should_split`): in the
/// small pool when at least one block remains, in the large pool only when
/// more than [`SMALL_SIZE_BYTES`] does. With expandable segments PyTorch
/// splits every block as the small pool does.
pub fn should_split(block_bytes: u64, request_bytes: u64, small_pool: bool) -> bool {
    let remaining = block_bytes.saturating_sub(request_bytes);
    if small_pool {
        remaining >= MIN_BLOCK_BYTES
    } else {
        remaining > SMALL_SIZE_BYTES
    }
}

/// What an entry of PyTorch's allocation history records
/// (`TraceEntry::Action`), in PyTorch's order: the index is its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceAction {
    /// A block handed out.
    Alloc,
    /// A free asked for (the block may still wait for streams).
    FreeRequested,
    /// A block back in the pool.
    FreeCompleted,
    /// Device memory taken as a new segment.
    SegmentAlloc,
    /// A segment given back.
    SegmentFree,
    /// Device memory mapped into the pool.
    SegmentMap,
    /// Device memory unmapped from the pool.
    SegmentUnmap,
    /// A snapshot was taken.
    Snapshot,
    /// A request ran out of memory (`addr` holds the device's free bytes).
    Oom,
}

impl TraceAction {
    /// Every action, in PyTorch's order (the index is its number).
    pub const ALL: [TraceAction; 9] = [
        Self::Alloc,
        Self::FreeRequested,
        Self::FreeCompleted,
        Self::SegmentAlloc,
        Self::SegmentFree,
        Self::SegmentMap,
        Self::SegmentUnmap,
        Self::Snapshot,
        Self::Oom,
    ];

    /// PyTorch's number for the action.
    pub fn raw(self) -> u32 {
        self as u32
    }

    /// PyTorch's name for it: a snapshot entry's `action`, and what
    /// `_record_memory_history(skip_actions=...)` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::FreeRequested => "free_requested",
            Self::FreeCompleted => "free_completed",
            Self::SegmentAlloc => "segment_alloc",
            Self::SegmentFree => "segment_free",
            Self::SegmentMap => "segment_map",
            Self::SegmentUnmap => "segment_unmap",
            Self::Snapshot => "snapshot",
            Self::Oom => "oom",
        }
    }

    /// The action PyTorch calls `name`, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|action| action.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_whole_blocks_and_saturates() {
        assert_eq!(round_size(0), MIN_BLOCK_BYTES);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(u64::MAX - 1000), u64::MAX - 511);
        assert_eq!(round_size(u64::MAX), u64::MAX);
    }

    #[test]
    fn the_split_rule_differs_by_pool() {
        assert!(!should_split(1024, 1024, true));
        assert!(should_split(1536, 1024, true));
        assert!(!should_split(SMALL_SIZE_BYTES * 2, SMALL_SIZE_BYTES, false));
        assert!(should_split(
            SMALL_SIZE_BYTES * 2 + MIN_BLOCK_BYTES,
            SMALL_SIZE_BYTES,
            false
        ));
        // A request larger than the block leaves nothing to split off.
        assert!(!should_split(512, 1024, true));
    }

    #[test]
    fn a_trace_action_is_found_by_its_name_and_numbered_in_order() {
        for (index, action) in TraceAction::ALL.into_iter().enumerate() {
            assert_eq!(action.raw() as usize, index);
            assert_eq!(TraceAction::from_name(action.name()), Some(action));
        }
        assert_eq!(TraceAction::from_name("free"), None);
    }
}
