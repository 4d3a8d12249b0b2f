//! What a call of [`super::DeviceAllocator`] carries in and out.

use crate::history::NO_CONTEXT;
use crate::pool_id::PoolId;

/// A request as PyTorch makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<S> {
    /// Bytes asked for.
    pub size: u64,
    /// The stream the memory is used on (where it is freed).
    pub stream: S,
    /// The pool to serve it from: a private pool whose filter took the request, or
    /// [`PoolId::DEFAULT`].
    pub pool: PoolId,
    /// Whether `stream` is capturing a CUDA graph now (`cudaStreamIsCapturing`).
    pub capturing: bool,
    /// The caller's stack as a number, or [`NO_CONTEXT`].
    pub context: u64,
}

impl<S> Request<S> {
    /// `size` bytes on `stream` from the device's own pool, no capture, no stack.
    pub fn new(size: u64, stream: S) -> Self {
        Self {
            size,
            stream,
            pool: PoolId::DEFAULT,
            capturing: false,
            context: NO_CONTEXT,
        }
    }

    /// The same request served from `pool`.
    pub fn in_pool(self, pool: PoolId) -> Self {
        Self { pool, ..self }
    }

    /// The same request, its stream capturing a graph or not.
    pub fn capturing(self, capturing: bool) -> Self {
        Self { capturing, ..self }
    }

    /// The same request with a stack.
    pub fn with_context(self, context: u64) -> Self {
        Self { context, ..self }
    }
}

/// What an allocation or free did, with the device's totals after it (what PyTorch's
/// profiler records). Bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The block's device address.
    pub ptr: u64,
    /// The block's bytes (the request rounded up to 512, or the reused block's).
    pub bytes: u64,
    /// Bytes of all live blocks of the device.
    pub allocated_bytes: u64,
    /// Device memory the pool has mapped.
    pub reserved_bytes: u64,
}
