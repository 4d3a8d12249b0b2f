//! The one error type of the crate.

/// Why a device, pool or ledger operation failed.
///
/// A failed driver (or simulated driver) call is [`Error::Device`]; a pool
/// that cannot find room even after growing and compacting is
/// [`Error::OutOfMemory`], which carries enough figures to tell
/// fragmentation (free bytes large, largest free block small) from
/// exhaustion, and the pool from the rest of the context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The allocator or heap underneath rejected the operation (stale
    /// handle, bad alignment, zero size, ...).
    #[error(transparent)]
    Memcore(#[from] memcore::Error),
    /// The pool could not place a request: growth is capped or the device
    /// is full, and compaction (if allowed) could not make room either.
    #[error(
        "out of device memory: requested {requested} bytes aligned to {align}; \
         pool holds {pool_bytes} bytes of which {free_bytes} are free \
         (largest free block {largest_free} bytes); the rest of the context \
         holds {context_reserved_bytes} bytes"
    )]
    OutOfMemory {
        /// Requested size in bytes.
        requested: u64,
        /// Requested alignment in bytes.
        align: u64,
        /// Free bytes inside the pool.
        free_bytes: u64,
        /// Largest free block inside the pool, bytes.
        largest_free: u64,
        /// Device memory the pool holds (mapped or allocated chunks), bytes.
        pool_bytes: u64,
        /// Device memory in use outside this pool: `total - free - pool_bytes`
        /// from the device's memory info, bytes (driver, context, other
        /// allocations).
        context_reserved_bytes: u64,
    },
    /// A ledger whose context reservations (one item, or all together) are
    /// larger than the device's memory: no context could be created so.
    #[error(
        "{what} would take {}, more than the device's {total_bytes} bytes of memory",
        byte_count(*bytes)
    )]
    ExceedsDevice {
        /// The ledger item, or "the items together".
        what: &'static str,
        /// What it would take, bytes.
        bytes: u64,
        /// The device's memory, bytes.
        total_bytes: u64,
    },
    /// A driver call (or its simulation) failed. For CUDA, `detail` holds the
    /// `CUresult` name.
    #[error("device call {op} failed: {detail}")]
    Device {
        /// The operation, e.g. `"map"`, `"cuMemCreate"`.
        op: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// An access to device memory that is not mapped, or past the end of a
    /// pool block.
    #[error("invalid address range [{addr:#x}, +{len}): {why}")]
    InvalidAddress {
        /// First byte of the access.
        addr: u64,
        /// Length of the access in bytes.
        len: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// [`crate::Pool::pin`] of a block that a [`crate::PinGuard`] already
    /// holds in place.
    #[error("block {0:?} is already pinned")]
    AlreadyPinned(memcore::Handle),
    /// A configuration that cannot work (e.g. a VMM pool reserving nothing).
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// A [`crate::StitchedPool`] could not back a request: the device
    /// refused physical memory even after the pool released its idle
    /// handles, or the pool's virtual reservation is full.
    #[error(
        "out of device memory in a stitched pool: requested {requested} bytes; \
         the pool holds {physical_bytes} bytes in handles for {live_bytes} live bytes; \
         {why}"
    )]
    StitchedOutOfMemory {
        /// Requested size in bytes.
        requested: u64,
        /// Bytes in the pool's physical handles after the rollback.
        physical_bytes: u64,
        /// Requested bytes of the pool's live allocations.
        live_bytes: u64,
        /// What refused: the driver's error, or the reservation's size.
        why: String,
    },
    /// A free of a pointer that no live allocation of this pool starts at:
    /// never allocated here, or freed already.
    #[error("no live allocation of this pool starts at {ptr:#x} (unknown pointer or double free)")]
    UnknownPointer {
        /// The pointer passed in.
        ptr: u64,
    },
    /// The operation needs something this device or configuration lacks.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}

/// `bytes` for a message; `u64::MAX` is where a saturating sum stopped.
fn byte_count(bytes: u64) -> String {
    if bytes == u64::MAX {
        "2^64 bytes or more".into()
    } else {
        format!("{bytes} bytes")
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
