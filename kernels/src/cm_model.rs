//! The algorithm of `cuda/cm_alloc.cuh` on the host, with std atomics, so
//! that CPU threads can race it and tests can check what the device cannot
//! show: no two live blocks overlap, a freed block is found again, every
//! chunk goes back to the free map once all blocks are freed, and growth
//! keeps the blocks already handed out.
//!
//! Step for step the device's: a request of a warp is a group of `n`
//! requests of one class served by one leader ([`HostHeap::allocate_group`]);
//! a thread's free is [`HostHeap::free`] (the device combines the atomics of
//! frees in one word or chunk; the bits and counts they change are the same).
//! Addresses are plain numbers: the model touches no memory but its own
//! bitmaps and states. Growth ([`HostHeap::add_region`]) takes `&mut self`,
//! as the device's happens between launches.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use crate::cm_heap::{
    ACTIVE, BLOCK_MAP_WORDS, CHUNK_BYTES, CLASS_SHIFT, CLASSES, COUNT_MASK, CmCounters, HeapImage,
    MAP_WORDS, MAX_CHUNKS, MAX_REQUEST_BYTES, Reason, RegionTable, SPANS_BIT, class_blocks,
    class_bytes, class_of,
};

/// Words of one chunk's maps (block map, then span map).
const BITMAP_WORDS: usize = 2 * BLOCK_MAP_WORDS;
/// [`CmCounters::epoch`] steps: a thread took a chunk off every map (low
/// half: chunks in transit now), and a chunk became visible (high half).
const EPOCH_TRANSIT: u64 = 1;
const EPOCH_PUBLISH: u64 = 1 << 32;
const EPOCH_TRANSIT_MASK: u64 = EPOCH_PUBLISH - 1;
/// Classes above its own that a request tries right after its own, before
/// the slow path (`CM_FALLBACK_CLASSES` in `cm_alloc.cuh`).
pub const FALLBACK_CLASSES: usize = 2;

/// A heap as the device holds it, in host memory.
#[derive(Debug)]
pub struct HostHeap {
    table: RegionTable,
    /// One bitmap per chunk id, [`BITMAP_WORDS`] words each.
    bitmaps: Vec<AtomicU64>,
    active: Vec<AtomicU32>,
    state: Vec<AtomicU32>,
    free_map: Vec<AtomicU64>,
    room_map: Vec<AtomicU64>,
    counters: Counters,
    /// Yields a thread takes while it holds a chunk that no map shows (taken
    /// off the free map, or emptied and not yet back on it): 0 normally; a
    /// test raises it to widen the window that thousands of warps hit on
    /// the device and a few CPU threads rarely do.
    transit_yields: AtomicU32,
}

#[derive(Debug, Default)]
struct Counters {
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
    failures: AtomicU64,
    failed_bytes: AtomicU64,
    largest_failed: AtomicU64,
    bad_frees: AtomicU64,
    reason: [AtomicU64; 4],
    epoch: AtomicU64,
}

/// What [`HostHeap::check`] found wrong with a quiescent heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption(pub String);

impl Default for HostHeap {
    fn default() -> Self {
        Self::new()
    }
}

fn zeros32(n: usize) -> Vec<AtomicU32> {
    (0..n).map(|_| AtomicU32::new(0)).collect()
}

fn zeros64(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl HostHeap {
    /// A heap with no region: every request fails until one is added.
    pub fn new() -> Self {
        Self {
            table: RegionTable::default(),
            bitmaps: Vec::new(),
            active: zeros32(CLASSES * ACTIVE),
            state: zeros32(MAX_CHUNKS as usize),
            free_map: zeros64(MAP_WORDS),
            room_map: zeros64(CLASSES * MAP_WORDS),
            counters: Counters::default(),
            transit_yields: AtomicU32::new(0),
        }
    }

    /// Makes every thread yield `n` times while it holds a chunk in transit
    /// (see the field); for tests that race the publication of chunks.
    pub fn set_transit_yields(&self, n: u32) {
        self.transit_yields.store(n, SeqCst);
    }

    fn in_transit(&self) {
        for _ in 0..self.transit_yields.load(SeqCst) {
            std::thread::yield_now();
        }
    }

    /// Adds a region of `chunks` chunks whose first block is at `base`;
    /// `false` (nothing added) if the region table is full or the heap would
    /// pass [`MAX_CHUNKS`].
    pub fn add_region(&mut self, base: u64, chunks: u32) -> bool {
        let Some(table) = self.table.with_region(base, chunks) else {
            return false;
        };
        let first = self.table.chunks;
        self.table = table;
        self.bitmaps
            .extend((0..chunks as usize * BITMAP_WORDS).map(|_| AtomicU64::new(0)));
        for id in first..first + chunks {
            self.free_map[id as usize / 64].fetch_or(1 << (id % 64), SeqCst);
        }
        true
    }

    /// The regions.
    pub fn regions(&self) -> &RegionTable {
        &self.table
    }

    /// The counters, as the host reads them after a launch.
    pub fn counters(&self) -> CmCounters {
        let c = &self.counters;
        CmCounters {
            live_bytes: c.live_bytes.load(SeqCst),
            peak_bytes: c.peak_bytes.load(SeqCst),
            allocations: c.allocations.load(SeqCst),
            frees: c.frees.load(SeqCst),
            failures: c.failures.load(SeqCst),
            failed_bytes: c.failed_bytes.load(SeqCst),
            largest_failed: c.largest_failed.load(SeqCst),
            bad_frees: c.bad_frees.load(SeqCst),
            reason: [0, 1, 2, 3].map(|i| c.reason[i].load(SeqCst)),
            epoch: c.epoch.load(SeqCst),
            unused: 0,
        }
    }

    /// Chunks in the free map now.
    pub fn free_chunks(&self) -> u32 {
        self.free_map
            .iter()
            .map(|w| w.load(SeqCst).count_ones())
            .sum()
    }

    fn chunk_data(&self, id: u32) -> u64 {
        let t = &self.table;
        let mut r = 0;
        while r + 1 < t.regions as usize && id >= t.region_first[r] + t.region_chunks[r] {
            r += 1;
        }
        t.region_base[r] + u64::from(id - t.region_first[r]) * CHUNK_BYTES
    }

    /// Chunk `id`'s block map.
    fn bitmap(&self, id: u32) -> &[AtomicU64] {
        let start = id as usize * BITMAP_WORDS;
        &self.bitmaps[start..start + BLOCK_MAP_WORDS]
    }

    /// Chunk `id`'s span map.
    fn span_map(&self, id: u32) -> &[AtomicU64] {
        let start = id as usize * BITMAP_WORDS + BLOCK_MAP_WORDS;
        &self.bitmaps[start..start + BLOCK_MAP_WORDS]
    }

    fn room(&self, k: usize) -> &[AtomicU64] {
        &self.room_map[k * MAP_WORDS..(k + 1) * MAP_WORDS]
    }

    /// A chunk became visible: in a map or an active slot.
    fn publish(&self) {
        self.counters.epoch.fetch_add(EPOCH_PUBLISH, SeqCst);
    }

    /// This thread is about to hold a chunk that no map shows.
    fn enter_transit(&self) {
        self.counters.epoch.fetch_add(EPOCH_TRANSIT, SeqCst);
    }

    /// It holds it no longer; `published`: the chunk is visible again.
    fn leave_transit(&self, published: bool) {
        let add = if published {
            EPOCH_PUBLISH - EPOCH_TRANSIT
        } else {
            EPOCH_TRANSIT.wrapping_neg()
        };
        self.counters.epoch.fetch_add(add, SeqCst);
    }

    /// Sets chunk `id`'s bit in `map` (the free map or a room map),
    /// publishing it if it was clear.
    fn map_set(&self, map: &[AtomicU64], id: u32) {
        let bit = 1u64 << (id % 64);
        if map[id as usize / 64].load(SeqCst) & bit == 0
            && map[id as usize / 64].fetch_or(bit, SeqCst) & bit == 0
        {
            self.publish();
        }
    }

    /// Chunk `id` of class tag `cls` whose count reached 0 (its state is
    /// `empty` now: the tag and maybe [`SPANS_BIT`]) goes back to the free
    /// map, unless someone reserved in it meanwhile.
    fn settle(&self, id: u32, cls: u32, empty: u32) {
        self.enter_transit();
        let settled = self.state[id as usize]
            .compare_exchange(empty, 0, SeqCst, SeqCst)
            .is_ok();
        if settled {
            self.room(cls as usize - 1)[id as usize / 64].fetch_and(!(1 << (id % 64)), SeqCst);
            self.in_transit();
            self.free_map[id as usize / 64].fetch_or(1 << (id % 64), SeqCst);
        }
        self.leave_transit(settled);
    }

    /// Gives back `n` reserved blocks of chunk `id` (freed ones, or ones a
    /// reservation could not use): a chunk whose count reaches 0 goes back
    /// to the free map, one whose count drops below its blocks gets its
    /// room mark.
    fn unreserve(&self, id: u32, n: u32) -> u32 {
        let old = self.state[id as usize].fetch_sub(n, SeqCst);
        let (tag, count) = (old >> CLASS_SHIFT, old & COUNT_MASK);
        if tag != 0 {
            let k = tag as usize - 1;
            if count == n {
                self.settle(id, tag, old - n);
            } else if count >= class_blocks(k) && count - n < class_blocks(k) {
                self.map_set(self.room(k), id);
            }
        }
        old
    }

    fn reserve(&self, id: u32, k: usize, want: u32) -> u32 {
        let blocks = class_blocks(k);
        let tag = k as u32 + 1;
        let peek = self.state[id as usize].load(SeqCst);
        if peek >> CLASS_SHIFT != tag || peek & COUNT_MASK >= blocks {
            return 0;
        }
        let old = self.state[id as usize].fetch_add(want, SeqCst);
        let count = old & COUNT_MASK;
        let got = if old >> CLASS_SHIFT == tag && count < blocks {
            want.min(blocks - count)
        } else {
            0
        };
        if got < want {
            self.unreserve(id, want - got);
        }
        got
    }

    fn take_free(&self, k: usize, want: u32, start: u32) -> Option<(u32, u32)> {
        let words = self.table.chunks.div_ceil(64);
        for i in 0..words {
            let w = ((start + i) % words) as usize;
            let mut bits = self.free_map[w].load(SeqCst);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                self.enter_transit();
                let old = self.free_map[w].fetch_and(!(1 << b), SeqCst);
                if old & (1 << b) == 0 {
                    self.leave_transit(false);
                    continue;
                }
                let id = w as u32 * 64 + b;
                self.in_transit();
                self.state[id as usize].fetch_add((k as u32 + 1) << CLASS_SHIFT, SeqCst);
                let got = self.reserve(id, k, want);
                if got != 0 {
                    // Still in transit: reserve_some publishes it.
                    return Some((id + 1, got));
                }
                // A stale reservation settled it: it is back on the free map.
                self.leave_transit(false);
            }
        }
        None
    }

    fn find_room(&self, k: usize, want: u32, skip: u32, start: u32) -> Option<(u32, u32)> {
        for s in 0..ACTIVE {
            let a = self.active[k * ACTIVE + (start as usize + s) % ACTIVE].load(SeqCst);
            if a != 0 && a != skip {
                let got = self.reserve(a - 1, k, want);
                if got != 0 {
                    return Some((a, got));
                }
            }
        }
        let words = self.table.chunks.div_ceil(64);
        let room = self.room(k);
        for i in 0..words {
            let w = ((start + i) % words) as usize;
            let mut bits = room[w].load(SeqCst);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let id = w as u32 * 64 + b;
                let got = self.reserve(id, k, want);
                if got != 0 {
                    return Some((id + 1, got));
                }
                // A free may make room between the two steps: the chunk is
                // in transit until the mark is back or it is known full.
                self.enter_transit();
                room[w].fetch_and(!(1 << b), SeqCst);
                self.in_transit();
                let now = self.state[id as usize].load(SeqCst);
                let has_room =
                    now >> CLASS_SHIFT == k as u32 + 1 && now & COUNT_MASK < class_blocks(k);
                if has_room {
                    self.map_set(room, id);
                }
                self.leave_transit(has_room);
            }
        }
        None
    }

    /// Up to `want` blocks of class `k` reserved in one chunk: `(chunk id +
    /// 1, blocks)`, `None` only when one whole search found no chunk of the
    /// class with room and none free while no chunk was in transit or
    /// published anywhere in the heap (see [`HostHeap::allocate_group`]).
    /// Not `patient` (the slow path's larger classes): one search only, so
    /// that a heap busy publishing chunks does not hold a request there.
    fn reserve_some(&self, k: usize, want: u32, hash: u32, patient: bool) -> Option<(u32, u32)> {
        let slot = &self.active[k * ACTIVE + hash as usize % ACTIVE];
        let a = slot.load(SeqCst);
        if a != 0 {
            let got = self.reserve(a - 1, k, want);
            if got != 0 {
                return Some((a, got));
            }
        }
        loop {
            let seen = self.counters.epoch.load(SeqCst);
            let found = self
                .find_room(k, want, a, hash)
                .map(|(c, got)| (c, got, false))
                .or_else(|| self.take_free(k, want, hash).map(|(c, got)| (c, got, true)));
            if let Some((c, got, fresh)) = found {
                if c != a || fresh {
                    self.replace_active(slot, k, a, c);
                }
                if fresh {
                    self.leave_transit(true);
                }
                return Some((c, got));
            }
            let now = self.counters.epoch.load(SeqCst);
            if !patient || (now == seen && seen & EPOCH_TRANSIT_MASK == 0) {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// Puts chunk `c` (id + 1) in the active slot that held `a`. A chunk
    /// that leaves the slot with room keeps it visible: it gets its room
    /// mark first (one that fills later and empties again gets it from
    /// [`HostHeap::unreserve`]). If another thread changed the slot, `c`
    /// gets the mark instead.
    fn replace_active(&self, slot: &AtomicU32, k: usize, a: u32, c: u32) {
        if a != 0 {
            let st = self.state[a as usize - 1].load(SeqCst);
            if st >> CLASS_SHIFT == k as u32 + 1 && st & COUNT_MASK < class_blocks(k) {
                self.map_set(self.room(k), a - 1);
            }
        }
        if slot.compare_exchange(a, c, SeqCst, SeqCst).is_err() {
            self.map_set(self.room(k), c - 1);
        }
    }

    fn claim_bits(&self, id: u32, k: usize, want: u32, start: u32) -> (usize, u64) {
        let blocks = class_blocks(k);
        let words = blocks.div_ceil(64) as usize;
        let valid = if blocks >= 64 {
            !0
        } else {
            (1u64 << blocks) - 1
        };
        let bitmap = self.bitmap(id);
        let mut i = start as usize % words;
        loop {
            let mut clear = !bitmap[i].load(SeqCst) & valid;
            while clear != 0 {
                let mut take = 0u64;
                let mut rest = clear;
                for _ in 0..want {
                    if rest == 0 {
                        break;
                    }
                    take |= rest & rest.wrapping_neg();
                    rest &= rest - 1;
                }
                let old = bitmap[i].fetch_or(take, SeqCst);
                let got = take & !old;
                if got != 0 {
                    return (i, got);
                }
                clear = !(old | take) & valid;
            }
            i = if i + 1 == words { 0 } else { i + 1 };
        }
    }

    /// A block of class `k` made of a span of a smaller class's chunk: an
    /// aligned run of 2^(k - j) clear bits of a chunk of class j < k (one
    /// pass over the chunks from `start`), found in the block map, reserved
    /// in the chunk's count, then claimed.
    /// The span's tails are marked in the span map and the chunk gets
    /// [`SPANS_BIT`] before the block is handed out. `None` if no chunk of a
    /// smaller class has such a run.
    fn borrow(&self, k: usize, start: u32) -> Option<u64> {
        let chunks = self.table.chunks;
        for i in 0..chunks {
            let id = start.wrapping_add(i) % chunks;
            let state = &self.state[id as usize];
            let tag = state.load(SeqCst) >> CLASS_SHIFT;
            if tag == 0 || tag as usize > k {
                continue;
            }
            let j = tag as usize - 1;
            let (run, blocks) = (1u32 << (k - j), class_blocks(j));
            // A run clear in the map but reserved by others in the count is
            // either claimed soon (the map shows it) or given back (the
            // count does): wait for one or the other.
            while let Some(index) = self.find_run(id, blocks, run) {
                let old = state.fetch_add(run, SeqCst);
                if old >> CLASS_SHIFT != tag {
                    self.unreserve(id, run);
                    break;
                }
                if (old & COUNT_MASK) + run <= blocks && self.claim_run(id, index, run) {
                    state.fetch_or(SPANS_BIT, SeqCst);
                    let spans = self.span_map(id);
                    for (w, mask) in span_words(index, run) {
                        spans[w].fetch_or(mask, SeqCst);
                    }
                    return Some(self.chunk_data(id) + u64::from(index) * class_bytes(j));
                }
                self.unreserve(id, run);
                std::thread::yield_now();
            }
        }
        None
    }

    /// The first `run` (a power of two) clear bits aligned to `run` among
    /// the `blocks` bits of chunk `id`'s block map, read only.
    fn find_run(&self, id: u32, blocks: u32, run: u32) -> Option<u32> {
        let map = self.bitmap(id);
        (0..blocks).step_by(run as usize).find(|&index| {
            run_words(index, run)
                .iter()
                .all(|&(w, mask)| map[w].load(SeqCst) & mask == 0)
        })
    }

    /// Sets the `run` bits from `index` of chunk `id`'s block map; `false`
    /// (nothing set) if another thread took one of them first.
    fn claim_run(&self, id: u32, index: u32, run: u32) -> bool {
        let map = self.bitmap(id);
        let words = run_words(index, run);
        for (n, &(w, mask)) in words.iter().enumerate() {
            let old = map[w].fetch_or(mask, SeqCst);
            if old & mask != 0 {
                // Give back only the bits this call set.
                map[w].fetch_and(!(mask & !old), SeqCst);
                for &(w, mask) in &words[..n] {
                    map[w].fetch_and(!mask, SeqCst);
                }
                return false;
            }
        }
        true
    }

    /// Blocks in the span that starts at block `index` of chunk `id` (1 for
    /// a block alone); `None` if `index` is a span's tail.
    fn span_len(&self, id: u32, index: u32) -> Option<u32> {
        let spans = self.span_map(id);
        let (w, b) = (index as usize / 64, index % 64);
        let word = spans[w].load(SeqCst);
        if word & (1 << b) != 0 {
            return None;
        }
        if b == 63 {
            return Some(1);
        }
        let ones = (!(word >> (b + 1))).trailing_zeros().min(63 - b);
        if b != 0 || ones != 63 {
            return Some(ones + 1);
        }
        let full = spans[w + 1..]
            .iter()
            .take_while(|s| s.load(SeqCst) == !0)
            .count();
        Some(64 * (1 + full as u32))
    }

    fn fail(&self, reason: Reason, bytes: u64, n: u64, class_bytes: u64) {
        let c = &self.counters;
        c.failures.fetch_add(n, SeqCst);
        c.reason[reason as usize].fetch_add(n, SeqCst);
        if reason == Reason::Exhausted {
            c.failed_bytes.fetch_add(n * class_bytes, SeqCst);
        }
        c.largest_failed.fetch_max(bytes, SeqCst);
    }

    /// One request of `bytes` from the warp slot `hash`; `None` with the
    /// reason counted.
    pub fn allocate(&self, bytes: u64, hash: u32) -> Option<u64> {
        self.allocate_group(bytes, 1, hash).pop()
    }

    /// `n` (1 to 32) requests of `bytes` each, as the leader of a warp serves
    /// the lanes asking for one class: the addresses handed out, fewer than
    /// `n` if the heap ran out (the rest counted as failures).
    ///
    /// The order: class k, then the [`FALLBACK_CLASSES`] above it (the fast
    /// path); then, one block at a time, a span of 2^(k - j) free blocks
    /// of a chunk of any class j < k, then a block of any
    /// class above. The rule, on a heap no other thread frees in meanwhile:
    /// a request of class k gets NULL only when no `class_bytes(k)`-aligned
    /// window of that size is free ([`HeapImage::free_window`] is `None`).
    /// No rule in free bytes alone holds for an allocator that leaves blocks
    /// in place: every other 16 B block free leaves half a chunk free and no
    /// 32 B window. A block is counted at its own size in the counters
    /// ([`HostHeap::block_bytes`]: a larger class's, or the span's).
    pub fn allocate_group(&self, bytes: u64, n: u32, hash: u32) -> Vec<u64> {
        if bytes == 0 || bytes > MAX_REQUEST_BYTES {
            let reason = if bytes == 0 {
                Reason::Zero
            } else {
                Reason::TooLarge
            };
            self.fail(reason, bytes, u64::from(n), 0);
            return Vec::new();
        }
        let k = class_of(bytes);
        let size = class_bytes(k);
        let mut out = Vec::with_capacity(n as usize);
        let mut added = 0;
        while (out.len() as u32) < n {
            let handed = out.len() as u32;
            let found = (k..CLASSES.min(k + 1 + FALLBACK_CLASSES))
                .find_map(|kk| Some(kk).zip(self.reserve_some(kk, n - handed, hash, true)));
            let Some((kk, (chunk, got))) = found.or_else(|| {
                // The slow path: one block at a time from a span of a
                // smaller class, else a block of any larger class.
                if let Some(address) = self.borrow(k, hash) {
                    out.push(address);
                    added += size;
                    return None;
                }
                (k + 1 + FALLBACK_CLASSES..CLASSES)
                    .find_map(|kk| Some(kk).zip(self.reserve_some(kk, n - handed, hash, false)))
            }) else {
                if out.len() as u32 > handed {
                    continue;
                }
                break;
            };
            let data = self.chunk_data(chunk - 1);
            let mut claimed = 0;
            while claimed < got {
                let start = hash.wrapping_mul(0x9E37_79B1).wrapping_add(handed);
                let (word, mut bits) = self.claim_bits(chunk - 1, kk, got - claimed, start);
                while bits != 0 {
                    let index = word as u64 * 64 + u64::from(bits.trailing_zeros());
                    bits &= bits - 1;
                    out.push(data + index * class_bytes(kk));
                    claimed += 1;
                }
            }
            added += u64::from(got) * class_bytes(kk);
        }
        let handed = out.len() as u64;
        let c = &self.counters;
        if handed != 0 {
            let live = c.live_bytes.fetch_add(added, SeqCst) + added;
            c.peak_bytes.fetch_max(live, SeqCst);
            c.allocations.fetch_add(handed, SeqCst);
        }
        if handed < u64::from(n) {
            self.fail(Reason::Exhausted, size, u64::from(n) - handed, size);
        }
        out
    }

    /// Bytes of the live block at `address` (its chunk's class size, times
    /// the blocks of its span), `None` if no chunk with a class holds it or
    /// it is a span's tail.
    pub fn block_bytes(&self, address: u64) -> Option<u64> {
        let t = &self.table;
        let r = (0..t.regions as usize).find(|&r| {
            address.wrapping_sub(t.region_base[r]) < u64::from(t.region_chunks[r]) * CHUNK_BYTES
        })?;
        let local = (address - t.region_base[r]) / CHUNK_BYTES;
        let id = t.region_first[r] + local as u32;
        let cls = self.state[id as usize].load(SeqCst) >> CLASS_SHIFT;
        if cls == 0 {
            return None;
        }
        let size = class_bytes(cls as usize - 1);
        let index = (address - t.region_base[r] - local * CHUNK_BYTES) / size;
        Some(u64::from(self.span_len(id, index as u32)?) * size)
    }

    /// Frees the block at `address`; a pointer that is no live block is
    /// counted in `bad_frees` and changes nothing else.
    pub fn free(&self, address: u64) {
        let t = &self.table;
        let bad = || {
            self.counters.bad_frees.fetch_add(1, SeqCst);
        };
        let Some(r) = (0..t.regions as usize).find(|&r| {
            address.wrapping_sub(t.region_base[r]) < u64::from(t.region_chunks[r]) * CHUNK_BYTES
        }) else {
            return bad();
        };
        let local = (address - t.region_base[r]) / CHUNK_BYTES;
        let id = t.region_first[r] + local as u32;
        let cls = self.state[id as usize].load(SeqCst) >> CLASS_SHIFT;
        let offset = address - t.region_base[r] - local * CHUNK_BYTES;
        if cls == 0 || offset % class_bytes(cls as usize - 1) != 0 {
            return bad();
        }
        let k = cls as usize - 1;
        let index = (offset / class_bytes(k)) as u32;
        let run = if self.state[id as usize].load(SeqCst) & SPANS_BIT != 0 {
            let Some(run) = self.span_len(id, index) else {
                return bad();
            };
            run
        } else {
            1
        };
        let bit = 1u64 << (index % 64);
        if run > 1 {
            if self.bitmap(id)[index as usize / 64].load(SeqCst) & bit == 0 {
                return bad();
            }
            // Tails first: a run whose bits are clear has no marks.
            let spans = self.span_map(id);
            for (w, mask) in span_words(index, run) {
                spans[w].fetch_and(!mask, SeqCst);
            }
            for (w, mask) in run_words(index, run) {
                self.bitmap(id)[w].fetch_and(!mask, SeqCst);
            }
        } else {
            let old = self.bitmap(id)[index as usize / 64].fetch_and(!bit, SeqCst);
            if old & bit == 0 {
                return bad();
            }
        }
        self.unreserve(id, run);
        self.counters
            .live_bytes
            .fetch_sub(u64::from(run) * class_bytes(k), SeqCst);
        self.counters.frees.fetch_add(1, SeqCst);
    }

    /// The heap's states and maps now (a quiescent heap's: no thread in
    /// it), for [`HeapImage::free_window`].
    pub fn image(&self) -> HeapImage {
        let chunks = self.table.chunks as usize;
        HeapImage {
            states: self.state[..chunks]
                .iter()
                .map(|s| s.load(SeqCst))
                .collect(),
            maps: self.bitmaps.iter().map(|w| w.load(SeqCst)).collect(),
        }
    }

    /// Checks a heap no thread is using: every chunk's count is the number
    /// of its set bits, a chunk is in the free map exactly when it has no
    /// class, no chunk is in transit, and `live_bytes` is what the bitmaps hold.
    pub fn check(&self) -> Result<(), Corruption> {
        let mut live = 0u64;
        for id in 0..self.table.chunks {
            let state = self.state[id as usize].load(SeqCst);
            let bits: u32 = self
                .bitmap(id)
                .iter()
                .map(|w| w.load(SeqCst).count_ones())
                .sum();
            let free = self.free_map[id as usize / 64].load(SeqCst) & (1 << (id % 64)) != 0;
            let cls = state >> CLASS_SHIFT;
            if state & COUNT_MASK != bits {
                return Err(Corruption(format!(
                    "chunk {id}: count {} but {bits} bits set",
                    state & COUNT_MASK
                )));
            }
            if free != (cls == 0) {
                return Err(Corruption(format!(
                    "chunk {id}: class tag {cls}, in the free map: {free}"
                )));
            }
            if cls != 0 {
                live += u64::from(bits) * class_bytes(cls as usize - 1);
            }
            let stray = self
                .bitmap(id)
                .iter()
                .zip(self.span_map(id))
                .any(|(b, s)| s.load(SeqCst) & !b.load(SeqCst) != 0);
            let marked = self.span_map(id).iter().any(|s| s.load(SeqCst) != 0);
            if stray || (marked && state & SPANS_BIT == 0) {
                return Err(Corruption(format!(
                    "chunk {id}: span marks on clear blocks or without the spans bit"
                )));
            }
        }
        let transit = self.counters.epoch.load(SeqCst) & EPOCH_TRANSIT_MASK;
        if transit != 0 {
            return Err(Corruption(format!("{transit} chunks still in transit")));
        }
        let counted = self.counters.live_bytes.load(SeqCst);
        if live != counted {
            return Err(Corruption(format!(
                "bitmaps hold {live} bytes, live_bytes says {counted}"
            )));
        }
        Ok(())
    }
}

/// The block-map words of the run of `run` (a power of two) blocks from
/// `index` (aligned to `run`): `(word, mask)`.
fn run_words(index: u32, run: u32) -> Vec<(usize, u64)> {
    if run >= 64 {
        let first = index as usize / 64;
        (first..first + run as usize / 64)
            .map(|w| (w, !0))
            .collect()
    } else {
        vec![(index as usize / 64, ((1u64 << run) - 1) << (index % 64))]
    }
}

/// The span-map words that mark the tails of that run: every block but the
/// first.
fn span_words(index: u32, run: u32) -> Vec<(usize, u64)> {
    let mut words = run_words(index, run);
    words[0].1 &= !(1u64 << (index % 64));
    words
}
