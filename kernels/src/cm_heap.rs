//! `cm_malloc`/`cm_free` (`cuda/cm_alloc.cuh`): an in-kernel allocator whose
//! heap the host grows between launches, and the kernels that exercise it
//! (`cuda/cm_heap.cu`).
//!
//! The heap is a [`DESCRIPTOR_BYTES`]-byte descriptor in device memory plus
//! regions the host adds to it. A region of `n` chunks is `n` x
//! [`CHUNK_BYTES`] of blocks followed by `n` x [`BITMAP_BYTES`] of bitmaps
//! ([`region_bytes`]). A chunk takes a size class (16 B << k) when first used;
//! blocks are claimed by setting bits of its bitmap after reserving them in
//! the chunk's count, and a chunk whose count drops to 0 is free again. The
//! header says what the kernels do step by step; `tests/cm_alloc` runs the
//! header itself on host threads, a warp's lanes as threads.
//!
//! The host zeroes the descriptor, writes the [`RegionTable`] and sets one
//! bit of the free map per chunk ([`free_map_words`]); after a launch it reads
//! the [`CmCounters`] and, if requests failed for lack of room, adds a region
//! of [`growth_chunks`] chunks. `ctx::DeviceHeap` does this.
//!
//! The kernels take [`HeapParams`] and report into [`HeapCounters`] like
//! CUDA's malloc kernels in [`crate::heap`]; they find the heap through the
//! module's `cm_heap` variable ([`HEAP_VARIABLE`]).

use bytemuck::{Pod, Zeroable};

pub use crate::heap::HeapCounters;
use crate::heap::HeapParams;
use crate::kernel::Kernel;
use crate::module::{KernelInfo, Module};

/// Bytes of the smallest block (class 0).
pub const MIN_BLOCK_BYTES: u64 = 16;
/// Bytes of one chunk; also the largest request.
pub const CHUNK_BYTES: u64 = 1 << 20;
/// Largest request in bytes; larger ones get NULL ([`Reason::TooLarge`]).
pub const MAX_REQUEST_BYTES: u64 = CHUNK_BYTES;
/// Size classes: 16 B << k for k in `0..CLASSES` (16 B to 1 MiB).
pub const CLASSES: usize = 17;
/// Chunks per class that warps take blocks from at once.
pub const ACTIVE: usize = 32;
/// Most regions one heap has.
pub const MAX_REGIONS: usize = 64;
/// Most chunks one heap has (64 GiB of blocks).
pub const MAX_CHUNKS: u32 = 1 << 16;
/// Words of a chunk's block map: one bit per block, enough for 16-byte
/// blocks.
pub const BLOCK_MAP_WORDS: usize = (CHUNK_BYTES / MIN_BLOCK_BYTES / 64) as usize;
/// Bytes of one chunk's maps: its block map (bit set: the block is taken),
/// then its span map of as many words (bit set: the block is a tail of a
/// span, see [`SPANS_BIT`]).
pub const BITMAP_BYTES: u64 = 2 * BLOCK_MAP_WORDS as u64 * 8;
/// Bit of a chunk state where the class + 1 starts (0: free chunk).
pub const CLASS_SHIFT: u32 = 24;
/// Bit of a chunk state set once a larger request took a span of its
/// blocks (an aligned run of 2^d blocks handed out as one block); cleared
/// when the chunk is free again. While it is clear, every block is alone
/// and a free need not read the span map.
pub const SPANS_BIT: u32 = 1 << 23;
/// The reserved-blocks part of a chunk state.
pub const COUNT_MASK: u32 = SPANS_BIT - 1;

/// Words of the free map and of each class's room map.
pub const MAP_WORDS: usize = MAX_CHUNKS as usize / 64;
/// Offset of the [`RegionTable`] in the descriptor.
pub const REGIONS_OFFSET: u64 = 0;
/// Offset of the [`CmCounters`] in the descriptor.
pub const COUNTERS_OFFSET: u64 = size_of::<RegionTable>() as u64;
/// Offset of the active chunks (`u32` chunk id + 1 per class and slot).
pub const ACTIVE_OFFSET: u64 = COUNTERS_OFFSET + size_of::<CmCounters>() as u64;
/// Offset of the chunk states (`u32` per chunk).
pub const STATE_OFFSET: u64 = ACTIVE_OFFSET + (CLASSES * ACTIVE * 4) as u64;
/// Offset of the free map (`u64` words, bit set: chunk free).
pub const FREE_MAP_OFFSET: u64 = STATE_OFFSET + MAX_CHUNKS as u64 * 4;
/// Offset of the room maps (one per class, bit set: the chunk may have room).
pub const ROOM_MAP_OFFSET: u64 = FREE_MAP_OFFSET + MAP_WORDS as u64 * 8;
/// Bytes of the whole descriptor (`sizeof(CmHeap)` in `cm_alloc.cuh`).
pub const DESCRIPTOR_BYTES: u64 = ROOM_MAP_OFFSET + (CLASSES * MAP_WORDS * 8) as u64;

/// The module variable that holds the descriptor's device address.
pub const HEAP_VARIABLE: &str = "cm_heap";

/// Why a request got NULL: the index into [`CmCounters::reason`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Zero bytes were asked.
    Zero = 0,
    /// More than [`MAX_REQUEST_BYTES`] were asked.
    TooLarge = 1,
    /// No chunk of the class had room and none was free: the host grows.
    Exhausted = 2,
}

/// The regions of a heap; the descriptor's first bytes (`CmHeap` up to
/// `counters`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct RegionTable {
    /// Regions in use.
    pub regions: u32,
    /// Chunk ids in use (the sum of `region_chunks`).
    pub chunks: u32,
    /// Device address of each region's first chunk.
    pub region_base: [u64; MAX_REGIONS],
    /// Id of each region's first chunk.
    pub region_first: [u32; MAX_REGIONS],
    /// Chunks in each region.
    pub region_chunks: [u32; MAX_REGIONS],
}

impl Default for RegionTable {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl RegionTable {
    /// The table with one more region of `chunks` chunks at `base`; `None`
    /// if the table is full or the heap would pass [`MAX_CHUNKS`].
    ///
    /// ```
    /// use kernels::cm_heap::RegionTable;
    /// let t = RegionTable::default().with_region(0x7000_0000, 4).unwrap();
    /// let t = t.with_region(0x9000_0000, 2).unwrap();
    /// assert_eq!((t.regions, t.chunks, t.region_first[1]), (2, 6, 4));
    /// ```
    pub fn with_region(&self, base: u64, chunks: u32) -> Option<Self> {
        let index = self.regions as usize;
        let total = self.chunks.checked_add(chunks)?;
        if index >= MAX_REGIONS || total > MAX_CHUNKS || chunks == 0 {
            return None;
        }
        let mut next = *self;
        next.region_base[index] = base;
        next.region_first[index] = self.chunks;
        next.region_chunks[index] = chunks;
        next.regions += 1;
        next.chunks = total;
        Some(next)
    }

    /// The bytes to write at [`REGIONS_OFFSET`] of the descriptor.
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(self)
    }

    /// Bytes of blocks the heap holds (chunks x [`CHUNK_BYTES`]).
    pub fn block_bytes(&self) -> u64 {
        u64::from(self.chunks) * CHUNK_BYTES
    }
}

/// The heap's counters; matches `CmCounters` in `cm_alloc.cuh`. Bytes are
/// class sizes (a 100-byte request counts 128).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CmCounters {
    /// Bytes of the live blocks.
    pub live_bytes: u64,
    /// Highest `live_bytes` seen.
    pub peak_bytes: u64,
    /// Requests that got a block.
    pub allocations: u64,
    /// Blocks freed.
    pub frees: u64,
    /// Requests that got NULL.
    pub failures: u64,
    /// Class bytes of the requests that failed with [`Reason::Exhausted`].
    pub failed_bytes: u64,
    /// Largest request that got NULL, bytes (class bytes when exhausted).
    pub largest_failed: u64,
    /// Frees of a pointer that was no live block (ignored).
    pub bad_frees: u64,
    /// Failures by [`Reason`].
    pub reason: [u64; 4],
    /// The allocator's publication clock: the low 32 bits count chunks that
    /// a thread holds off every map now (in transit), the high 32 bits count
    /// chunks made visible (put on the free map, given a room mark or an
    /// active slot). A search that ends with it unchanged and nothing in
    /// transit saw the whole heap; only then does a request get NULL.
    pub epoch: u64,
    /// Zero.
    pub unused: u64,
}

impl CmCounters {
    /// Bytes of the counters in the descriptor.
    pub const BYTES: usize = size_of::<Self>();

    /// The counters from bytes read from the device; `None` unless `bytes`
    /// is exactly [`Self::BYTES`] long.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytemuck::try_pod_read_unaligned(bytes).ok()
    }

    /// The bytes to write at [`COUNTERS_OFFSET`] of the descriptor.
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(self)
    }

    /// Failures for `reason`.
    pub fn failed(&self, reason: Reason) -> u64 {
        self.reason[reason as usize]
    }
}

/// The class of a request of `bytes` (1 to [`MAX_REQUEST_BYTES`]): the
/// smallest k with 16 B << k at least `bytes`.
///
/// ```
/// use kernels::cm_heap::{class_of, class_bytes};
/// assert_eq!((class_of(1), class_of(16), class_of(17), class_of(1 << 20)), (0, 0, 1, 16));
/// assert_eq!(class_bytes(class_of(100)), 128);
/// ```
pub fn class_of(bytes: u64) -> usize {
    if bytes <= MIN_BLOCK_BYTES {
        0
    } else {
        (64 - (bytes - 1).leading_zeros() - MIN_BLOCK_BYTES.trailing_zeros()) as usize
    }
}

/// Bytes of a block of class `k`.
pub fn class_bytes(k: usize) -> u64 {
    MIN_BLOCK_BYTES << k
}

/// Blocks of class `k` in one chunk.
pub fn class_blocks(k: usize) -> u32 {
    (CHUNK_BYTES / class_bytes(k)) as u32
}

/// Bytes of a region of `chunks` chunks (blocks, then bitmaps).
pub fn region_bytes(chunks: u32) -> u64 {
    u64::from(chunks) * (CHUNK_BYTES + BITMAP_BYTES)
}

/// The most chunks a region of at most `bytes` bytes holds.
///
/// ```
/// use kernels::cm_heap::{chunks_within, region_bytes};
/// assert_eq!(chunks_within(region_bytes(7)), 7);
/// assert_eq!(chunks_within(region_bytes(7) - 1), 6);
/// ```
pub fn chunks_within(bytes: u64) -> u32 {
    u32::try_from(bytes / (CHUNK_BYTES + BITMAP_BYTES)).unwrap_or(u32::MAX)
}

/// The free-map words of a heap whose chunks `first..first + chunks` were
/// just added: `(word index, bits to set)`.
///
/// ```
/// use kernels::cm_heap::free_map_words;
/// assert_eq!(free_map_words(62, 4), [(0, 0b11 << 62), (1, 0b11)]);
/// ```
pub fn free_map_words(first: u32, chunks: u32) -> Vec<(usize, u64)> {
    let mut words: Vec<(usize, u64)> = Vec::new();
    for id in first..first.saturating_add(chunks) {
        let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
        match words.last_mut() {
            Some((w, bits)) if *w == word => *bits |= bit,
            _ => words.push((word, bit)),
        }
    }
    words
}

/// The allocator's state as a quiescent heap holds it (no kernel running):
/// the chunk states and each chunk's maps, read from the device
/// (`ctx::DeviceHeap::image`) or from host memory in the tests. What the no-false-NULL
/// rule is checked against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapImage {
    /// One state per chunk id: class + 1 << [`CLASS_SHIFT`] | [`SPANS_BIT`]
    /// | reserved blocks.
    pub states: Vec<u32>,
    /// Per chunk id, [`BLOCK_MAP_WORDS`] words of block map then as many of
    /// span map.
    pub maps: Vec<u64>,
}

impl HeapImage {
    fn block_map(&self, id: usize) -> &[u64] {
        let start = id * 2 * BLOCK_MAP_WORDS;
        &self.maps[start..start + BLOCK_MAP_WORDS]
    }

    /// Bytes of the heap's blocks that no live block covers.
    pub fn free_bytes(&self) -> u64 {
        (0..self.states.len())
            .map(|id| {
                let cls = self.states[id] >> CLASS_SHIFT;
                if cls == 0 {
                    return CHUNK_BYTES;
                }
                let taken: u64 = self
                    .block_map(id)
                    .iter()
                    .map(|w| u64::from(w.count_ones()))
                    .sum();
                CHUNK_BYTES - taken * class_bytes(cls as usize - 1)
            })
            .sum()
    }

    /// A free window for a request of class `k`: `(chunk id, offset in the
    /// chunk in bytes)` of `class_bytes(k)` bytes aligned to that size that
    /// no live block covers, if the heap has one. The allocator's rule: a
    /// request of class k gets NULL only when this is `None` (checked on a
    /// quiescent heap; a request racing frees may miss one they make).
    ///
    /// ```
    /// use kernels::cm_heap::{CLASS_SHIFT, HeapImage, BLOCK_MAP_WORDS};
    /// // One chunk of 16 B blocks, every other one taken: no 32 B window.
    /// let mut maps = vec![0x5555_5555_5555_5555u64; BLOCK_MAP_WORDS];
    /// maps.extend(vec![0; BLOCK_MAP_WORDS]);
    /// let image = HeapImage { states: vec![1 << CLASS_SHIFT | 32768], maps };
    /// assert_eq!(image.free_window(0), Some((0, 16)));
    /// assert_eq!(image.free_window(1), None);
    /// assert_eq!(image.free_bytes(), 512 << 10);
    /// ```
    pub fn free_window(&self, k: usize) -> Option<(u32, u64)> {
        (0..self.states.len()).find_map(|id| {
            let cls = self.states[id] >> CLASS_SHIFT;
            if cls == 0 {
                return Some((id as u32, 0));
            }
            let j = cls as usize - 1;
            // A window of class k is 2^(k - j) blocks of class j, or lies
            // in one block of class j >= k.
            let run = 1u32 << k.saturating_sub(j);
            let index = find_clear_run(self.block_map(id), class_blocks(j), run)?;
            Some((id as u32, u64::from(index) * class_bytes(j)))
        })
    }
}

/// The first index of `run` (a power of two) clear bits aligned to `run`
/// among the first `blocks` bits of `map`.
fn find_clear_run(map: &[u64], blocks: u32, run: u32) -> Option<u32> {
    let mut index = 0;
    while index + run <= blocks {
        let clear = if run >= 64 {
            let first = index as usize / 64;
            map[first..first + run as usize / 64]
                .iter()
                .all(|&w| w == 0)
        } else {
            let mask = ((1u64 << run) - 1) << (index % 64);
            map[index as usize / 64] & mask == 0
        };
        if clear {
            return Some(index);
        }
        index += run;
    }
    None
}

/// Chunks to add after a launch whose exhausted requests asked for
/// `failed_bytes` (class bytes) on a heap of `chunks` chunks: twice what
/// failed (chunks of other classes and partly used chunks of the same class
/// cannot serve it), at least half the heap so that growth is geometric,
/// bounded by what [`MAX_CHUNKS`] leaves. 0 when nothing failed or nothing
/// is left. The one sizing rule: the device host and the tests call it.
///
/// ```
/// use kernels::cm_heap::growth_chunks;
/// assert_eq!(growth_chunks(16, 0), 0);
/// assert_eq!(growth_chunks(16, 64 << 20), 128);
/// assert_eq!(growth_chunks(400, 1 << 20), 200);
/// ```
pub fn growth_chunks(chunks: u32, failed_bytes: u64) -> u32 {
    if failed_bytes == 0 {
        return 0;
    }
    let needed = failed_bytes.div_ceil(CHUNK_BYTES).saturating_mul(2);
    let wanted = needed.max(u64::from(chunks / 2)).max(1);
    let left = u64::from(MAX_CHUNKS.saturating_sub(chunks));
    wanted.min(left) as u32
}

/// Each thread: `cm_malloc(size)`, fill, check, `cm_free`.
pub const MALLOC_FREE: Kernel<HeapParams> = Kernel::new(&MODULE, 0);
/// Like [`MALLOC_FREE`] with a size per thread, log-uniform from 16 B to
/// `size`.
pub const MALLOC_FREE_MIXED: Kernel<HeapParams> = Kernel::new(&MODULE, 1);
/// Each thread whose slot is 0: `cm_malloc(size)`, fill, keep the block in
/// its slot (0 for NULL). A thread whose slot holds a block keeps it: a
/// relaunch after growth retries only the threads that got NULL.
pub const MALLOC_HOLD_MISSING: Kernel<HeapParams> = Kernel::new(&MODULE, 2);
/// Each thread: check and free the block in its slot.
pub const CHECK_FREE_HELD: Kernel<HeapParams> = Kernel::new(&MODULE, 3);
/// As [`crate::heap::EXHAUST`], with `cm_malloc`.
pub const EXHAUST: Kernel<HeapParams> = Kernel::new(&MODULE, 4);
/// As [`crate::heap::FRAGMENT_FILL`], with `cm_malloc`.
pub const FRAGMENT_FILL: Kernel<HeapParams> = Kernel::new(&MODULE, 5);
/// As [`crate::heap::FRAGMENT_PUNCH`], with `cm_free`.
pub const FRAGMENT_PUNCH: Kernel<HeapParams> = Kernel::new(&MODULE, 6);
/// As [`crate::heap::FRAGMENT_LARGE`], with `cm_malloc`.
pub const FRAGMENT_LARGE: Kernel<HeapParams> = Kernel::new(&MODULE, 7);
/// As [`crate::heap::RELEASE_LISTS`], with `cm_free`.
pub const RELEASE_LISTS: Kernel<HeapParams> = Kernel::new(&MODULE, 8);

const fn cm_kernel(name: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        param_bytes: size_of::<HeapParams>(),
        local_bytes_per_thread: 0,
        uses_device_heap: false,
    }
}

/// `cm_heap.ptx`.
pub static MODULE: Module = Module {
    name: "cm_heap",
    ptx: include_str!("../ptx/cm_heap.ptx"),
    kernels: &[
        cm_kernel("cm_malloc_free"),
        cm_kernel("cm_malloc_free_mixed"),
        cm_kernel("cm_malloc_hold_missing"),
        cm_kernel("cm_check_free_held"),
        cm_kernel("cm_exhaust"),
        cm_kernel("cm_fragment_fill"),
        cm_kernel("cm_fragment_punch"),
        cm_kernel("cm_fragment_large"),
        cm_kernel("cm_release_lists"),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_the_headers() {
        // The static_asserts of cm_alloc.cuh state the same numbers.
        assert_eq!(CmCounters::BYTES, 112);
        assert_eq!(COUNTERS_OFFSET, 1032);
        assert_eq!(ACTIVE_OFFSET, 1144);
        assert_eq!(STATE_OFFSET, 3320);
        assert_eq!(FREE_MAP_OFFSET, 265_464);
        assert_eq!(ROOM_MAP_OFFSET, 273_656);
        assert_eq!(DESCRIPTOR_BYTES, 412_920);
        let header = include_str!("../cuda/cm_alloc.cuh");
        for n in [1032, 1144, 3320, 265_464, 273_656, 412_920] {
            assert!(header.contains(&format!("== {n},")), "{n} in cm_alloc.cuh");
        }
    }

    #[test]
    fn classes_cover_16_bytes_to_a_chunk() {
        for bytes in [1, 15, 16, 17, 31, 32, 4095, 4096, 4097, CHUNK_BYTES] {
            let k = class_of(bytes);
            assert!(k < CLASSES);
            assert!(class_bytes(k) >= bytes);
            assert!(k == 0 || class_bytes(k - 1) < bytes, "{bytes}");
        }
        assert_eq!(class_blocks(0), 65_536);
        assert_eq!(class_blocks(CLASSES - 1), 1);
    }

    #[test]
    fn region_tables_refuse_overflow() {
        let t = RegionTable::default();
        assert_eq!(t.with_region(0x1000, 0), None);
        assert_eq!(t.with_region(0x1000, MAX_CHUNKS + 1), None);
        let mut full = t;
        for i in 0..MAX_REGIONS as u64 {
            full = full.with_region(i << 32, 1).unwrap();
        }
        assert_eq!(full.with_region(0, 1), None);
        assert_eq!(full.block_bytes(), MAX_REGIONS as u64 * CHUNK_BYTES);
    }

    #[test]
    fn growth_covers_what_failed_and_stops_at_the_cap() {
        assert!(u64::from(growth_chunks(10, 300 << 20)) * CHUNK_BYTES >= 300 << 20);
        assert_eq!(growth_chunks(MAX_CHUNKS, 1 << 30), 0);
        assert_eq!(growth_chunks(MAX_CHUNKS - 3, 1 << 30), 3);
    }
}
