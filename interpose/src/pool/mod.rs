//! `cudamem run --pool`: the program's `cuMemAlloc`/`cuMemFree` served from
//! ctx's [`StitchedPool`] in the program's own process, over the real
//! driver ([`device::DriverDevice`]), so every byte can be given back by a
//! pause ([`pause`]) and mapped again at the same address.
//!
//! The pool is made for the device of the context current at the first
//! `cuMemAlloc`; allocations on another device, pitched and managed
//! memory, stream-ordered allocations and a free of a pointer the pool did
//! not hand out go to the driver as before. Small requests share the
//! pool's 2 MiB pages. The driver's answers about a pooled pointer that
//! would name the pool's page rather than the block
//! (`cuMemGetAddressRange`, the range attributes of
//! `cuPointerGetAttribute`) are given from the pool's table.

pub mod device;
pub mod ledger;
pub mod pause;

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use ctx::{Error, StitchedConfig, StitchedPool};

use crate::driver::{CuResult, call_driver, read};
use device::DriverDevice;

/// The environment variable that turns serving on (`stitch`, the one
/// policy).
pub const POOL_VAR: &str = "CUDAMEM_POOL";

use ctx::driver::result::{INVALID_VALUE, OUT_OF_MEMORY};

/// The pool of this process and what it needs to serve and pause.
pub struct Served {
    /// The pool.
    pub pool: StitchedPool<DriverDevice>,
    /// Its device.
    pub ordinal: c_int,
    /// The context current when it was made: pauses run in it.
    pub context: u64,
    /// Its reservation: base, bytes.
    pub reservation: (u64, u64),
    /// Live blocks: pointer, requested bytes (for range questions and the
    /// pause's copies).
    live: Mutex<BTreeMap<u64, u64>>,
}

// SAFETY: the context is a driver handle used only as a number here.
unsafe impl Sync for Served {}
// SAFETY: as above.
unsafe impl Send for Served {}

/// Whether `cudamem run --pool` asked for serving: 0 not read yet, 1 no,
/// 2 yes.
static ON: AtomicU8 = AtomicU8::new(0);

/// Whether `cudamem run --pool` asked for serving (read on the first call
/// of each thread until one has read it). Never behind a once-lock: every
/// thread's first driver call asks, and a `fork` while one of them read
/// would leave the child waiting for ever on a reader it does not have.
pub fn enabled() -> bool {
    match ON.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            crate::stop::slow_setup_for_test();
            let on = std::env::var_os(POOL_VAR).is_some_and(|value| !value.is_empty());
            ON.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

static SERVED: OnceLock<Option<Served>> = OnceLock::new();

/// The process whose thread is making the pool now (0: none). A child
/// forked meanwhile does not have that thread, and never waits for it: the
/// driver serves the child.
static MAKING: AtomicU32 = AtomicU32::new(0);

/// The pool, once made.
pub fn get() -> Option<&'static Served> {
    SERVED.get().and_then(Option::as_ref)
}

/// The pool, made now for the current context's device if serving is on
/// and it is not made yet. `None` when serving is off or the pool cannot be
/// made (told once on stderr): the driver serves then.
fn get_or_make() -> Option<&'static Served> {
    if !enabled() {
        return None;
    }
    if let Some(made) = SERVED.get() {
        return made.as_ref();
    }
    let me = std::process::id();
    let making = MAKING.load(Ordering::Acquire);
    if making != 0 && making != me {
        return None;
    }
    let context = read::current_context().filter(|&ctx| ctx != 0)?;
    let ordinal = read::current_device()?;
    MAKING.store(me, Ordering::Release);
    let served = SERVED
        .get_or_init(|| match make(ordinal, context) {
            Ok(served) => {
                crate::control::start();
                Some(served)
            }
            Err(error) => {
                eprintln!(
                    "cudamem: the pool cannot be made on device {ordinal} ({error}); the driver serves every allocation, and nothing can be paused"
                );
                None
            }
        })
        .as_ref();
    MAKING.store(0, Ordering::Release);
    served
}

fn make(ordinal: c_int, context: u64) -> ctx::Result<Served> {
    let device = DriverDevice::new(ordinal)?;
    let pool = StitchedPool::new(device, StitchedConfig::default())?;
    let reservation = pool.reservation();
    Ok(Served {
        pool,
        ordinal,
        context,
        reservation,
        live: Mutex::new(BTreeMap::new()),
    })
}

/// The driver's code for a pool's refusal.
fn code_of(error: &Error) -> CuResult {
    match error {
        Error::StitchedOutOfMemory { .. } | Error::OutOfMemory { .. } => OUT_OF_MEMORY,
        other => other
            .driver_code()
            .map_or(INVALID_VALUE, |code| code.0 as CuResult),
    }
}

impl Served {
    fn live(&self) -> MutexGuard<'_, BTreeMap<u64, u64>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn inside(&self, ptr: u64) -> bool {
        ptr >= self.reservation.0 && ptr - self.reservation.0 < self.reservation.1
    }

    /// Serve `size` bytes: the pointer, or the driver's code for the
    /// refusal.
    fn allocate(&self, size: u64) -> Result<u64, CuResult> {
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        let mut live = self.live();
        let ptr = self.pool.allocate(size).map_err(|error| code_of(&error))?;
        live.insert(ptr, size);
        Ok(ptr)
    }

    /// Free `ptr` if the pool handed it out (`None`: not the pool's).
    fn free(&self, ptr: u64) -> Option<CuResult> {
        if !self.inside(ptr) {
            return None;
        }
        let mut live = self.live();
        live.remove(&ptr)?;
        Some(match self.pool.free(ptr) {
            Ok(()) => crate::driver::SUCCESS,
            Err(error) => code_of(&error),
        })
    }

    /// The live block holding `ptr`: its start and requested bytes.
    pub fn block_of(&self, ptr: u64) -> Option<(u64, u64)> {
        if !self.inside(ptr) {
            return None;
        }
        let live = self.live();
        let (&start, &size) = live.range(..=ptr).next_back()?;
        (ptr < start + size.max(1)).then_some((start, size))
    }

    /// Every live block, by address.
    pub fn live_blocks(&self) -> Vec<(u64, u64)> {
        self.live()
            .iter()
            .map(|(&ptr, &size)| (ptr, size))
            .collect()
    }
}

/// `cuMemAlloc` through the pool: `None` when the driver serves it (no
/// pool, or another device is current).
pub fn allocate(size: usize) -> Option<Result<u64, CuResult>> {
    let served = get_or_make()?;
    if read::current_device() != Some(served.ordinal) {
        return None;
    }
    Some(served.allocate(size as u64))
}

/// Device work may have been queued since the pool last waited for it.
static QUEUED: AtomicBool = AtomicBool::new(true);

/// A launch, copy or memset was queued (by a wrapped call).
pub fn work_queued() {
    if !QUEUED.load(Ordering::Relaxed) {
        QUEUED.store(true, Ordering::Relaxed);
    }
}

/// `cuMemFree` through the pool: `None` when the pointer is not the pool's.
/// As the driver's free, it waits for the device's queued work first (a
/// kernel may still use the block, which the pool hands out again at
/// once), where any was queued since the last wait.
pub fn free(ptr: u64) -> Option<CuResult> {
    let served = get()?;
    if served.block_of(ptr).is_none_or(|(start, _)| start != ptr) {
        return None;
    }
    if QUEUED.swap(false, Ordering::AcqRel) {
        let synced = call_driver!(device::sym::SYNCHRONIZE, fn());
        if synced != Some(crate::driver::SUCCESS) {
            QUEUED.store(true, Ordering::Relaxed);
        }
    }
    served.free(ptr)
}

/// The pooled block holding `ptr`, if any.
pub fn block_of(ptr: u64) -> Option<(u64, u64)> {
    get()?.block_of(ptr)
}
