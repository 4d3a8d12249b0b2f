#![doc = include_str!("../README.md")]
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod address_space;
mod call_tally;
mod copy;
pub mod device;
mod error;
pub mod ledger;
pub mod pool;
pub mod preflight;
pub mod profile;
pub mod sim;

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cuda;

pub use call_tally::{CallTally, VmmCalls};
pub use device::{DeviceMemory, MemInfo, StreamId};
pub use error::{Error, Result};
pub use kernels::moves::BlockMove;
pub use ledger::{Ledger, LedgerItem, LedgerItemKind, Limits, Workload};
pub use pool::{
    CompactionPolicy, CompactionReport, Growth, PinGuard, Pool, PoolConfig, PoolGuard, PoolStats,
};
pub use preflight::{Preflight, PreflightReport};
pub use profile::DeviceProfile;
pub use sim::{SimConfig, SimDevice};
