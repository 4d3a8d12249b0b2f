#![doc = include_str!("../README.md")]
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

mod alloc_api;
pub mod bytes;
mod compact;
mod error;
mod freelist;
mod handle;
pub mod pytorch;
mod stitch;
mod tlsf;

pub use alloc_api::{
    Allocation, Allocator, DEFAULT_ALIGN, Extent, MAX_ALIGN, NewRegion, Stats, align_up,
    check_align,
};
pub use compact::{CompactionPlan, Move};
pub use error::{Error, Result};
pub use freelist::{Fit, FreeList};
pub use handle::{BlockFlags, BlockInfo, Handle, Heap};
pub use stitch::driver::{DriverCall, DriverCalls, DriverCosts, DriverOp, H200_DRIVER_COSTS};
pub use stitch::{
    FULL_BANDWIDTH_HANDLE_BYTES, HandleInfo, PAGE_BYTES, STITCH_ALIGN, Stitch, StitchBlock,
    StitchConfig, StitchStats, VIRTUAL_BYTES,
};
pub use tlsf::Tlsf;
