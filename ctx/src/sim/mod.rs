//! A simulated device in host memory, for tests and trace replays.

mod physical;

use kernels::moves::{BlockMove, MAX_MOVES, SlideBlocksParams};

use crate::address_space::{self, AddressSpace};
use crate::copy::{self, Batch, CopyStep};
use crate::device::{DeviceMemory, MemInfo, PhysicalHandle};
use crate::peers::{PeerLinks, PeerSet};
use crate::{Error, Result};

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
    /// Whether the VMM calls (`reserve`, `map`, ...) work.
    pub vmm: bool,
    /// Whether memory holds data (host allocations) or only bookkeeping.
    pub backed: bool,
}

impl SimConfig {
    /// An H200 as measured: 150,109,880,320 bytes total, 2 MiB VMM pages,
    /// 552,402,944 bytes taken by a fresh context (its default-stack local
    /// memory included; see [`DeviceProfile`](crate::DeviceProfile)); unbacked, for trace
    /// replays.
    pub const fn h200_like() -> Self {
        Self {
            capacity_bytes: 150_109_880_320,
            granularity_bytes: 2 << 20,
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
    /// Successful `map` calls.
    pub maps: u64,
    /// Successful `unmap` calls.
    pub unmaps: u64,
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
    /// Successful `set_access` calls (peer grants).
    pub set_accesses: u64,
    /// Successful `create_physical` calls.
    pub physical_creates: u64,
    /// Successful `map_physical` calls.
    pub physical_maps: u64,
    /// Successful `grant_access` calls.
    pub access_grants: u64,
    /// Successful `unmap_physical` calls.
    pub physical_unmaps: u64,
    /// Successful `release_physical` calls.
    pub physical_releases: u64,
}

/// What a range of device memory is backed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BackingKind {
    /// Part of a reservation, made by `map`.
    Mapping,
    /// A plain allocation, made by `alloc_chunk`.
    Chunk,
    /// A physical handle mapped by `map_physical`; its bytes live with the
    /// handle, so they travel when it is mapped elsewhere.
    Handle(u64),
}

/// One mapping or chunk; `data` is empty on an unbacked device and for a
/// handle's mapping.
#[derive(Debug)]
struct Backing {
    size: u64,
    kind: BackingKind,
    data: Vec<u8>,
    /// Other devices granted access (`set_access`).
    peers: PeerSet,
    /// Whether the device may touch it: a handle's mapping is not until
    /// `grant_access`, as with the driver.
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
/// inside reservations, on granularity boundaries; only whole mappings can
/// be unmapped; a reservation is released only when nothing in it is mapped;
/// accesses must stay inside mapped memory or chunks; and mapped memory plus
/// chunks plus the context's own share never exceed the capacity.
///
/// With `backed: false` it keeps the bookkeeping only: writes are dropped and
/// reads return zeros, so replays of multi-GB traces fit in host RAM.
///
/// It is one device of a host whose devices reach each other as its
/// [`PeerLinks`] say ([`SimDevice::on_host`]; alone by default): a grant
/// ([`DeviceMemory::set_access`]) to a peer that cannot reach it is refused,
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
}

fn device_error(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Device {
        op,
        detail: detail.into(),
    }
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
    /// dev.map(base, 64 << 10)?;
    /// let mut out = [0; 4];
    /// assert!(dev.read_as(0, base, &mut out).is_err(), "not granted yet");
    /// dev.set_access(base, 64 << 10, PeerSet::of(&[0])?)?;
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
        }
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Bytes of mapped memory, chunks and physical handles now.
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
            Err(device_error(
                op,
                format!("CUDA_ERROR_INVALID_VALUE: granularity {g} is not a power of two"),
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
            _ => Err(device_error(
                op,
                "CUDA_ERROR_OUT_OF_MEMORY: address space exhausted",
            )),
        }
    }

    /// Take `size` bytes of capacity for a new mapping or chunk.
    fn charge(&mut self, op: &'static str, size: u64) -> Result<Vec<u8>> {
        let free = self.free_bytes();
        if size > free {
            return Err(device_error(
                op,
                format!("CUDA_ERROR_OUT_OF_MEMORY: {size} bytes requested, {free} bytes free"),
            ));
        }
        let mut data = Vec::new();
        if self.config.backed {
            let len = usize::try_from(size)
                .map_err(|_| device_error(op, "backing larger than host address space"))?;
            data.try_reserve_exact(len).map_err(|_| {
                device_error(op, format!("host memory for {size} bytes of backing"))
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
        let g = self.checked_granularity("reserve")?;
        if size == 0 || size % g != 0 {
            return Err(device_error(
                "reserve",
                format!("CUDA_ERROR_INVALID_VALUE: size {size} is not a positive multiple of {g}"),
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

    fn map(&mut self, addr: u64, size: u64) -> Result<()> {
        let g = self.checked_granularity("map")?;
        self.space.check_map(addr, size, g)?;
        let data = self.charge("map", size)?;
        self.space.add_backing(
            addr,
            Backing {
                size,
                kind: BackingKind::Mapping,
                data,
                peers: PeerSet::NONE,
                accessible: true,
            },
        );
        self.counters.maps += 1;
        Ok(())
    }

    fn set_access(&mut self, addr: u64, size: u64, peers: PeerSet) -> Result<()> {
        let starts = self
            .space
            .whole_run(addr, size, |b| {
                matches!(b.kind, BackingKind::Mapping | BackingKind::Handle(_))
            })
            .ok_or_else(|| {
                device_error(
                    "set_access",
                    format!(
                        "CUDA_ERROR_INVALID_VALUE: [{addr:#x}, +{size}) is not a run of whole mappings"
                    ),
                )
            })?;
        let peers = peers.without(self.ordinal);
        for peer in peers.iter() {
            if !self.links.can_access(peer, self.ordinal) {
                return Err(Error::PeerAccess {
                    device: self.ordinal,
                    peer,
                    why: if peer >= self.links.device_count() {
                        "no such device on this host"
                    } else {
                        "the host's links do not connect them"
                    },
                });
            }
        }
        for start in starts {
            if let Some(b) = self.space.backing_mut(start) {
                b.peers = b.peers.union(peers);
            }
        }
        self.counters.set_accesses += 1;
        Ok(())
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        let end = addr.saturating_add(size);
        let mut cursor = addr;
        let mut starts = Vec::new();
        while cursor < end {
            match self.space.backings().get(&cursor) {
                Some(b) if b.kind == BackingKind::Mapping && cursor + b.size <= end => {
                    starts.push(cursor);
                    cursor += b.size;
                }
                _ => break,
            }
        }
        if size == 0 || cursor != end {
            return Err(device_error(
                "unmap",
                format!(
                    "CUDA_ERROR_INVALID_VALUE: [{addr:#x}, +{size}) is not a run of whole mappings"
                ),
            ));
        }
        for start in starts {
            self.space.remove_backing(start);
        }
        self.used_bytes -= size;
        self.counters.unmaps += 1;
        Ok(())
    }

    fn alloc_chunk(&mut self, size: u64) -> Result<u64> {
        if size == 0 {
            return Err(device_error(
                "alloc_chunk",
                "CUDA_ERROR_INVALID_VALUE: zero bytes",
            ));
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
        match self.space.backings().get(&addr) {
            Some(b) if b.kind == BackingKind::Chunk && b.size == size => {
                self.space.remove_backing(addr);
                self.used_bytes -= size;
                self.counters.chunk_frees += 1;
                Ok(())
            }
            _ => Err(device_error(
                "free_chunk",
                format!("CUDA_ERROR_INVALID_VALUE: no chunk [{addr:#x}, +{size})"),
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
                        if !SlideBlocksParams::is_slide(&run) {
                            return Err(device_error(
                                "copy_moves",
                                format!("a batch planned as a slide is none: {run:?}"),
                            ));
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

    fn create_physical(&mut self, size: u64) -> Result<PhysicalHandle> {
        self.create_handle(size)
    }

    fn map_physical(&mut self, handle: PhysicalHandle, addr: u64) -> Result<()> {
        self.map_handle(handle, addr)
    }

    fn grant_access(&mut self, addr: u64, size: u64) -> Result<()> {
        self.grant_handle_access(addr, size)
    }

    fn unmap_physical(&mut self, addr: u64, size: u64) -> Result<()> {
        self.unmap_handle(addr, size)
    }

    fn release_physical(&mut self, handle: PhysicalHandle) -> Result<()> {
        self.release_handle(handle)
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
            BackingKind::Mapping | BackingKind::Chunk => &backing.data,
        }
    }

    /// [`SimDevice::bytes_of`], to write.
    fn bytes_of_mut(&mut self, start: u64) -> Option<&mut [u8]> {
        let backing = self.space.backing_mut(start)?;
        match backing.kind {
            BackingKind::Handle(number) => self.handles.bytes_mut(number),
            BackingKind::Mapping | BackingKind::Chunk => Some(&mut backing.data),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 64 << 10;

    #[test]
    fn addresses_start_high_and_are_page_aligned() {
        let mut dev = SimDevice::new(SimConfig::small(1 << 20));
        let base = dev.reserve(4 * PAGE).unwrap();
        assert!(base >= SIM_BASE_ADDRESS);
        assert_eq!(base % PAGE, 0);
        let chunk = dev.alloc_chunk(1000).unwrap();
        assert!(
            chunk >= base + 4 * PAGE,
            "chunk must not fall inside the reservation"
        );
    }

    #[test]
    fn capacity_counts_mappings_chunks_and_context() {
        let mut config = SimConfig::small(8 * PAGE);
        config.context_reserved_bytes = 2 * PAGE;
        let mut dev = SimDevice::new(config);
        let base = dev.reserve(8 * PAGE).unwrap();
        dev.map(base, 4 * PAGE).unwrap();
        assert_eq!(dev.mem_info().unwrap().free, 2 * PAGE);
        let chunk = dev.alloc_chunk(2 * PAGE).unwrap();
        assert_eq!(dev.mem_info().unwrap().free, 0);
        let err = dev.map(base + 4 * PAGE, PAGE).unwrap_err();
        assert!(
            matches!(err, Error::Device { op: "map", ref detail } if detail.contains("OUT_OF_MEMORY"))
        );
        assert!(dev.alloc_chunk(1).is_err());
        dev.free_chunk(chunk, 2 * PAGE).unwrap();
        dev.map(base + 4 * PAGE, PAGE).unwrap();
        assert_eq!(dev.used_bytes(), 5 * PAGE);
    }

    #[test]
    fn unmap_takes_whole_mappings_only() {
        let mut dev = SimDevice::new(SimConfig::small(1 << 20));
        let base = dev.reserve(4 * PAGE).unwrap();
        dev.map(base, 2 * PAGE).unwrap();
        dev.map(base + 2 * PAGE, PAGE).unwrap();
        assert!(dev.unmap(base, PAGE).is_err(), "half a mapping");
        assert!(dev.release(base, 4 * PAGE).is_err(), "still mapped");
        dev.unmap(base, 3 * PAGE).unwrap();
        assert_eq!(dev.used_bytes(), 0);
        dev.release(base, 4 * PAGE).unwrap();
    }

    #[test]
    fn map_rejects_ranges_outside_reservations_or_overlapping() {
        let mut dev = SimDevice::new(SimConfig::small(1 << 20));
        let base = dev.reserve(2 * PAGE).unwrap();
        assert!(dev.map(base + PAGE, 2 * PAGE).is_err());
        assert!(dev.map(base + 1, PAGE).is_err());
        dev.map(base, 2 * PAGE).unwrap();
        assert!(dev.map(base + PAGE, PAGE).is_err());
    }

    #[test]
    fn data_crosses_mapping_boundaries_and_copies_overlap() {
        let mut dev = SimDevice::new(SimConfig::small(1 << 20));
        let base = dev.reserve(2 * PAGE).unwrap();
        dev.map(base, PAGE).unwrap();
        dev.map(base + PAGE, PAGE).unwrap();
        let pattern: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        let at = base + PAGE - 100;
        dev.write(at, &pattern).unwrap();
        dev.copy_within(at, at + 50, 200).unwrap();
        let mut out = vec![0; 200];
        dev.read(at + 50, &mut out).unwrap();
        assert_eq!(out, pattern);
        let err = dev.read(base + 2 * PAGE - 10, &mut out).unwrap_err();
        assert!(matches!(err, Error::InvalidAddress { .. }));
    }

    #[test]
    fn a_batch_of_moves_runs_in_order() {
        use kernels::moves::BlockMove;
        let mut dev = SimDevice::new(SimConfig::small(1 << 20));
        let base = dev.reserve(PAGE).unwrap();
        dev.map(base, PAGE).unwrap();
        dev.write(base, b"abcdefgh").unwrap();
        // The second move reads what the first wrote; the third overlaps itself.
        let moves = [
            BlockMove {
                src: base,
                dst: base + 100,
                len: 4,
            },
            BlockMove {
                src: base + 100,
                dst: base + 200,
                len: 4,
            },
            BlockMove {
                src: base + 200,
                dst: base + 202,
                len: 4,
            },
        ];
        dev.copy_moves(&moves).unwrap();
        let mut out = [0; 6];
        dev.read(base + 200, &mut out).unwrap();
        assert_eq!(&out, b"ababcd");
        assert_eq!(dev.counters().copies, 3);
    }

    #[test]
    fn batched_moves_copy_what_memmove_one_by_one_copies() {
        let mut dev = SimDevice::new(SimConfig::small(1 << 20));
        let base = dev.reserve(PAGE).unwrap();
        dev.map(base, PAGE).unwrap();
        let original: Vec<u8> = (0..PAGE)
            .map(|i| (i as u8).wrapping_mul(37) ^ 0x5a)
            .collect();
        dev.write(base, &original).unwrap();
        let mv = |src: u64, dst: u64, len: u64| BlockMove {
            src: base + src,
            dst: base + dst,
            len,
        };
        // A slide of aligned blocks, relocations into far holes (independent),
        // an unaligned chain and a move over itself.
        let mut moves: Vec<BlockMove> = (1..20).map(|k| mv(512 * k, 512 * k - 256, 480)).collect();
        moves.extend((0..10).map(|k| mv(20_000 + 300 * k, 40_000 + 300 * k, 200)));
        moves.extend((1..5).map(|k| mv(50_000 + 100 * k, 50_000 + 100 * (k - 1), 100)));
        moves.push(mv(60_000, 60_003, 1000));
        let mut expected = original.clone();
        for m in &moves {
            let (s, d) = ((m.src - base) as usize, (m.dst - base) as usize);
            expected.copy_within(s..s + m.len as usize, d);
        }
        dev.copy_moves(&moves).unwrap();
        let mut out = vec![0; PAGE as usize];
        dev.read(base, &mut out).unwrap();
        assert!(
            out == expected,
            "batched copies differ from memmove one by one"
        );
        assert_eq!(dev.counters().copies, moves.len() as u64);
        // A bad range anywhere in the list is refused before any byte moves.
        let before = out.clone();
        let err = dev
            .copy_moves(&[mv(0, 256, 16), mv(PAGE - 8, 0, 16)])
            .unwrap_err();
        assert!(matches!(err, Error::InvalidAddress { .. }), "{err:?}");
        dev.read(base, &mut out).unwrap();
        assert!(out == before, "a refused batch changed memory");
    }

    #[test]
    fn unbacked_device_keeps_bookkeeping_only() {
        let mut dev = SimDevice::new(SimConfig::h200_like());
        let info = dev.mem_info().unwrap();
        assert_eq!(info.total - info.free, 552_402_944);
        let base = dev.reserve(64 << 30).unwrap();
        dev.map(base, 64 << 30).unwrap();
        dev.write(base, &[1, 2, 3]).unwrap();
        let mut out = [9; 3];
        dev.read(base, &mut out).unwrap();
        assert_eq!(out, [0; 3]);
        assert!(dev.read(base + (64 << 30), &mut out).is_err());
    }

    #[test]
    fn vmm_off_refuses_reservations() {
        let mut config = SimConfig::small(1 << 20);
        config.vmm = false;
        let mut dev = SimDevice::new(config);
        assert!(matches!(dev.reserve(PAGE), Err(Error::Unsupported(_))));
        assert!(dev.alloc_chunk(PAGE).is_ok());
    }
}
