//! PyTorch's CUDA allocator on ctx's pool: a shared library that
//! `torch.cuda.memory.CUDAPluggableAllocator` loads, so every PyTorch program can run
//! on the non-moving VMM pool with no change to its model code.
//!
//! - [`DeviceAllocator`] is the Rust API: one device's [`ctx::Pool`] (`Growth::Vmm`,
//!   `CompactionPolicy::Never`, so pointers stay valid), the live pointers, and stream
//!   order ([`StreamEvents`]: memory freed on stream S is reusable at once by S, by
//!   other streams once the work queued on S before the free has completed). It is
//!   generic over the device ([`ctx::DeviceMemory`] + [`DeviceFacts`]) and the streams,
//!   so tests run it on ctx's [`ctx::SimDevice`] with [`SimStreams`].
//! - [`registry`] holds the process's allocators, one per device, opened on first use
//!   with [`Settings`] from the environment (`CUDAMEM_POLICY`, `CUDAMEM_MIN_GROWTH`),
//!   and reports errors on stderr (out of memory: the device's ledger, once).
//! - [`ffi`] is the C ABI over it: `cudamem_malloc`, `cudamem_free`, `cudamem_stats`,
//!   `cudamem_empty_cache`, `cudamem_explain`; a thin shell, the only `unsafe` here
//!   (reading the caller's pointers). Driver calls live in `ctx::cuda`.
//! - [`explain`] renders a context's ledger (ctx's [`ctx::Ledger`]) with the pool in it.
//!
//! Without the `cuda` feature the C functions serve no device: they return NULL and
//! say once that the library was built without CUDA.
//!
//! It is not a caching allocator in PyTorch's sense: `torch.cuda.memory_allocated()`
//! and friends do not see it; [`AllocatorStats`] (`cudamem_stats`) does.
//!
//! ```
//! use cudamem_torch::{DeviceAllocator, Settings, SimStreams};
//! use ctx::{SimConfig, SimDevice, StreamId};
//!
//! let streams = SimStreams::default();
//! let alloc = DeviceAllocator::new(
//!     0,
//!     SimDevice::new(SimConfig::small(64 << 20)),
//!     streams.clone(),
//!     &Settings::parse(None, None)?,
//! )?;
//! let (s1, s2) = (StreamId(1), StreamId(2));
//! let a = alloc.allocate(4096, s1)?;
//! let b = alloc.allocate(4096, s2)?; // a second stream: from now on frees wait
//! streams.launch(s1); // a kernel on s1 still uses `a`
//! alloc.free(a, 4096, s1)?;
//! assert_ne!(alloc.allocate(4096, s2)?, a); // not for s2 yet
//! assert_eq!(alloc.stats().pending_bytes, 4096);
//! streams.complete(s1);
//! alloc.allocate(4096, s2)?; // the event has completed: `a` went back to the pool
//! assert_eq!(alloc.stats().pending_bytes, 0);
//! # let _ = b;
//! # Ok::<(), cudamem_torch::Error>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod allocator;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
mod events;
pub mod explain;
mod facts;
#[allow(unsafe_code)]
pub mod ffi;
pub mod registry;
mod settings;

pub use allocator::{AllocatorStats, BLOCK_ALIGN, DeviceAllocator};
#[cfg(feature = "cuda")]
pub use cuda::CudaStreams;
pub use error::{Error, MAX_DEVICES, Result};
pub use events::{SimEvent, SimStreams, StreamEvents};
pub use facts::{ContextFacts, DeviceFacts};
pub use settings::{Peers, Policy, Settings};
