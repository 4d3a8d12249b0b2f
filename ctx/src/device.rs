//! The backend interface: what a pool needs from a device.
//!
//! Two implementations exist: [`crate::sim::SimDevice`] (host memory, for
//! tests and trace replays) and, behind the `cuda` feature, the CUDA driver.

use memcore::moves::BlockMove;

use crate::Result;
use crate::peers::PeerSet;

/// Device memory figures as `cuMemGetInfo` reports them, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MemInfo {
    /// Bytes still available for allocation.
    pub free: u64,
    /// Bytes of device memory in all.
    pub total: u64,
}

/// A stream an allocation is used on; `StreamId(0)` is the default stream.
///
/// The pool only records it; see [`crate::Pool`] for what it does (and does
/// not) synchronize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default (legacy) stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// A physical allocation made by [`DeviceMemory::create_physical`]
/// (`CUmemGenericAllocationHandle` on CUDA): memory that exists apart from
/// any address until it is mapped. Only the device that made it knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PhysicalHandle(pub(crate) u64);

impl PhysicalHandle {
    /// The handle a backend outside this crate made, by its own number.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The backend's number for it.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

/// Device memory as a pool uses it, at the driver's level and no higher:
/// virtual address reservations, physical memory made, mapped into them,
/// made accessible, unmapped and released as separate steps (VMM), plain
/// chunk allocations when there is no VMM, copies and host transfers.
///
/// A backend does the minimum each call needs and checks only what keeps
/// its own calls sound (the driver's rules for ranges, which
/// [`SimDevice`](crate::SimDevice) keeps as strictly as the driver);
/// putting the steps together (create, map and grant with a rollback when
/// one fails; unmap and release) is the pools' shared code, written once
/// above every backend.
///
/// All addresses are absolute device addresses and never zero; all sizes are
/// bytes. A refused call changes nothing.
pub trait DeviceMemory: Send {
    /// A short human-readable name of the device.
    fn name(&self) -> String;

    /// The device's ordinal among the host's devices (what [`PeerSet`]s
    /// name).
    fn ordinal(&self) -> u32;

    /// The VMM page in bytes ([`memcore::PAGE_BYTES`] on recent NVIDIA
    /// GPUs): reservation sizes, mapping addresses and physical sizes are
    /// multiples of it. Chunk sizes are rounded to it by the pool as well.
    fn granularity(&self) -> u64;

    /// Whether [`reserve`](Self::reserve) and the physical-memory steps
    /// work.
    fn supports_vmm(&self) -> bool;

    /// Reserve `size` bytes of virtual address space, no physical memory
    /// (`cuMemAddressReserve`); returns the base address.
    fn reserve(&mut self, size: u64) -> Result<u64>;

    /// Give back a reservation made by [`reserve`](Self::reserve)
    /// (`cuMemAddressFree`); nothing in it may be mapped any more.
    fn release(&mut self, base: u64, size: u64) -> Result<()>;

    /// Create `size` bytes of physical memory (`cuMemCreate`), a positive
    /// multiple of [`granularity`](Self::granularity), mapped nowhere.
    fn create_physical(&mut self, size: u64) -> Result<PhysicalHandle>;

    /// Map all of `handle` at `addr` (`cuMemMap`): `[addr, addr + its
    /// size)` lies inside a reservation, on granularity boundaries, with
    /// nothing mapped there yet. A mapping is always one whole handle. The
    /// range is not accessible until [`grant_access`](Self::grant_access).
    fn map_physical(&mut self, handle: PhysicalHandle, addr: u64) -> Result<()>;

    /// Make `[addr, addr + size)`, a run of whole mappings made by
    /// [`map_physical`](Self::map_physical), readable and writable by every
    /// device in `devices` (`cuMemSetAccess`, one descriptor per device):
    /// this device's own ordinal for its own access, any other for a peer's.
    /// What was granted before stays. A peer that cannot reach this
    /// device's memory is refused with
    /// [`Error::PeerAccess`](crate::Error::PeerAccess) before anything
    /// changes; an empty set is an invalid value.
    fn grant_access(&mut self, addr: u64, size: u64, devices: PeerSet) -> Result<()>;

    /// Unmap the one mapping of a handle that covers exactly `[addr, addr +
    /// size)` (`cuMemUnmap`), after queued work on it is done; the handle
    /// and its contents stay, to be mapped again or released.
    fn unmap_physical(&mut self, addr: u64, size: u64) -> Result<()>;

    /// Give `handle`, mapped nowhere, back to the device (`cuMemRelease`).
    fn release_physical(&mut self, handle: PhysicalHandle) -> Result<()>;

    /// Allocate `size` bytes outside any reservation (`cuMemAlloc`); returns
    /// the address, aligned to at least 256 bytes.
    fn alloc_chunk(&mut self, size: u64) -> Result<u64>;

    /// Free a chunk made by [`alloc_chunk`](Self::alloc_chunk), whole.
    fn free_chunk(&mut self, addr: u64, size: u64) -> Result<()>;

    /// Copy `len` bytes from `src` to `dst` on the device, memmove semantics
    /// (the ranges may overlap). Ordered after all earlier work on the device.
    fn copy_within(&mut self, src: u64, dst: u64, len: u64) -> Result<()>;

    /// Copy every move, in order, each with memmove semantics: the result is
    /// that of calling [`copy_within`](Self::copy_within) for each in turn,
    /// so a move may read what an earlier one wrote. Ordered after all
    /// earlier work on the device.
    ///
    /// A compaction hands its whole plan over at once, so a device can queue
    /// the copies without waiting between them, and copy moves that do not
    /// depend on each other together. The default copies one after another.
    fn copy_moves(&mut self, moves: &[BlockMove]) -> Result<()> {
        for m in moves {
            self.copy_within(m.src, m.dst, m.len)?;
        }
        Ok(())
    }

    /// Copy host bytes to the device at `dst`.
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<()>;

    /// Copy device bytes at `src` to the host.
    fn read(&mut self, src: u64, out: &mut [u8]) -> Result<()>;

    /// Free and total device memory now.
    fn mem_info(&self) -> Result<MemInfo>;

    /// Wait until all work queued on the device, on every stream, is done.
    fn synchronize(&mut self) -> Result<()>;
}
