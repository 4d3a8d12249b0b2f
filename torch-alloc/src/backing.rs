//! [`Backing`]: the device pool a [`crate::DeviceAllocator`] stands on, either of
//! ctx's two non-moving pools:
//!
//! - `tlsf`: [`ctx::Pool`], TLSF over one reservation mapped from its start
//!   (`Growth::Vmm`, `CompactionPolicy::Never`, so pointers stay valid). It gives
//!   back the free pages at the top of its mapping.
//! - `stitch`: [`ctx::StitchedPool`], memcore's stitching policy: physical handles
//!   mapped wherever the blocks are, so it gives back every idle page.
//!
//! The allocator above does the stream order, the private pools and PyTorch's
//! figures; a backing only places bytes and says what it holds.

use std::fmt::Debug;

use ctx::{Handle, MemInfo, Pool, StitchedPool};

use crate::Result;
use crate::facts::{ContextFacts, DeviceFacts};
use crate::settings::Settings;
use memcore::pytorch::MIN_BLOCK_BYTES;

/// The TLSF pool on `memory` as `settings` say: a reservation of the device's total
/// memory, rounded up to whole pages, granted to `settings.peers`.
pub fn tlsf_pool<D: DeviceFacts>(memory: D, settings: &Settings) -> Result<Pool<D>> {
    let page = memory.granularity().max(1);
    let total = memory.mem_info()?.total;
    let reserve = total.div_ceil(page).saturating_mul(page).max(page);
    let peers = settings
        .peers
        .resolve(memory.ordinal(), memory.device_count()?);
    Ok(Pool::new(memory, settings.pool_config(reserve, peers))?)
}

/// The part of the device's memory a stitched pool leaves free, as a divisor of the
/// device's total bytes (1/256: 0.4%). The driver keeps bookkeeping in device memory
/// for every physical handle, and the stitched pool holds many (one per 32 MiB it
/// maps), so a pool sized to the free memory left the context too little to load the
/// next kernel's module (loaded at its first launch) once it had filled the device: the
/// launch, not an allocation, then failed for lack of memory.
pub const STITCHED_HEADROOM_DIVISOR: u64 = 256;

/// The stitched pool on `memory` as `settings` say: handles up to the device's free
/// memory now less [`STITCHED_HEADROOM_DIVISOR`]'s part of its total, granted to
/// `settings.peers`.
pub fn stitched_pool<D: DeviceFacts>(memory: D, settings: &Settings) -> Result<StitchedPool<D>> {
    let peers = settings
        .peers
        .resolve(memory.ordinal(), memory.device_count()?);
    let info = memory.mem_info()?;
    let capacity = info
        .free
        .saturating_sub(info.total / STITCHED_HEADROOM_DIVISOR);
    Ok(StitchedPool::new(
        memory,
        settings.stitched_config(capacity, peers),
    )?)
}

/// What a backing holds, bytes and counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Device memory mapped now.
    pub mapped_bytes: u64,
    /// The most device memory mapped at once.
    pub peak_mapped_bytes: u64,
    /// Mapped bytes no block holds.
    pub free_bytes: u64,
    /// The largest request the backing can place without new device memory.
    pub largest_free_bytes: u64,
    /// What [`Backing::give_back`] would return to the device now.
    pub releasable_bytes: u64,
    /// Mapped free bytes a new block surely may use together with new device memory:
    /// the free tail (TLSF), the idle handles (stitched: the model maps them anywhere).
    pub growable_bytes: u64,
    /// Device memory allocations held: physical handles, or (TLSF) its one mapping.
    pub segments: u64,
    /// Device memory allocations made so far.
    pub device_allocs: u64,
    /// Device memory allocations given back so far.
    pub device_frees: u64,
    /// Grants of mappings to peer devices so far.
    pub peer_access_calls: u64,
}

/// A device pool that hands out blocks that never move.
pub trait Backing: Send + Sync {
    /// The device underneath.
    type Device: DeviceFacts;
    /// What names a block to [`Backing::free`].
    type Token: Copy + Debug + Send + Sync;

    /// `bytes` (a multiple of 512) at a device address that stays put until freed.
    /// Out of memory is `ctx::Error::OutOfMemory` or `StitchedOutOfMemory`
    /// ([`is_out_of_memory`]).
    fn allocate(&self, bytes: u64) -> ctx::Result<(Self::Token, u64)>;

    /// Gives a block back; its memory may be reused at once.
    fn free(&self, token: Self::Token) -> ctx::Result<()>;

    /// Gives the device what the pool holds and no block needs (synchronizing the
    /// device first, as the pools do before they unmap).
    fn give_back(&self) -> ctx::Result<()>;

    /// The figures now.
    fn figures(&self) -> Figures;

    /// The device address ranges mapped now, sorted, as `(address, bytes)`.
    fn mapped_runs(&self) -> Vec<(u64, u64)>;

    /// Each physical mapping held now, sorted, as `(address, bytes)`: the units memory
    /// is shared with other processes in.
    fn mappings(&self) -> Vec<(u64, u64)>;

    /// The reserved virtual range, `(address, bytes)`: every block lies in it.
    fn reservation(&self) -> (u64, u64);

    /// Driver calls that took or gave memory so far.
    fn memory_driver_calls(&self) -> u64;

    /// The context's figures for the ledger.
    fn context_facts(&self) -> Result<ContextFacts>;

    /// The device's memory now.
    fn mem_info(&self) -> ctx::Result<MemInfo>;
}

/// Whether a pool refused for lack of device memory (and not for a broken call): the
/// TLSF pool's or the stitched pool's out of memory, the stitching model's refusal to
/// pass its capacity, or the driver's own out-of-memory code.
pub fn is_out_of_memory(error: &ctx::Error) -> bool {
    match error {
        ctx::Error::OutOfMemory { .. }
        | ctx::Error::StitchedOutOfMemory { .. }
        | ctx::Error::Memcore(memcore::Error::OutOfMemory { .. }) => true,
        ctx::Error::Driver { code, .. } => code.is_out_of_memory(),
        _ => false,
    }
}

impl<D: DeviceFacts> Backing for Pool<D> {
    type Device = D;
    type Token = Handle;

    fn allocate(&self, bytes: u64) -> ctx::Result<(Handle, u64)> {
        let mut pool = self.lock();
        let handle = pool.allocate(bytes, MIN_BLOCK_BYTES, None)?;
        match pool.device_ptr(handle) {
            Ok(ptr) => Ok((handle, ptr)),
            Err(error) => {
                // The block was never handed out.
                let _ = pool.free(handle);
                Err(error)
            }
        }
    }

    fn free(&self, token: Handle) -> ctx::Result<()> {
        Pool::free(self, token)
    }

    fn give_back(&self) -> ctx::Result<()> {
        self.shrink().map(|_| ())
    }

    fn figures(&self) -> Figures {
        let pool = self.lock();
        let stats = pool.stats();
        let page = pool.device().granularity().max(1);
        let start = pool.reservation_start().unwrap_or(0);
        let end = start + stats.mapped_bytes;
        let top = stats.heap.top.max(start);
        let releasable = end.saturating_sub(top.div_ceil(page).saturating_mul(page));
        Figures {
            mapped_bytes: stats.mapped_bytes,
            peak_mapped_bytes: stats.peak_mapped_bytes,
            free_bytes: stats.heap.free_bytes,
            largest_free_bytes: stats.heap.largest_free,
            releasable_bytes: releasable,
            growable_bytes: releasable,
            segments: u64::from(stats.mapped_bytes > 0),
            device_allocs: stats.calls.create.calls,
            device_frees: stats.calls.release.calls,
            peer_access_calls: stats.peer_access.calls,
        }
    }

    fn mapped_runs(&self) -> Vec<(u64, u64)> {
        let pool = self.lock();
        let mapped = pool.stats().mapped_bytes;
        match pool.reservation_start() {
            Some(start) if mapped > 0 => vec![(start, mapped)],
            _ => Vec::new(),
        }
    }

    fn mappings(&self) -> Vec<(u64, u64)> {
        Pool::mappings(self)
    }

    fn reservation(&self) -> (u64, u64) {
        let pool = self.lock();
        (
            pool.reservation_start().unwrap_or(0),
            pool.stats().reserved_va_bytes,
        )
    }

    fn memory_driver_calls(&self) -> u64 {
        let stats = self.stats();
        stats.calls.total() + stats.peer_access.calls
    }

    fn context_facts(&self) -> Result<ContextFacts> {
        self.lock().device().context_facts()
    }

    fn mem_info(&self) -> ctx::Result<MemInfo> {
        self.lock().device().mem_info()
    }
}

impl<D: DeviceFacts> Backing for StitchedPool<D> {
    type Device = D;
    type Token = u64;

    fn allocate(&self, bytes: u64) -> ctx::Result<(u64, u64)> {
        let ptr = StitchedPool::allocate(self, bytes)?;
        Ok((ptr, ptr))
    }

    fn free(&self, token: u64) -> ctx::Result<()> {
        StitchedPool::free(self, token)
    }

    fn give_back(&self) -> ctx::Result<()> {
        self.trim()
    }

    fn figures(&self) -> Figures {
        let stats = self.stats();
        let model = stats.model;
        Figures {
            mapped_bytes: model.physical_bytes,
            peak_mapped_bytes: model.peak_physical_bytes,
            free_bytes: model.physical_bytes.saturating_sub(model.live_bytes),
            largest_free_bytes: model.idle_bytes,
            releasable_bytes: model.idle_bytes,
            growable_bytes: model.idle_bytes,
            segments: model.small_handles + model.large_handles,
            device_allocs: stats.calls.create.calls,
            device_frees: stats.calls.release.calls,
            peer_access_calls: stats.peer_access.calls,
        }
    }

    fn mapped_runs(&self) -> Vec<(u64, u64)> {
        StitchedPool::mapped_runs(self)
    }

    fn mappings(&self) -> Vec<(u64, u64)> {
        StitchedPool::mappings(self)
    }

    fn reservation(&self) -> (u64, u64) {
        StitchedPool::reservation(self)
    }

    fn memory_driver_calls(&self) -> u64 {
        let stats = self.stats();
        stats.calls.total() + stats.peer_access.calls
    }

    fn context_facts(&self) -> Result<ContextFacts> {
        self.with_device(|device| device.context_facts())
    }

    fn mem_info(&self) -> ctx::Result<MemInfo> {
        self.with_device(|device| device.mem_info())
    }
}
