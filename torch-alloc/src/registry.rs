//! The process's allocators, one per device, behind the C functions: opened on a
//! device's first call, kept for the life of the process. Errors are reported on
//! stderr here, so the C shell only converts.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ctx::{PeerLinks, SimConfig, SimDevice, StreamId};

use crate::allocator::{AllocatorStats, DeviceAllocator};
use crate::error::{Error, MAX_DEVICES, Result};
use crate::events::{SimStreams, StreamEvents};
use crate::facts::DeviceFacts;
use crate::settings::Settings;

/// Error messages printed at most, per process; the rest are counted in the stats.
const MAX_ERROR_MESSAGES: u64 = 32;

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

/// A device's allocator, whatever its backend.
trait AnyDevice: Send + Sync {
    fn allocate(&self, size: u64, stream: CallerStream) -> Result<u64>;
    fn free(&self, ptr: u64, size: u64, stream: CallerStream) -> Result<()>;
    fn stats(&self) -> AllocatorStats;
    fn empty_cache(&self) -> Result<u64>;
    fn explain(&self) -> Result<String>;
}

impl<D, E> AnyDevice for DeviceAllocator<D, E>
where
    D: DeviceFacts,
    E: StreamEvents,
    E::Stream: FromCaller,
    Self: Sync,
{
    fn allocate(&self, size: u64, stream: CallerStream) -> Result<u64> {
        DeviceAllocator::allocate(self, size, E::Stream::from_caller(stream))
    }
    fn free(&self, ptr: u64, size: u64, stream: CallerStream) -> Result<()> {
        DeviceAllocator::free(self, ptr, size, E::Stream::from_caller(stream))
    }
    fn stats(&self) -> AllocatorStats {
        DeviceAllocator::stats(self)
    }
    fn empty_cache(&self) -> Result<u64> {
        DeviceAllocator::empty_cache(self)
    }
    fn explain(&self) -> Result<String> {
        DeviceAllocator::explain(self)
    }
}

/// Where devices come from.
#[derive(Debug)]
enum Backend {
    /// The CUDA driver (or, built without `cuda`, nothing).
    Driver,
    /// Simulated devices of one host, each reaching every other's memory, for tests;
    /// device `i` has `streams[i]`.
    Simulated {
        config: SimConfig,
        streams: Vec<SimStreams>,
    },
}

/// One device: its allocator, or why it has none.
struct Slot {
    allocator: Result<Box<dyn AnyDevice>>,
    oom_reported: AtomicBool,
    oom_messages: AtomicU64,
}

static BACKEND: OnceLock<Backend> = OnceLock::new();
static SLOTS: [OnceLock<Slot>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
static ERROR_MESSAGES: AtomicU64 = AtomicU64::new(0);
static NO_CUDA_REPORTED: AtomicBool = AtomicBool::new(false);

/// Makes the C functions serve `devices` simulated devices of `config` instead of the
/// driver, for tests; returns each device's streams to complete work on. `None` when a
/// backend was chosen already (by an earlier call of either kind).
#[doc(hidden)]
pub fn install_simulated(config: SimConfig, devices: usize) -> Option<Vec<SimStreams>> {
    let streams: Vec<SimStreams> = (0..devices.min(MAX_DEVICES))
        .map(|_| SimStreams::default())
        .collect();
    BACKEND
        .set(Backend::Simulated {
            config,
            streams: streams.clone(),
        })
        .ok()
        .map(|()| streams)
}

/// How many out-of-memory explanations device `device` has printed (at most one).
#[doc(hidden)]
pub fn oom_messages(device: i32) -> u64 {
    slot_index(device)
        .ok()
        .and_then(|i| SLOTS.get(i)?.get())
        .map_or(0, |slot| slot.oom_messages.load(Ordering::Relaxed))
}

fn slot_index(device: i32) -> Result<usize> {
    usize::try_from(device)
        .ok()
        .filter(|i| *i < MAX_DEVICES)
        .ok_or(Error::BadDevice { device })
}

fn slot(device: i32) -> Result<&'static Slot> {
    let index = slot_index(device)?;
    let cell = SLOTS.get(index).ok_or(Error::BadDevice { device })?;
    Ok(cell.get_or_init(|| {
        let allocator = open(device);
        if let Err(error) = &allocator {
            let first =
                !matches!(error, Error::NoCuda) || !NO_CUDA_REPORTED.swap(true, Ordering::Relaxed);
            if first {
                eprintln!("cudamem: device {device}: {error}");
            }
        }
        Slot {
            allocator,
            oom_reported: AtomicBool::new(false),
            oom_messages: AtomicU64::new(0),
        }
    }))
}

fn open(device: i32) -> Result<Box<dyn AnyDevice>> {
    let settings = Settings::from_env()?;
    match BACKEND.get_or_init(|| Backend::Driver) {
        Backend::Simulated { config, streams } => {
            let index = slot_index(device)?;
            let events = streams
                .get(index)
                .cloned()
                .ok_or(Error::BadDevice { device })?;
            let ordinal = u32::try_from(index).map_err(|_| Error::BadDevice { device })?;
            let count = u32::try_from(streams.len()).unwrap_or(u32::MAX);
            let memory = SimDevice::on_host(*config, ordinal, PeerLinks::all(count));
            Ok(Box::new(DeviceAllocator::new(
                device, memory, events, &settings,
            )?))
        }
        Backend::Driver => open_driver(device, &settings),
    }
}

#[cfg(feature = "cuda")]
fn open_driver(device: i32, settings: &Settings) -> Result<Box<dyn AnyDevice>> {
    use ctx::{CudaContext, CudaDevice};
    let ordinal = u32::try_from(device).map_err(|_| Error::BadDevice { device })?;
    let context = CudaContext::new(ordinal)?;
    let memory = CudaDevice::new(&context)?;
    let events = crate::cuda::CudaStreams::new(&context);
    Ok(Box::new(DeviceAllocator::new(
        device, memory, events, settings,
    )?))
}

#[cfg(not(feature = "cuda"))]
fn open_driver(_device: i32, _settings: &Settings) -> Result<Box<dyn AnyDevice>> {
    Err(Error::NoCuda)
}

/// The device's allocator; an error when it could not be opened (reported then, once).
fn allocator(device: i32) -> Result<&'static dyn AnyDevice, Option<Error>> {
    match slot(device) {
        Ok(slot) => match &slot.allocator {
            Ok(allocator) => Ok(allocator.as_ref()),
            Err(_) => Err(None),
        },
        Err(error) => Err(Some(error)),
    }
}

/// Prints `error` unless too many were printed already.
fn report(error: &Error) {
    if ERROR_MESSAGES.fetch_add(1, Ordering::Relaxed) < MAX_ERROR_MESSAGES {
        eprintln!("cudamem: {error}");
    } else if ERROR_MESSAGES.load(Ordering::Relaxed) == MAX_ERROR_MESSAGES + 1 {
        eprintln!("cudamem: more errors follow; not printed (cudamem_stats counts them)");
    }
}

fn size_of(call: &'static str, device: i32, size: i64) -> Result<u64> {
    u64::try_from(size).map_err(|_| Error::NegativeSize { call, device, size })
}

/// `cudamem_malloc`: a device address, or 0 after reporting why (out of memory: the
/// ledger, once per device).
pub fn malloc(size: i64, device: i32, stream: CallerStream) -> u64 {
    let allocator = match allocator(device) {
        Ok(allocator) => allocator,
        Err(error) => {
            error.inspect(report);
            return 0;
        }
    };
    let outcome =
        size_of("cudamem_malloc", device, size).and_then(|size| allocator.allocate(size, stream));
    match outcome {
        Ok(ptr) => ptr,
        Err(error @ Error::OutOfMemory { .. }) => {
            if let Ok(slot) = slot(device) {
                if !slot.oom_reported.swap(true, Ordering::Relaxed) {
                    slot.oom_messages.fetch_add(1, Ordering::Relaxed);
                    eprintln!("cudamem: {error}");
                }
            }
            0
        }
        Err(error) => {
            report(&error);
            0
        }
    }
}

/// `cudamem_free`: frees, or reports why not.
pub fn free(ptr: u64, size: i64, device: i32, stream: CallerStream) {
    let outcome = match allocator(device) {
        Ok(allocator) => {
            size_of("cudamem_free", device, size).and_then(|size| allocator.free(ptr, size, stream))
        }
        Err(error) => {
            error.inspect(report);
            return;
        }
    };
    if let Err(error) = outcome {
        report(&error);
    }
}

/// `cudamem_stats`: the device's figures; `None` (reported) when it has no allocator.
pub fn stats(device: i32) -> Option<AllocatorStats> {
    match allocator(device) {
        Ok(allocator) => Some(allocator.stats()),
        Err(error) => {
            error.inspect(report);
            None
        }
    }
}

/// `cudamem_empty_cache`: every opened device gives back what it can; returns the bytes
/// given back.
pub fn empty_cache() -> u64 {
    let mut given_back = 0;
    for slot in SLOTS.iter().filter_map(OnceLock::get) {
        if let Ok(allocator) = &slot.allocator {
            match allocator.empty_cache() {
                Ok(bytes) => given_back += bytes,
                Err(error) => report(&error),
            }
        }
    }
    given_back
}

/// `cudamem_explain`: the device's ledger as text.
pub fn explain(device: i32) -> Result<String> {
    match allocator(device) {
        Ok(allocator) => allocator.explain(),
        Err(Some(error)) => Err(error),
        Err(None) => match slot(device).map(|slot| &slot.allocator) {
            Ok(Err(error)) => Err(error.clone()),
            _ => Err(Error::BadDevice { device }),
        },
    }
}
