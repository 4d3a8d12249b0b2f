//! [`DeviceStats`]: a device's figures in the form of PyTorch's own allocator
//! (`c10::CachingDeviceAllocator::DeviceStats`), which `torch.cuda.memory_stats()`,
//! `memory_allocated()`, `max_memory_reserved()`, `memory_summary()` and the profiler
//! read.
//!
//! The invariants PyTorch's users rely on hold at every moment: every `peak` is at
//! least its `current`, `current == allocated - freed` until the accumulated counts are
//! reset, the aggregate is the sum of the small and the large pool, and allocated bytes
//! are at most active bytes, which are at most reserved bytes.

use memcore::pytorch;

/// One figure with its history, PyTorch's `Stat`; bytes or counts.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// Now.
    pub current: i64,
    /// The most `current` has been since the last peak reset.
    pub peak: i64,
    /// Added up since the last reset of accumulated figures.
    pub allocated: i64,
    /// Taken away since the last reset of accumulated figures.
    pub freed: i64,
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Stat {
    /// `current` grows by `n`.
    pub fn increase(&mut self, n: u64) {
        self.current = self.current.saturating_add(signed(n));
        self.peak = self.peak.max(self.current);
        self.allocated = self.allocated.saturating_add(signed(n));
    }

    /// `current` shrinks by `n`.
    pub fn decrease(&mut self, n: u64) {
        self.current = self.current.saturating_sub(signed(n));
        self.freed = self.freed.saturating_add(signed(n));
    }

    /// `current` becomes `value`, the difference counted as allocated or freed.
    pub fn set(&mut self, value: u64) {
        let now = u64::try_from(self.current).unwrap_or(0);
        if value >= now {
            self.increase(value - now);
        } else {
            self.decrease(now - value);
        }
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A figure for all blocks, the small pool and the large pool (PyTorch's `StatArray`,
/// indexed by `StatType`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatArray {
    /// Every block (`StatType::AGGREGATE`).
    pub aggregate: Stat,
    /// Blocks of at most [`pytorch::SMALL_SIZE_BYTES`] (`SMALL_POOL`).
    pub small_pool: Stat,
    /// Larger blocks (`LARGE_POOL`).
    pub large_pool: Stat,
}

impl StatArray {
    /// The aggregate and the pool of a block of `block_bytes` grow by `n`.
    pub fn increase(&mut self, block_bytes: u64, n: u64) {
        self.aggregate.increase(n);
        self.pool_of(block_bytes).increase(n);
    }

    /// The aggregate and the pool of a block of `block_bytes` shrink by `n`.
    pub fn decrease(&mut self, block_bytes: u64, n: u64) {
        self.aggregate.decrease(n);
        self.pool_of(block_bytes).decrease(n);
    }

    /// Aggregate and large pool become `value`: what the device holds, which no block
    /// size classifies (the pools share one reservation).
    pub fn set_held(&mut self, value: u64) {
        self.aggregate.set(value);
        self.large_pool.set(value);
    }

    fn pool_of(&mut self, block_bytes: u64) -> &mut Stat {
        if pytorch::is_small(block_bytes) {
            &mut self.small_pool
        } else {
            &mut self.large_pool
        }
    }

    fn each(&mut self) -> [&mut Stat; 3] {
        [
            &mut self.aggregate,
            &mut self.small_pool,
            &mut self.large_pool,
        ]
    }
}

/// A device's figures as PyTorch's `DeviceStats`, field for field and in its order;
/// `#[repr(C)]`, the layout of `struct cudamem_device_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceStats {
    /// Live blocks handed to the caller (count).
    pub allocation: StatArray,
    /// Device memory allocations the pool holds (count): physical handles of the
    /// stitched pool; the one growing mapping of the TLSF pool.
    pub segment: StatArray,
    /// Blocks live or freed but still waiting for their streams (count).
    pub active: StatArray,
    /// Free pieces of mapped memory that cannot be given back now (count: at most one
    /// per mapped run, as measured when the figures are read).
    pub inactive_split: StatArray,
    /// Bytes of live blocks (each request rounded up to 512 bytes).
    pub allocated_bytes: StatArray,
    /// Device memory the pool has mapped, bytes: what `memory_reserved()` answers;
    /// its peak is the pool's peak mapped bytes.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes mapped and free that cannot be given back now (as measured when read).
    pub inactive_split_bytes: StatArray,
    /// Bytes the caller asked for, of active blocks.
    pub requested_bytes: StatArray,
    /// Requests that first failed and were retried after waiting for every stream's
    /// freed blocks.
    pub num_alloc_retries: i64,
    /// Requests refused for lack of memory.
    pub num_ooms: i64,
    /// Always zero: no block size is exempt from splitting.
    pub oversize_allocations: Stat,
    /// Always zero.
    pub oversize_segments: Stat,
    /// Times every stream was waited for (out of memory, `empty_cache`).
    pub num_sync_all_streams: i64,
    /// Device memory allocations made (physical handles created).
    pub num_device_alloc: i64,
    /// Device memory allocations given back.
    pub num_device_free: i64,
    /// The largest block that may be split, bytes; -1: any (what PyTorch reports
    /// without `max_split_size_mb`).
    pub max_split_size: i64,
}

impl Default for DeviceStats {
    fn default() -> Self {
        Self {
            allocation: StatArray::default(),
            segment: StatArray::default(),
            active: StatArray::default(),
            inactive_split: StatArray::default(),
            allocated_bytes: StatArray::default(),
            reserved_bytes: StatArray::default(),
            active_bytes: StatArray::default(),
            inactive_split_bytes: StatArray::default(),
            requested_bytes: StatArray::default(),
            num_alloc_retries: 0,
            num_ooms: 0,
            oversize_allocations: Stat::default(),
            oversize_segments: Stat::default(),
            num_sync_all_streams: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            max_split_size: -1,
        }
    }
}

impl DeviceStats {
    fn arrays(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// A block of `bytes` (asked for `requested`) handed out.
    pub fn block_allocated(&mut self, bytes: u64, requested: u64) {
        self.allocation.increase(bytes, 1);
        self.allocated_bytes.increase(bytes, bytes);
        self.active.increase(bytes, 1);
        self.active_bytes.increase(bytes, bytes);
        self.requested_bytes.increase(bytes, requested);
    }

    /// A block freed by the caller; it stays active until [`Self::block_returned`].
    pub fn block_freed(&mut self, bytes: u64) {
        self.allocation.decrease(bytes, 1);
        self.allocated_bytes.decrease(bytes, bytes);
    }

    /// A freed block back in its pool: no stream uses it any more.
    pub fn block_returned(&mut self, bytes: u64, requested: u64) {
        self.active.decrease(bytes, 1);
        self.active_bytes.decrease(bytes, bytes);
        self.requested_bytes.decrease(bytes, requested);
    }

    /// Every peak becomes its current value (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peaks(&mut self) {
        for array in self.arrays() {
            array.each().into_iter().for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// Every accumulated count becomes zero
    /// (`torch.cuda.reset_accumulated_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays() {
            array.each().into_iter().for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_move_allocated_active_and_requested_by_pool() {
        let mut stats = DeviceStats::default();
        stats.block_allocated(512, 100);
        stats.block_allocated(4 << 20, 4 << 20);
        assert_eq!(stats.allocated_bytes.aggregate.current, 512 + (4 << 20));
        assert_eq!(stats.allocated_bytes.small_pool.current, 512);
        assert_eq!(stats.allocation.large_pool.current, 1);
        stats.block_freed(512);
        assert_eq!(stats.active_bytes.aggregate.current, 512 + (4 << 20));
        stats.block_returned(512, 100);
        assert_eq!(stats.requested_bytes.aggregate.current, 4 << 20);
        assert_eq!(stats.allocated_bytes.aggregate.peak, 512 + (4 << 20));
        stats.reset_peaks();
        assert_eq!(stats.allocated_bytes.aggregate.peak, 4 << 20);
        assert_eq!(stats.allocation.aggregate.allocated, 2);
        stats.reset_accumulated();
        assert_eq!(stats.allocation.aggregate.allocated, 0);
        assert_eq!(stats.allocation.aggregate.current, 1);
    }

    #[test]
    fn a_held_figure_counts_its_changes() {
        let mut reserved = StatArray::default();
        reserved.set_held(2 << 20);
        reserved.set_held(1 << 20);
        assert_eq!(
            reserved.aggregate,
            Stat {
                current: 1 << 20,
                peak: 2 << 20,
                allocated: 2 << 20,
                freed: 1 << 20,
            }
        );
        assert_eq!(reserved.large_pool, reserved.aggregate);
        assert_eq!(reserved.small_pool, Stat::default());
    }
}
