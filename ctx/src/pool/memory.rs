//! The device memory a pool holds: a VMM reservation mapped from its start,
//! or a set of chunks. It grows by mapping (or allocating) at the top and
//! shrinks by giving back whole mappings (or chunks) from the top, and keeps
//! the heap's regions equal to what it holds.

use memcore::{Allocator, Extent, Heap, NewRegion};

use crate::call_tally::CallTally;
use crate::device::DeviceMemory;
use crate::peers::{self, PeerSet};
use crate::{Error, Result};

/// Device memory behind a pool's heap.
#[derive(Debug)]
pub(super) enum PoolMemory {
    /// One reservation of `reserved` bytes at `base`; `[base, base + mapped)`
    /// is mapped, as the run of `segments` (one per `map` call, ascending,
    /// contiguous), because the driver unmaps only whole mappings.
    Vmm {
        base: u64,
        reserved: u64,
        mapped: u64,
        segments: Vec<Extent>,
    },
    /// Chunks from `alloc_chunk`, sorted by address; `held` bytes in all.
    Chunks { chunks: Vec<Extent>, held: u64 },
}

impl PoolMemory {
    /// Reserve `reserve_bytes` (a positive multiple of the granularity) of
    /// address space for a VMM pool.
    pub(super) fn reserve<D: DeviceMemory>(device: &mut D, reserve_bytes: u64) -> Result<Self> {
        let base = device.reserve(reserve_bytes)?;
        Ok(Self::Vmm {
            base,
            reserved: reserve_bytes,
            mapped: 0,
            segments: Vec::new(),
        })
    }

    /// A chunk pool holding nothing yet.
    pub(super) fn chunks() -> Self {
        Self::Chunks {
            chunks: Vec::new(),
            held: 0,
        }
    }

    /// Device memory held, bytes: mapped, or allocated as chunks.
    pub(super) fn mapped_bytes(&self) -> u64 {
        match self {
            Self::Vmm { mapped, .. } => *mapped,
            Self::Chunks { held, .. } => *held,
        }
    }

    /// Virtual address space reserved, bytes (0 for chunks).
    pub(super) fn reserved_bytes(&self) -> u64 {
        match self {
            Self::Vmm { reserved, .. } => *reserved,
            Self::Chunks { .. } => 0,
        }
    }

    /// What the pool holds, `(address, bytes)` by address: each mapping (VMM,
    /// one physical handle each) or chunk.
    pub(super) fn held(&self) -> Vec<(u64, u64)> {
        self.pieces().iter().map(|e| (e.offset, e.size)).collect()
    }

    /// Device address of the reservation's first byte (VMM); `None` for
    /// chunks.
    pub(super) fn reservation_start(&self) -> Option<u64> {
        match self {
            Self::Vmm { base, .. } => Some(*base),
            Self::Chunks { .. } => None,
        }
    }

    /// How many more bytes may be held under `max_bytes` (and, for VMM, the
    /// reservation).
    pub(super) fn headroom(&self, max_bytes: u64) -> u64 {
        match self {
            Self::Vmm {
                reserved, mapped, ..
            } => max_bytes.min(*reserved).saturating_sub(*mapped),
            Self::Chunks { held, .. } => max_bytes.saturating_sub(*held),
        }
    }

    /// Bytes to add so that a `size`-byte block aligned to `align` fits:
    /// at the top of the mapped range (VMM), or in a fresh chunk, whose
    /// address the device aligns to at least 256 bytes. The heap answers
    /// exactly; not yet rounded to pages.
    pub(super) fn growth_for<A: Allocator>(
        &self,
        heap: &Heap<A>,
        size: u64,
        align: u64,
    ) -> memcore::Result<u64> {
        let at = match self {
            Self::Vmm { base, mapped, .. } => NewRegion::At(base + mapped),
            Self::Chunks { .. } => NewRegion::Anywhere,
        };
        heap.allocator().growth_needed(size, align, at)
    }

    /// Take `bytes` (a multiple of the granularity) more from the device,
    /// grant `peers` access to the new mapping (counted in `peer_access`),
    /// and hand it to the heap. A chunk pool has no peers (the pool refuses
    /// them when it is made).
    pub(super) fn grow<D: DeviceMemory, A: Allocator>(
        &mut self,
        device: &mut D,
        heap: &mut Heap<A>,
        bytes: u64,
        peers: PeerSet,
        peer_access: &mut CallTally,
    ) -> Result<()> {
        match self {
            Self::Vmm {
                base,
                mapped,
                segments,
                ..
            } => {
                let addr = *base + *mapped;
                device.map(addr, bytes)?;
                if let Err(e) = peers::grant(device, addr, bytes, peers, peer_access) {
                    // Nothing used the range yet; the grant's error is the
                    // one to report.
                    let _ = device.unmap(addr, bytes);
                    return Err(e);
                }
                if let Err(e) = heap.add_region(addr, bytes) {
                    // Best effort: the heap never saw the range, so it holds
                    // no data.
                    let _ = device.unmap(addr, bytes);
                    return Err(e.into());
                }
                segments.push(Extent::new(addr, bytes));
                *mapped += bytes;
            }
            Self::Chunks { chunks, held } => {
                if !peers.is_empty() {
                    return Err(Error::PeersNeedVmm);
                }
                let addr = device.alloc_chunk(bytes)?;
                if let Err(e) = heap.add_region(addr, bytes) {
                    let _ = device.free_chunk(addr, bytes);
                    return Err(e.into());
                }
                let at = chunks.partition_point(|c| c.offset < addr);
                chunks.insert(at, Extent::new(addr, bytes));
                *held += bytes;
            }
        }
        Ok(())
    }

    /// Give every whole mapping (or chunk) that is free at the top back to
    /// the device, repeating while that frees something. Synchronizes the
    /// device before the first unmap, since freed blocks may still be read
    /// by queued work. Returns the bytes given back.
    pub(super) fn shrink<D: DeviceMemory, A: Allocator>(
        &mut self,
        device: &mut D,
        heap: &mut Heap<A>,
    ) -> Result<u64> {
        let mut released = 0;
        let mut synchronized = false;
        while let Some(tail) = heap.release_tail(1) {
            let take = self.top_pieces_within(tail);
            let mut result = Ok(());
            if take > 0 && !synchronized {
                result = device.synchronize();
                synchronized = true;
            }
            let mut kept_end = tail.end();
            for _ in 0..take {
                if result.is_err() {
                    break;
                }
                match self.give_back_top(device) {
                    Ok(bytes) => {
                        kept_end -= bytes;
                        released += bytes;
                    }
                    Err(e) => result = Err(e),
                }
            }
            // The part of the tail below the last whole piece stays: back to
            // the heap, contiguous with the region it came from.
            if kept_end > tail.offset {
                heap.add_region(tail.offset, kept_end - tail.offset)?;
            }
            result?;
            if take == 0 {
                break;
            }
        }
        Ok(released)
    }

    /// Give everything back to the device, regardless of the heap (the pool
    /// is going away). Stops at the first failure.
    pub(super) fn release_all<D: DeviceMemory>(&mut self, device: &mut D) -> Result<()> {
        while !self.pieces().is_empty() {
            self.give_back_top(device)?;
        }
        if let Self::Vmm { base, reserved, .. } = *self {
            device.release(base, reserved)?;
        }
        Ok(())
    }

    fn pieces(&self) -> &[Extent] {
        match self {
            Self::Vmm { segments, .. } => segments,
            Self::Chunks { chunks, .. } => chunks,
        }
    }

    /// How many pieces, from the top down, lie wholly inside `tail` (a free
    /// range that ends at the top of the highest region).
    fn top_pieces_within(&self, tail: Extent) -> usize {
        let mut cut = tail.end();
        let mut count = 0;
        for piece in self.pieces().iter().rev() {
            if piece.offset < tail.offset || piece.end() != cut {
                break;
            }
            cut = piece.offset;
            count += 1;
        }
        count
    }

    /// Unmap (or free) the highest piece; returns its bytes. On failure
    /// nothing changes.
    fn give_back_top<D: DeviceMemory>(&mut self, device: &mut D) -> Result<u64> {
        let corrupt = || Error::from(memcore::Error::Corrupt("pool holds no device memory"));
        match self {
            Self::Vmm {
                mapped, segments, ..
            } => {
                let top = *segments.last().ok_or_else(corrupt)?;
                device.unmap(top.offset, top.size)?;
                segments.pop();
                *mapped -= top.size;
                Ok(top.size)
            }
            Self::Chunks { chunks, held } => {
                let top = *chunks.last().ok_or_else(corrupt)?;
                device.free_chunk(top.offset, top.size)?;
                chunks.pop();
                *held -= top.size;
                Ok(top.size)
            }
        }
    }
}
