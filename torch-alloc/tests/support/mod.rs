//! What the allocator tests share: an allocator on each backing over a simulated
//! device, and a macro that runs one test body on both.

#![allow(dead_code)]

use ctx::{Pool, SimConfig, SimDevice, StitchedPool, StreamId};
use cudamem_torch::{Backing, DeviceAllocator, Outcome, Request, Settings, SimStreams, backing};

pub const MIB: u64 = 1 << 20;
pub const S1: StreamId = StreamId(0x100);
pub const S2: StreamId = StreamId(0x200);
pub const S3: StreamId = StreamId(0x300);

/// An allocator and the simulated streams it records events on.
pub struct Case<B: Backing> {
    pub alloc: DeviceAllocator<B, SimStreams>,
    pub streams: SimStreams,
}

impl<B: Backing> Case<B> {
    /// Allocates `size` bytes on `stream`, expecting success.
    pub fn take(&self, size: u64, stream: StreamId) -> u64 {
        self.alloc
            .allocate(Request::new(size, stream))
            .unwrap_or_else(|e| panic!("allocate {size} on {stream:?}: {e}"))
            .ptr
    }

    /// Frees `ptr`, expecting success.
    pub fn give(&self, ptr: u64) -> Outcome {
        self.alloc
            .free(ptr, 0)
            .unwrap_or_else(|e| panic!("free {ptr:#x}: {e}"))
    }

    /// Event calls made so far.
    pub fn event_calls(&self) -> u64 {
        self.alloc.stats().event_calls
    }
}

/// How a test makes its allocator.
pub type Make<B> = fn(SimConfig) -> Case<B>;

/// The TLSF pool on a simulated device.
pub fn tlsf(config: SimConfig) -> Case<Pool<SimDevice>> {
    let streams = SimStreams::default();
    let pool = backing::tlsf_pool(SimDevice::new(config), &Settings::default()).unwrap();
    Case {
        alloc: DeviceAllocator::new(0, pool, streams.clone()).unwrap(),
        streams,
    }
}

/// The stitched pool on a simulated device.
pub fn stitch(config: SimConfig) -> Case<StitchedPool<SimDevice>> {
    let streams = SimStreams::default();
    let pool = backing::stitched_pool(SimDevice::new(config), &Settings::default()).unwrap();
    Case {
        alloc: DeviceAllocator::new(0, pool, streams.clone()).unwrap(),
        streams,
    }
}

/// Runs the generic test body `$body` on both backings, as `$name::tlsf` and
/// `$name::stitch`.
#[macro_export]
macro_rules! on_both {
    ($($name:ident => $body:ident;)*) => {
        $(
            mod $name {
                #[test]
                fn tlsf() {
                    super::$body(super::support::tlsf);
                }
                #[test]
                fn stitch() {
                    super::$body(super::support::stitch);
                }
            }
        )*
    };
}

/// Deterministic pseudo-random numbers (xorshift).
pub fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
