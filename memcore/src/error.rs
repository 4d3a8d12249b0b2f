//! The one error type of the crate.

/// Why an operation on an allocator, a heap or a plan failed.
///
/// Every variant carries enough to tell the caller what happened without
/// reading the allocator's state again: an out-of-memory carries the free
/// bytes and the largest free block, so fragmentation can be told apart
/// from exhaustion.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No free block can hold the request.
    #[error(
        "out of memory: requested {requested} bytes aligned to {align}; \
         {free_bytes} bytes free, largest free block {largest_free} bytes"
    )]
    OutOfMemory {
        /// Requested size in bytes.
        requested: u64,
        /// Requested alignment in bytes.
        align: u64,
        /// Free bytes in the allocator at the time of the request.
        free_bytes: u64,
        /// Largest free block in bytes at the time of the request.
        largest_free: u64,
    },
    /// The alignment is zero, not a power of two, or above [`crate::MAX_ALIGN`].
    #[error("alignment {align} is not a power of two between 1 and {max}")]
    InvalidAlignment {
        /// The alignment asked for, in bytes.
        align: u64,
        /// The largest alignment supported, in bytes.
        max: u64,
    },
    /// A request for zero bytes.
    #[error("zero-byte allocation")]
    ZeroSize,
    /// A size or offset that overflows the 64-bit address space.
    #[error("size {size} at offset {offset} overflows the address space")]
    Overflow {
        /// Offset in bytes.
        offset: u64,
        /// Size in bytes.
        size: u64,
    },
    /// Free of an allocation that is not live here: never allocated, or
    /// already freed.
    #[error("no live allocation at offset {offset}: unknown pointer or double free")]
    UnknownAllocation {
        /// Offset the caller named, in bytes.
        offset: u64,
    },
    /// A handle of this heap whose block was freed.
    #[error("stale handle {0:?}: its block was freed")]
    StaleHandle(crate::Handle),
    /// A handle made by another heap: acting on it here would touch one of
    /// this heap's blocks instead.
    #[error("foreign handle {0:?}: made by another heap")]
    ForeignHandle(crate::Handle),
    /// A region that overlaps a region already managed.
    #[error("region [{offset:#x}, +{size}) overlaps a managed region")]
    RegionOverlap {
        /// Start of the region in bytes.
        offset: u64,
        /// Length of the region in bytes.
        size: u64,
    },
    /// A layout or plan that puts a block outside the managed regions or on
    /// top of another block.
    #[error("invalid layout: block [{offset:#x}, +{size}) {why}")]
    InvalidLayout {
        /// Start of the offending block in bytes.
        offset: u64,
        /// Length of the offending block in bytes.
        size: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A plan that was made for another state of the heap.
    #[error("compaction plan is stale: the heap changed since it was made")]
    StalePlan,
    /// A request that would take a model past the steps it takes (a
    /// stitched pool's large handle past the pages it looks at, or its page
    /// steps over the whole input): the model cannot take it, though the
    /// request is well formed.
    #[error("the request needs {steps} steps, more than the {limit} the model takes")]
    StepBudget {
        /// Steps the request would take (for the page-step bound: all
        /// steps so far with it).
        steps: u64,
        /// The most the model takes.
        limit: u64,
    },
    /// A plan that was made for another heap: committing it here would
    /// move this heap's blocks without copying them.
    #[error("compaction plan was made for another heap")]
    ForeignPlan,
    /// The allocator's own bookkeeping is inconsistent; a bug, reported
    /// rather than acted upon.
    #[error("internal state is corrupt: {0}")]
    Corrupt(&'static str),
}

/// The crate's result type.
pub type Result<T, E = Error> = core::result::Result<T, E>;
