//! The reference model: maps from pointers and handles to what they hold,
//! and counts. Each step is the plain meaning of its record.

use std::collections::BTreeMap;

use trace::event::Call;

/// A live allocation or handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Bytes.
    pub size: u64,
    /// Calling library id.
    pub caller: u32,
    /// The call that made it.
    pub call: Call,
    /// The stream it was allocated on (0 for none).
    pub stream: u64,
}

/// What the process holds, as the records say.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// Device allocations by pointer.
    pub device: BTreeMap<u64, Held>,
    /// Pinned host allocations by pointer.
    pub host: BTreeMap<u64, Held>,
    /// VMM physical handles on the device.
    pub handles: BTreeMap<u64, Held>,
    /// VMM physical handles of host memory.
    pub host_handles: BTreeMap<u64, Held>,
    /// Reserved address ranges: start -> bytes.
    pub reserved: BTreeMap<u64, u64>,
    /// Mapped ranges: start -> bytes.
    pub mapped: BTreeMap<u64, u64>,
    /// Successful allocations and handles.
    pub allocations: u64,
    /// Frees and releases recorded.
    pub frees: u64,
    /// Frees of pointers or handles nobody allocated.
    pub unknown_frees: u64,
    /// Calls that returned out of memory.
    pub out_of_memory: u64,
    /// Calls that failed otherwise.
    pub other_failures: u64,
}

impl Model {
    /// Whether `ptr` is a live allocation of either kind.
    pub fn is_live(&self, ptr: u64) -> bool {
        self.device.contains_key(&ptr) || self.host.contains_key(&ptr)
    }

    /// A call returned `result`, not success.
    pub fn failed(&mut self, result: i32) {
        if result == ctx::driver::result::OUT_OF_MEMORY {
            self.out_of_memory += 1;
        } else {
            self.other_failures += 1;
        }
    }

    /// Device bytes live: allocations and device handles.
    pub fn device_bytes(&self) -> u64 {
        bytes([&self.device, &self.handles])
    }

    /// Pinned host bytes live: allocations and host handles.
    pub fn host_bytes(&self) -> u64 {
        bytes([&self.host, &self.host_handles])
    }

    /// Live bytes `cuMemAllocAsync` made (the device's own stream-ordered
    /// pool; a program's pools are apart).
    pub fn async_bytes(&self) -> u64 {
        self.device
            .values()
            .filter(|held| held.call == Call::MemAllocAsync)
            .map(|held| held.size)
            .sum()
    }

    /// Device bytes and blocks of caller `id`.
    pub fn caller(&self, id: u32) -> (u64, u64) {
        self.device
            .values()
            .chain(self.handles.values())
            .filter(|held| held.caller == id)
            .fold((0, 0), |(bytes, blocks), held| {
                (bytes + held.size, blocks + 1)
            })
    }
}

/// Bytes held in `tables` together.
fn bytes(tables: [&BTreeMap<u64, Held>; 2]) -> u64 {
    tables
        .iter()
        .flat_map(|table| table.values())
        .map(|held| held.size)
        .sum()
}

impl Model {
    /// The model after `step`.
    pub fn step(&mut self, step: &crate::transitions::Step) {
        use crate::transitions::Step;
        match *step {
            Step::Alloc { held, ptr, result } => {
                if result != 0 {
                    self.failed(result);
                    return;
                }
                self.allocations += 1;
                if held.call.is_host() {
                    self.host.insert(ptr, held);
                } else {
                    self.device.insert(ptr, held);
                }
            }
            Step::Free { call, ptr, .. } => {
                self.frees += 1;
                let table = if call.is_host() {
                    &mut self.host
                } else {
                    &mut self.device
                };
                if table.remove(&ptr).is_none() {
                    self.unknown_frees += 1;
                }
            }
            Step::FailedFree { call, ptr } => {
                // Tried and failed: nothing changes but the counts seen.
                let _ = (call, ptr);
            }
            Step::Reserve { ptr, size, result } => {
                if result == 0 {
                    self.reserved.entry(ptr).or_insert(size);
                }
            }
            Step::AddressFree { ptr } => {
                self.reserved.remove(&ptr);
            }
            Step::Create {
                held,
                handle,
                host,
                result,
            } => {
                if result != 0 {
                    self.failed(result);
                    return;
                }
                self.allocations += 1;
                if host {
                    self.host_handles.insert(handle, held);
                } else {
                    self.handles.insert(handle, held);
                }
            }
            Step::Release { handle } => {
                self.frees += 1;
                if self.handles.remove(&handle).is_none()
                    && self.host_handles.remove(&handle).is_none()
                {
                    self.unknown_frees += 1;
                }
            }
            Step::Map { ptr, size, result } => {
                if result == 0 {
                    self.mapped.entry(ptr).or_insert(size);
                }
            }
            Step::Unmap { ptr, size } => {
                let end = ptr.saturating_add(size);
                self.mapped.retain(|&start, _| !(ptr..end).contains(&start));
            }
        }
    }
}
