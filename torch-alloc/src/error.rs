//! The one error type of the crate.

/// Why a call of the allocator failed. Every variant says where (device, pointer) and
/// what; quoted user values are cut to 80 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A request or free named a negative size.
    #[error("{call} on device {device}: negative size {size} bytes")]
    NegativeSize {
        /// `cudamem_malloc` or `cudamem_free`.
        call: &'static str,
        /// The device argument.
        device: i32,
        /// The size argument, bytes.
        size: i64,
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
    /// A free of an address this allocator does not hold live: a double free, or memory
    /// from another allocator.
    #[error(
        "cudamem_free on device {device}: {ptr:#x} is not a live allocation of cudamem \
         (freed twice, or allocated elsewhere)"
    )]
    UnknownPointer {
        /// The device argument.
        device: i32,
        /// The pointer argument.
        ptr: u64,
    },
    /// A free named another size than the allocation had; nothing was freed.
    #[error(
        "cudamem_free on device {device}: {ptr:#x} was allocated with {allocated} bytes \
         but freed with {given}; not freed"
    )]
    SizeMismatch {
        /// The device argument.
        device: i32,
        /// The pointer argument.
        ptr: u64,
        /// Bytes requested when it was allocated.
        allocated: u64,
        /// Bytes the free named.
        given: u64,
    },
    /// The pool could not place the request even after every stream's freed blocks came
    /// back; `report` is the ledger of the device at that moment.
    #[error("out of memory on device {device}: {requested} bytes requested\n{report}")]
    OutOfMemory {
        /// The device.
        device: i32,
        /// Bytes requested.
        requested: u64,
        /// Why: the pool's figures and the context's ledger, several lines.
        report: String,
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
