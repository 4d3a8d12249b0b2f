//! The one error type of the crate.

/// Why a call of the allocator failed. Every variant says where (device, pointer) and
/// what; quoted user values are cut to 80 characters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A device argument that names every device (-1) or one device (0 and up) was
    /// another negative number.
    #[error("device {device} is neither a device (0 and up) nor -1 (every device)")]
    BadDeviceSelector {
        /// The device argument.
        device: i32,
    },
    /// The device argument is outside what the library serves.
    #[error("device {device} is out of range: devices 0 to {} are served", MAX_DEVICES - 1)]
    BadDevice {
        /// The device argument.
        device: i32,
    },
    /// A pointer argument was null.
    #[error("{call}: {what} is a null pointer")]
    NullPointer {
        /// The C function.
        call: &'static str,
        /// Which argument.
        what: &'static str,
    },
    /// A free (or a question about a block) of an address this library does not hold
    /// live: a double free, or memory from another allocator.
    #[error("{ptr:#x} is not a live allocation of cudamem (freed twice, or allocated elsewhere)")]
    UnknownPointer {
        /// The pointer argument.
        ptr: u64,
    },
    /// A request named a private pool (a CUDA graph's memory pool) that the device does
    /// not have: never begun, or released already.
    #[error("device {device} has no private memory pool ({}, {})", pool.0, pool.1)]
    UnknownPool {
        /// The device.
        device: i32,
        /// The pool's id, PyTorch's `MempoolId_t`.
        pool: (u64, u64),
    },
    /// `beginAllocateToPool` for a pool that allocations are diverted to already, or
    /// `endAllocateToPool` for one they are not.
    #[error("device {device}: private pool ({}, {}) {why}", pool.0, pool.1)]
    PoolState {
        /// The device.
        device: i32,
        /// The pool's id.
        pool: (u64, u64),
        /// What is wrong, e.g. "is being allocated to already".
        why: &'static str,
    },
    /// A checkpoint of a private pool that this device did not make, or whose pool is
    /// gone.
    #[error("device {device}: no checkpoint {checkpoint} of a live private pool")]
    UnknownCheckpoint {
        /// The device.
        device: i32,
        /// The checkpoint's number.
        checkpoint: u64,
    },
    /// A memory fraction outside `0..=1`.
    #[error("device {device}: memory fraction {fraction} is not between 0 and 1")]
    BadFraction {
        /// The device.
        device: i32,
        /// The fraction asked for.
        fraction: f64,
    },
    /// The pool could not place the request even after every stream's freed blocks came
    /// back (or would pass the memory fraction set for the device). The text is
    /// PyTorch's first line (`headline`, [`crate::oom::Headline`]), then `report`, the
    /// ledger of the device at that moment.
    #[error("{headline}\n{report}")]
    OutOfMemory {
        /// The device.
        device: i32,
        /// Bytes requested.
        requested: u64,
        /// PyTorch's line: "CUDA out of memory. Tried to allocate ...".
        headline: String,
        /// Why: the pool's figures and the context's ledger, several lines.
        report: String,
    },
    /// The request cannot be served while a CUDA graph is being captured on the device
    /// (it would have to wait for the device, which a capture forbids).
    #[error("device {device}: {what} is not possible while a CUDA graph is being captured")]
    Capturing {
        /// The device.
        device: i32,
        /// What was asked.
        what: &'static str,
    },
    /// `CUDAMEM_POLICY` names no policy.
    #[error("CUDAMEM_POLICY={value:?} is not a policy; known: {known}")]
    UnknownPolicy {
        /// The value, cut to 80 characters.
        value: String,
        /// The policies there are.
        known: &'static str,
    },
    /// `CUDAMEM_MIN_GROWTH` is not a size.
    #[error(
        "CUDAMEM_MIN_GROWTH={value:?} is not a size in bytes \
         (an integer, optionally with K, M or G, e.g. 2M, 64M, 1G)"
    )]
    BadMinGrowth {
        /// The value, cut to 80 characters.
        value: String,
    },
    /// `CUDAMEM_GROWTH_DIVISOR` is not a whole number below 2^32.
    #[error(
        "CUDAMEM_GROWTH_DIVISOR={value:?} is not a whole number from 0 to 4294967295 \
         (0: off; e.g. 16 grows by at least 1/16 of the mapped bytes, up to 32 MiB)"
    )]
    BadGrowthDivisor {
        /// The value, cut to 80 characters.
        value: String,
    },
    /// `CUDAMEM_PEERS` is neither `all` nor device ordinals below 64.
    #[error(
        "CUDAMEM_PEERS={value:?} is not `all` or device ordinals 0 to 63 separated by \
         commas (e.g. 0,1); the bad part: {part:?}"
    )]
    BadPeers {
        /// The value, cut to 80 characters.
        value: String,
        /// The part that is no ordinal below 64, cut to 80 characters.
        part: String,
    },
    /// The library was built without the `cuda` feature and no simulated devices are
    /// installed.
    #[error(
        "libcudamem_torch was built without CUDA; rebuild it with \
         `cargo build --release -p cudamem-torch --features cuda`"
    )]
    NoCuda,
    /// The device, pool or driver failed.
    #[error(transparent)]
    Ctx(#[from] ctx::Error),
}

/// The most devices the C functions serve; devices are numbered from 0.
pub const MAX_DEVICES: usize = 64;

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `text` cut to 80 characters, for quoting user input in errors.
pub(crate) fn cut(text: &str) -> String {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}
