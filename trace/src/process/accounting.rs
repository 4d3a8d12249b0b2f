//! [`Accounting`]: what a process holds on each device, record by record.
//!
//! The interposer feeds it every record it writes (so an out-of-memory
//! explanation sees the process as it is), and `cudamem run` feeds it the
//! same records read back from the log (so the peak ledger is computed by
//! the same code): one state machine, two readers.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::event::{Call, Event, LimitKind, MemInfoWhy, Record, ResolveHow};
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
}

impl Accounting {
    /// Apply one record.
    pub fn apply(&mut self, record: &Record<'_>) {
        match &record.event {
            Event::Process { pid, exe, .. } => {
                self.pid = *pid;
                self.exe = exe.to_string();
                self.counts.exited = false;
            }
            Event::Library { id, path } => {
                let index = *id as usize;
                if self.libraries.len() <= index {
                    self.libraries.resize(index + 1, None);
                }
                self.libraries[index] = Some(path.to_string());
            }
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
            } => {
                // The free did not happen: the block is live again.
                self.counts.frees -= 1;
                self.allocated(call_allocating(call), ptr, size, caller, 0);
                self.counts.allocations -= 1;
            }
            &Event::Reserve { ptr, size, result } => {
                if result == 0 && self.reserved.insert(ptr, size).is_none() {
                    self.reserved_bytes += size;
                }
            }
            &Event::AddressFree { ptr, .. } => {
                if let Some(size) = self.reserved.remove(&ptr) {
                    self.reserved_bytes -= size;
                }
            }
            &Event::Create {
                handle,
                size,
                device,
                caller,
                result,
            } => {
                if result == 0 {
                    self.counts.allocations += 1;
                    let block = Block {
                        size,
                        caller,
                        call: Call::MemCreate,
                    };
                    if device < 0 {
                        self.host.insert(handle, block);
                        self.live_host_bytes += size;
                        self.caller(caller).host_bytes += size;
                    } else {
                        self.handles.insert(handle, block);
                        self.created_bytes += size;
                        self.add_device(block);
                    }
                } else {
                    self.failed(result);
                }
            }
            &Event::Release { handle } => {
                self.counts.frees += 1;
                if let Some(block) = self.handles.remove(&handle) {
                    self.created_bytes -= block.size;
                    self.remove_device(block);
                } else if let Some(block) = self.host.remove(&handle) {
                    self.live_host_bytes -= block.size;
                    self.caller(block.caller).host_bytes -= block.size;
                } else {
                    self.counts.unknown_frees += 1;
                }
            }
            &Event::Map {
                ptr, size, result, ..
            } => {
                if result == 0 && self.mappings.insert(ptr, size).is_none() {
                    self.mapped_bytes += size;
                }
            }
            &Event::Unmap { ptr, size } => {
                let end = ptr.saturating_add(size);
                let inside: Vec<u64> = self
                    .mappings
                    .range(ptr..end)
                    .map(|(&start, _)| start)
                    .collect();
                for start in inside {
                    if let Some(size) = self.mappings.remove(&start) {
                        self.mapped_bytes -= size;
                    }
                }
            }
            Event::Context {
                device,
                result,
                sm_count,
                threads_per_sm,
                total,
                free,
                stack,
                heap,
                fifo,
                ..
            } => {
                if *result != 0 {
                    self.failed(*result);
                    return;
                }
                let state = self.device_mut(*device);
                state.contexts += 1;
                if state.contexts == 1 || state.facts.total.is_none() {
                    state.facts.sm_count = *sm_count;
                    state.facts.threads_per_sm = *threads_per_sm;
                    state.facts.total = *total;
                    state.facts.used_at_context =
                        total.zip(*free).map(|(t, f)| t.saturating_sub(f));
                    state.facts.stack_at_context = *stack;
                    state.stack = *stack;
                    state.heap = *heap;
                    state.fifo = *fifo;
                    if let (Some(free), Some(total)) = (free, total) {
                        state.last_reading = Some(Reading {
                            why: MemInfoWhy::Context,
                            free: *free,
                            total: *total,
                            pool_reserved: None,
                            time_ns: record.time_ns,
                        });
                    }
                }
            }
            Event::Limit {
                which,
                result,
                value,
                window,
                ..
            } => {
                if *result != 0 {
                    self.failed(*result);
                    return;
                }
                let state = self.current_device_mut();
                match which {
                    LimitKind::Stack => {
                        state.stack = value.or(state.stack);
                        state.stack_source = StackSource::SetLimit;
                        if let (Some(before), Some(after)) = (window.free_before, window.free_after)
                        {
                            let change = i128::from(before)
                                - i128::from(after)
                                - i128::from(window.live_change);
                            state.local_change_measured = state
                                .local_change_measured
                                .saturating_add(i64::try_from(change).unwrap_or(0));
                        } else {
                            state.local_change_unmeasured = true;
                        }
                    }
                    LimitKind::MallocHeap | LimitKind::PrintfFifo => {
                        if *which == LimitKind::MallocHeap {
                            state.heap = value.or(state.heap);
                        } else {
                            state.fifo = value.or(state.fifo);
                        }
                        state.heap_fifo_measured += window.taken_bytes().unwrap_or(0);
                    }
                    LimitKind::Other(_) => {}
                }
            }
            Event::Module {
                call,
                result,
                window,
            } => {
                if *result != 0 {
                    self.failed(*result);
                }
                let state = self.current_device_mut();
                let taken = window.taken_bytes().unwrap_or(0);
                if call.is_object() {
                    state.objects_measured += taken;
                    state.object_calls += 1;
                } else {
                    if call.is_load() {
                        state.module_loads += 1;
                    }
                    state.module_measured += taken;
                }
            }
            Event::Launch {
                local_bytes,
                stack_before,
                stack_after,
                window,
                result,
                name,
                ..
            } => {
                if *result == OUT_OF_MEMORY {
                    self.counts.out_of_memory += 1;
                }
                let state = self.current_device_mut();
                if let Some(local_bytes) = local_bytes {
                    state.kernels.push(Kernel {
                        name: name.to_string(),
                        local_bytes: *local_bytes,
                    });
                }
                let raised = matches!((stack_before, stack_after), (Some(b), Some(a)) if a > b);
                if raised {
                    state.stack = *stack_after;
                    state.stack_source = StackSource::Kernel(name.to_string());
                    match window.taken_bytes() {
                        Some(taken) => {
                            state.local_change_measured =
                                state.local_change_measured.saturating_add(taken as i64);
                        }
                        None => state.local_change_unmeasured = true,
                    }
                } else {
                    state.module_measured += window.taken_bytes().unwrap_or(0);
                }
            }
            &Event::MemInfo {
                why,
                device,
                free,
                total,
                pool_reserved,
            } => {
                let state = self.device_mut(device);
                state.facts.total.get_or_insert(total);
                // A reading without the pool's (the program's own) keeps the
                // last one read: the reserve changes only as the pool grows
                // or is trimmed, which the next peak reading sees.
                let pool_reserved = pool_reserved
                    .or_else(|| state.last_reading.and_then(|last| last.pool_reserved));
                state.last_reading = Some(Reading {
                    why,
                    free,
                    total,
                    pool_reserved,
                    time_ns: record.time_ns,
                });
            }
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
            &Event::Signal { number } => self.counts.signal = Some(number),
            &Event::Exit { dropped } => {
                self.counts.exited = true;
                self.counts.dropped += dropped;
            }
        }
    }

    fn failed(&mut self, result: i32) {
        if result == OUT_OF_MEMORY {
            self.counts.out_of_memory += 1;
        } else {
            self.counts.other_failures += 1;
        }
    }

    fn allocated(&mut self, call: Call, ptr: u64, size: u64, caller: u32, result: i32) {
        if result != 0 {
            self.failed(result);
            return;
        }
        self.counts.allocations += 1;
        let block = Block { size, caller, call };
        if call.is_host() {
            if let Some(old) = self.host.insert(ptr, block) {
                self.live_host_bytes -= old.size;
                self.caller(old.caller).host_bytes -= old.size;
            }
            self.live_host_bytes += size;
            self.caller(caller).host_bytes += size;
        } else {
            if let Some(old) = self.live.insert(ptr, block) {
                // The driver handed out a live pointer again: its free went
                // by unseen. The new block replaces it.
                self.live_device_bytes -= old.size;
                self.remove_device(old);
            }
            self.live_device_bytes += size;
            self.add_device(block);
        }
    }

    fn freed(&mut self, call: Call, ptr: u64) {
        self.counts.frees += 1;
        let table = if call.is_host() {
            &mut self.host
        } else {
            &mut self.live
        };
        let Some(block) = table.remove(&ptr) else {
            self.counts.unknown_frees += 1;
            return;
        };
        if call.is_host() {
            self.live_host_bytes -= block.size;
            self.caller(block.caller).host_bytes -= block.size;
        } else {
            self.live_device_bytes -= block.size;
            self.remove_device(block);
        }
    }

    /// The size and calling library of the live block a free of `ptr` by
    /// `call` would release: what a `free-failed` record must carry.
    pub fn block_of(&self, call: Call, ptr: u64) -> Option<(u64, u32)> {
        let table = if call.is_host() {
            &self.host
        } else {
            &self.live
        };
        table.get(&ptr).map(|block| (block.size, block.caller))
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
mod tests {
    use super::*;
    use crate::event::Window;

    fn apply(accounting: &mut Accounting, event: Event<'static>) {
        accounting.apply(&Record {
            time_ns: 0,
            thread: 1,
            event,
        });
    }

    #[test]
    fn vmm_physical_memory_is_live_and_address_space_is_not() {
        let mut a = Accounting::default();
        apply(
            &mut a,
            Event::Reserve {
                ptr: 0x1000_0000,
                size: 1 << 40,
                result: 0,
            },
        );
        apply(
            &mut a,
            Event::Create {
                handle: 9,
                size: 2 << 20,
                device: 0,
                caller: 2,
                result: 0,
            },
        );
        apply(
            &mut a,
            Event::Map {
                ptr: 0x1000_0000,
                size: 2 << 20,
                offset: 0,
                handle: 9,
                result: 0,
            },
        );
        assert_eq!(a.live_device_bytes(), 2 << 20);
        assert_eq!(a.vmm_bytes(), (1 << 40, 2 << 20, 2 << 20));
        assert_eq!(a.callers()[0].1.device_bytes, 2 << 20);
        apply(
            &mut a,
            Event::Unmap {
                ptr: 0x1000_0000,
                size: 1 << 30,
            },
        );
        apply(&mut a, Event::Release { handle: 9 });
        apply(
            &mut a,
            Event::AddressFree {
                ptr: 0x1000_0000,
                size: 1 << 40,
            },
        );
        assert_eq!(a.vmm_bytes(), (0, 0, 0));
        assert_eq!(a.live_device_bytes(), 0);
        assert!(a.callers().is_empty());
    }

    #[test]
    fn pinned_host_memory_is_counted_apart() {
        let mut a = Accounting::default();
        apply(
            &mut a,
            Event::Alloc {
                call: Call::MemHostAlloc,
                ptr: 0x55,
                size: 4096,
                stream: 0,
                caller: 1,
                result: 0,
            },
        );
        assert_eq!((a.live_device_bytes(), a.live_host_bytes()), (0, 4096));
        apply(
            &mut a,
            Event::Free {
                call: Call::MemFreeHost,
                ptr: 0x55,
                stream: 0,
                caller: 1,
            },
        );
        assert_eq!(a.live_host_bytes(), 0);
    }

    #[test]
    fn a_failed_free_keeps_the_block_and_unknown_frees_are_counted() {
        let mut a = Accounting::default();
        apply(
            &mut a,
            Event::Alloc {
                call: Call::MemAlloc,
                ptr: 0x10,
                size: 512,
                stream: 0,
                caller: 1,
                result: 0,
            },
        );
        let block = a.block_of(Call::MemFree, 0x10).unwrap();
        apply(
            &mut a,
            Event::Free {
                call: Call::MemFree,
                ptr: 0x10,
                stream: 0,
                caller: 1,
            },
        );
        assert_eq!(a.live_device_bytes(), 0);
        apply(
            &mut a,
            Event::FreeFailed {
                call: Call::MemFree,
                ptr: 0x10,
                size: block.0,
                caller: block.1,
                result: 700,
            },
        );
        assert_eq!(a.live_device_bytes(), 512);
        assert_eq!((a.counts.allocations, a.counts.frees), (1, 0));
        apply(
            &mut a,
            Event::Free {
                call: Call::MemFree,
                ptr: 0x99,
                stream: 0,
                caller: 1,
            },
        );
        assert_eq!(a.counts.unknown_frees, 1);
        apply(
            &mut a,
            Event::Alloc {
                call: Call::MemAlloc,
                ptr: 0,
                size: 1 << 40,
                stream: 0,
                caller: 1,
                result: 2,
            },
        );
        assert_eq!(a.counts.out_of_memory, 1);
    }

    #[test]
    fn limits_and_loads_fill_the_measured_items() {
        let mut a = Accounting::default();
        apply(
            &mut a,
            Event::Context {
                how: crate::event::ContextHow::Create,
                device: 3,
                ctx: 1,
                result: 0,
                sm_count: Some(2),
                threads_per_sm: Some(1024),
                total: Some(1 << 30),
                free: Some((1 << 30) - (10 << 20)),
                stack: Some(1024),
                heap: None,
                fifo: None,
            },
        );
        let window = |taken: u64| Window {
            free_before: Some(1 << 29),
            free_after: Some((1 << 29) - taken),
            live_change: 0,
        };
        apply(
            &mut a,
            Event::Limit {
                which: LimitKind::Stack,
                requested: 4096,
                result: 0,
                value: Some(4096),
                window: window(6 << 20),
            },
        );
        apply(
            &mut a,
            Event::Module {
                call: Call::LibraryLoadData,
                result: 0,
                window: window(1 << 20),
            },
        );
        let device = &a.devices()[0];
        assert_eq!(device.facts.ordinal, 3);
        assert_eq!(device.facts.used_at_context, Some(10 << 20));
        assert_eq!(
            (device.stack, device.stack_source.clone()),
            (Some(4096), StackSource::SetLimit)
        );
        assert_eq!(device.local_change_measured, 6 << 20);
        assert_eq!((device.module_measured, device.module_loads), (1 << 20, 1));
    }
}
