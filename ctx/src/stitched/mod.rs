//! [`StitchedPool`]: memcore's [`Stitch`] run on a device. Allocations are
//! plain device pointers that never move; physical memory is handles
//! mapped into one reserved virtual range, as the model decides.

mod mirror;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use memcore::{DriverCalls, PAGE_BYTES, Stitch, StitchBlock, StitchConfig, StitchStats};

use crate::mapping::Mapper;
use crate::{CallTally, DeviceMemory, Error, PeerSet, Result};
use mirror::{Failure, Mirror};

/// How many times the device's memory a [`StitchedPool`] reserves by
/// default: virtual space costs nothing, and the model's best fit keeps its
/// blocks low, so a few times the memory is room for any fragmentation.
pub const STITCHED_RESERVATION_PER_DEVICE: u64 = 4;

/// How a [`StitchedPool`] is made; the default reserves
/// [`STITCHED_RESERVATION_PER_DEVICE`] times the device's memory and runs
/// the policy's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StitchedConfig {
    /// Virtual bytes to reserve, rounded up to whole
    /// [`PAGE_BYTES`](memcore::PAGE_BYTES) pages; 0:
    /// [`STITCHED_RESERVATION_PER_DEVICE`] times the device's memory.
    pub reservation_bytes: u64,
    /// The policy; its `log_ops` is turned on, as the pool needs the ops.
    pub stitch: StitchConfig,
    /// Other devices of the host that may read and write the pool's memory:
    /// every handle the pool maps is granted to them as it is mapped, as a
    /// [`crate::Pool`] does for its growths ([`crate::PoolConfig::peers`]),
    /// counted in [`StitchedStats::peer_access`].
    pub peers: PeerSet,
}

/// What a [`StitchedPool`] holds and what its driver calls cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StitchedStats {
    /// The model's figures: live and physical bytes, handles, driver calls
    /// counted and modeled.
    pub model: StitchStats,
    /// The device calls the pool made, with the host time measured in
    /// them (`map` is `cuMemMap`, `set_access` the device's own
    /// `cuMemSetAccess` after it), counted as the model counts its own
    /// ([`StitchStats::calls`]).
    pub calls: DriverCalls,
    /// Virtual bytes reserved.
    pub reservation_bytes: u64,
    /// Allocations whose backing failed and were rolled back.
    pub rollbacks: u64,
    /// Grants of mapped handles to [`StitchedConfig::peers`].
    pub peer_access: CallTally,
}

/// A non-moving pool over a device: memcore's stitching policy, whose driver
/// operations it carries out, handing out plain device addresses.
///
/// `Send + Sync` through one mutex. Every allocation is backed before
/// [`allocate`](Self::allocate) returns; a freed block's pages stay mapped
/// for the next request until the policy recycles them or
/// [`trim`](Self::trim) releases them. When the device refuses physical
/// memory, the pool undoes the request, releases its idle handles and tries
/// once more before it reports [`Error::StitchedOutOfMemory`].
///
/// ```
/// use ctx::{DeviceMemory, SimConfig, SimDevice, StitchedConfig, StitchedPool};
///
/// let pool = StitchedPool::new(SimDevice::new(SimConfig::small(64 << 20)), StitchedConfig::default())?;
/// let ptr = pool.allocate(3 << 20)?;
/// pool.with_device(|device| device.write(ptr + 1000, b"kept"))?;
/// pool.free(ptr)?;
/// assert!(pool.free(ptr).is_err(), "a double free is refused");
/// pool.trim()?;
/// assert_eq!(pool.stats().model.physical_bytes, 0);
/// # Ok::<(), ctx::Error>(())
/// ```
#[derive(Debug)]
pub struct StitchedPool<D: DeviceMemory> {
    state: Mutex<State<D>>,
}

/// A pointer hash for the live table: pointers are multiples of 512, so
/// their low bits carry nothing; a multiply spreads the high ones.
#[derive(Debug, Default, Clone, Copy)]
struct PointerHasher(u64);

impl Hasher for PointerHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = mixed ^ (mixed >> 29);
    }
}

#[derive(Debug)]
struct State<D: DeviceMemory> {
    device: D,
    stitch: Stitch,
    mirror: Mirror,
    /// Live blocks by device pointer.
    live: HashMap<u64, StitchBlock, BuildHasherDefault<PointerHasher>>,
    rollbacks: u64,
}

impl<D: DeviceMemory> StitchedPool<D> {
    /// A pool on `device`: reserves the virtual range now, creates no
    /// physical memory yet. The device needs VMM with a page that divides
    /// [`PAGE_BYTES`](memcore::PAGE_BYTES).
    pub fn new(mut device: D, config: StitchedConfig) -> Result<Self> {
        if !device.supports_vmm() {
            return Err(Error::Unsupported(
                "a stitched pool needs virtual memory management",
            ));
        }
        let page = device.granularity();
        if page == 0 || PAGE_BYTES % page != 0 {
            return Err(Error::InvalidConfig(
                "a stitched pool needs a device page that divides 2 MiB",
            ));
        }
        let wanted = if config.reservation_bytes == 0 {
            device
                .mem_info()?
                .total
                .saturating_mul(STITCHED_RESERVATION_PER_DEVICE)
        } else {
            config.reservation_bytes
        };
        let reserved = memcore::align_up(wanted.max(1), PAGE_BYTES).ok_or(Error::InvalidConfig(
            "the stitched pool's reservation overflows",
        ))?;
        let mut mapper = Mapper::new(device.ordinal(), config.peers)?;
        let base = mapper.reserve(&mut device, reserved)?;
        let stitch = Stitch::new(StitchConfig {
            log_ops: true,
            ..config.stitch
        });
        Ok(Self {
            state: Mutex::new(State {
                device,
                stitch,
                mirror: Mirror::new(base, reserved, mapper),
                live: HashMap::default(),
                rollbacks: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<D>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `size` bytes, backed and accessible, at a device address that is a
    /// multiple of 512 and stays put until [`free`](Self::free).
    pub fn allocate(&self, size: u64) -> Result<u64> {
        self.lock().allocate(size)
    }

    /// Frees the allocation at `ptr`. A pointer no live allocation starts at
    /// is [`Error::UnknownPointer`] and changes nothing.
    pub fn free(&self, ptr: u64) -> Result<()> {
        self.lock().free(ptr)
    }

    /// Unmaps and releases every idle handle.
    pub fn trim(&self) -> Result<()> {
        let mut state = self.lock();
        state.stitch.trim();
        state.carry_out().map_err(Failure::into_error)
    }

    /// The model's figures and the calls made.
    pub fn stats(&self) -> StitchedStats {
        let state = self.lock();
        StitchedStats {
            model: state.stitch.stats(),
            calls: state.mirror.calls(),
            peer_access: state.mirror.peer_access(),
            reservation_bytes: state.mirror.reserved,
            rollbacks: state.rollbacks,
        }
    }

    /// The reserved virtual range: its first device address and its bytes.
    pub fn reservation(&self) -> (u64, u64) {
        let state = self.lock();
        (state.mirror.base, state.mirror.reserved)
    }

    /// Every live allocation as (device pointer, requested bytes), in no
    /// particular order.
    pub fn live_allocations(&self) -> Vec<(u64, u64)> {
        let state = self.lock();
        state.live.iter().map(|(&ptr, b)| (ptr, b.size)).collect()
    }

    /// Every handle the pool has mapped now, as `(address, bytes)` sorted by
    /// address: the unit a handle is exported or shared in.
    pub fn mappings(&self) -> Vec<(u64, u64)> {
        let state = self.lock();
        let mut mapped: Vec<(u64, u64)> = state
            .stitch
            .handles()
            .filter_map(|h| h.mapped_at)
            .map(|e| (state.mirror.base + e.offset, e.size))
            .collect();
        mapped.sort_unstable();
        mapped
    }

    /// The device address ranges the pool has mapped now, as `(address,
    /// bytes)`, sorted by address, adjacent mappings merged into one range:
    /// where a memory snapshot shows the pool's segments.
    pub fn mapped_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (addr, bytes) in self.mappings() {
            match runs.last_mut() {
                Some((start, size)) if *start + *size == addr => *size += bytes,
                _ => runs.push((addr, bytes)),
            }
        }
        runs
    }

    /// Runs `f` on the device under the pool's lock (to read or write what
    /// an allocation holds).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.lock().device)
    }

    /// Checks the model's own invariants, and that the device holds exactly
    /// the model's handles, mapped where the model maps them.
    pub fn check(&self) -> Result<()> {
        let state = self.lock();
        state.stitch.check()?;
        state.mirror.check(state.stitch.handles())
    }
}

impl<D: DeviceMemory> State<D> {
    fn carry_out(&mut self) -> Result<(), Failure> {
        let ops = self.stitch.take_ops();
        match self.mirror.carry_out(&mut self.device, &ops) {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    fn allocate(&mut self, size: u64) -> Result<u64> {
        match self.try_allocate(size) {
            Err(Failure::CreateRefused(_)) => {}
            done => return done.map_err(|failure| self.out_of_memory(size, failure)),
        }
        // The rollback released every idle handle: try once more.
        self.try_allocate(size)
            .map_err(|failure| self.out_of_memory(size, failure))
    }

    fn out_of_memory(&self, requested: u64, failure: Failure) -> Error {
        let stats = self.stitch.stats();
        let (driver_code, why) = match failure {
            Failure::CreateRefused(error) => (
                error.driver_code(),
                format!("after releasing idle handles, {error}"),
            ),
            Failure::OutsideReservation { end } => (
                None,
                format!(
                    "the virtual reservation of {} bytes is full (the block would need {end})",
                    self.mirror.reserved
                ),
            ),
            Failure::Driver(error) => return error,
        };
        Error::StitchedOutOfMemory {
            requested,
            physical_bytes: stats.physical_bytes,
            live_bytes: stats.live_bytes,
            driver_code,
            why,
        }
    }

    /// One attempt: the model places and backs the block, the device
    /// follows; if the device fails, the block is freed and the idle
    /// handles released in both, and the failure returned.
    fn try_allocate(&mut self, size: u64) -> Result<u64, Failure> {
        let placed = self.stitch.allocate(size);
        let done = self.carry_out();
        let block = placed.map_err(|e| Failure::Driver(e.into()))?;
        let end = block.offset.saturating_add(block.size);
        let failure = match done {
            Ok(()) if end <= self.mirror.reserved => {
                let ptr = self.mirror.base + block.offset;
                self.live.insert(ptr, block);
                return Ok(ptr);
            }
            Ok(()) => Failure::OutsideReservation { end },
            Err(failure) => failure,
        };
        self.stitch
            .free(block)
            .map_err(|e| Failure::Driver(e.into()))?;
        self.stitch.trim();
        self.carry_out()?;
        self.rollbacks += 1;
        Err(failure)
    }

    fn free(&mut self, ptr: u64) -> Result<()> {
        let block = self
            .live
            .remove(&ptr)
            .ok_or(Error::UnknownPointer { ptr })?;
        if let Err(error) = self.stitch.free(block) {
            // The model refused its own block: keep it live, as it was.
            self.live.insert(ptr, block);
            return Err(error.into());
        }
        self.carry_out().map_err(Failure::into_error)
    }
}

impl Failure {
    /// The error to report for a failure outside an allocation.
    fn into_error(self) -> Error {
        match self {
            Failure::CreateRefused(error) | Failure::Driver(error) => error,
            Failure::OutsideReservation { end } => Error::InvalidAddress {
                addr: end,
                len: 0,
                why: "a mapping would end past the stitched pool's reservation",
            },
        }
    }
}

impl<D: DeviceMemory> Drop for State<D> {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; the device gives back what
        // remains when it goes.
        let _ = self.mirror.clear(&mut self.device);
    }
}
