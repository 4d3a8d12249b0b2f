#![doc = include_str!("../README.md")]
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

mod alloc_api;
pub mod bytes;
mod calls;
mod compact;
mod error;
mod freelist;
mod growth;
mod handle;
pub mod moves;
pub mod pytorch;
mod steps;
mod stitch;
mod tlsf;
mod vmm;

pub use alloc_api::{
    Allocation, Allocator, DEFAULT_ALIGN, Extent, MAX_ALIGN, NewRegion, Stats, align_up,
    check_align,
};
pub use calls::{CallTally, DriverCall, DriverCalls};
pub use compact::{CompactionPlan, Move};
pub use error::{Error, Result};
pub use freelist::{Fit, FreeList};
pub use growth::{GrowthRule, GrowthStep};
pub use handle::{BlockFlags, BlockInfo, Handle, Heap};
pub use steps::{MODEL_STEPS_FLOOR, MODEL_STEPS_PER_REQUEST, model_steps};
pub use stitch::driver::{DriverCosts, DriverOp, H200_DRIVER_COSTS};
pub use stitch::{
    HUGE_REQUEST_BYTES, HandleInfo, MAX_LARGE_PAGES, STITCH_ALIGN, Stitch, StitchBlock,
    StitchConfig, StitchStats, VIRTUAL_BYTES,
};
pub use tlsf::Tlsf;
pub use vmm::{FULL_BANDWIDTH_HANDLE_BYTES, FULL_BANDWIDTH_HANDLE_PAGES, PAGE_BYTES};
