//! What a pool keeps behind its lock, and the allocation path: fit in the
//! heap; if that fails, compact and/or grow as the policy says.

use std::time::{Duration, Instant};

use memcore::{BlockFlags, CompactionPlan, GrowthRule, Handle, Heap, Tlsf};

use super::memory::PoolMemory;
use super::{CompactionPolicy, CompactionReport, Growth, PoolConfig, PoolStats};
use memcore::moves::BlockMove;

use crate::device::{DeviceMemory, StreamId};
use crate::mapping::Mapper;
use crate::{Error, Result};

/// A pool's state; every field is guarded by the pool's one mutex.
#[derive(Debug)]
pub(super) struct PoolState<D: DeviceMemory> {
    pub(super) device: D,
    pub(super) config: PoolConfig,
    heap: Heap<Tlsf>,
    memory: PoolMemory,
    /// Device page, bytes; a power of two.
    granularity: u64,
    /// How each growth is sized: the configuration's step rule over
    /// `granularity`-byte pages (the divisor only for VMM).
    growth: GrowthRule,
    /// Stream of each live block that was allocated with one, indexed by
    /// handle slot; `None` for the rest.
    streams: Vec<Option<StreamId>>,
    peak_mapped_bytes: u64,
    bytes_moved: u64,
    compactions: u64,
    grows: u64,
    shrinks: u64,
    /// Makes every mapping, granted to the device and the configured
    /// peers, and counts the calls.
    mapper: Mapper,
    /// Host time spent making compaction plans.
    plan_time: Duration,
    /// Host time spent in the device's copies of compactions, from handing
    /// the moves over until they were done.
    copy_time: Duration,
}

/// What executing one compaction plan did.
struct Executed {
    moves: usize,
    bytes: u64,
    copy_time: Duration,
}

impl<D: DeviceMemory> PoolState<D> {
    pub(super) fn new(mut device: D, config: PoolConfig) -> Result<Self> {
        let granularity = device.granularity();
        if !granularity.is_power_of_two() {
            return Err(Error::Unsupported(
                "the device's page is not a power of two",
            ));
        }
        if config.growth == Growth::Chunks && !config.peers.without(device.ordinal()).is_empty() {
            return Err(Error::PeersNeedVmm);
        }
        let mut mapper = Mapper::new(device.ordinal(), config.peers)?;
        let memory = match config.growth {
            Growth::Vmm => {
                if !device.supports_vmm() {
                    return Err(Error::Unsupported("Growth::Vmm on a device without VMM"));
                }
                let reserve = memcore::align_up(config.reserve_bytes, granularity)
                    .filter(|r| *r > 0)
                    .ok_or(Error::InvalidConfig(
                        "Growth::Vmm needs reserve_bytes between 1 and 2^64 - page",
                    ))?;
                PoolMemory::reserve(&mut device, &mut mapper, reserve)?
            }
            Growth::Chunks => PoolMemory::chunks(),
        };
        let growth = GrowthRule {
            page_bytes: granularity,
            min_bytes: config.min_growth_bytes,
            divisor: match config.growth {
                Growth::Vmm => config.growth_divisor,
                Growth::Chunks => 0,
            },
        };
        Ok(Self {
            device,
            config,
            heap: Heap::new(Tlsf::new()),
            memory,
            granularity,
            growth,
            streams: Vec::new(),
            peak_mapped_bytes: 0,
            bytes_moved: 0,
            compactions: 0,
            grows: 0,
            shrinks: 0,
            mapper,
            plan_time: Duration::ZERO,
            copy_time: Duration::ZERO,
        })
    }

    #[inline]
    pub(super) fn allocate(
        &mut self,
        size: u64,
        align: u64,
        stream: Option<StreamId>,
    ) -> Result<Handle> {
        let handle = match self.heap.allocate(size, align, BlockFlags::empty()) {
            Ok(handle) => handle,
            Err(memcore::Error::OutOfMemory { .. }) => self.allocate_slow(size, align)?,
            Err(e) => return Err(e.into()),
        };
        if let Some(stream) = stream {
            let slot = handle.slot() as usize;
            if slot >= self.streams.len() {
                self.streams.resize(slot + 1, None);
            }
            self.streams[slot] = Some(stream);
        }
        Ok(handle)
    }

    /// The request did not fit: compact and/or grow, as the policy says.
    #[cold]
    fn allocate_slow(&mut self, size: u64, align: u64) -> Result<Handle> {
        use CompactionPolicy::{BeforeGrow, Never, SlideBeforeGrow, WhenGrowFails};
        let policy = self.config.compaction;
        let mut found = match policy {
            Never | WhenGrowFails => self.grow_and_fit(size, align)?,
            BeforeGrow | SlideBeforeGrow => self.make_room_and_fit(size, align)?,
        };
        if found.is_none() && policy == SlideBeforeGrow {
            // Free space brought down to the top leaves the least to grow.
            self.compact()?;
        }
        if found.is_none() {
            found = match policy {
                Never => None,
                WhenGrowFails => self.make_room_and_fit(size, align)?,
                BeforeGrow | SlideBeforeGrow => self.grow_and_fit(size, align)?,
            };
        }
        if found.is_none() && policy != Never {
            found = self.grow_to_limit_and_make_room(size, align)?;
        }
        found.ok_or_else(|| self.out_of_memory(size, align))
    }

    /// `Some` if the heap has a block for the request now.
    fn try_fit(&mut self, size: u64, align: u64) -> Result<Option<Handle>> {
        match self.heap.allocate(size, align, BlockFlags::empty()) {
            Ok(handle) => Ok(Some(handle)),
            Err(memcore::Error::OutOfMemory { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Grow as memcore's [`GrowthRule`] sizes it for what the request
    /// needs, then fit; `None` if growth is capped or the device is full.
    fn grow_and_fit(&mut self, size: u64, align: u64) -> Result<Option<Handle>> {
        let needed = match self.memory.growth_for(&self.heap, size, align) {
            Ok(needed) => needed,
            // Past the address space: no growth can hold it.
            Err(memcore::Error::Overflow { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let held = self.memory.mapped_bytes();
        let room = self.memory.headroom(self.config.max_bytes);
        let Some(step) = self.growth.step(needed, held, room) else {
            return Ok(None);
        };
        // A step the device refuses shrinks to what the request needs.
        let grown =
            self.try_grow(step.bytes)? || (step.bytes > step.need && self.try_grow(step.need)?);
        if !grown {
            return Ok(None);
        }
        // The heap said how much it needs, exactly: a refusal now is a
        // broken promise, not a reason to grow again.
        self.try_fit(size, align)?
            .map(Some)
            .ok_or(Error::from(memcore::Error::Corrupt(
                "the heap refused a request after growing by what it asked for",
            )))
    }

    /// Compact just enough for the request, then fit; `None` if no plan can
    /// make room.
    fn make_room_and_fit(&mut self, size: u64, align: u64) -> Result<Option<Handle>> {
        let start = Instant::now();
        let planned = self.heap.plan_room(size, align);
        self.plan_time += start.elapsed();
        let plan = match planned {
            Ok(plan) => plan,
            Err(memcore::Error::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        self.execute(plan)?;
        self.try_fit(size, align)
    }

    /// Last resort of the compacting policies: take whatever headroom is
    /// left (VMM only, where it extends the top region), then compact.
    fn grow_to_limit_and_make_room(&mut self, size: u64, align: u64) -> Result<Option<Handle>> {
        if self.config.growth != Growth::Vmm {
            return Ok(None);
        }
        let device_free = self.device.mem_info()?.free;
        let page_mask = !(self.granularity - 1);
        let bytes = self.memory.headroom(self.config.max_bytes).min(device_free) & page_mask;
        if bytes == 0 || self.heap.stats().free_bytes.saturating_add(bytes) < size {
            return Ok(None);
        }
        if !self.try_grow(bytes)? {
            return Ok(None);
        }
        match self.try_fit(size, align)? {
            Some(handle) => Ok(Some(handle)),
            None => self.make_room_and_fit(size, align),
        }
    }

    /// Take `bytes` (whole pages) more from the device; `false` if that
    /// would pass `max_bytes` or the reservation, or the device refuses and
    /// reports less free memory. A device that refuses despite reporting
    /// enough free memory is an error.
    ///
    /// The device is asked first and its free memory read only after a
    /// refusal: a growth that succeeds costs the driver calls of the growth
    /// alone.
    fn try_grow(&mut self, bytes: u64) -> Result<bool> {
        if bytes > self.memory.headroom(self.config.max_bytes) {
            return Ok(false);
        }
        let grown = self
            .memory
            .grow(&mut self.device, &mut self.heap, &mut self.mapper, bytes);
        if let Err(refused) = grown {
            return match self.device.mem_info() {
                // A refused grant is no shortage of memory.
                _ if matches!(refused, Error::PeerAccess { .. }) => Err(refused),
                Ok(info) if info.free < bytes => Ok(false),
                _ => Err(refused),
            };
        }
        self.grows += 1;
        self.peak_mapped_bytes = self.peak_mapped_bytes.max(self.memory.mapped_bytes());
        Ok(true)
    }

    /// Copy the plan's moves on the device, as one batch, and commit it.
    /// Synchronizes the device first: queued work may still use the blocks
    /// that move.
    ///
    /// If a copy fails, the error is returned and the plan is not
    /// committed; blocks moved by the plan may then hold partly copied data.
    fn execute(&mut self, plan: CompactionPlan) -> Result<Executed> {
        let moves = plan.moves().len();
        let bytes = plan.bytes_moved();
        let mut copy_time = Duration::ZERO;
        if moves > 0 {
            self.device.synchronize()?;
            let batch: Vec<BlockMove> = plan
                .moves()
                .iter()
                .map(|m| BlockMove {
                    src: m.src,
                    dst: m.dst,
                    len: m.len,
                })
                .collect();
            let start = Instant::now();
            self.device.copy_moves(&batch)?;
            copy_time = start.elapsed();
        }
        // An empty plan is committed too: relaying the allocator gives back
        // alignment padding.
        self.heap.commit(plan)?;
        if moves > 0 {
            self.compactions += 1;
            self.bytes_moved += bytes;
            self.copy_time += copy_time;
        }
        Ok(Executed {
            moves,
            bytes,
            copy_time,
        })
    }

    fn out_of_memory(&self, size: u64, align: u64) -> Error {
        let stats = self.heap.stats();
        let pool_bytes = self.memory.mapped_bytes();
        // The error is the news; a failing memory query only blanks a figure.
        let context_reserved_bytes = self.device.mem_info().map_or(0, |info| {
            info.total
                .saturating_sub(info.free)
                .saturating_sub(pool_bytes)
        });
        Error::OutOfMemory {
            requested: size,
            align,
            free_bytes: stats.free_bytes,
            largest_free: stats.largest_free,
            pool_bytes,
            context_reserved_bytes,
        }
    }

    #[inline]
    pub(super) fn free(&mut self, handle: Handle) -> Result<()> {
        self.heap.free(handle)?;
        if let Some(stream) = self.streams.get_mut(handle.slot() as usize) {
            *stream = None;
        }
        Ok(())
    }

    pub(super) fn device_ptr(&self, handle: Handle) -> Result<u64> {
        Ok(self.heap.offset(handle)?)
    }

    pub(super) fn stream(&self, handle: Handle) -> Result<Option<StreamId>> {
        self.heap.offset(handle)?;
        Ok(self.streams.get(handle.slot() as usize).copied().flatten())
    }

    /// Pin the block and return its device address; a block pinned already
    /// is refused, so one guard owns each pin.
    pub(super) fn pin(&mut self, handle: Handle) -> Result<u64> {
        let info = self.heap.info(handle)?;
        if info.flags.contains(BlockFlags::PINNED) {
            return Err(Error::AlreadyPinned(handle));
        }
        self.heap
            .set_flags(handle, info.flags | BlockFlags::PINNED)?;
        Ok(info.offset)
    }

    /// Let compaction move the block again.
    pub(super) fn unpin(&mut self, handle: Handle) -> Result<()> {
        let info = self.heap.info(handle)?;
        Ok(self
            .heap
            .set_flags(handle, info.flags - BlockFlags::PINNED)?)
    }

    /// Device address of `[offset, offset + len)` inside the block.
    fn block_range(&self, handle: Handle, offset: u64, len: u64) -> Result<u64> {
        let info = self.heap.info(handle)?;
        match offset.checked_add(len) {
            Some(end) if end <= info.size => Ok(info.offset + offset),
            _ => Err(Error::InvalidAddress {
                addr: info.offset.saturating_add(offset),
                len,
                why: "past the end of the block",
            }),
        }
    }

    pub(super) fn write(&mut self, handle: Handle, offset: u64, data: &[u8]) -> Result<()> {
        let addr = self.block_range(handle, offset, data.len() as u64)?;
        self.device.write(addr, data)
    }

    pub(super) fn read(&mut self, handle: Handle, offset: u64, out: &mut [u8]) -> Result<()> {
        let addr = self.block_range(handle, offset, out.len() as u64)?;
        self.device.read(addr, out)
    }

    pub(super) fn compact(&mut self) -> Result<CompactionReport> {
        let before = self.heap.stats();
        let start = Instant::now();
        let plan = self.heap.plan_full();
        let plan_time = start.elapsed();
        self.plan_time += plan_time;
        let executed = self.execute(plan)?;
        let after = self.heap.stats();
        Ok(CompactionReport {
            moves: executed.moves,
            bytes_moved: executed.bytes,
            free_bytes: after.free_bytes,
            largest_free_before: before.largest_free,
            largest_free_after: after.largest_free,
            plan_time,
            copy_time: executed.copy_time,
        })
    }

    pub(super) fn shrink(&mut self) -> Result<u64> {
        let released = self
            .memory
            .shrink(&mut self.device, &mut self.heap, &mut self.mapper)?;
        if released > 0 {
            self.shrinks += 1;
        }
        Ok(released)
    }

    pub(super) fn mappings(&self) -> Vec<(u64, u64)> {
        self.memory.held()
    }

    pub(super) fn reservation_start(&self) -> Option<u64> {
        self.memory.reservation_start()
    }

    pub(super) fn plan_steps(&self) -> u64 {
        self.heap.plan_steps()
    }

    pub(super) fn stats(&self) -> PoolStats {
        PoolStats {
            heap: self.heap.stats(),
            mapped_bytes: self.memory.mapped_bytes(),
            peak_mapped_bytes: self.peak_mapped_bytes,
            reserved_va_bytes: self.memory.reserved_bytes(),
            bytes_moved: self.bytes_moved,
            compactions: self.compactions,
            grows: self.grows,
            shrinks: self.shrinks,
            calls: self.mapper.calls(),
            peer_access: self.mapper.peer_access(),
            compaction_plan_time: self.plan_time,
            compaction_plan_steps: self.heap.plan_steps(),
            compaction_copy_time: self.copy_time,
        }
    }

    /// Give all device memory back and hand out the device.
    pub(super) fn into_device(mut self) -> (D, Result<()>) {
        let result = self
            .device
            .synchronize()
            .and_then(|()| self.memory.release_all(&mut self.device, &mut self.mapper));
        (self.device, result)
    }
}
