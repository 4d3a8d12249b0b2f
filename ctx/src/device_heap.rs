//! The host side of `cm_malloc` (kernels/cuda/cm_alloc.cuh): a device heap
//! whose descriptor and regions come from a [`Pool`], bound to the modules
//! that call it, grown between launches when requests failed.
//!
//! The layout and the growth rule are the kernels crate's
//! ([`kernels::cm_heap`]); this file only moves bytes.

use kernels::cm_heap::{
    self, CmCounters, DESCRIPTOR_BYTES, FREE_MAP_OFFSET, HeapImage, RegionTable, STATE_OFFSET,
};
use memcore::Handle;

use crate::{DeviceMemory, Error, Pool, Result};

/// Alignment of the descriptor and of each region, bytes: every block is
/// then aligned to its class size up to this.
const REGION_ALIGN: u64 = 4096;

/// Chunks of the first region of a heap asked for `bytes` of regions.
fn first_chunks(bytes: u64) -> u32 {
    cm_heap::chunks_within(bytes).max(1)
}

/// Bytes a [`DeviceHeap::new`] asked for `bytes` takes from its pool: the
/// descriptor and its first region (at least one chunk), before any growth
/// and before the pool's own rounding. The ledger's `cm_malloc heap` line.
///
/// ```
/// use kernels::cm_heap::{DESCRIPTOR_BYTES, region_bytes};
/// assert_eq!(ctx::device_heap_bytes(0), DESCRIPTOR_BYTES + region_bytes(1));
/// assert_eq!(ctx::device_heap_bytes(region_bytes(256)), DESCRIPTOR_BYTES + region_bytes(256));
/// ```
pub fn device_heap_bytes(bytes: u64) -> u64 {
    DESCRIPTOR_BYTES + cm_heap::region_bytes(first_chunks(bytes))
}

/// A `cm_malloc` heap in device memory. Its blocks stay where they are for
/// its whole life: the descriptor and regions are pinned in the pool.
#[derive(Debug)]
pub struct DeviceHeap<D: DeviceMemory> {
    pool: Pool<D>,
    descriptor: Handle,
    regions: Vec<Handle>,
    table: RegionTable,
}

impl<D: DeviceMemory> DeviceHeap<D> {
    /// A heap of at most `bytes` bytes of regions (at least one chunk) taken
    /// from `pool`, plus its descriptor.
    pub fn new(pool: Pool<D>, bytes: u64) -> Result<Self> {
        let descriptor = pool.allocate(DESCRIPTOR_BYTES, REGION_ALIGN, None)?;
        pool.pin(descriptor)?.hold_until_freed();
        pool.write(descriptor, 0, &vec![0u8; DESCRIPTOR_BYTES as usize])?;
        let mut heap = Self {
            pool,
            descriptor,
            regions: Vec::new(),
            table: RegionTable::default(),
        };
        heap.grow(first_chunks(bytes))?;
        Ok(heap)
    }

    /// Device address of the descriptor (`CmHeap *`), for kernels that call
    /// `cm_heap_malloc` with it explicitly.
    pub fn descriptor_address(&self) -> Result<u64> {
        self.pool.device_ptr(self.descriptor)
    }

    /// The regions.
    pub fn table(&self) -> &RegionTable {
        &self.table
    }

    /// Bytes of device memory the regions hold (blocks and bitmaps).
    pub fn region_bytes(&self) -> u64 {
        cm_heap::region_bytes(self.table.chunks)
    }

    /// Adds a region of `chunks` chunks. Call it between launches only: a
    /// kernel running now may read the table half written.
    pub fn grow(&mut self, chunks: u32) -> Result<()> {
        if chunks == 0 {
            return Ok(());
        }
        let bytes = cm_heap::region_bytes(chunks);
        let region = self.pool.allocate(bytes, REGION_ALIGN, None)?;
        let added = self
            .pool
            .pin(region)
            .map(|guard| guard.hold_until_freed())
            .and_then(|base| {
                self.table
                    .with_region(base, chunks)
                    .ok_or(Error::InvalidConfig(
                        "device heap: region table full or chunk limit reached",
                    ))
            });
        let table = match added {
            Ok(table) => table,
            Err(e) => {
                let _ = self.pool.free(region);
                return Err(e);
            }
        };
        // The bitmaps start clear.
        let bitmaps = chunks as usize * cm_heap::BITMAP_BYTES as usize;
        self.pool.write(
            region,
            u64::from(chunks) * cm_heap::CHUNK_BYTES,
            &vec![0u8; bitmaps],
        )?;
        for (word, bits) in cm_heap::free_map_words(self.table.chunks, chunks) {
            // Between launches nothing else writes the map; the new chunks'
            // words hold only bits of chunks added before, which stay.
            let offset = FREE_MAP_OFFSET + word as u64 * 8;
            let mut old = [0u8; 8];
            self.pool.read(self.descriptor, offset, &mut old)?;
            let merged = u64::from_le_bytes(old) | bits;
            self.pool
                .write(self.descriptor, offset, &merged.to_le_bytes())?;
        }
        self.pool
            .write(self.descriptor, cm_heap::REGIONS_OFFSET, table.as_bytes())?;
        self.table = table;
        self.regions.push(region);
        Ok(())
    }

    /// The counters as the last launch left them.
    pub fn counters(&self) -> Result<CmCounters> {
        let mut bytes = [0u8; CmCounters::BYTES];
        self.pool
            .read(self.descriptor, cm_heap::COUNTERS_OFFSET, &mut bytes)?;
        CmCounters::from_bytes(&bytes).ok_or(Error::InvalidConfig("device heap counters"))
    }

    /// The chunk states and maps as the last launch left them (call it
    /// between launches), for [`HeapImage::free_window`]: whether a request
    /// that got NULL had a free window of its class.
    pub fn image(&self) -> Result<HeapImage> {
        let chunks = self.table.chunks as usize;
        let mut states = vec![0u8; chunks * 4];
        self.pool.read(self.descriptor, STATE_OFFSET, &mut states)?;
        let mut maps = Vec::new();
        for (r, &region) in self.regions.iter().enumerate() {
            let n = self.table.region_chunks[r];
            let mut bytes = vec![0u8; n as usize * cm_heap::BITMAP_BYTES as usize];
            self.pool
                .read(region, u64::from(n) * cm_heap::CHUNK_BYTES, &mut bytes)?;
            maps.extend(
                bytes
                    .chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))),
            );
        }
        Ok(HeapImage {
            states: states
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes(w.try_into().unwrap_or([0; 4])))
                .collect(),
            maps,
        })
    }

    /// Zeroes the failure counters (live, peak, allocations and frees stay).
    pub fn clear_failures(&self) -> Result<()> {
        let mut counters = self.counters()?;
        counters.failures = 0;
        counters.failed_bytes = 0;
        counters.largest_failed = 0;
        counters.bad_frees = 0;
        counters.reason = [0; 4];
        self.pool.write(
            self.descriptor,
            cm_heap::COUNTERS_OFFSET,
            counters.as_bytes(),
        )
    }

    /// After a launch: if requests failed for lack of room, adds the region
    /// [`cm_heap::growth_chunks`] asks for and clears the failure counters.
    /// Returns the chunks added (0: nothing failed, or the heap is at its
    /// limit).
    pub fn grow_after_launch(&mut self) -> Result<u32> {
        let counters = self.counters()?;
        let chunks = cm_heap::growth_chunks(self.table.chunks, counters.failed_bytes);
        if counters.failures != 0 {
            self.clear_failures()?;
        }
        self.grow(chunks)?;
        Ok(chunks)
    }
}

#[cfg(feature = "cuda")]
impl DeviceHeap<crate::CudaDevice> {
    /// Makes `cm_malloc`/`cm_free` in `module` use this heap (writes the
    /// module's `cm_heap` variable). The module must outlive no launch that
    /// runs after this heap is dropped.
    pub fn bind(&self, module: &crate::Module) -> Result<()> {
        module.set_global(
            cm_heap::HEAP_VARIABLE,
            &self.descriptor_address()?.to_le_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use kernels::cm_heap::{self, FREE_MAP_OFFSET, REGIONS_OFFSET, RegionTable, STATE_OFFSET};

    use super::DeviceHeap;
    use crate::{Pool, PoolConfig, SimConfig, SimDevice};

    fn heap(chunks: u32) -> DeviceHeap<SimDevice> {
        let device = SimDevice::new(SimConfig::small(256 << 20));
        let pool = Pool::new(device, PoolConfig::vmm(256 << 20)).unwrap();
        DeviceHeap::new(pool, cm_heap::region_bytes(chunks)).unwrap()
    }

    /// Whether the descriptor holds `table` where kernels read it.
    fn descriptor_holds(heap: &DeviceHeap<SimDevice>, table: &RegionTable) -> bool {
        let mut bytes = vec![0u8; table.as_bytes().len()];
        heap.pool
            .read(heap.descriptor, REGIONS_OFFSET, &mut bytes)
            .unwrap();
        bytes == table.as_bytes()
    }

    /// Bits of the free-chunk map the descriptor holds for chunks `0..chunks`.
    fn free_map_bits(heap: &DeviceHeap<SimDevice>, chunks: u32) -> u32 {
        (0..chunks.div_ceil(64))
            .map(|word| {
                let mut bytes = [0u8; 8];
                heap.pool
                    .read(
                        heap.descriptor,
                        FREE_MAP_OFFSET + word as u64 * 8,
                        &mut bytes,
                    )
                    .unwrap();
                u64::from_le_bytes(bytes).count_ones()
            })
            .sum()
    }

    #[test]
    fn growth_appends_a_region_and_marks_its_chunks_free_keeping_the_old_ones() {
        let mut heap = heap(3);
        assert_eq!((heap.table().regions, heap.table().chunks), (1, 3));
        assert!(descriptor_holds(&heap, heap.table()));
        assert_eq!(free_map_bits(&heap, 3), 3);
        let first_base = heap.table().region_base[0];

        heap.grow(5).unwrap();
        let table = *heap.table();
        assert_eq!((table.regions, table.chunks), (2, 8));
        assert_eq!((table.region_first[1], table.region_chunks[1]), (3, 5));
        assert_eq!(table.region_base[0], first_base, "the first region stays");
        assert!(descriptor_holds(&heap, &table));
        assert_eq!(free_map_bits(&heap, 8), 8);
        assert_eq!(heap.region_bytes(), cm_heap::region_bytes(8));
    }

    #[test]
    fn the_image_of_a_fresh_heap_and_of_one_chunk_taken() {
        let mut heap = heap(2);
        heap.grow(1).unwrap();
        let image = heap.image().unwrap();
        assert_eq!((image.states.len(), image.maps.len()), (3, 3 * 2048));
        assert_eq!(image.free_bytes(), 3 * cm_heap::CHUNK_BYTES);
        // Chunk 0 made class 0 with its first block map word full, as a
        // kernel leaves it; chunk 2 (the second region) class 16, taken.
        let taken = [(0usize, 1u32 << 24 | 64), (2, 17 << 24 | 1)];
        for (id, state) in taken {
            heap.pool
                .write(
                    heap.descriptor,
                    STATE_OFFSET + id as u64 * 4,
                    &state.to_le_bytes(),
                )
                .unwrap();
        }
        let first = heap.regions[0];
        heap.pool
            .write(first, 2 * cm_heap::CHUNK_BYTES, &[0xff; 8])
            .unwrap();
        heap.pool
            .write(heap.regions[1], cm_heap::CHUNK_BYTES, &[1])
            .unwrap();
        let image = heap.image().unwrap();
        assert_eq!(image.free_bytes(), 2 * cm_heap::CHUNK_BYTES - 64 * 16);
        assert_eq!(image.free_window(0), Some((0, 64 * 16)));
        assert_eq!(image.free_window(16), Some((1, 0)));
    }

    #[test]
    fn a_heap_with_nothing_failed_does_not_grow_after_a_launch() {
        let mut heap = heap(2);
        assert_eq!(heap.grow_after_launch().unwrap(), 0);
        assert_eq!(heap.table().chunks, 2);
        assert_eq!(heap.counters().unwrap().failures, 0);
    }
}
