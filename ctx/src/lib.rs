#![doc = include_str!("../README.md")]
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod address_space;
mod copy;
mod device;
#[cfg(feature = "kernels")]
mod device_heap;
pub mod driver;
mod driver_code;
mod error;
mod ledger;
mod mapping;
mod peers;
mod pool;
mod preflight;
mod profile;
mod sim;
mod stitched;
pub mod text;

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda;

pub use device::{DeviceMemory, MemInfo, PhysicalHandle, StreamId};
#[cfg(feature = "kernels")]
pub use device_heap::{DeviceHeap, device_heap_bytes};
pub use driver_code::DriverCode;
pub use error::{Error, Result};
pub use ledger::{
    BIG_LOCAL_BYTES, BIG_LOCAL_SHARE, FIND_LOCAL_MEMORY, Figure, Ledger, LedgerItem,
    LedgerItemKind, LedgerRow, Limits, LocalMemoryAdvice, Prediction, REDUCE_LOCAL_MEMORY,
    Workload, local_memory_reservation_bytes, per_thread_local_bytes, render_rows,
};
pub use memcore::moves::BlockMove;
/// The stitching policy's types a stitched pool user meets, and the record
/// of driver calls every pool keeps.
pub use memcore::{CallTally, DriverCalls, StitchConfig, StitchStats};
/// What a pool's blocks are named by, and what its heap reports and
/// refuses: memcore's types, so a user of ctx needs no other crate.
pub use memcore::{DEFAULT_ALIGN, Error as HeapError, Handle, Stats as HeapStats};
pub use peers::{PeerLinks, PeerSet};
pub use pool::{
    CompactionPolicy, CompactionReport, Growth, PinGuard, Pool, PoolConfig, PoolGuard, PoolStats,
};
pub use preflight::{Preflight, PreflightReport};
pub use profile::{DeviceProfile, LOCAL_MEMORY_GRANULE};
pub use sim::{SimCall, SimConfig, SimCounters, SimDevice, SimFaults};
pub use stitched::{STITCHED_RESERVATION_PER_DEVICE, StitchedConfig, StitchedPool, StitchedStats};

/// The CUDA backend (feature `cuda`): see the crate docs.
#[cfg(feature = "cuda")]
pub use cuda::{
    CopyCalls, CudaContext, CudaDevice, Event, ForeignStream, Function, FunctionAttributes,
    LargestAllocation, LaunchConfig, Limit, MemoryDelta, Module, Stream,
};
