#![doc = include_str!("../README.md")]
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod address_space;
mod call_tally;
mod copy;
mod device;
mod device_heap;
mod error;
mod ledger;
mod peers;
mod pool;
mod preflight;
mod profile;
mod sim;
mod stitched;

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda;

pub use call_tally::{CallTally, VmmCalls};
pub use device::{DeviceMemory, MemInfo, PhysicalHandle, StreamId};
pub use device_heap::{DeviceHeap, device_heap_bytes};
pub use error::{Error, Result};
pub use kernels::moves::BlockMove;
pub use ledger::{
    Ledger, LedgerItem, LedgerItemKind, Limits, Workload, local_memory_reservation_bytes,
    per_thread_local_bytes,
};
/// What a pool's blocks are named by, and what its heap reports and
/// refuses: memcore's types, so a user of ctx needs no other crate.
pub use memcore::{DEFAULT_ALIGN, Error as HeapError, Handle, Stats as HeapStats};
/// The stitching policy's types a stitched pool user meets.
pub use memcore::{DriverCalls, StitchConfig, StitchStats};
pub use peers::{PeerLinks, PeerSet};
pub use pool::{
    CompactionPolicy, CompactionReport, Growth, PinGuard, Pool, PoolConfig, PoolGuard, PoolStats,
};
pub use preflight::{Preflight, PreflightReport};
pub use profile::{DeviceProfile, LOCAL_MEMORY_GRANULE};
pub use sim::{SimConfig, SimCounters, SimDevice};
pub use stitched::{STITCHED_RESERVATION_PER_DEVICE, StitchedConfig, StitchedPool, StitchedStats};

/// The CUDA backend (feature `cuda`): see the crate docs.
#[cfg(feature = "cuda")]
pub use cuda::{
    CopyBandwidth, CopyCalls, CudaContext, CudaDevice, Event, ForeignStream, Function,
    FunctionAttributes, LargestAllocation, LaunchConfig, Limit, MemoryDelta, Module, Stream,
};
