//! [`PrivatePools`]: the memory of CUDA graphs, kept apart from the device's own pool.
//!
//! A graph bakes the addresses it used into its replays, so memory a graph used is
//! never handed to anyone outside its pool until the pool is released. A private pool
//! takes device memory from the backing in *segments* (whole multiples of
//! [`SEGMENT_BYTES`]) and places blocks inside them with memcore's TLSF, one heap per
//! stream (a block freed on one stream is reused by that stream only, as PyTorch's own
//! pools do). Graphs sharing a pool count in its use count; at zero the pool is
//! *released*: it places nothing more, and each segment goes back to the backing once
//! no block in it lives (after a device-wide wait, since a replay may still run).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

use memcore::{Allocation, Allocator, Extent, Tlsf};

use crate::error::{Error, Result};
use crate::pool_id::PoolId;
use memcore::pytorch::MIN_BLOCK_BYTES;

/// A private pool takes device memory in multiples of this, bytes (one VMM page: the
/// smallest unit a device maps).
pub const SEGMENT_BYTES: u64 = memcore::PAGE_BYTES;

/// The bytes of the segment that a block of `bytes` needs; `None` on overflow.
pub(super) fn segment_bytes(bytes: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(SEGMENT_BYTES)
}

/// Device memory a private pool took from the backing.
#[derive(Debug)]
pub(super) struct Segment<T, S> {
    /// What names it to the backing.
    pub(super) token: T,
    /// Its bytes.
    pub(super) bytes: u64,
    /// The stream whose heap places blocks in it.
    pub(super) stream: S,
    /// Blocks (live, or freed and waiting for streams) that overlap it.
    holders: u32,
}

#[derive(Debug)]
struct PrivatePool<T, S> {
    /// Graphs (and `MemPool`s) using the pool; at zero it is released.
    use_count: u32,
    /// Allocations are diverted to it now (between begin and end).
    diverting: bool,
    /// By address.
    segments: BTreeMap<u64, Segment<T, S>>,
    /// Free space inside the segments, per stream; dropped at release.
    heaps: HashMap<S, Tlsf>,
    /// Blocks handed out and not freed, by address.
    live: BTreeSet<u64>,
    /// Requests of the device's own pool that found no memory may be placed here.
    use_on_oom: bool,
    /// Each block's bytes are whole segments ([`SEGMENT_BYTES`] multiples): since
    /// segments are such multiples too and TLSF places a block at the start of a free
    /// range, no two blocks share a segment's page.
    no_split: bool,
}

impl<T, S> PrivatePool<T, S> {
    fn new() -> Self {
        Self {
            use_count: 1,
            diverting: false,
            segments: BTreeMap::new(),
            heaps: HashMap::new(),
            live: BTreeSet::new(),
            use_on_oom: false,
            no_split: false,
        }
    }

    fn released(&self) -> bool {
        self.use_count == 0
    }

    /// The segments `[ptr, ptr + bytes)` overlaps.
    fn overlapping(&mut self, ptr: u64, bytes: u64) -> impl Iterator<Item = &mut Segment<T, S>> {
        let first = self
            .segments
            .range(..=ptr)
            .next_back()
            .map_or(ptr, |(start, _)| *start);
        self.segments
            .range_mut(first..ptr.saturating_add(bytes))
            .filter(move |(start, s)| **start + s.bytes > ptr)
            .map(|(_, s)| s)
    }
}

/// Every private pool of one device.
#[derive(Debug)]
pub(super) struct PrivatePools<T, S> {
    device: i32,
    pools: HashMap<PoolId, PrivatePool<T, S>>,
}

impl<T: Copy, S: Copy + Eq + Hash> PrivatePools<T, S> {
    pub(super) fn new(device: i32) -> Self {
        Self {
            device,
            pools: HashMap::new(),
        }
    }

    fn unknown(&self, pool: PoolId) -> Error {
        Error::UnknownPool {
            device: self.device,
            pool: pool.pair(),
        }
    }

    fn state_error(&self, pool: PoolId, why: &'static str) -> Error {
        Error::PoolState {
            device: self.device,
            pool: pool.pair(),
            why,
        }
    }

    fn get(&self, pool: PoolId) -> Result<&PrivatePool<T, S>> {
        self.pools.get(&pool).ok_or_else(|| self.unknown(pool))
    }

    fn get_mut(&mut self, pool: PoolId) -> Result<&mut PrivatePool<T, S>> {
        let unknown = self.unknown(pool);
        self.pools.get_mut(&pool).ok_or(unknown)
    }

    /// One more user of `pool`, made if new (`createOrIncrefPool`).
    pub(super) fn incref(&mut self, pool: PoolId) -> Result<()> {
        match self.pools.get_mut(&pool) {
            None => {
                self.pools.insert(pool, PrivatePool::new());
                Ok(())
            }
            Some(p) if p.released() => Err(self.state_error(pool, "was released already")),
            Some(p) => {
                p.use_count += 1;
                Ok(())
            }
        }
    }

    /// Allocations go to `pool` from now on (`beginAllocateToPool`), which counts as
    /// one more user.
    pub(super) fn begin(&mut self, pool: PoolId) -> Result<()> {
        if self.pools.get(&pool).is_some_and(|p| p.diverting) {
            return Err(self.state_error(pool, "is being allocated to already"));
        }
        self.incref(pool)?;
        self.get_mut(pool)?.diverting = true;
        Ok(())
    }

    /// Allocations stop going to `pool` (`endAllocateToPool`).
    pub(super) fn end(&mut self, pool: PoolId) -> Result<()> {
        let not_diverting = self.state_error(pool, "is not being allocated to");
        let p = self.get_mut(pool)?;
        if !p.diverting {
            return Err(not_diverting);
        }
        p.diverting = false;
        Ok(())
    }

    /// One user fewer (`releasePool`); at none the pool places nothing more.
    pub(super) fn release(&mut self, pool: PoolId) -> Result<()> {
        let released = self.state_error(pool, "was released already");
        let p = self.get_mut(pool)?;
        if p.released() {
            return Err(released);
        }
        p.use_count -= 1;
        if p.released() {
            p.diverting = false;
            p.heaps.clear();
        }
        Ok(())
    }

    /// Whether `pool` serves the device pool's requests that found no memory.
    pub(super) fn set_use_on_oom(&mut self, pool: PoolId, on: bool) -> Result<()> {
        self.get_mut(pool)?.use_on_oom = on;
        Ok(())
    }

    /// `pool` hands each block whole segments of its own from now on.
    pub(super) fn set_no_split(&mut self, pool: PoolId) -> Result<()> {
        self.get_mut(pool)?.no_split = true;
        Ok(())
    }

    /// The bytes a block of `bytes` takes in `pool`: `bytes`, or whole segments in a
    /// pool that splits none; `None` on overflow.
    pub(super) fn block_bytes(&self, pool: PoolId, bytes: u64) -> Option<u64> {
        if self.pools.get(&pool).is_some_and(|p| p.no_split) {
            segment_bytes(bytes)
        } else {
            Some(bytes)
        }
    }

    /// The live pools that serve the device pool's requests that found no memory.
    pub(super) fn used_on_oom(&self) -> Vec<PoolId> {
        let mut pools: Vec<PoolId> = self
            .pools
            .iter()
            .filter(|(_, p)| p.use_on_oom && !p.released())
            .map(|(id, _)| *id)
            .collect();
        pools.sort_unstable_by_key(|id| id.pair());
        pools
    }

    /// The pool's use count (`getPoolUseCount`); 0 for a pool the device lacks.
    pub(super) fn use_count(&self, pool: PoolId) -> u32 {
        self.pools.get(&pool).map_or(0, |p| p.use_count)
    }

    /// Places `bytes` for `stream` in `pool`'s free space; `None` if no segment of the
    /// stream holds that much.
    pub(super) fn try_place(
        &mut self,
        pool: PoolId,
        stream: S,
        bytes: u64,
    ) -> Result<Option<Allocation>> {
        let released = self.state_error(pool, "was released already");
        let p = self.get_mut(pool)?;
        if p.released() {
            return Err(released);
        }
        let Some(heap) = p.heaps.get_mut(&stream) else {
            return Ok(None);
        };
        let allocation = match heap.allocate(bytes, MIN_BLOCK_BYTES) {
            Ok(allocation) => allocation,
            Err(memcore::Error::OutOfMemory { .. }) => return Ok(None),
            Err(error) => return Err(ctx::Error::from(error).into()),
        };
        p.live.insert(allocation.offset);
        for segment in p.overlapping(allocation.offset, bytes) {
            segment.holders += 1;
        }
        Ok(Some(allocation))
    }

    /// Adds device memory `[ptr, ptr + bytes)` to `pool` for `stream`.
    pub(super) fn add_segment(
        &mut self,
        pool: PoolId,
        stream: S,
        token: T,
        ptr: u64,
        bytes: u64,
    ) -> Result<()> {
        let p = self.get_mut(pool)?;
        let heap = p.heaps.entry(stream).or_default();
        heap.add_region(ptr, bytes).map_err(ctx::Error::from)?;
        p.segments.insert(
            ptr,
            Segment {
                token,
                bytes,
                stream,
                holders: 0,
            },
        );
        Ok(())
    }

    /// The block at `ptr` was freed by its user (it may still wait for streams).
    pub(super) fn note_freed(&mut self, pool: PoolId, ptr: u64) {
        if let Some(p) = self.pools.get_mut(&pool) {
            p.live.remove(&ptr);
        }
    }

    /// A freed block of `pool` is back: its space is free in the pool (or, once the
    /// pool is released, its segments may go).
    pub(super) fn give_back(
        &mut self,
        pool: PoolId,
        stream: S,
        allocation: Allocation,
        bytes: u64,
    ) -> Result<()> {
        let p = self.get_mut(pool)?;
        if let Some(heap) = p.heaps.get_mut(&stream) {
            heap.free(allocation).map_err(ctx::Error::from)?;
        }
        for segment in p.overlapping(allocation.offset, bytes) {
            segment.holders = segment.holders.saturating_sub(1);
        }
        Ok(())
    }

    /// Whether some released pool has a segment that no block holds.
    pub(super) fn has_releasable(&self) -> bool {
        self.pools
            .values()
            .any(|p| p.released() && p.segments.values().any(|s| s.holders == 0))
    }

    /// Takes every segment of a released pool that no block holds, and forgets a
    /// released pool with no segment left: `(address, segment)` pairs to give back.
    pub(super) fn take_releasable(&mut self) -> Vec<(PoolId, u64, Segment<T, S>)> {
        let mut out = Vec::new();
        for (id, p) in self.pools.iter_mut().filter(|(_, p)| p.released()) {
            let free: Vec<u64> = p
                .segments
                .iter()
                .filter(|(_, s)| s.holders == 0)
                .map(|(a, _)| *a)
                .collect();
            for addr in free {
                if let Some(segment) = p.segments.remove(&addr) {
                    out.push((*id, addr, segment));
                }
            }
        }
        self.pools
            .retain(|_, p| !(p.released() && p.segments.is_empty()));
        out
    }

    /// The blocks of `pool` handed out and not freed.
    pub(super) fn live(&self, pool: PoolId) -> Result<&BTreeSet<u64>> {
        Ok(&self.get(pool)?.live)
    }

    /// Lays `pool` out anew with exactly `blocks` (`(address, bytes, stream)`, any
    /// order) in use, dropping every other placement: what restoring a checkpoint
    /// does. Returns the new allocation of each block, in the order given.
    pub(super) fn rebuild(
        &mut self,
        pool: PoolId,
        blocks: &[(u64, u64, S)],
    ) -> Result<Vec<Allocation>> {
        let p = self.get_mut(pool)?;
        let mut by_stream: HashMap<S, Vec<(usize, Extent)>> = HashMap::new();
        for (i, (ptr, bytes, stream)) in blocks.iter().enumerate() {
            by_stream
                .entry(*stream)
                .or_default()
                .push((i, Extent::new(*ptr, *bytes)));
        }
        let mut out = vec![None; blocks.len()];
        for (stream, heap) in &mut p.heaps {
            let mut used = by_stream.remove(stream).unwrap_or_default();
            used.sort_unstable_by_key(|(_, e)| e.offset);
            let extents: Vec<Extent> = used.iter().map(|(_, e)| *e).collect();
            let allocations = heap.rebuild(&extents).map_err(ctx::Error::from)?;
            for ((i, _), allocation) in used.iter().zip(allocations) {
                out[*i] = Some(allocation);
            }
        }
        if !by_stream.is_empty() {
            return Err(ctx::Error::Memcore(memcore::Error::Corrupt(
                "a checkpoint names a stream the private pool has no memory for",
            ))
            .into());
        }
        p.live = blocks.iter().map(|(ptr, _, _)| *ptr).collect();
        for segment in p.segments.values_mut() {
            segment.holders = 0;
        }
        for (ptr, bytes, _) in blocks {
            for segment in p.overlapping(*ptr, *bytes) {
                segment.holders += 1;
            }
        }
        out.into_iter()
            .map(|a| {
                a.ok_or_else(|| {
                    ctx::Error::Memcore(memcore::Error::Corrupt(
                        "a rebuilt private pool lost a block",
                    ))
                    .into()
                })
            })
            .collect()
    }

    /// Every segment with its pool, by address within each pool.
    pub(super) fn segments(&self) -> impl Iterator<Item = (PoolId, u64, &Segment<T, S>)> {
        self.pools
            .iter()
            .flat_map(|(id, p)| p.segments.iter().map(move |(a, s)| (*id, *a, s)))
    }
}
