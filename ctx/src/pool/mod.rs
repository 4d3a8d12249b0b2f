//! The compacting device-memory pool ([`Pool`]) and its configuration.

mod memory;
mod state;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use memcore::{CallTally, DriverCalls, Handle, Stats};

use crate::Result;
use crate::device::{DeviceMemory, StreamId};
use crate::peers::PeerSet;
use state::PoolState;

/// How a pool gets device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Growth {
    /// Reserve address space once, map pages at the end of the mapped part:
    /// the pool stays one contiguous region. Needs
    /// [`DeviceMemory::supports_vmm`].
    Vmm,
    /// Allocate chunks (`cuMemAlloc`) of at least `min_growth_bytes` where
    /// there is room (see [`PoolConfig::min_growth_bytes`]); the pool is
    /// a set of separate regions, and only whole chunks at the top of the
    /// highest one can be given back.
    Chunks,
}

/// When a pool moves blocks to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum CompactionPolicy {
    /// Never move blocks on its own; only grow ([`Pool::compact`] still
    /// works).
    Never,
    /// When a request does not fit, first compact just enough for it
    /// (fewest bytes moved), grow only if compaction cannot make room: the
    /// smallest footprint.
    BeforeGrow,
    /// As [`BeforeGrow`](Self::BeforeGrow), but when no plan can make room,
    /// first slide every block down ([`Pool::compact`]) and then grow by what
    /// is still missing: the least growth, at the cost of copying every block
    /// above the first hole.
    SlideBeforeGrow,
    /// When a request does not fit, grow; compact only when growth is capped
    /// by `max_bytes` or the device is full.
    WhenGrowFails,
}

/// How a pool behaves. Sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PoolConfig {
    /// Where memory comes from.
    pub growth: Growth,
    /// When blocks move on their own.
    pub compaction: CompactionPolicy,
    /// Address space reserved once for [`Growth::Vmm`], rounded up to whole
    /// pages; the pool never holds more. Ignored for chunks.
    pub reserve_bytes: u64,
    /// The most device memory the pool holds (mapped or in chunks).
    pub max_bytes: u64,
    /// The fewest bytes one growth takes, rounded up to whole pages: for
    /// [`Growth::Chunks`] the smallest chunk; for [`Growth::Vmm`] the fewest
    /// bytes mapped at once (0: what the request needs). A pool that grows
    /// by whole steps makes fewer driver calls (a VMM growth is one
    /// cuMemCreate + cuMemMap + cuMemSetAccess whatever its size) and
    /// fewer, larger mappings, over which `cuMemcpy` runs faster
    /// (BENCHMARKS.md); it may hold up to one step more than it needs.
    ///
    /// One rule for both kinds of growth, memcore's
    /// [`GrowthRule`](memcore::GrowthRule): a step larger than what is left
    /// under `max_bytes` (and, for VMM, the reservation) shrinks to what is
    /// left, and a step the device refuses shrinks to what the request
    /// needs.
    pub min_growth_bytes: u64,
    /// For [`Growth::Vmm`]: each growth maps at least the pool's mapped
    /// bytes divided by this, capped at
    /// [`memcore::FULL_BANDWIDTH_HANDLE_BYTES`] (0: off; the same
    /// [`GrowthRule`](memcore::GrowthRule)). A growth is one handle, and
    /// copies over handles smaller than that run below the bandwidth of
    /// `cuMemAlloc` memory (BENCHMARKS.md); with this rule a pool of more
    /// than `divisor` x 32 MiB maps 32 MiB handles or larger, while a
    /// smaller one overshoots by at most 1/`divisor` of itself.
    pub growth_divisor: u32,
    /// Other devices of the host, by ordinal, that may read and write the
    /// pool's memory directly: every mapping the pool makes is granted to
    /// each of them as it is made ([`DeviceMemory::grant_access`]), counted
    /// in [`PoolStats::peer_access`]. The pool's own device is left out.
    /// Needs [`Growth::Vmm`]: a chunk pool with peers is refused
    /// ([`Error::PeersNeedVmm`](crate::Error::PeersNeedVmm)). Empty, the
    /// default: no grants, no extra driver calls.
    pub peers: PeerSet,
}

impl PoolConfig {
    /// A VMM pool reserving `reserve_bytes` of address space, compacting
    /// before it grows, capped only by the reservation.
    pub const fn vmm(reserve_bytes: u64) -> Self {
        Self {
            growth: Growth::Vmm,
            compaction: CompactionPolicy::BeforeGrow,
            reserve_bytes,
            max_bytes: u64::MAX,
            min_growth_bytes: 0,
            growth_divisor: 0,
            peers: PeerSet::NONE,
        }
    }

    /// A chunk pool allocating at least `min_growth_bytes` at a time, compacting
    /// before it grows, uncapped.
    pub const fn chunks(min_growth_bytes: u64) -> Self {
        Self {
            growth: Growth::Chunks,
            compaction: CompactionPolicy::BeforeGrow,
            reserve_bytes: 0,
            max_bytes: u64::MAX,
            min_growth_bytes,
            growth_divisor: 0,
            peers: PeerSet::NONE,
        }
    }

    /// As `self`, granting `peers` access to every mapping
    /// ([`PoolConfig::peers`]).
    pub const fn with_peers(mut self, peers: PeerSet) -> Self {
        self.peers = peers;
        self
    }
}

/// A snapshot of a pool. Sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// The heap's own figures (live, free, largest free block, ...).
    pub heap: Stats,
    /// Device memory the pool holds now: mapped pages or chunks.
    pub mapped_bytes: u64,
    /// The most device memory the pool has held at once: its footprint.
    pub peak_mapped_bytes: u64,
    /// Address space reserved (VMM), 0 for chunks.
    pub reserved_va_bytes: u64,
    /// Bytes copied by compactions so far.
    pub bytes_moved: u64,
    /// Compactions that moved at least one block.
    pub compactions: u64,
    /// Times the pool took memory from the device.
    pub grows: u64,
    /// Calls to [`Pool::shrink`] that gave memory back.
    pub shrinks: u64,
    /// The VMM calls the pool made, counted and timed on the host: the
    /// reservation, then one create, map and own-access grant per growth,
    /// one unmap and release per mapping given back (zero for chunks).
    pub calls: DriverCalls,
    /// Grants of mappings to the pool's peers ([`PoolConfig::peers`]): one
    /// `grant_access` call per mapping, covering every peer, so each peer was
    /// granted `calls` mappings of `bytes` bytes in all; `time` is the host
    /// time in those calls. All zero for a pool without peers.
    pub peer_access: CallTally,
    /// Host time spent planning compactions (explicit and on the
    /// allocation path), plans that found no room included.
    pub compaction_plan_time: Duration,
    /// The work of every compaction plan, in blocks and holes looked at
    /// ([`memcore::Heap::plan_steps`]): what a model bounds a replay's
    /// planning by.
    pub compaction_plan_steps: u64,
    /// Host time spent copying for compactions: from handing a plan's moves
    /// to the device until the device reported them done.
    pub compaction_copy_time: Duration,
}

/// What one [`Pool::compact`] did. Sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CompactionReport {
    /// Blocks copied.
    pub moves: usize,
    /// Bytes copied.
    pub bytes_moved: u64,
    /// Free bytes in the pool afterwards.
    pub free_bytes: u64,
    /// Largest free block before.
    pub largest_free_before: u64,
    /// Largest free block after.
    pub largest_free_after: u64,
    /// Host time spent making the plan.
    pub plan_time: Duration,
    /// Host time from handing the moves to the device until they were done
    /// (zero when nothing moved); `bytes_moved / copy_time` is the
    /// compaction's copy bandwidth.
    pub copy_time: Duration,
}

/// A compacting device-memory pool, shareable between threads:
/// [`memcore::Heap`] over [`memcore::Tlsf`], whose offsets are device
/// addresses, on top of a [`DeviceMemory`].
///
/// The heap's regions are exactly the device memory the pool holds: with
/// [`Growth::Vmm`] one address reservation, mapped from its start in whole
/// pages as requests need them; with [`Growth::Chunks`] plain chunk
/// allocations. Blocks are named by [`Handle`]s, so compaction can move them
/// (a plan's copies go to the device as one batch,
/// [`DeviceMemory::copy_moves`]) and the handles stay valid; raw device addresses
/// ([`Pool::device_ptr`]) are valid until the next compaction unless the
/// block is [pinned](Pool::pin).
///
/// Streams: an allocation may name the stream it is used on; the pool
/// records it ([`Pool::stream`]) but does not track stream completion. Freed
/// bytes are reused at once, as with stream-ordered allocation on one
/// stream: the caller must not free a block that work on another stream
/// still uses. Compaction and shrinking synchronize the whole device before
/// they copy or unmap anything.
///
/// ```
/// use ctx::{Pool, PoolConfig, SimConfig, SimDevice};
///
/// let pool = Pool::new(SimDevice::new(SimConfig::small(1 << 20)), PoolConfig::vmm(1 << 20))?;
/// let a = pool.allocate(1000, 256, None)?;
/// let b = pool.allocate(1000, 256, None)?;
/// pool.write(b, 0, b"kept")?;
/// pool.free(a)?;
/// let report = pool.compact()?;
/// assert_eq!(report.bytes_moved, 1000);
/// let mut out = [0; 4];
/// pool.read(b, 0, &mut out)?;
/// assert_eq!(&out, b"kept");
/// assert_eq!(pool.stats().mapped_bytes, 64 << 10); // one 64 KiB page
/// # Ok::<(), ctx::Error>(())
/// ```
///
/// Dropping the pool drops the device, which gives back what it holds; use
/// [`Pool::into_device`] to keep the device.
#[derive(Debug)]
pub struct Pool<D: DeviceMemory> {
    state: Mutex<PoolState<D>>,
}

impl<D: DeviceMemory> Pool<D> {
    /// A pool on `device`. A VMM pool reserves its address space now; no
    /// memory is mapped until the first allocation.
    pub fn new(device: D, config: PoolConfig) -> Result<Self> {
        Ok(Self {
            state: Mutex::new(PoolState::new(device, config)?),
        })
    }

    /// Take the lock to run several operations under it.
    ///
    /// A panic while the lock was held does not poison the pool: the pool
    /// reports broken state as errors rather than panicking, so the state is
    /// taken as is.
    #[inline]
    pub fn lock(&self) -> PoolGuard<'_, D> {
        PoolGuard {
            state: self.state.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Allocate `size` bytes aligned to `align` (a power of two), growing
    /// and compacting as [`PoolConfig`] says; `stream` is recorded with the
    /// block. O(1) without heap allocation when the request fits.
    #[inline]
    pub fn allocate(&self, size: u64, align: u64, stream: Option<StreamId>) -> Result<Handle> {
        self.lock().allocate(size, align, stream)
    }

    /// Free a block; its bytes are reusable at once.
    #[inline]
    pub fn free(&self, handle: Handle) -> Result<()> {
        self.lock().free(handle)
    }

    /// The block's device address now; valid until the next compaction
    /// unless the block is pinned.
    pub fn device_ptr(&self, handle: Handle) -> Result<u64> {
        self.lock().device_ptr(handle)
    }

    /// The stream the block was allocated for, if one was named.
    pub fn stream(&self, handle: Handle) -> Result<Option<StreamId>> {
        self.lock().stream(handle)
    }

    /// Keep the block where it is until the returned guard is dropped, so
    /// its device address ([`PinGuard::ptr`]) stays valid through
    /// compactions. A block already pinned is refused
    /// ([`Error::AlreadyPinned`](crate::Error::AlreadyPinned)).
    ///
    /// ```
    /// use ctx::{Pool, PoolConfig, SimConfig, SimDevice};
    ///
    /// let pool = Pool::new(SimDevice::new(SimConfig::small(1 << 20)), PoolConfig::vmm(1 << 20))?;
    /// let a = pool.allocate(1000, 256, None)?;
    /// let b = pool.allocate(1000, 256, None)?;
    /// pool.free(a)?;
    /// let at = {
    ///     let pinned = pool.pin(b)?;
    ///     pool.compact()?;
    ///     assert_eq!(pool.device_ptr(b)?, pinned.ptr(), "pinned: stays put");
    ///     pinned.ptr()
    /// };
    /// pool.compact()?;
    /// assert!(pool.device_ptr(b)? < at, "unpinned: slides down");
    /// # Ok::<(), ctx::Error>(())
    /// ```
    pub fn pin(&self, handle: Handle) -> Result<PinGuard<'_, D>> {
        let ptr = self.lock().state.pin(handle)?;
        Ok(PinGuard {
            pool: self,
            handle,
            ptr,
        })
    }

    /// Copy host bytes into the block at `offset` bytes from its start.
    pub fn write(&self, handle: Handle, offset: u64, data: &[u8]) -> Result<()> {
        self.lock().write(handle, offset, data)
    }

    /// Copy bytes of the block from `offset` bytes on into `out`.
    pub fn read(&self, handle: Handle, offset: u64, out: &mut [u8]) -> Result<()> {
        self.lock().read(handle, offset, out)
    }

    /// Slide every unpinned block toward the start of its region; handles
    /// stay valid, device addresses change.
    pub fn compact(&self) -> Result<CompactionReport> {
        self.lock().compact()
    }

    /// Give whole free pages (or chunks) at the top back to the device;
    /// returns the bytes given back. Compact first to give back more.
    pub fn shrink(&self) -> Result<u64> {
        self.lock().shrink()
    }

    /// Current figures.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats()
    }

    /// Device address of the first byte of the pool's reservation
    /// ([`Growth::Vmm`]): every block lies at or above it, and it does not
    /// change for the pool's life. `None` for [`Growth::Chunks`], whose
    /// chunks lie wherever the device put them.
    pub fn reservation_start(&self) -> Option<u64> {
        self.lock().reservation_start()
    }

    /// What the pool holds from the device, `(address, bytes)` sorted by
    /// address: each mapping ([`Growth::Vmm`], one physical handle each, the
    /// unit a handle is exported or shared in) or chunk.
    pub fn mappings(&self) -> Vec<(u64, u64)> {
        self.lock().mappings()
    }

    /// The configuration the pool was made with.
    pub fn config(&self) -> PoolConfig {
        self.lock().state.config
    }

    /// Give all the pool's memory back to the device (live blocks included)
    /// and return the device. Best effort: a device call that fails leaves
    /// the rest held; [`Pool::try_into_device`] tells.
    pub fn into_device(self) -> D {
        self.try_into_device().0
    }

    /// As [`Pool::into_device`], with the outcome of giving memory back.
    pub fn try_into_device(self) -> (D, Result<()>) {
        self.state
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .into_device()
    }
}

/// The pool's lock, held: the same operations as [`Pool`] (pinning
/// aside), without taking the lock again for each.
#[must_use = "the lock is released when the guard drops"]
#[derive(Debug)]
pub struct PoolGuard<'a, D: DeviceMemory> {
    state: MutexGuard<'a, PoolState<D>>,
}

impl<D: DeviceMemory> PoolGuard<'_, D> {
    /// See [`Pool::allocate`].
    #[inline]
    pub fn allocate(&mut self, size: u64, align: u64, stream: Option<StreamId>) -> Result<Handle> {
        self.state.allocate(size, align, stream)
    }

    /// See [`Pool::free`].
    #[inline]
    pub fn free(&mut self, handle: Handle) -> Result<()> {
        self.state.free(handle)
    }

    /// See [`Pool::device_ptr`].
    pub fn device_ptr(&self, handle: Handle) -> Result<u64> {
        self.state.device_ptr(handle)
    }

    /// [`PoolStats::compaction_plan_steps`], without the rest of the
    /// figures.
    pub fn compaction_plan_steps(&self) -> u64 {
        self.state.plan_steps()
    }

    /// See [`Pool::stream`].
    pub fn stream(&self, handle: Handle) -> Result<Option<StreamId>> {
        self.state.stream(handle)
    }

    /// See [`Pool::write`].
    pub fn write(&mut self, handle: Handle, offset: u64, data: &[u8]) -> Result<()> {
        self.state.write(handle, offset, data)
    }

    /// See [`Pool::read`].
    pub fn read(&mut self, handle: Handle, offset: u64, out: &mut [u8]) -> Result<()> {
        self.state.read(handle, offset, out)
    }

    /// See [`Pool::compact`].
    pub fn compact(&mut self) -> Result<CompactionReport> {
        self.state.compact()
    }

    /// See [`Pool::shrink`].
    pub fn shrink(&mut self) -> Result<u64> {
        self.state.shrink()
    }

    /// See [`Pool::stats`].
    pub fn stats(&self) -> PoolStats {
        self.state.stats()
    }

    /// See [`Pool::reservation_start`].
    pub fn reservation_start(&self) -> Option<u64> {
        self.state.reservation_start()
    }

    /// See [`Pool::mappings`].
    pub fn mappings(&self) -> Vec<(u64, u64)> {
        self.state.mappings()
    }

    /// The device, to read its figures. Changing its memory behind the
    /// pool's back is not offered.
    pub fn device(&self) -> &D {
        &self.state.device
    }
}

/// A block held in place: while the guard lives, compaction does not move
/// the block, so [`PinGuard::ptr`] stays its device address. Dropping the
/// guard lets compaction move it again; made by [`Pool::pin`].
///
/// Dropping takes the pool's lock: drop a guard while this thread holds no
/// [`PoolGuard`] of the same pool. Freeing the block ends the pin as well;
/// the guard then unpins nothing.
#[must_use = "the block is unpinned when the guard drops"]
#[derive(Debug)]
pub struct PinGuard<'a, D: DeviceMemory> {
    pool: &'a Pool<D>,
    handle: Handle,
    ptr: u64,
}

impl<D: DeviceMemory> PinGuard<'_, D> {
    /// The block's device address, valid while the guard lives (and the
    /// block is not freed).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The pinned block.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// Ends the guard but not the pin: the block stays where it is until it
    /// is freed. For blocks whose address is handed to code that outlives
    /// any guard (a device heap's regions, a kernel's descriptor). Returns
    /// the block's device address.
    pub fn hold_until_freed(self) -> u64 {
        let ptr = self.ptr;
        // The guard owns nothing but the duty to unpin, which is what this
        // gives up.
        std::mem::forget(self);
        ptr
    }
}

impl<D: DeviceMemory> Drop for PinGuard<'_, D> {
    fn drop(&mut self) {
        // A block freed while pinned has nothing left to unpin: the heap
        // refuses its stale handle, and the generation check keeps a new
        // block in the slot untouched.
        let _ = self.pool.lock().state.unpin(self.handle);
    }
}
