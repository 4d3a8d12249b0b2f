//! The one error type of the crate.

use crate::DriverCode;

/// Why a device, pool or ledger operation failed.
///
/// A failed driver (or simulated driver) call is [`Error::Driver`], whose
/// [`DriverCode`] is what code decides on; a pool
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
    /// A driver call failed, or the simulated device refused one as the
    /// driver would (same code), or the backend refused arguments before
    /// the call for the reason the driver would give (a range that breaks
    /// its rules is [`DriverCode::INVALID_VALUE`]).
    #[error("{op} failed: {code}{}", detail_suffix(detail))]
    Driver {
        /// The call, e.g. `"cuMemCreate"`, or the [`crate::DeviceMemory`]
        /// method (`"map_physical"`) where the backend refused it first.
        op: &'static str,
        /// The driver's result code: what callers decide on.
        code: DriverCode,
        /// What else is known, for people (the range, the module, the JIT
        /// log); may be empty. Never decided on.
        detail: String,
    },
    /// The crate's own records broke a rule they keep (a pool's picture of
    /// the device and the device disagree, a copy plan is not what its
    /// planner promised): a bug here, reported rather than acted on.
    #[error("broken internal state: {0}")]
    Inconsistent(String),
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
    /// Linking PTX modules into one (`CudaContext::link_ptx`) failed:
    /// `step` is the driver call (`cuLinkAddData`, `cuLinkComplete`, ...),
    /// `code` its result, `log` what the linker wrote to its error log
    /// (e.g. the symbol left undefined).
    #[error(
        "linking module `{module}`: {step} failed: {code}{}{}",
        detail_suffix(detail),
        link_log_suffix(log)
    )]
    Link {
        /// The linked module's name.
        module: String,
        /// The driver call that failed.
        step: &'static str,
        /// Its result code ([`DriverCode::INVALID_VALUE`] for input refused
        /// before any call).
        code: DriverCode,
        /// Which input, when one was being added, or what was wrong with
        /// it; may be empty.
        detail: String,
        /// The linker's error log, empty if it wrote none.
        log: String,
    },
    /// [`crate::Pool::pin`] of a block that a [`crate::PinGuard`] already
    /// holds in place.
    #[error("block {0:?} is already pinned")]
    AlreadyPinned(memcore::Handle),
    /// A configuration that cannot work (e.g. a VMM pool reserving nothing).
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// A device named as a peer cannot reach the memory of the device that
    /// was to grant it access (`cuDeviceCanAccessPeer` says no, or there is
    /// no such device).
    #[error("device {peer} cannot access memory of device {device}: {why}")]
    PeerAccess {
        /// The device whose memory was to be granted.
        device: u32,
        /// The device that was to be granted access.
        peer: u32,
        /// Why not.
        why: &'static str,
    },
    /// Peers named for a [`crate::Growth::Chunks`] pool: memory from
    /// `cuMemAlloc` is reachable by a peer only through
    /// `cuCtxEnablePeerAccess`, which opens every allocation of the context
    /// to that peer, not the pool's alone.
    #[error(
        "peer access needs Growth::Vmm: cuMemAlloc chunks are reachable by peers only          through cuCtxEnablePeerAccess, which opens the whole context; use Growth::Vmm          or name no peers"
    )]
    PeersNeedVmm,
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
        /// The driver's code when the device refused the memory
        /// ([`DriverCode::OUT_OF_MEMORY`]); `None` when the pool's virtual
        /// reservation was full.
        driver_code: Option<DriverCode>,
        /// What refused, for people: the driver's error, or the
        /// reservation's size.
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

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

impl Error {
    /// A driver error of `code` from `op`, with `detail` for people.
    pub(crate) fn driver(op: &'static str, code: DriverCode, detail: impl Into<String>) -> Error {
        Error::Driver {
            op,
            code,
            detail: detail.into(),
        }
    }

    /// The same error with `detail` (for people) in place of its own, if it
    /// is a driver error; any other error as it is.
    #[cfg(feature = "cuda")]
    pub(crate) fn with_detail(self, detail: String) -> Error {
        match self {
            Error::Driver { op, code, .. } => Error::Driver { op, code, detail },
            other => other,
        }
    }

    /// The driver's result code, if this is a failed driver call.
    ///
    /// ```
    /// use ctx::{DeviceMemory, DriverCode, SimConfig, SimDevice};
    ///
    /// let mut dev = SimDevice::new(SimConfig::small(1 << 20));
    /// let refused = dev.create_physical(4 << 20).unwrap_err();
    /// assert_eq!(refused.driver_code(), Some(DriverCode::OUT_OF_MEMORY));
    /// assert!(refused.driver_code().is_some_and(DriverCode::is_out_of_memory));
    /// ```
    pub fn driver_code(&self) -> Option<DriverCode> {
        match self {
            Error::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }
}

fn link_log_suffix(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("; linker log: {log}")
    }
}

/// The text of a log buffer the driver filled: up to its first NUL,
/// trimmed (empty if it wrote nothing).
#[cfg(any(feature = "cuda", test))]
pub(crate) fn driver_log(buffer: &[u8]) -> String {
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).trim().to_string()
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

#[cfg(test)]
mod tests {
    use super::{Error, driver_log};
    use crate::DriverCode;

    #[test]
    fn a_link_error_carries_the_linker_log() {
        let mut buffer = b"error   : Undefined reference to 'cm_malloc' in 'cm_user'\n".to_vec();
        buffer.extend([0, b'x', b'y']);
        let log = driver_log(&buffer);
        assert_eq!(
            log,
            "error   : Undefined reference to 'cm_malloc' in 'cm_user'"
        );
        let e = Error::Link {
            module: "user+cm".into(),
            step: "cuLinkComplete",
            code: DriverCode::NOT_FOUND,
            detail: String::new(),
            log,
        };
        assert_eq!(
            e.to_string(),
            "linking module `user+cm`: cuLinkComplete failed: CUDA_ERROR_NOT_FOUND; linker log: \
             error   : Undefined reference to 'cm_malloc' in 'cm_user'"
        );
        assert_eq!(driver_log(&[0; 16]), "");
        let quiet = Error::Link {
            module: "m".into(),
            step: "cuLinkAddData",
            code: DriverCode(201),
            detail: "part.ptx".into(),
            log: String::new(),
        };
        assert_eq!(
            quiet.to_string(),
            "linking module `m`: cuLinkAddData failed: CUDA_ERROR_INVALID_CONTEXT (part.ptx)"
        );
        let refused = Error::driver("map_physical", DriverCode::INVALID_VALUE, "");
        assert_eq!(
            refused.to_string(),
            "map_physical failed: CUDA_ERROR_INVALID_VALUE"
        );
        assert_eq!(refused.driver_code(), Some(DriverCode::INVALID_VALUE));
        assert_eq!(Error::InvalidConfig("x").driver_code(), None);
    }
}
