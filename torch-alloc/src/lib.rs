//! PyTorch's CUDA allocator on ctx's pools: a shared library whose C ABI the C++
//! backend in `torch-alloc/cpp/` (a `c10::cuda::CUDACachingAllocator::CUDAAllocator`)
//! calls, so every PyTorch program runs on cudamem's non-moving pools with no change to
//! its model code, and keeps what PyTorch users rely on: `torch.cuda.memory_stats()`,
//! cuDNN's benchmark mode, CUDA graphs, `torch.compile(mode="reduce-overhead")`,
//! memory snapshots, `empty_cache`, memory fractions, and an out-of-memory error that
//! comes at once, with the device's ledger.
//!
//! - [`DeviceAllocator`] is the Rust API: one device's [`Backing`] (ctx's TLSF
//!   [`ctx::Pool`] or its [`ctx::StitchedPool`], `CUDAMEM_POLICY`), the live blocks,
//!   stream order ([`StreamEvents`]: memory freed on stream S is reusable at once by
//!   S, by other streams once the work queued on S before the free has completed),
//!   CUDA graphs' private pools, PyTorch's figures ([`DeviceStats`]), the history
//!   and snapshots. It is generic over the device and the streams, so tests run it on
//!   ctx's [`ctx::SimDevice`] with [`SimStreams`].
//! - [`registry`] holds the process's allocators, one per device, opened on first use
//!   with [`Settings`] from the environment.
//! - [`ffi`] is the C ABI over it (declared in `torch-alloc/cpp/cudamem.h`); a thin
//!   shell, the only `unsafe` here (the caller's pointers). Driver calls live in
//!   `ctx::cuda`.
//! - [`explain`] renders a context's ledger (ctx's [`ctx::Ledger`]) with the pool in it.
//!
//! It is not a moving allocator: blocks never move, so pointers PyTorch holds stay
//! valid. Without the `cuda` feature the C functions serve no device: they fail with a
//! message saying the library was built without CUDA.
//!
//! ```
//! use cudamem_torch::{DeviceAllocator, Request, Settings, SimStreams, backing};
//! use ctx::{SimConfig, SimDevice, StreamId};
//!
//! let streams = SimStreams::default();
//! let memory = SimDevice::new(SimConfig::small(64 << 20));
//! let alloc = DeviceAllocator::new(0, backing::stitched_pool(memory, &Settings::default())?, streams.clone())?;
//! let (s1, s2) = (StreamId(1), StreamId(2));
//! let a = alloc.allocate(Request::new(4096, s1))?.ptr;
//! let _b = alloc.allocate(Request::new(4096, s2))?; // a second stream: from now on frees wait
//! streams.launch(s1); // a kernel on s1 still uses `a`
//! alloc.free(a, 0)?;
//! assert_ne!(alloc.allocate(Request::new(4096, s2))?.ptr, a); // not for s2 yet
//! assert_eq!(alloc.stats().pending_bytes, 4096);
//! streams.complete(s1);
//! alloc.allocate(Request::new(4096, s2))?; // the event has completed: `a` went back
//! assert_eq!(alloc.stats().pending_bytes, 0);
//! let stats = alloc.device_stats();
//! assert!(stats.allocated_bytes.aggregate.current <= stats.reserved_bytes.aggregate.current);
//! # Ok::<(), cudamem_torch::Error>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod allocator;
pub mod backing;
#[cfg(feature = "cuda")]
mod cuda;
mod device_stats;
mod error;
mod events;
pub mod explain;
mod facts;
#[allow(unsafe_code)]
pub mod ffi;
pub mod history;
pub mod oom;
mod pool_id;
pub mod registry;
mod settings;
pub mod snapshot;

pub use allocator::{AllocatorStats, DeviceAllocator, Outcome, Request, Restored, SEGMENT_BYTES};
pub use backing::{Backing, Figures};
#[cfg(feature = "cuda")]
pub use cuda::CudaStreams;
pub use device_stats::{DeviceStats, Stat, StatArray};
pub use error::{Error, MAX_DEVICES, Result};
pub use events::{SimEvent, SimStreams, StreamEvents};
pub use facts::{ContextFacts, DeviceFacts};
pub use pool_id::PoolId;
pub use settings::{Peers, Policy, Settings};
