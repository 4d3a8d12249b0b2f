//! What the allocator reads from a device besides its memory: the facts the context's
//! ledger is computed from.

use ctx::{DeviceMemory, DeviceProfile, Limits, MemInfo, SimDevice};

use crate::Result;

/// The figures of a context that [`crate::explain`] puts in its ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextFacts {
    /// The device as the ledger models it.
    pub profile: DeviceProfile,
    /// The context's limits now.
    pub limits: Limits,
    /// `cuMemGetInfo` now, bytes.
    pub mem: MemInfo,
}

/// A device the allocator can explain.
pub trait DeviceFacts: DeviceMemory {
    /// The context's figures now.
    fn context_facts(&self) -> Result<ContextFacts>;

    /// How many devices the process sees (what `CUDAMEM_PEERS=all` grants).
    fn device_count(&self) -> Result<u32>;

    /// Runs `work`, leaving the calling thread's current context as it found it
    /// (the caller's current device is the caller's). The simulation has none.
    fn keeping_current<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
        work()
    }
}

impl DeviceFacts for SimDevice {
    /// The devices of the simulated host ([`SimDevice::links`]).
    fn device_count(&self) -> Result<u32> {
        Ok(self.links().device_count())
    }

    /// An H200-shaped profile scaled to the simulated capacity: the context's share is
    /// the simulated reservation, and no local memory, heap or FIFO is held (limits 0).
    fn context_facts(&self) -> Result<ContextFacts> {
        let config = self.config();
        let h200 = DeviceProfile::builtin("h200").unwrap_or(DeviceProfile::all()[0]);
        Ok(ContextFacts {
            profile: DeviceProfile {
                name: "sim",
                full_name: "simulated device",
                total_bytes: config.capacity_bytes,
                context_baseline_bytes: Some(config.context_reserved_bytes),
                source: "a simulated device",
                ..h200
            },
            limits: Limits {
                stack_bytes: 0,
                malloc_heap_bytes: 0,
                printf_fifo_bytes: 0,
            },
            mem: self.mem_info()?,
        })
    }
}
