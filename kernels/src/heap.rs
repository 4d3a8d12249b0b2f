//! In-kernel `malloc`/`free`: throughput, blocks held across launches, heap
//! exhaustion and fragmentation (`heap.cu`).
//!
//! Every kernel takes a [`HeapParams`] and adds to a [`HeapCounters`] in
//! device memory. Each block is filled with the [pattern](crate::pattern)
//! seeded by `seed ^ block address`, so blocks that overlap are caught as
//! mismatches when either is checked.
//!
//! The list kernels ([`EXHAUST`], [`FRAGMENT_FILL`], [`FRAGMENT_PUNCH`],
//! [`FRAGMENT_LARGE`], [`RELEASE_LISTS`]) keep each thread's blocks in a
//! linked list threaded through the blocks themselves, its head in
//! `slots[thread]`, so a later launch can find and free them. Such blocks
//! start with a 16-byte header (next address, size); requests under
//! [`LIST_MIN_BYTES`] are raised to it.

use bytemuck::{Pod, Zeroable};

use crate::kernel::Kernel;
use crate::module::{KernelInfo, Module};

/// Smallest block, in bytes, that the list kernels allocate.
pub const LIST_MIN_BYTES: u64 = 16;

/// Counters the heap kernels add to with atomics; matches `HeapCounters` in
/// `heap.cu`. Zero it before a launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HeapCounters {
    /// `malloc` calls that returned a block.
    pub allocations: u64,
    /// `malloc` calls that returned NULL (list kernels: threads that met a NULL).
    pub nulls: u64,
    /// Bytes that differed from the pattern when a block was checked.
    pub mismatches: u64,
    /// Bytes requested by the successful `malloc` calls ([`FRAGMENT_PUNCH`]:
    /// bytes freed).
    pub bytes: u64,
    /// List kernels: threads that stopped at `max_per_thread` without a NULL.
    pub capped: u64,
    /// `free` calls.
    pub frees: u64,
}

impl HeapCounters {
    /// Bytes of the counters in device memory.
    pub const BYTES: usize = size_of::<Self>();

    /// The counters from bytes copied back from the device; `None` unless
    /// `bytes` is exactly [`Self::BYTES`] long.
    ///
    /// ```
    /// use kernels::heap::HeapCounters;
    /// let c = HeapCounters { nulls: 3, ..HeapCounters::default() };
    /// assert_eq!(HeapCounters::from_bytes(c.as_bytes()), Some(c));
    /// assert_eq!(HeapCounters::from_bytes(&[0; 8]), None);
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytemuck::try_pod_read_unaligned(bytes).ok()
    }

    /// The bytes to copy to the device (all zero for a fresh start).
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(self)
    }
}

/// Parameters of every heap kernel; matches `HeapParams` in `heap.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HeapParams {
    /// Device address of a [`HeapCounters`].
    pub counters: u64,
    /// Device address of `threads` `u64`s: the held block of each thread
    /// ([`MALLOC_HOLD`]) or the head of its list (list kernels). Unused by
    /// [`MALLOC_FREE`].
    pub slots: u64,
    /// Bytes per `malloc` call ([`FRAGMENT_FILL`]: the smallest of the four
    /// sizes it cycles through).
    pub size: u64,
    /// Threads that take part; the grid may be larger.
    pub threads: u32,
    /// Bound on `malloc` calls per thread (list kernels).
    pub max_per_thread: u32,
    /// Pattern seed, mixed with each block's address.
    pub seed: u64,
}

/// Each thread: `malloc(size)`, fill, check, `free`.
pub const MALLOC_FREE: Kernel<HeapParams> = Kernel::new(&MODULE, 0);
/// Each thread: `malloc(size)`, fill, keep the address in `slots[thread]`
/// (0 for NULL).
pub const MALLOC_HOLD: Kernel<HeapParams> = Kernel::new(&MODULE, 1);
/// Each thread: check and free the block [`MALLOC_HOLD`] left in its slot.
pub const CHECK_FREE_HELD: Kernel<HeapParams> = Kernel::new(&MODULE, 2);
/// Each thread: `malloc(size)` until NULL or `max_per_thread`, keeping every
/// block on its list. Release with [`RELEASE_LISTS`].
pub const EXHAUST: Kernel<HeapParams> = Kernel::new(&MODULE, 3);
/// Like [`EXHAUST`], with sizes cycling through 1, 2, 3, 4 times `size`.
pub const FRAGMENT_FILL: Kernel<HeapParams> = Kernel::new(&MODULE, 4);
/// Frees every other block (2nd, 4th, ...) of each thread's list, checking
/// each first; counts the freed bytes in `bytes`.
pub const FRAGMENT_PUNCH: Kernel<HeapParams> = Kernel::new(&MODULE, 5);
/// `malloc(size)` until NULL or `max_per_thread`, pushed on the same lists:
/// how much of the punched heap large requests can use.
pub const FRAGMENT_LARGE: Kernel<HeapParams> = Kernel::new(&MODULE, 6);
/// Checks and frees every block of each thread's list.
pub const RELEASE_LISTS: Kernel<HeapParams> = Kernel::new(&MODULE, 7);

const fn heap_kernel(name: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        param_bytes: size_of::<HeapParams>(),
        local_bytes_per_thread: 0,
        uses_device_heap: true,
    }
}

/// Like [`MALLOC_FREE`] with a size per thread, log-uniform from 16 B to
/// `size` (at least 16).
pub const MALLOC_FREE_MIXED: Kernel<HeapParams> = Kernel::new(&MODULE, 8);

/// `heap.ptx`.
pub static MODULE: Module = Module {
    name: "heap",
    ptx: include_str!("../ptx/heap.ptx"),
    kernels: &[
        heap_kernel("heap_malloc_free"),
        heap_kernel("heap_malloc_hold"),
        heap_kernel("heap_check_free_held"),
        heap_kernel("heap_exhaust"),
        heap_kernel("heap_fragment_fill"),
        heap_kernel("heap_fragment_punch"),
        heap_kernel("heap_fragment_large"),
        heap_kernel("heap_release_lists"),
        heap_kernel("heap_malloc_free_mixed"),
    ],
};
