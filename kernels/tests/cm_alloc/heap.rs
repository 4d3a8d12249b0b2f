//! A `cm_malloc` heap in host memory, laid out as `ctx::DeviceHeap` lays
//! one out in device memory (through `kernels::cm_heap`): a zeroed
//! descriptor, regions of chunks and their maps, the region table and the
//! free map written by the host between steps. Its words are atomics, so
//! the lanes (C++ `std::atomic_ref`) and the checks here may share them;
//! the checks read it between steps only.
//!
//! [`Heap::check`] and [`Heap::block_bytes`] read the state as the header
//! describes it, independently of the code under test.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use kernels::cm_heap::{
    BITMAP_BYTES, BLOCK_MAP_WORDS, CHUNK_BYTES, CLASS_SHIFT, COUNT_MASK, COUNTERS_OFFSET,
    CmCounters, DESCRIPTOR_BYTES, FREE_MAP_OFFSET, HeapImage, MAP_WORDS, REGIONS_OFFSET,
    RegionTable, SPANS_BIT, STATE_OFFSET, class_blocks, class_bytes, free_map_words, region_bytes,
};

/// What `CmCounters::epoch`'s low half counts: chunks in transit.
const EPOCH_TRANSIT_MASK: u64 = (1 << 32) - 1;
/// Alignment of each region, bytes, as `ctx::DeviceHeap` aligns them.
const REGION_ALIGN: usize = 4096;

/// Words of host memory, zeroed, that start at a [`REGION_ALIGN`] boundary.
struct Words {
    storage: Box<[AtomicU64]>,
    start: usize,
}

impl Words {
    fn new(bytes: u64) -> Self {
        let words = (bytes as usize).div_ceil(8);
        let storage: Box<[AtomicU64]> = (0..words + REGION_ALIGN / 8)
            .map(|_| AtomicU64::new(0))
            .collect();
        let address = storage.as_ptr() as usize;
        let start = address.next_multiple_of(REGION_ALIGN) - address;
        Self {
            storage,
            start: start / 8,
        }
    }

    fn address(&self) -> u64 {
        self.storage[self.start..].as_ptr() as u64
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        &self.storage[self.start + index]
    }
}

/// A heap's descriptor and regions in host memory.
pub struct Heap {
    descriptor: Words,
    /// Each region's memory and its chunks, in the table's order.
    regions: Vec<(Words, u32)>,
    table: RegionTable,
}

impl Heap {
    /// A heap with a region of `n` chunks per entry of `chunks`.
    pub fn new(chunks: &[u32]) -> Self {
        assert_eq!(
            crate::host::descriptor_bytes(),
            DESCRIPTOR_BYTES,
            "sizeof(CmHeap) on the host"
        );
        let mut heap = Self {
            descriptor: Words::new(DESCRIPTOR_BYTES),
            regions: Vec::new(),
            table: RegionTable::default(),
        };
        for &n in chunks {
            assert!(heap.add_region(n), "a region of {n} chunks");
        }
        heap
    }

    /// The descriptor's address (`CmHeap *`).
    pub fn descriptor(&self) -> *mut std::ffi::c_void {
        self.descriptor.address() as *mut std::ffi::c_void
    }

    /// Adds a region of `chunks` chunks, as the host grows a heap between
    /// launches; `false` (nothing added) if the table refuses it.
    pub fn add_region(&mut self, chunks: u32) -> bool {
        let memory = Words::new(region_bytes(chunks));
        let Some(table) = self.table.with_region(memory.address(), chunks) else {
            return false;
        };
        let first = self.table.chunks;
        self.table = table;
        for (i, bytes) in table.as_bytes().chunks_exact(8).enumerate() {
            let word = u64::from_le_bytes(bytes.try_into().unwrap());
            self.descriptor
                .word(REGIONS_OFFSET as usize / 8 + i)
                .store(word, Relaxed);
        }
        for (word, bits) in free_map_words(first, chunks) {
            self.descriptor
                .word(FREE_MAP_OFFSET as usize / 8 + word)
                .fetch_or(bits, Relaxed);
        }
        self.regions.push((memory, chunks));
        true
    }

    /// The regions.
    pub fn regions(&self) -> &RegionTable {
        &self.table
    }

    /// Address of the first block of region `r`.
    pub fn base(&self, r: usize) -> u64 {
        self.table.region_base[r]
    }

    fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        assert_eq!(offset % 8, 0);
        (0..len.div_ceil(8))
            .flat_map(|i| {
                self.descriptor
                    .word(offset as usize / 8 + i)
                    .load(Relaxed)
                    .to_le_bytes()
            })
            .take(len)
            .collect()
    }

    /// The counters, as the host reads them after a launch.
    pub fn counters(&self) -> CmCounters {
        CmCounters::from_bytes(&self.bytes(COUNTERS_OFFSET, CmCounters::BYTES)).unwrap()
    }

    fn state(&self, id: u32) -> u32 {
        let offset = STATE_OFFSET + u64::from(id) * 4;
        let word = self.descriptor.word(offset as usize / 8).load(Relaxed);
        (word >> (8 * (offset % 8))) as u32
    }

    fn free_map_word(&self, w: usize) -> u64 {
        self.descriptor
            .word(FREE_MAP_OFFSET as usize / 8 + w)
            .load(Relaxed)
    }

    /// Chunks in the free map now.
    pub fn free_chunks(&self) -> u32 {
        (0..MAP_WORDS)
            .map(|w| self.free_map_word(w).count_ones())
            .sum()
    }

    /// Chunk `id`'s maps: its block map, then its span map.
    fn maps(&self, id: u32) -> Vec<u64> {
        let r = (0..self.regions.len())
            .rfind(|&r| self.table.region_first[r] <= id)
            .unwrap();
        let (memory, chunks) = &self.regions[r];
        let local = (id - self.table.region_first[r]) as usize;
        let start =
            (u64::from(*chunks) * CHUNK_BYTES) as usize / 8 + local * BITMAP_BYTES as usize / 8;
        (0..2 * BLOCK_MAP_WORDS)
            .map(|i| memory.word(start + i).load(Relaxed))
            .collect()
    }

    /// The chunk states and maps now, for `HeapImage::free_window`.
    pub fn image(&self) -> HeapImage {
        HeapImage {
            states: (0..self.table.chunks).map(|id| self.state(id)).collect(),
            maps: (0..self.table.chunks)
                .flat_map(|id| self.maps(id))
                .collect(),
        }
    }

    /// Bytes of the live block at `address`: its chunk's class size, times
    /// the blocks of its span. `None` if no chunk with a class holds it, it
    /// is off its class's alignment, its bit is clear, or it is a span's tail.
    pub fn block_bytes(&self, address: u64) -> Option<u64> {
        let t = &self.table;
        let r = (0..t.regions as usize).find(|&r| {
            address.wrapping_sub(t.region_base[r]) < u64::from(t.region_chunks[r]) * CHUNK_BYTES
        })?;
        let local = (address - t.region_base[r]) / CHUNK_BYTES;
        let id = t.region_first[r] + local as u32;
        let cls = self.state(id) >> CLASS_SHIFT;
        if cls == 0 {
            return None;
        }
        let k = cls as usize - 1;
        let offset = address - t.region_base[r] - local * CHUNK_BYTES;
        if offset % class_bytes(k) != 0 {
            return None;
        }
        let index = (offset / class_bytes(k)) as usize;
        let maps = self.maps(id);
        let bit = |map: usize, i: usize| maps[map * BLOCK_MAP_WORDS + i / 64] >> (i % 64) & 1 == 1;
        if !bit(0, index) || bit(1, index) {
            return None;
        }
        let blocks = class_blocks(k) as usize;
        let tails = (index + 1..blocks).take_while(|&i| bit(1, i)).count();
        Some((1 + tails as u64) * class_bytes(k))
    }

    /// Checks a heap no lane is in: every chunk's count is the number of its
    /// set bits, a chunk is in the free map exactly when it has no class,
    /// span marks sit only on taken blocks of chunks with the spans bit, no
    /// chunk is in transit, and `live_bytes` is what the block maps hold.
    pub fn check(&self) -> Result<(), String> {
        let mut live = 0u64;
        for id in 0..self.table.chunks {
            let state = self.state(id);
            let maps = self.maps(id);
            let (blocks, spans) = maps.split_at(BLOCK_MAP_WORDS);
            let bits: u32 = blocks.iter().map(|w| w.count_ones()).sum();
            let free = self.free_map_word(id as usize / 64) >> (id % 64) & 1 == 1;
            let cls = state >> CLASS_SHIFT;
            if state & COUNT_MASK != bits {
                return Err(format!(
                    "chunk {id}: count {} but {bits} bits set",
                    state & COUNT_MASK
                ));
            }
            if free != (cls == 0) {
                return Err(format!(
                    "chunk {id}: class tag {cls}, in the free map: {free}"
                ));
            }
            if cls != 0 {
                live += u64::from(bits) * class_bytes(cls as usize - 1);
            }
            let stray = blocks.iter().zip(spans).any(|(b, s)| s & !b != 0);
            let marked = spans.iter().any(|&s| s != 0);
            if stray || (marked && state & SPANS_BIT == 0) {
                return Err(format!(
                    "chunk {id}: span marks on clear blocks or without the spans bit"
                ));
            }
        }
        let counters = self.counters();
        let transit = counters.epoch & EPOCH_TRANSIT_MASK;
        if transit != 0 {
            return Err(format!("{transit} chunks still in transit"));
        }
        if live != counters.live_bytes {
            return Err(format!(
                "block maps hold {live} bytes, live_bytes says {}",
                counters.live_bytes
            ));
        }
        Ok(())
    }
}
