//! The process's allocators, one per device, behind the C functions: opened on a
//! device's first call with the settings from the environment, kept for the life of
//! the process. Calls return typed errors; the C shell turns them into status codes
//! and messages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use ctx::{PeerLinks, SimConfig, SimDevice, StreamId};

use crate::allocator::{AllocatorStats, DeviceAllocator, Outcome, Request, Restored};
use crate::backing::{self, Backing};
use crate::device_stats::DeviceStats;
use crate::error::{Error, MAX_DEVICES, Result};
use crate::events::{SimStreams, StreamEvents};
use crate::history::HistorySettings;
use crate::pool_id::PoolId;
use crate::settings::{Policy, Settings};
use crate::snapshot::Snapshot;

/// The `cudaStream_t` of a C call, as each backend reads it.
#[derive(Debug, Clone, Copy)]
pub struct CallerStream {
    id: StreamId,
    #[cfg(feature = "cuda")]
    cuda: ctx::ForeignStream,
}

impl CallerStream {
    /// The stream of a C call: its handle as a number, and (feature `cuda`) as a
    /// driver handle its caller vouched for.
    pub fn new(id: StreamId, #[cfg(feature = "cuda")] cuda: ctx::ForeignStream) -> Self {
        Self {
            id,
            #[cfg(feature = "cuda")]
            cuda,
        }
    }
}

/// A backend's stream type, read from a C call's stream.
pub trait FromCaller {
    /// The stream `caller` names.
    fn from_caller(caller: CallerStream) -> Self;
}

impl FromCaller for StreamId {
    fn from_caller(caller: CallerStream) -> Self {
        caller.id
    }
}

#[cfg(feature = "cuda")]
impl FromCaller for ctx::ForeignStream {
    fn from_caller(caller: CallerStream) -> Self {
        caller.cuda
    }
}

/// A request of a C call.
#[derive(Debug, Clone, Copy)]
pub struct CallerRequest {
    /// Bytes.
    pub size: u64,
    /// Its stream.
    pub stream: CallerStream,
    /// Its pool.
    pub pool: PoolId,
    /// Whether the stream is capturing.
    pub capturing: bool,
    /// Its stack number.
    pub context: u64,
}

/// A device's allocator, whatever its backing and streams.
trait AnyDevice: Send + Sync {
    fn allocate(&self, request: CallerRequest) -> Result<Outcome>;
    fn free(&self, ptr: u64, context: u64) -> Result<Outcome>;
    fn owns(&self, ptr: u64) -> bool;
    fn block_of(&self, ptr: u64) -> Result<(u64, u64)>;
    fn block_mappings(&self, ptr: u64) -> Result<Vec<(u64, u64)>>;
    fn record_stream(&self, ptr: u64, stream: CallerStream) -> Result<()>;
    fn empty_cache(&self) -> Result<u64>;
    fn stats(&self) -> AllocatorStats;
    fn device_stats(&self) -> DeviceStats;
    fn reset_peak_stats(&self);
    fn reset_accumulated_stats(&self);
    fn largest_block(&self) -> Result<u64>;
    fn set_memory_fraction(&self, fraction: f64) -> Result<()>;
    fn memory_fraction(&self) -> f64;
    fn begin_allocate_to_pool(&self, pool: PoolId) -> Result<()>;
    fn end_allocate_to_pool(&self, pool: PoolId) -> Result<()>;
    fn release_pool(&self, pool: PoolId) -> Result<()>;
    fn incref_pool(&self, pool: PoolId) -> Result<()>;
    fn pool_use_count(&self, pool: PoolId) -> u32;
    fn check_pool_live(&self, pool: PoolId, expected: &[u64]) -> Result<bool>;
    fn checkpoint_pool(&self, pool: PoolId) -> Result<u64>;
    fn drop_checkpoint(&self, number: u64) -> Result<()>;
    fn set_use_on_oom(&self, pool: PoolId, on: bool) -> Result<()>;
    fn set_no_split(&self, pool: PoolId) -> Result<()>;
    fn restore_checkpoint(&self, number: u64) -> Result<Restored>;
    fn record_history(&self, settings: HistorySettings, clear: bool);
    fn take_dead_contexts(&self, max: usize) -> Vec<u64>;
    fn snapshot(&self, pool: PoolId, trace: bool) -> Snapshot;
    fn explain(&self) -> Result<String>;
}

impl<B, E> AnyDevice for DeviceAllocator<B, E>
where
    B: Backing,
    E: StreamEvents,
    E::Stream: FromCaller,
    Self: Sync,
{
    fn allocate(&self, r: CallerRequest) -> Result<Outcome> {
        let request = Request::new(r.size, E::Stream::from_caller(r.stream))
            .in_pool(r.pool)
            .capturing(r.capturing)
            .with_context(r.context);
        DeviceAllocator::allocate(self, request)
    }
    fn free(&self, ptr: u64, context: u64) -> Result<Outcome> {
        DeviceAllocator::free(self, ptr, context)
    }
    fn owns(&self, ptr: u64) -> bool {
        DeviceAllocator::owns(self, ptr)
    }
    fn block_of(&self, ptr: u64) -> Result<(u64, u64)> {
        DeviceAllocator::block_of(self, ptr)
    }
    fn block_mappings(&self, ptr: u64) -> Result<Vec<(u64, u64)>> {
        DeviceAllocator::block_mappings(self, ptr)
    }
    fn record_stream(&self, ptr: u64, stream: CallerStream) -> Result<()> {
        DeviceAllocator::record_stream(self, ptr, E::Stream::from_caller(stream))
    }
    fn empty_cache(&self) -> Result<u64> {
        DeviceAllocator::empty_cache(self)
    }
    fn stats(&self) -> AllocatorStats {
        DeviceAllocator::stats(self)
    }
    fn device_stats(&self) -> DeviceStats {
        DeviceAllocator::device_stats(self)
    }
    fn reset_peak_stats(&self) {
        DeviceAllocator::reset_peak_stats(self)
    }
    fn reset_accumulated_stats(&self) {
        DeviceAllocator::reset_accumulated_stats(self)
    }
    fn largest_block(&self) -> Result<u64> {
        DeviceAllocator::largest_block(self)
    }
    fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        DeviceAllocator::set_memory_fraction(self, fraction)
    }
    fn memory_fraction(&self) -> f64 {
        DeviceAllocator::memory_fraction(self)
    }
    fn begin_allocate_to_pool(&self, pool: PoolId) -> Result<()> {
        DeviceAllocator::begin_allocate_to_pool(self, pool)
    }
    fn end_allocate_to_pool(&self, pool: PoolId) -> Result<()> {
        DeviceAllocator::end_allocate_to_pool(self, pool)
    }
    fn release_pool(&self, pool: PoolId) -> Result<()> {
        DeviceAllocator::release_pool(self, pool)
    }
    fn incref_pool(&self, pool: PoolId) -> Result<()> {
        DeviceAllocator::incref_pool(self, pool)
    }
    fn pool_use_count(&self, pool: PoolId) -> u32 {
        DeviceAllocator::pool_use_count(self, pool)
    }
    fn check_pool_live(&self, pool: PoolId, expected: &[u64]) -> Result<bool> {
        DeviceAllocator::check_pool_live(self, pool, expected)
    }
    fn checkpoint_pool(&self, pool: PoolId) -> Result<u64> {
        DeviceAllocator::checkpoint_pool(self, pool)
    }
    fn drop_checkpoint(&self, number: u64) -> Result<()> {
        DeviceAllocator::drop_checkpoint(self, number)
    }
    fn set_use_on_oom(&self, pool: PoolId, on: bool) -> Result<()> {
        DeviceAllocator::set_use_on_oom(self, pool, on)
    }
    fn set_no_split(&self, pool: PoolId) -> Result<()> {
        DeviceAllocator::set_no_split(self, pool)
    }
    fn restore_checkpoint(&self, number: u64) -> Result<Restored> {
        DeviceAllocator::restore_checkpoint(self, number)
    }
    fn record_history(&self, settings: HistorySettings, clear: bool) {
        DeviceAllocator::record_history(self, settings, clear)
    }
    fn take_dead_contexts(&self, max: usize) -> Vec<u64> {
        DeviceAllocator::take_dead_contexts(self, max)
    }
    fn snapshot(&self, pool: PoolId, trace: bool) -> Snapshot {
        DeviceAllocator::snapshot(self, pool, trace)
    }
    fn explain(&self) -> Result<String> {
        DeviceAllocator::explain(self)
    }
}

/// Where devices come from.
#[derive(Debug)]
enum Source {
    /// The CUDA driver (or, built without `cuda`, nothing).
    Driver,
    /// Simulated devices of one host, each reaching every other's memory, for tests;
    /// device `i` has `streams[i]`.
    Simulated {
        config: SimConfig,
        streams: Vec<SimStreams>,
    },
}

/// Virtual bytes each simulated device's ranges may span: past any reservation a
/// simulated device of a test makes.
const SIM_DEVICE_SPAN: u64 = 1 << 40;

static SOURCE: OnceLock<Source> = OnceLock::new();
static SLOTS: [OnceLock<Result<Box<dyn AnyDevice>>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];
/// The history settings of the last `record_history` for every device, which devices
/// opened later take too.
static HISTORY: Mutex<Option<HistorySettings>> = Mutex::new(None);
/// Opened devices, one bit each, so calls for "every device" skip the rest quickly.
static OPENED: AtomicU64 = AtomicU64::new(0);

/// Makes the C functions serve `devices` simulated devices of `config` instead of the
/// driver, for tests; returns each device's streams to complete work on. `None` when a
/// source was chosen already (by an earlier call of either kind).
#[doc(hidden)]
pub fn install_simulated(config: SimConfig, devices: usize) -> Option<Vec<SimStreams>> {
    let streams: Vec<SimStreams> = (0..devices.min(MAX_DEVICES))
        .map(|_| SimStreams::default())
        .collect();
    SOURCE
        .set(Source::Simulated {
            config,
            streams: streams.clone(),
        })
        .ok()
        .map(|()| streams)
}

fn slot_index(device: i32) -> Result<usize> {
    usize::try_from(device)
        .ok()
        .filter(|i| *i < MAX_DEVICES)
        .ok_or(Error::BadDevice { device })
}

/// The device's allocator, opened on first use; an error when it cannot be (the same
/// error on every call).
fn allocator(device: i32) -> Result<&'static dyn AnyDevice> {
    let index = slot_index(device)?;
    let slot = SLOTS[index].get_or_init(|| {
        let opened = open(device);
        if let Ok(allocator) = &opened {
            let history = *HISTORY.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(settings) = history {
                allocator.record_history(settings, false);
            }
            OPENED.fetch_or(1 << index, Ordering::AcqRel);
        }
        opened
    });
    match slot {
        Ok(allocator) => Ok(allocator.as_ref()),
        Err(error) => Err(error.clone()),
    }
}

/// Every opened device's allocator.
fn opened() -> impl Iterator<Item = &'static dyn AnyDevice> {
    let bits = OPENED.load(Ordering::Acquire);
    (0..MAX_DEVICES)
        .filter(move |i| bits & (1 << i) != 0)
        .filter_map(|i| SLOTS[i].get()?.as_ref().ok().map(|a| a.as_ref()))
}

fn open(device: i32) -> Result<Box<dyn AnyDevice>> {
    let settings = Settings::from_env()?;
    match SOURCE.get_or_init(|| Source::Driver) {
        Source::Simulated { config, streams } => {
            let index = slot_index(device)?;
            let events = streams
                .get(index)
                .cloned()
                .ok_or(Error::BadDevice { device })?;
            let ordinal = u32::try_from(index).map_err(|_| Error::BadDevice { device })?;
            let count = u32::try_from(streams.len()).unwrap_or(u32::MAX);
            let mut memory = SimDevice::on_host(*config, ordinal, PeerLinks::all(count));
            // The devices of one process share one virtual address space (what lets a
            // free find its device by address): each simulated device's ranges start
            // past the ranges of the devices before it.
            let skipped = u64::from(ordinal) * SIM_DEVICE_SPAN;
            if skipped > 0 {
                ctx::DeviceMemory::reserve(&mut memory, skipped)?;
            }
            boxed(device, memory, events, &settings)
        }
        Source::Driver => open_driver(device, &settings),
    }
}

fn boxed<D, E>(device: i32, memory: D, events: E, settings: &Settings) -> Result<Box<dyn AnyDevice>>
where
    D: crate::facts::DeviceFacts + 'static,
    E: StreamEvents + 'static,
    E::Stream: FromCaller,
{
    Ok(match settings.policy {
        Policy::Tlsf => Box::new(DeviceAllocator::new(
            device,
            backing::tlsf_pool(memory, settings)?,
            events,
        )?),
        Policy::Stitch => Box::new(DeviceAllocator::new(
            device,
            backing::stitched_pool(memory, settings)?,
            events,
        )?),
    })
}

#[cfg(feature = "cuda")]
fn open_driver(device: i32, settings: &Settings) -> Result<Box<dyn AnyDevice>> {
    use ctx::{CudaContext, CudaDevice};
    let ordinal = u32::try_from(device).map_err(|_| Error::BadDevice { device })?;
    let context = CudaContext::new(ordinal)?;
    // Exportable handles: tensors can be shared with other processes.
    let memory = CudaDevice::shareable(&context)?;
    let events = crate::cuda::CudaStreams::new(&context);
    boxed(device, memory, events, settings)
}

#[cfg(not(feature = "cuda"))]
fn open_driver(_device: i32, _settings: &Settings) -> Result<Box<dyn AnyDevice>> {
    Err(Error::NoCuda)
}

/// The opened device that holds `ptr`: the one whose reservation holds it (devices of
/// one process share one virtual address space), or, where reservations overlap (the
/// simulated devices of tests), the one whose block it is.
fn owner(ptr: u64) -> Result<(i32, &'static dyn AnyDevice)> {
    let bits = OPENED.load(Ordering::Acquire);
    let mut found = None;
    for index in (0..MAX_DEVICES).filter(|i| bits & (1 << i) != 0) {
        if let Some(Ok(allocator)) = SLOTS[index].get() {
            if allocator.owns(ptr) {
                let candidate = (index as i32, allocator.as_ref());
                if found.is_some() {
                    return overlapping_owner(ptr, bits);
                }
                found = Some(candidate);
            }
        }
    }
    found.ok_or(Error::UnknownPointer { ptr })
}

fn overlapping_owner(ptr: u64, bits: u64) -> Result<(i32, &'static dyn AnyDevice)> {
    (0..MAX_DEVICES)
        .filter(|i| bits & (1 << i) != 0)
        .filter_map(|i| Some((i as i32, SLOTS[i].get()?.as_ref().ok()?.as_ref())))
        .find(|(_, a)| a.owns(ptr) && a.block_of(ptr).is_ok())
        .ok_or(Error::UnknownPointer { ptr })
}

/// Whether `device` has an allocator (was opened, successfully).
pub fn is_open(device: i32) -> bool {
    slot_index(device).is_ok_and(|i| matches!(SLOTS[i].get(), Some(Ok(_))))
}

/// Serves a request on `device`.
pub fn allocate(device: i32, request: CallerRequest) -> Result<Outcome> {
    allocator(device)?.allocate(request)
}

/// Frees `ptr` on the device that owns it; returns the device too.
pub fn free(ptr: u64, context: u64) -> Result<(i32, Outcome)> {
    let (device, allocator) = owner(ptr)?;
    Ok((device, allocator.free(ptr, context)?))
}

/// The block holding `ptr`: `(device, first byte, bytes)`.
pub fn block_of(ptr: u64) -> Result<(i32, u64, u64)> {
    let (device, allocator) = owner(ptr)?;
    let (base, bytes) = allocator.block_of(ptr)?;
    Ok((device, base, bytes))
}

/// The physical mappings backing the block at `ptr`.
pub fn block_mappings(ptr: u64) -> Result<Vec<(u64, u64)>> {
    owner(ptr)?.1.block_mappings(ptr)
}

/// `stream` uses the block at `ptr` too.
pub fn record_stream(ptr: u64, stream: CallerStream) -> Result<()> {
    owner(ptr)?.1.record_stream(ptr, stream)
}

/// Empties the cache of `device`, or of every opened device (`None`); the mapped bytes
/// given back.
pub fn empty_cache(device: Option<i32>) -> Result<u64> {
    match device {
        Some(device) => allocator(device)?.empty_cache(),
        None => opened().map(|a| a.empty_cache()).sum(),
    }
}

/// Records history on `device`, or on every device now and later (`None`).
pub fn record_history(device: Option<i32>, settings: HistorySettings, clear: bool) -> Result<()> {
    match device {
        Some(device) => allocator(device)?.record_history(settings, clear),
        None => {
            *HISTORY.lock().unwrap_or_else(PoisonError::into_inner) = Some(settings);
            opened().for_each(|a| a.record_history(settings, clear));
        }
    }
    Ok(())
}

/// The stack numbers no device holds any more, up to `max`, from every opened device.
pub fn take_dead_contexts(max: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for allocator in opened() {
        if out.len() >= max {
            break;
        }
        out.extend(allocator.take_dead_contexts(max - out.len()));
    }
    out
}

macro_rules! per_device {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(device: i32, $($arg: $ty),*) -> Result<$out> {
                Ok(allocator(device)?.$name($($arg),*))
            }
        )*
    };
}

macro_rules! per_device_fallible {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(device: i32, $($arg: $ty),*) -> Result<$out> {
                allocator(device)?.$name($($arg),*)
            }
        )*
    };
}

per_device! {
    /// The device's figures for `cudamem_stats`.
    stats() -> AllocatorStats;
    /// PyTorch's figures of the device.
    device_stats() -> DeviceStats;
    /// Resets the device's peaks.
    reset_peak_stats() -> ();
    /// Resets the device's accumulated counts.
    reset_accumulated_stats() -> ();
    /// The memory fraction of the device.
    memory_fraction() -> f64;
    /// The use count of a private pool.
    pool_use_count(pool: PoolId) -> u32;
    /// The device's memory as a snapshot shows it.
    snapshot(pool: PoolId, trace: bool) -> Snapshot;
}

per_device_fallible! {
    /// The largest block the device could hand out now.
    largest_block() -> u64;
    /// Caps the device's pool at a fraction of its memory.
    set_memory_fraction(fraction: f64) -> ();
    /// Diverts allocations to a private pool.
    begin_allocate_to_pool(pool: PoolId) -> ();
    /// Stops diverting allocations to a private pool.
    end_allocate_to_pool(pool: PoolId) -> ();
    /// One user of a private pool fewer.
    release_pool(pool: PoolId) -> ();
    /// One user of a private pool more.
    incref_pool(pool: PoolId) -> ();
    /// Whether a private pool's live blocks are exactly these.
    check_pool_live(pool: PoolId, expected: &[u64]) -> bool;
    /// A checkpoint of a private pool.
    checkpoint_pool(pool: PoolId) -> u64;
    /// Restores a checkpoint.
    restore_checkpoint(number: u64) -> Restored;
    /// Forgets a checkpoint.
    drop_checkpoint(number: u64) -> ();
    /// Whether a private pool serves requests the device's pool cannot.
    set_use_on_oom(pool: PoolId, on: bool) -> ();
    /// A private pool hands out whole segments, never splitting one.
    set_no_split(pool: PoolId) -> ();
    /// The device's ledger as text.
    explain() -> String;
}
