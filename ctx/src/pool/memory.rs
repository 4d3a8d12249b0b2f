//! The device memory a pool holds: a VMM reservation mapped from its start,
//! or a set of chunks. It grows by mapping (or allocating) at the top and
//! shrinks by giving back whole mappings (or chunks) from the top, and keeps
//! the heap's regions equal to what it holds. Every mapping is made and
//! given back through the pool's [`Mapper`].

use memcore::{Allocator, Extent, Heap, NewRegion};

use crate::device::DeviceMemory;
use crate::mapping::{Mapper, Physical, Refused};
use crate::{Error, Result};

/// Device memory behind a pool's heap.
#[derive(Debug)]
pub(super) enum PoolMemory {
    /// One reservation of `reserved` bytes at `base`.
    Vmm {
        base: u64,
        reserved: u64,
        /// `[base, base + mapped)` is mapped: `mapped` is the sum of the
        /// `segments`' bytes, and the heap's regions are exactly that range.
        mapped: u64,
        /// One handle per growth, mapped one after another from `base` in
        /// ascending order (the driver unmaps only whole mappings, so a
        /// shrink gives back whole segments from the top).
        segments: Vec<Physical>,
        /// Handles a failed rollback or release left on the device, outside
        /// the heap; given back with the rest when the pool goes.
        stranded: Vec<Physical>,
    },
    /// Chunks from `alloc_chunk`, sorted by address; `held` bytes in all.
    Chunks { chunks: Vec<Extent>, held: u64 },
}

impl PoolMemory {
    /// Reserve `reserve_bytes` (a positive multiple of the granularity) of
    /// address space for a VMM pool.
    pub(super) fn reserve<D: DeviceMemory>(
        device: &mut D,
        mapper: &mut Mapper,
        reserve_bytes: u64,
    ) -> Result<Self> {
        let base = mapper.reserve(device, reserve_bytes)?;
        Ok(Self::Vmm {
            base,
            reserved: reserve_bytes,
            mapped: 0,
            segments: Vec::new(),
            stranded: Vec::new(),
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
        match self {
            Self::Vmm { segments, .. } => segments
                .iter()
                .filter_map(|s| Some((s.mapped_at()?, s.bytes())))
                .collect(),
            Self::Chunks { chunks, .. } => chunks.iter().map(|e| (e.offset, e.size)).collect(),
        }
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

    /// Take `bytes` (a multiple of the granularity) more from the device
    /// (for VMM: one handle created, mapped at the top and granted to the
    /// device and the mapper's peers) and hand it to the heap. On failure
    /// nothing changes (bar what a failed rollback strands). A chunk pool
    /// has no peers (the pool refuses them when it is made).
    pub(super) fn grow<D: DeviceMemory, A: Allocator>(
        &mut self,
        device: &mut D,
        heap: &mut Heap<A>,
        mapper: &mut Mapper,
        bytes: u64,
    ) -> Result<()> {
        match self {
            Self::Vmm {
                base,
                mapped,
                segments,
                stranded,
                ..
            } => {
                let addr = *base + *mapped;
                let physical = match mapper.create_mapped(device, bytes, addr) {
                    Ok(physical) => physical,
                    Err(Refused { error, left }) => {
                        stranded.extend(left);
                        return Err(*error);
                    }
                };
                if let Err(e) = heap.add_region(addr, bytes) {
                    // The heap never saw the range, so it holds no data.
                    if let Err(Refused { left, .. }) = mapper.release(device, physical) {
                        stranded.extend(left);
                    }
                    return Err(e.into());
                }
                segments.push(physical);
                *mapped += bytes;
            }
            Self::Chunks { chunks, held } => {
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
        mapper: &mut Mapper,
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
                let (gone, given) = self.give_back_top(device, mapper);
                kept_end -= gone;
                match given {
                    Ok(()) => released += gone,
                    Err(e) => result = Err(e),
                }
            }
            // The part of the tail below the last piece that left stays:
            // back to the heap, contiguous with the region it came from.
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
    /// is going away): what failed rollbacks stranded, every piece, then the
    /// reservation. Stops at the first failure.
    pub(super) fn release_all<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        mapper: &mut Mapper,
    ) -> Result<()> {
        if let Self::Vmm { stranded, .. } = self {
            while let Some(physical) = stranded.pop() {
                if let Err(Refused { error, left }) = mapper.release(device, physical) {
                    stranded.extend(left);
                    return Err(*error);
                }
            }
        }
        while self.pieces() > 0 {
            self.give_back_top(device, mapper).1?;
        }
        if let Self::Vmm { base, reserved, .. } = *self {
            device.release(base, reserved)?;
        }
        Ok(())
    }

    /// How many pieces (mappings or chunks) the pool holds.
    fn pieces(&self) -> usize {
        match self {
            Self::Vmm { segments, .. } => segments.len(),
            Self::Chunks { chunks, .. } => chunks.len(),
        }
    }

    /// How many pieces, from the top down, lie wholly inside `tail` (a free
    /// range that ends at the top of the highest region).
    fn top_pieces_within(&self, tail: Extent) -> usize {
        match self {
            Self::Vmm { segments, .. } => count_top(
                segments
                    .iter()
                    .rev()
                    .map(|s| Extent::new(s.mapped_at().unwrap_or(0), s.bytes())),
                tail,
            ),
            Self::Chunks { chunks, .. } => count_top(chunks.iter().rev().copied(), tail),
        }
    }

    /// Unmap and release (or free) the highest piece. Returns the bytes that
    /// left the pool's range and the outcome: on failure nothing leaves,
    /// unless the unmap went through and the release did not, in which
    /// case the handle is stranded (kept for the end) and its bytes left
    /// the range all the same.
    fn give_back_top<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        mapper: &mut Mapper,
    ) -> (u64, Result<()>) {
        let corrupt = || Error::from(memcore::Error::Corrupt("pool holds no device memory"));
        match self {
            Self::Vmm {
                mapped,
                segments,
                stranded,
                ..
            } => {
                let Some(top) = segments.pop() else {
                    return (0, Err(corrupt()));
                };
                match mapper.release(device, top) {
                    Ok(()) => {}
                    Err(Refused {
                        error,
                        left: Some(left),
                    }) if left.mapped_at().is_some() => {
                        segments.push(left);
                        return (0, Err(*error));
                    }
                    Err(Refused { error, left }) => {
                        stranded.extend(left);
                        *mapped -= top.bytes();
                        return (top.bytes(), Err(*error));
                    }
                }
                *mapped -= top.bytes();
                (top.bytes(), Ok(()))
            }
            Self::Chunks { chunks, held } => {
                let Some(&top) = chunks.last() else {
                    return (0, Err(corrupt()));
                };
                if let Err(e) = device.free_chunk(top.offset, top.size) {
                    return (0, Err(e));
                }
                chunks.pop();
                *held -= top.size;
                (top.size, Ok(()))
            }
        }
    }
}

/// How many of `pieces` (from the top down) lie wholly inside `tail` and
/// end where the one above begins.
fn count_top(pieces: impl Iterator<Item = Extent>, tail: Extent) -> usize {
    let mut cut = tail.end();
    let mut count = 0;
    for piece in pieces {
        if piece.offset < tail.offset || piece.end() != cut {
            break;
        }
        cut = piece.offset;
        count += 1;
    }
    count
}
