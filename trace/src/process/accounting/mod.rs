//! [`Accounting`]: what a process holds on each device, record by record.
//!
//! The interposer feeds it every record it writes (so an out-of-memory
//! explanation sees the process as it is), and `cudamem run` feeds it the
//! same records read back from the log (so the peak ledger is computed by
//! the same code): one state machine, two readers.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::event::{Call, Event, MemInfoWhy, Record, ResolveHow};
use crate::image::Answer;

mod causes;
mod memory;

pub use causes::{SAID_DROP_BYTES, UnexplainedDrop, code_bound_bytes};
use ctx::driver::result::OUT_OF_MEMORY;

/// The allocating call a free undoes (host frees give back host memory).
fn call_allocating(free: Call) -> Call {
    match free {
        Call::MemFreeHost => Call::MemHostAlloc,
        Call::MemFreeAsync => Call::MemAllocAsync,
        _ => Call::MemAlloc,
    }
}

/// Hashes pointers and handles (the maps' only keys) with one folded
/// multiply: the interposer updates these maps inside every allocation call.
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        let product = u128::from(self.0) * 0x9E37_79B9_7F4A_7C15;
        (product as u64) ^ ((product >> 64) as u64)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 ^= value;
    }
}

type AddressMap<V> = HashMap<u64, V, BuildHasherDefault<AddressHasher>>;

/// A live block: device memory (`cuMemAlloc*`, managed, stream-ordered),
/// pinned host memory, or a VMM physical handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    size: u64,
    caller: u32,
    call: Call,
}

/// A device as the first context on it showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Device ordinal.
    pub ordinal: i32,
    /// Streaming multiprocessors.
    pub sm_count: Option<u64>,
    /// Most resident threads per multiprocessor.
    pub threads_per_sm: Option<u64>,
    /// Device memory in all, bytes.
    pub total: Option<u64>,
    /// `total - free` right after the first context was made, bytes (other
    /// processes' memory on the device included).
    pub used_at_context: Option<u64>,
    /// The stack limit right after the first context was made, bytes per
    /// thread.
    pub stack_at_context: Option<u64>,
}

/// A kernel whose local memory was read at its first launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// Its name as the program resolved it (mangled), or its handle.
    pub name: String,
    /// `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`: local memory per thread, bytes.
    pub local_bytes: u64,
}

/// Who set the stack limit the local memory reservation follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackSource {
    /// The context's default.
    Default,
    /// The program, with `cuCtxSetLimit(CU_LIMIT_STACK_SIZE)`.
    SetLimit,
    /// The driver, raising it at the first launch of this kernel.
    Kernel(String),
}

/// A reading of free and total memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Why it was read.
    pub why: MemInfoWhy,
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
    /// Bytes the device's default stream-ordered pool held, where read.
    pub pool_reserved: Option<u64>,
    /// When, nanoseconds since the process started recording.
    pub time_ns: u64,
}

/// What one device holds, as far as the records tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    /// The device's facts.
    pub facts: DeviceFacts,
    /// Contexts made or retained on it.
    pub contexts: u32,
    /// The current stack limit, bytes per thread.
    pub stack: Option<u64>,
    /// Who set it.
    pub stack_source: StackSource,
    /// The malloc heap limit, bytes.
    pub heap: Option<u64>,
    /// The printf FIFO limit, bytes.
    pub fifo: Option<u64>,
    /// Device bytes the stack limit's changes took, measured (a lowered
    /// limit gives bytes back).
    pub local_change_measured: i64,
    /// A change of the stack limit went unmeasured (free memory could not be
    /// read around it): the measured local memory is not known.
    pub local_change_unmeasured: bool,
    /// Device bytes module and library loads took, and first launches that
    /// did not raise the stack (lazy loading of their code), measured.
    pub module_measured: u64,
    /// Device bytes setting the malloc heap and printf FIFO limits took at
    /// once, measured.
    pub heap_fifo_measured: u64,
    /// Module and library loads.
    pub module_loads: u64,
    /// Device bytes the driver took making streams, events, executable
    /// graphs and memory pools, and at a graph's first upload or launch,
    /// measured around the first calls of each kind.
    pub objects_measured: u64,
    /// Those calls measured.
    pub object_calls: u64,
    /// Device bytes the malloc heap took at the first launch of a kernel
    /// (the driver takes it whole then), measured.
    pub heap_measured: u64,
    /// The malloc heap is yet to be taken (from the context on, until a
    /// first launch takes it).
    pub heap_pending: bool,
    /// Whether the images loaded call `malloc`: yes if one does, unknown
    /// if one could not be read, no otherwise (and before any image).
    pub images_call_malloc: Answer,
    /// Whether the images loaded call `printf` (as for `malloc`).
    pub images_call_printf: Answer,
    /// What could not be read of the images (the first 8 notes).
    pub image_notes: Vec<String>,
    /// The most module code the images loaded can hold, bytes
    /// ([`code_bound_bytes`] of each).
    pub code_bound: u64,
    /// A load's image size was not known (a file, an image of no known
    /// format, a log without image records): module code is not bounded.
    pub code_unbounded: bool,
    /// Drops of free memory no cause fits (the first 16).
    pub unexplained_drops: Vec<UnexplainedDrop>,
    /// The image record of the load about to be recorded: its call and
    /// size.
    pending_image: Option<(Call, Option<u64>)>,
    /// Kernels launched at least once whose local memory was read.
    pub kernels: Vec<Kernel>,
    /// The last reading of free memory.
    pub last_reading: Option<Reading>,
}

/// Live bytes of one calling library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallerBytes {
    /// Device bytes (allocations and VMM physical memory).
    pub device_bytes: u64,
    /// Live device allocations and handles.
    pub blocks: u64,
    /// Pinned host bytes.
    pub host_bytes: u64,
    /// The largest live block, bytes.
    pub largest: u64,
}

/// How `cuGetProcAddress` answers were handed on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolutions {
    /// Wrapped as exported symbols.
    pub export: u64,
    /// Wrapped by the version table.
    pub table: u64,
    /// Handed on unwrapped, with up to 16 of their names.
    pub unwrapped: u64,
    /// Names handed on unwrapped (first 16).
    pub unwrapped_names: Vec<String>,
}

/// Counts over the whole log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Successful allocations (device, managed, host, handles).
    pub allocations: u64,
    /// Frees the records saw.
    pub frees: u64,
    /// Frees of pointers no record allocated (made before recording, or
    /// through a path the interposer does not see).
    pub unknown_frees: u64,
    /// Calls that returned `CUDA_ERROR_OUT_OF_MEMORY`.
    pub out_of_memory: u64,
    /// Allocation calls that failed otherwise.
    pub other_failures: u64,
    /// Records the interposer dropped at its size bound.
    pub dropped: u64,
    /// Whether the process's last image wrote its exit record.
    pub exited: bool,
    /// The last fatal signal the process saw.
    pub signal: Option<i32>,
    /// The driver library the process asked the loader for, when none was
    /// loaded by its exit.
    pub driver_missing: Option<String>,
    /// Records of driver calls (every kind but the process's own:
    /// `process`, `library`, `driver-missing`, `signal`, `exit`); 0 for a
    /// process that made no driver call the interposer saw.
    pub driver_records: u64,
}

/// The state of one process's device memory, record by record.
///
/// ```
/// use trace::process::accounting::Accounting;
/// use trace::event::{Call, Event, Record};
///
/// let mut accounting = Accounting::default();
/// let record = |event| Record { time_ns: 0, thread: 1, event };
/// accounting.apply(&record(Event::Alloc {
///     call: Call::MemAlloc, ptr: 0x1000, size: 4096, stream: 0, caller: 0, result: 0,
/// }));
/// assert_eq!(accounting.live_device_bytes(), 4096);
/// accounting.apply(&record(Event::Free { call: Call::MemFree, ptr: 0x1000, stream: 0, caller: 0 }));
/// assert_eq!(accounting.live_device_bytes(), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Accounting {
    /// The process's id (from its last `process` record).
    pub pid: u32,
    /// Its executable.
    pub exe: String,
    libraries: Vec<Option<String>>,
    devices: Vec<DeviceState>,
    live: AddressMap<Block>,
    host: AddressMap<Block>,
    handles: AddressMap<Block>,
    reserved: AddressMap<u64>,
    /// Mapped ranges: start -> size.
    mappings: BTreeMap<u64, u64>,
    by_caller: Vec<CallerBytes>,
    live_device_bytes: u64,
    live_async_bytes: u64,
    live_host_bytes: u64,
    created_bytes: u64,
    mapped_bytes: u64,
    reserved_bytes: u64,
    /// Counts over the log.
    pub counts: Counts,
    /// How entry points were handed on.
    pub resolutions: Resolutions,
    /// The drop no cause fitted at the last record, until taken.
    last_unexplained: Option<UnexplainedDrop>,
    /// The block the last free removed, for a `free-failed` record that
    /// follows it.
    last_freed: Option<(u64, Block)>,
}

impl Accounting {
    /// Apply one record.
    pub fn apply(&mut self, record: &Record<'_>) {
        if !matches!(
            record.event,
            Event::Process { .. }
                | Event::Library { .. }
                | Event::DriverMissing { .. }
                | Event::Signal { .. }
                | Event::Exit { .. }
        ) {
            self.counts.driver_records += 1;
        }
        match &record.event {
            Event::Process { pid, exe, .. } => {
                self.pid = *pid;
                self.exe = exe.to_string();
                self.counts.exited = false;
            }
            Event::Library { id, path } => self.library_named(*id, path),
            &Event::Alloc {
                call,
                ptr,
                size,
                caller,
                result,
                ..
            } => self.allocated(call, ptr, size, caller, result),
            &Event::Free { call, ptr, .. } => self.freed(call, ptr),
            &Event::FreeFailed {
                call,
                ptr,
                size,
                caller,
                ..
            } => self.free_failed(call, ptr, size, caller),
            &Event::Reserve { ptr, size, result } => self.reserved(ptr, size, result),
            &Event::AddressFree { ptr, .. } => self.address_freed(ptr),
            &Event::Create {
                handle,
                size,
                device,
                caller,
                result,
            } => self.created(handle, size, device, caller, result),
            &Event::Release { handle } => self.released(handle),
            &Event::Map {
                ptr, size, result, ..
            } => self.mapped(ptr, size, result),
            &Event::Unmap { ptr, size } => self.unmapped(ptr, size),
            Event::Context { .. } => self.context(record),
            &Event::Limit {
                which,
                result,
                value,
                window,
                ..
            } => self.limit(which, result, value, window),
            Event::Image { .. } => self.image(&record.event),
            &Event::Module {
                call,
                result,
                window,
            } => self.module(call, result, window),
            Event::Launch { .. } => self.launch(&record.event),
            &Event::MemInfo { .. } => self.mem_info(record),
            Event::Resolve { name, how, .. } => match how {
                ResolveHow::Export => self.resolutions.export += 1,
                ResolveHow::Table => self.resolutions.table += 1,
                ResolveHow::Unwrapped => {
                    self.resolutions.unwrapped += 1;
                    if self.resolutions.unwrapped_names.len() < 16 {
                        self.resolutions.unwrapped_names.push(name.to_string());
                    }
                }
            },
            Event::DriverMissing { name } => self.counts.driver_missing = Some(name.to_string()),
            &Event::Signal { number } => self.counts.signal = Some(number),
            &Event::Exit { dropped } => {
                self.counts.exited = true;
                self.counts.dropped += dropped;
            }
        }
    }

    fn library_named(&mut self, id: u32, path: &str) {
        let index = id as usize;
        if self.libraries.len() <= index {
            self.libraries.resize(index + 1, None);
        }
        self.libraries[index] = Some(path.to_string());
    }

    fn failed(&mut self, result: i32) {
        if result == OUT_OF_MEMORY {
            self.counts.out_of_memory += 1;
        } else {
            self.counts.other_failures += 1;
        }
    }

    fn caller(&mut self, id: u32) -> &mut CallerBytes {
        let index = id as usize;
        if self.by_caller.len() <= index {
            self.by_caller.resize(index + 1, CallerBytes::default());
        }
        &mut self.by_caller[index]
    }

    fn add_device(&mut self, block: Block) {
        if block.call == Call::MemAllocAsync {
            self.live_async_bytes += block.size;
        }
        let caller = self.caller(block.caller);
        caller.device_bytes += block.size;
        caller.blocks += 1;
        caller.largest = caller.largest.max(block.size);
    }

    fn remove_device(&mut self, block: Block) {
        if block.call == Call::MemAllocAsync {
            self.live_async_bytes -= block.size;
        }
        let caller = self.caller(block.caller);
        caller.device_bytes -= block.size;
        caller.blocks -= 1;
    }

    fn device_mut(&mut self, ordinal: i32) -> &mut DeviceState {
        // A reading or limit with no device (-1) belongs to the only device.
        let ordinal = if ordinal < 0 && self.devices.len() == 1 {
            self.devices[0].facts.ordinal
        } else {
            ordinal
        };
        let index = match self.devices.iter().position(|d| d.facts.ordinal == ordinal) {
            Some(index) => index,
            None => {
                self.devices.push(DeviceState::new(ordinal));
                self.devices.len() - 1
            }
        };
        &mut self.devices[index]
    }

    fn current_device_mut(&mut self) -> &mut DeviceState {
        if self.devices.is_empty() {
            self.devices.push(DeviceState::new(0));
        }
        // Context events say which device; later calls go to the device
        // whose context came last (one device per process is the case the
        // records can tell apart).
        let last = self.devices.len() - 1;
        &mut self.devices[last]
    }

    /// Device bytes live in allocations and VMM physical handles, all
    /// devices together.
    pub fn live_device_bytes(&self) -> u64 {
        self.live_device_bytes + self.created_bytes
    }

    /// Device bytes live from `cuMemAllocAsync` (the device's current
    /// stream-ordered pool).
    pub fn live_async_bytes(&self) -> u64 {
        self.live_async_bytes
    }

    /// Pinned host bytes live.
    pub fn live_host_bytes(&self) -> u64 {
        self.live_host_bytes
    }

    /// VMM bytes: (reserved address space, mapped, physical handles).
    pub fn vmm_bytes(&self) -> (u64, u64, u64) {
        (self.reserved_bytes, self.mapped_bytes, self.created_bytes)
    }

    /// Live device allocations and handles.
    pub fn live_blocks(&self) -> usize {
        self.live.len() + self.handles.len()
    }

    /// The devices seen, in order of their first context.
    pub fn devices(&self) -> &[DeviceState] {
        &self.devices
    }

    /// The path of library `id`, if a record named it.
    pub fn library(&self, id: u32) -> Option<&str> {
        self.libraries.get(id as usize)?.as_deref()
    }

    /// Live bytes per calling library, largest device holder first:
    /// (library path or `(unknown)`, its bytes).
    pub fn callers(&self) -> Vec<(String, CallerBytes)> {
        let mut callers: Vec<(String, CallerBytes)> = self
            .by_caller
            .iter()
            .enumerate()
            .filter(|(_, bytes)| bytes.blocks > 0 || bytes.host_bytes > 0)
            .map(|(id, bytes)| {
                let name = self.library(id as u32).unwrap_or("(unknown)").to_string();
                (name, *bytes)
            })
            .collect();
        callers.sort_by(|a, b| {
            b.1.device_bytes
                .cmp(&a.1.device_bytes)
                .then(b.1.host_bytes.cmp(&a.1.host_bytes))
        });
        callers
    }

    /// The largest live device block: (bytes, calling library).
    pub fn largest_block(&self) -> Option<(u64, String)> {
        self.live
            .values()
            .chain(self.handles.values())
            .max_by_key(|block| block.size)
            .map(|block| {
                (
                    block.size,
                    self.library(block.caller)
                        .unwrap_or("(unknown)")
                        .to_string(),
                )
            })
    }
}

impl DeviceState {
    fn new(ordinal: i32) -> Self {
        Self {
            facts: DeviceFacts {
                ordinal,
                sm_count: None,
                threads_per_sm: None,
                total: None,
                used_at_context: None,
                stack_at_context: None,
            },
            contexts: 0,
            stack: None,
            stack_source: StackSource::Default,
            heap: None,
            fifo: None,
            local_change_measured: 0,
            local_change_unmeasured: false,
            module_measured: 0,
            heap_fifo_measured: 0,
            module_loads: 0,
            objects_measured: 0,
            object_calls: 0,
            heap_measured: 0,
            heap_pending: true,
            images_call_malloc: Answer::No,
            images_call_printf: Answer::No,
            image_notes: Vec::new(),
            code_bound: 0,
            code_unbounded: false,
            unexplained_drops: Vec::new(),
            pending_image: None,
            kernels: Vec::new(),
            last_reading: None,
        }
    }

    /// The launched kernel with the largest local frame.
    pub fn largest_frame(&self) -> Option<&Kernel> {
        self.kernels.iter().max_by_key(|kernel| kernel.local_bytes)
    }
}

#[cfg(test)]
mod tests;
