//! A simulated device in host memory, for tests and trace replays.

mod faults;
mod physical;

use memcore::moves::{BlockMove, MAX_MOVES, is_slide};

use crate::address_space::{self, AddressSpace, invalid_value};
use crate::copy::{self, Batch, CopyStep};
use crate::device::{DeviceMemory, MemInfo, PhysicalHandle};
use crate::peers::{PeerLinks, PeerSet};
use crate::{DriverCode, Error, Result};

pub use faults::{SimCall, SimFaults};

/// Where the simulated address space starts. Nonzero and high, so simulated
/// device pointers look like real ones and address zero is never valid.
const SIM_BASE_ADDRESS: u64 = 0x7f00_0000_0000;

/// How a [`SimDevice`] behaves. All sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    /// Device memory in all, as `mem_info().total` reports it.
    pub capacity_bytes: u64,
    /// VMM page: reservations and mappings are multiples of it; a power of
    /// two.
    pub granularity_bytes: u64,
    /// What the driver and context hold before any allocation; counted
    /// against the capacity.
    pub context_reserved_bytes: u64,
    /// Whether the VMM calls (`reserve`, `create_physical`, ...) work.
    pub vmm: bool,
    /// Whether memory holds data (host allocations) or only bookkeeping.
    pub backed: bool,
}

impl SimConfig {
    /// An H200 as measured: 150,109,880,320 bytes total, 2 MiB VMM pages
    /// ([`memcore::PAGE_BYTES`]),
    /// 552,402,944 bytes taken by a fresh context (its default-stack local
    /// memory included; see [`DeviceProfile`](crate::DeviceProfile)); unbacked, for trace
    /// replays.
    pub const fn h200_like() -> Self {
        Self {
            capacity_bytes: 150_109_880_320,
            granularity_bytes: memcore::PAGE_BYTES,
            context_reserved_bytes: 552_402_944,
            vmm: true,
            backed: false,
        }
    }

    /// A small backed device for tests: `capacity_bytes` in all, 64 KiB
    /// pages, nothing reserved by the context, VMM on.
    pub const fn small(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            granularity_bytes: 64 << 10,
            context_reserved_bytes: 0,
            vmm: true,
            backed: true,
        }
    }
}

/// Counts of the calls a [`SimDevice`] has served, for tests and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimCounters {
    /// Successful `create_physical` calls.
    pub creates: u64,
    /// Successful `map_physical` calls.
    pub maps: u64,
    /// Successful `grant_access` calls (the device's own and peers').
    pub grants: u64,
    /// Successful `unmap_physical` calls.
    pub unmaps: u64,
    /// Successful `release_physical` calls.
    pub releases: u64,
    /// Successful `alloc_chunk` calls.
    pub chunk_allocs: u64,
    /// Successful `free_chunk` calls.
    pub chunk_frees: u64,
    /// Moves copied: successful `copy_within` calls and the moves of
    /// successful `copy_moves` calls.
    pub copies: u64,
    /// Bytes those moves copied.
    pub bytes_copied: u64,
    /// `synchronize` calls.
    pub synchronizes: u64,
}

/// What a range of device memory is backed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BackingKind {
    /// A plain allocation, made by `alloc_chunk`.
    Chunk,
    /// A physical handle mapped by `map_physical`; its bytes live with the
    /// handle, so they travel when it is mapped elsewhere.
    Handle(u64),
}

/// One mapping or chunk; `data` holds a chunk's bytes on a backed device
/// and is empty otherwise (a handle's bytes live with the handle).
#[derive(Debug)]
struct Backing {
    size: u64,
    kind: BackingKind,
    data: Vec<u8>,
    /// Other devices granted access (`grant_access`).
    peers: PeerSet,
    /// Whether the device itself may touch it: a chunk always, a handle's
    /// mapping once `grant_access` named the device, as with the driver.
    accessible: bool,
}

impl address_space::Backing for Backing {
    fn size(&self) -> u64 {
        self.size
    }
}

/// A part of an access that falls into one backing.
struct Piece {
    backing: u64,
    offset_in_backing: usize,
    len: usize,
}

/// A device simulated in host memory, for tests and trace replays.
///
/// It keeps the rules of the CUDA driver that a pool can break: mappings lie
/// inside reservations, on granularity boundaries, one whole handle each;
/// a mapping is accessible only once granted; only whole mappings can be
/// unmapped; a reservation is released only when nothing in it is mapped;
/// accesses must stay inside accessible memory or chunks; and physical
/// memory plus chunks plus the context's own share never exceed the
/// capacity. It refuses what the driver refuses with the driver's code
/// ([`DriverCode::INVALID_VALUE`], [`DriverCode::OUT_OF_MEMORY`], ...), and
/// fails any call a test plans to fail ([`SimDevice::faults`]).
///
/// With `backed: false` it keeps the bookkeeping only: writes are dropped and
/// reads return zeros, so replays of multi-GB traces fit in host RAM.
///
/// It is one device of a host whose devices reach each other as its
/// [`PeerLinks`] say ([`SimDevice::on_host`]; alone by default): a grant
/// ([`DeviceMemory::grant_access`]) to a peer that cannot reach it is refused,
/// and [`SimDevice::read_as`] reads as a peer would, refused where the peer
/// was granted nothing.
#[derive(Debug)]
pub struct SimDevice {
    config: SimConfig,
    ordinal: u32,
    links: PeerLinks,
    next_va: u64,
    space: AddressSpace<Backing>,
    /// Bytes of mappings, chunks and physical handles.
    used_bytes: u64,
    counters: SimCounters,
    /// Physical handles by number, with their bytes.
    handles: physical::Handles,
    /// Calls planned to fail.
    faults: SimFaults,
}

/// What the driver says when it has not the memory asked for.
fn out_of_memory(op: &'static str, detail: impl Into<String>) -> Error {
    Error::driver(op, DriverCode::OUT_OF_MEMORY, detail)
}

impl SimDevice {
    /// A device with the given behaviour. A granularity that is not a power
    /// of two is reported by the first call that needs it.
    pub fn new(config: SimConfig) -> Self {
        Self::on_host(config, 0, PeerLinks::none(1))
    }

    /// Device `ordinal` of a host whose devices reach each other as `links`
    /// say. The devices share no memory: each is its own `SimDevice`.
    ///
    /// ```
    /// use ctx::{DeviceMemory, PeerLinks, PeerSet, SimConfig, SimDevice};
    /// let mut dev = SimDevice::on_host(SimConfig::small(1 << 20), 1, PeerLinks::all(2));
    /// let base = dev.reserve(64 << 10)?;
    /// let handle = dev.create_physical(64 << 10)?;
    /// dev.map_physical(handle, base)?;
    /// dev.grant_access(base, 64 << 10, PeerSet::of(&[1])?)?;
    /// let mut out = [0; 4];
    /// assert!(dev.read_as(0, base, &mut out).is_err(), "not granted yet");
    /// dev.grant_access(base, 64 << 10, PeerSet::of(&[0])?)?;
    /// dev.read_as(0, base, &mut out)?;
    /// # Ok::<(), ctx::Error>(())
    /// ```
    pub fn on_host(config: SimConfig, ordinal: u32, links: PeerLinks) -> Self {
        Self {
            config,
            ordinal,
            links,
            next_va: SIM_BASE_ADDRESS,
            space: AddressSpace::default(),
            used_bytes: 0,
            counters: SimCounters::default(),
            handles: physical::Handles::default(),
            faults: SimFaults::default(),
        }
    }

    /// The calls planned to fail on this device: a handle that stays valid
    /// while a pool owns the device, so a test can plan failures for it.
    pub fn faults(&self) -> SimFaults {
        self.faults.clone()
    }

    /// `Err` if a test planned this call of `call` to fail.
    fn injected(&self, call: SimCall, op: &'static str) -> Result<()> {
        match self.faults.take(call) {
            Some(code) => Err(Error::driver(op, code, "a failure the test planned")),
            None => Ok(()),
        }
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Bytes of chunks and physical handles now.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Calls served so far.
    pub fn counters(&self) -> SimCounters {
        self.counters
    }

    /// Which devices of the host reach which.
    pub fn links(&self) -> &PeerLinks {
        &self.links
    }

    /// Read as device `peer` would, directly: every byte must lie in memory
    /// granted to `peer` (or be `peer`'s own), else
    /// [`Error::InvalidAddress`].
    pub fn read_as(&self, peer: u32, src: u64, out: &mut [u8]) -> Result<()> {
        let from = self.pieces(src, out.len() as u64)?;
        let granted = |p: &Piece| self.space.backings()[&p.backing].peers.contains(peer);
        if peer != self.ordinal && !from.iter().all(granted) {
            return Err(Error::InvalidAddress {
                addr: src,
                len: out.len() as u64,
                why: "not granted to that peer",
            });
        }
        if !self.config.backed {
            out.fill(0);
            return Ok(());
        }
        let mut pos = 0;
        for p in from {
            let data = self.bytes_of(p.backing);
            out[pos..pos + p.len]
                .copy_from_slice(&data[p.offset_in_backing..p.offset_in_backing + p.len]);
            pos += p.len;
        }
        Ok(())
    }

    fn checked_granularity(&self, op: &'static str) -> Result<u64> {
        let g = self.config.granularity_bytes;
        if g.is_power_of_two() {
            Ok(g)
        } else {
            Err(invalid_value(
                op,
                format!("granularity {g} is not a power of two"),
            ))
        }
    }

    /// Hand out `size` bytes of fresh address space, granularity-aligned,
    /// with one unused page after it so stray accesses past the end fail.
    fn take_address_space(&mut self, op: &'static str, size: u64) -> Result<u64> {
        let g = self.checked_granularity(op)?;
        let base = memcore::align_up(self.next_va, g);
        let next = base
            .and_then(|base| base.checked_add(size))
            .and_then(|end| end.checked_add(g))
            .and_then(|end| memcore::align_up(end, g));
        match (base, next) {
            (Some(base), Some(next)) => {
                self.next_va = next;
                Ok(base)
            }
            _ => Err(out_of_memory(op, "address space exhausted")),
        }
    }

    /// Take `size` bytes of capacity for a new handle or chunk.
    fn charge(&mut self, op: &'static str, size: u64) -> Result<Vec<u8>> {
        let free = self.free_bytes();
        if size > free {
            return Err(out_of_memory(
                op,
                format!("{size} bytes requested, {free} bytes free"),
            ));
        }
        let mut data = Vec::new();
        if self.config.backed {
            let len = usize::try_from(size)
                .map_err(|_| out_of_memory(op, "backing larger than host address space"))?;
            data.try_reserve_exact(len).map_err(|_| {
                out_of_memory(op, format!("host memory for {size} bytes of backing"))
            })?;
            data.resize(len, 0);
        }
        self.used_bytes += size;
        Ok(data)
    }

    fn free_bytes(&self) -> u64 {
        self.config
            .capacity_bytes
            .saturating_sub(self.config.context_reserved_bytes)
            .saturating_sub(self.used_bytes)
    }

    /// Split `[addr, addr + len)` into pieces of consecutive backings, or
    /// fail if any byte of it is not backed.
    fn pieces(&self, addr: u64, len: u64) -> Result<Vec<Piece>> {
        let invalid = |why| Error::InvalidAddress { addr, len, why };
        let end = addr
            .checked_add(len)
            .ok_or(invalid("range overflows the address space"))?;
        let mut pieces = Vec::new();
        let mut cursor = addr;
        while cursor < end {
            let (&start, backing) = self
                .space
                .backings()
                .range(..=cursor)
                .next_back()
                .filter(|(start, b)| *start + b.size > cursor)
                .ok_or(invalid("not mapped"))?;
            if !backing.accessible {
                return Err(invalid("mapped without access"));
            }
            let piece_end = end.min(start + backing.size);
            pieces.push(Piece {
                backing: start,
                offset_in_backing: (cursor - start) as usize,
                len: (piece_end - cursor) as usize,
            });
            cursor = piece_end;
        }
        Ok(pieces)
    }
}

impl DeviceMemory for SimDevice {
    fn name(&self) -> String {
        let backing = if self.config.backed {
            "backed"
        } else {
            "unbacked"
        };
        format!("sim ({} bytes, {backing})", self.config.capacity_bytes)
    }

    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    fn granularity(&self) -> u64 {
        self.config.granularity_bytes
    }

    fn supports_vmm(&self) -> bool {
        self.config.vmm
    }

    fn reserve(&mut self, size: u64) -> Result<u64> {
        if !self.config.vmm {
            return Err(Error::Unsupported("VMM is off on this simulated device"));
        }
        self.injected(SimCall::Reserve, "reserve")?;
        let g = self.checked_granularity("reserve")?;
        if size == 0 || size % g != 0 {
            return Err(invalid_value(
                "reserve",
                format!("size {size} is not a positive multiple of {g}"),
            ));
        }
        let base = self.take_address_space("reserve", size)?;
        self.space.reservations.insert(base, size);
        Ok(base)
    }

    fn release(&mut self, base: u64, size: u64) -> Result<()> {
        self.space.check_release(base, size)?;
        self.space.reservations.remove(&base);
        Ok(())
    }

    fn create_physical(&mut self, size: u64) -> Result<PhysicalHandle> {
        self.create_handle(size)
    }

    fn map_physical(&mut self, handle: PhysicalHandle, addr: u64) -> Result<()> {
        self.map_handle(handle, addr)
    }

    fn grant_access(&mut self, addr: u64, size: u64, devices: PeerSet) -> Result<()> {
        self.grant_handle_access(addr, size, devices)
    }

    fn unmap_physical(&mut self, addr: u64, size: u64) -> Result<()> {
        self.unmap_handle(addr, size)
    }

    fn release_physical(&mut self, handle: PhysicalHandle) -> Result<()> {
        self.release_handle(handle)
    }

    fn alloc_chunk(&mut self, size: u64) -> Result<u64> {
        self.injected(SimCall::AllocChunk, "alloc_chunk")?;
        if size == 0 {
            return Err(invalid_value("alloc_chunk", "zero bytes"));
        }
        // Check capacity before taking address space so a refused chunk
        // leaves no trace.
        let data = self.charge("alloc_chunk", size)?;
        let addr = match self.take_address_space("alloc_chunk", size) {
            Ok(addr) => addr,
            Err(e) => {
                self.used_bytes -= size;
                return Err(e);
            }
        };
        self.space.add_backing(
            addr,
            Backing {
                size,
                kind: BackingKind::Chunk,
                data,
                peers: PeerSet::NONE,
                accessible: true,
            },
        );
        self.counters.chunk_allocs += 1;
        Ok(addr)
    }

    fn free_chunk(&mut self, addr: u64, size: u64) -> Result<()> {
        self.injected(SimCall::FreeChunk, "free_chunk")?;
        match self.space.backings().get(&addr) {
            Some(b) if b.kind == BackingKind::Chunk && b.size == size => {
                self.space.remove_backing(addr);
                self.used_bytes -= size;
                self.counters.chunk_frees += 1;
                Ok(())
            }
            _ => Err(invalid_value(
                "free_chunk",
                format!("no chunk [{addr:#x}, +{size})"),
            )),
        }
    }

    fn copy_within(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        self.move_bytes(src, dst, len)?;
        self.counters.copies += 1;
        self.counters.bytes_copied += len;
        Ok(())
    }

    /// Copies as the CUDA backend does, with the same grouping (ctx's
    /// `copy` module): a run of independent moves reads every source before
    /// it writes any destination, as one launch of them may; a slide goes move after move, as its kernel promises;
    /// a move that overlaps itself goes in disjoint steps. A wrong grouping
    /// therefore copies wrong bytes here, where the tests see it. Every
    /// range is checked before any byte moves.
    fn copy_moves(&mut self, moves: &[BlockMove]) -> Result<()> {
        for m in moves {
            self.pieces(m.src, m.len)?;
            self.pieces(m.dst, m.len)?;
        }
        if self.config.backed {
            for batch in copy::batches(moves, MAX_MOVES) {
                match batch {
                    Batch::Together(run) => {
                        let mut staged = Vec::with_capacity(run.len());
                        for m in &run {
                            staged.push(self.gather(m.src, m.len)?);
                        }
                        for (m, bytes) in run.iter().zip(staged) {
                            let to = self.pieces(m.dst, m.len)?;
                            if let Some(bytes) = bytes {
                                self.scatter(&to, &bytes);
                            }
                        }
                    }
                    Batch::Slide(run) => {
                        if !is_slide(&run) {
                            return Err(Error::Inconsistent(format!(
                                "a batch planned as a slide is none: {run:?}"
                            )));
                        }
                        for m in &run {
                            self.move_bytes(m.src, m.dst, m.len)?;
                        }
                    }
                    Batch::Alone(m) => {
                        for step in copy::steps(m.src, m.dst, m.len, copy::SCRATCH_BYTES) {
                            let (CopyStep::Direct { src, dst, len }
                            | CopyStep::ViaScratch { src, dst, len }) = step;
                            self.move_bytes(src, dst, len)?;
                        }
                    }
                }
            }
        }
        self.counters.copies += moves.len() as u64;
        self.counters.bytes_copied += moves.iter().map(|m| m.len).sum::<u64>();
        Ok(())
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<()> {
        let to = self.pieces(dst, data.len() as u64)?;
        if self.config.backed {
            self.scatter(&to, data);
        }
        Ok(())
    }

    fn read(&mut self, src: u64, out: &mut [u8]) -> Result<()> {
        self.read_as(self.ordinal, src, out)
    }

    fn mem_info(&self) -> Result<MemInfo> {
        Ok(MemInfo {
            free: self.free_bytes(),
            total: self.config.capacity_bytes,
        })
    }

    fn synchronize(&mut self) -> Result<()> {
        self.counters.synchronizes += 1;
        Ok(())
    }
}

impl SimDevice {
    /// The bytes of `[addr, addr + len)`, `None` on an unbacked device.
    fn gather(&self, addr: u64, len: u64) -> Result<Option<Vec<u8>>> {
        let from = self.pieces(addr, len)?;
        if !self.config.backed {
            return Ok(None);
        }
        let mut staging = Vec::with_capacity(len as usize);
        for p in &from {
            let data = self.bytes_of(p.backing);
            staging.extend_from_slice(&data[p.offset_in_backing..p.offset_in_backing + p.len]);
        }
        Ok(Some(staging))
    }

    /// Memmove of `len` bytes, uncounted.
    fn move_bytes(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        let staged = self.gather(src, len)?;
        let to = self.pieces(dst, len)?;
        if let Some(bytes) = staged {
            self.scatter(&to, &bytes);
        }
        Ok(())
    }

    /// Copy `data` into the pieces, in order; their lengths sum to its length.
    fn scatter(&mut self, pieces: &[Piece], data: &[u8]) {
        let mut pos = 0;
        for p in pieces {
            if let Some(bytes) = self.bytes_of_mut(p.backing) {
                bytes[p.offset_in_backing..p.offset_in_backing + p.len]
                    .copy_from_slice(&data[pos..pos + p.len]);
            }
            pos += p.len;
        }
    }

    /// The bytes behind the backing that starts at `start`: its own, or
    /// its handle's. The caller found `start` by `pieces`.
    fn bytes_of(&self, start: u64) -> &[u8] {
        let backing = &self.space.backings()[&start];
        match backing.kind {
            BackingKind::Handle(number) => self.handles.bytes(number),
            BackingKind::Chunk => &backing.data,
        }
    }

    /// [`SimDevice::bytes_of`], to write.
    fn bytes_of_mut(&mut self, start: u64) -> Option<&mut [u8]> {
        let backing = self.space.backing_mut(start)?;
        match backing.kind {
            BackingKind::Handle(number) => self.handles.bytes_mut(number),
            BackingKind::Chunk => Some(&mut backing.data),
        }
    }
}

#[cfg(test)]
mod tests;
