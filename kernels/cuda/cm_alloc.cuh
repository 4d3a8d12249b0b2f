// cm_malloc / cm_free: an in-kernel allocator whose heap the host grows
// between launches.
//
// Use from CUDA C: #include "cm_alloc.cuh", call cm_malloc(bytes) and
// cm_free(ptr) in device code. The heap is a CmHeap descriptor in device
// memory that the host builds (ctx::cuda::DeviceHeap) and binds to a loaded
// module by writing its address into the module's `cm_heap` variable.
// Explicit variants (cm_heap_malloc / cm_heap_free) take the descriptor.
//
// The heap is a table of regions. A region of n chunks is n * 1 MiB of
// blocks followed by n * 16 KiB of maps (per chunk an 8 KiB block map, one
// bit per block, then an 8 KiB span map). Chunk ids run across regions
// (region r holds ids region_first[r] .. + region_chunks[r]). A chunk takes a
// size class (16 B << k, k = 0..16) when first used: state[id] holds the
// class + 1 in its top byte (0: the chunk is free), CM_SPANS_BIT, and in its
// low 23 bits the blocks reserved in it. Allocation reserves blocks in the count first and
// then claims that many bits of the chunk's bitmap, so a reservation always
// has a free bit to find; free clears the bit before it gives the
// reservation back. A chunk whose count drops to 0 goes back to free_map.
// Each class has CM_ACTIVE chunks that warps (hashed by SM and warp) take
// blocks from; a chunk that is full is replaced from room_map[k] (chunks of
// class k that a free made room in) or free_map. Threads of a warp asking
// for the same class are served by one leader: one atomic on the count and
// one per bitmap word for all of them; frees of one word / one chunk are
// combined the same way.
//
// The slow path, when class k and the CM_FALLBACK_CLASSES above it are out
// (cm_heap_malloc): a span of 2^(k - j) free blocks aligned to 2^(k - j) in
// a chunk of a smaller class j (cm_borrow), else a block of any larger class.
// A span is reserved in its chunk's count like blocks, claimed in the block
// map in one go, its tails (every block but the first) marked in the span
// map, and the chunk gets CM_SPANS_BIT; cm_free of its first block frees it
// whole. On a heap that no thread frees in meanwhile, a request of class k
// gets NULL only when no 2^k-aligned window of 2^k bytes is free anywhere
// (kernels::cm_heap::HeapImage::free_window states it; the host tests
// check it).
//
// NULL from one class means that class is truly out: a chunk of class k with room is always
// in an active slot of k, in room_map[k], or held by a thread that will
// publish it (a chunk taken off the free map, an emptied chunk on its way
// back to it, a room mark being rechecked). Such a thread counts itself in
// the low half of counters.epoch while it holds the chunk and adds to the
// high half when the chunk is visible again; a leader returns NULL only
// after a whole search during which the epoch did not move and nothing was
// in transit, and searches again otherwise.
//
// kernels/src/cm_heap.rs states the same layout for the host, and
// kernels/tests/cm_alloc runs this file itself on host threads, each warp's
// lanes as threads that meet in every warp function.
#pragma once

typedef unsigned long long cm_u64;
typedef unsigned int cm_u32;

#define CM_MIN_SHIFT 4u                    // smallest block: 16 B
#define CM_CHUNK_SHIFT 20u                 // chunk: 1 MiB
#define CM_CHUNK_BYTES (1ull << CM_CHUNK_SHIFT)
#define CM_CLASSES 17u                     // 16 B .. 1 MiB
#define CM_MAX_BYTES CM_CHUNK_BYTES        // largest request
#define CM_ACTIVE 32u                      // active chunks per class
#define CM_FALLBACK_CLASSES 2u             // classes above its own a request may take
#define CM_MAX_REGIONS 64u
#define CM_MAX_CHUNKS 65536u               // 64 GiB of blocks
#define CM_MAP_WORDS (CM_MAX_CHUNKS / 64u)
#define CM_BLOCK_MAP_WORDS ((cm_u32)(CM_CHUNK_BYTES >> CM_MIN_SHIFT) / 64u)
#define CM_BITMAP_BYTES (2u * CM_BLOCK_MAP_WORDS * 8ull) // block map, then span map
#define CM_SPANS_BIT (1u << 23)                             // a span was handed out in the chunk
#define CM_COUNT_MASK (CM_SPANS_BIT - 1u)
#define CM_CLASS_SHIFT 24u

// Why a cm_malloc returned NULL (index into CmCounters::reason).
#define CM_FAIL_ZERO 0u      // zero bytes asked
#define CM_FAIL_TOO_LARGE 1u // more than CM_MAX_BYTES asked
#define CM_FAIL_EXHAUSTED 2u // no chunk of the class has room and none is free: grow the heap
#define CM_REASONS 4u

// CmCounters::epoch steps: a thread holds a chunk that no map shows (low
// half), a chunk became visible in a map or an active slot (high half).
#define CM_EPOCH_TRANSIT 1ull
#define CM_EPOCH_PUBLISH (1ull << 32)
#define CM_EPOCH_TRANSIT_MASK (CM_EPOCH_PUBLISH - 1)

// Must match kernels::cm_heap::CmCounters (112 bytes).
struct CmCounters {
    cm_u64 live_bytes;      // bytes of the live blocks (class sizes)
    cm_u64 peak_bytes;      // highest live_bytes seen
    cm_u64 allocations;     // cm_malloc calls that returned a block
    cm_u64 frees;           // cm_free calls that freed a block
    cm_u64 failures;        // cm_malloc calls that returned NULL
    cm_u64 failed_bytes;    // class bytes of the CM_FAIL_EXHAUSTED requests
    cm_u64 largest_failed;  // largest request that got NULL, bytes
    cm_u64 bad_frees;       // cm_free of a pointer that is no live block
    cm_u64 reason[CM_REASONS];
    cm_u64 epoch;           // low 32 bits: chunks in transit; high: chunks published
    cm_u64 unused;
};

// Must match kernels::cm_heap (REGIONS_OFFSET .. DESCRIPTOR_BYTES).
struct CmHeap {
    cm_u32 regions;                         // regions in use
    cm_u32 chunks;                          // chunk ids in use
    cm_u64 region_base[CM_MAX_REGIONS];     // device address of the region's first chunk
    cm_u32 region_first[CM_MAX_REGIONS];    // id of the region's first chunk
    cm_u32 region_chunks[CM_MAX_REGIONS];   // chunks in the region
    CmCounters counters;
    cm_u32 active[CM_CLASSES][CM_ACTIVE];   // chunk id + 1, 0 for none
    cm_u32 state[CM_MAX_CHUNKS];            // class + 1 << 24 | CM_SPANS_BIT | reserved blocks
    cm_u64 free_map[CM_MAP_WORDS];          // bit set: the chunk is free
    cm_u64 room_map[CM_CLASSES][CM_MAP_WORDS]; // bit set: the chunk may have room
};

static_assert(sizeof(CmCounters) == 112, "CmCounters layout");
static_assert(__builtin_offsetof(CmHeap, counters) == 1032, "CmHeap layout");
static_assert(__builtin_offsetof(CmHeap, active) == 1144, "CmHeap layout");
static_assert(__builtin_offsetof(CmHeap, state) == 3320, "CmHeap layout");
static_assert(__builtin_offsetof(CmHeap, free_map) == 265464, "CmHeap layout");
static_assert(__builtin_offsetof(CmHeap, room_map) == 273656, "CmHeap layout");
static_assert(sizeof(CmHeap) == 412920, "CmHeap layout");

// The heap cm_malloc and cm_free use; the host writes it after loading the
// module (ctx::cuda::DeviceHeap::bind).
__device__ CmHeap *cm_heap;

// Where a thread holds a chunk that no map shows; empty on the device. The
// host tests widen these windows here.
#ifndef CM_TRANSIT_HOOK
#define CM_TRANSIT_HOOK()
#endif

#ifdef CUDA_HOST_EMULATION
// Host threads run this file in the tests (kernels/tests/emulation): the
// emulation's lane and warp slot, and relaxed atomic loads, which is what a
// volatile load is in the device's memory model.
__device__ __forceinline__ cm_u32 cm_lane()
{
    return host_lane_id();
}

__device__ __forceinline__ cm_u32 cm_warp_hash()
{
    return host_warp_slot();
}

__device__ __forceinline__ cm_u32 cm_load(const cm_u32 *p)
{
    return host_load_relaxed(p);
}

__device__ __forceinline__ cm_u64 cm_load64(const cm_u64 *p)
{
    return host_load_relaxed(p);
}
#else
__device__ __forceinline__ cm_u32 cm_lane()
{
    cm_u32 lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

// Spreads warps over the active chunks of a class: by SM and warp slot.
__device__ __forceinline__ cm_u32 cm_warp_hash()
{
    cm_u32 sm, warp;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    asm volatile("mov.u32 %0, %%warpid;" : "=r"(warp));
    return sm * 64u + warp;
}

__device__ __forceinline__ cm_u32 cm_load(const cm_u32 *p)
{
    return *(const volatile cm_u32 *)p;
}

__device__ __forceinline__ cm_u64 cm_load64(const cm_u64 *p)
{
    return *(const volatile cm_u64 *)p;
}
#endif

__device__ __forceinline__ cm_u32 cm_class(cm_u64 bytes)
{
    if (bytes <= (1ull << CM_MIN_SHIFT)) {
        return 0;
    }
    return (64u - __clzll(bytes - 1)) - CM_MIN_SHIFT;
}

__device__ __forceinline__ cm_u32 cm_blocks(cm_u32 k)
{
    return (cm_u32)(CM_CHUNK_BYTES >> (CM_MIN_SHIFT + k));
}

// Region of chunk `id`; its data address and bitmap.
struct CmChunk {
    cm_u64 data;
    cm_u64 *bitmap;
};

__device__ __forceinline__ CmChunk cm_chunk(const CmHeap *h, cm_u32 id)
{
    cm_u32 r = 0;
    while (r + 1 < h->regions && id >= h->region_first[r] + h->region_chunks[r]) {
        r++;
    }
    cm_u32 local = id - h->region_first[r];
    cm_u64 base = h->region_base[r];
    CmChunk c;
    c.data = base + ((cm_u64)local << CM_CHUNK_SHIFT);
    c.bitmap = (cm_u64 *)(base + ((cm_u64)h->region_chunks[r] << CM_CHUNK_SHIFT) + local * CM_BITMAP_BYTES);
    return c;
}

__device__ __forceinline__ void cm_publish(CmHeap *h)
{
    __threadfence();
    atomicAdd(&h->counters.epoch, CM_EPOCH_PUBLISH);
}

__device__ __forceinline__ void cm_enter_transit(CmHeap *h)
{
    atomicAdd(&h->counters.epoch, CM_EPOCH_TRANSIT);
    __threadfence();
}

__device__ __forceinline__ void cm_leave_transit(CmHeap *h, bool published)
{
    __threadfence();
    atomicAdd(&h->counters.epoch, published ? CM_EPOCH_PUBLISH - CM_EPOCH_TRANSIT : 0ull - CM_EPOCH_TRANSIT);
}

// Sets chunk `id`'s bit in `map`, publishing it if it was clear. The fence
// orders the caller's change of the chunk's state before the load, against
// cm_find_room's clear-then-recheck.
__device__ void cm_map_set(CmHeap *h, cm_u64 *map, cm_u32 id)
{
    cm_u64 bit = 1ull << (id % 64);
    __threadfence();
    if ((cm_load64(&map[id / 64]) & bit) == 0 && (atomicOr(&map[id / 64], bit) & bit) == 0) {
        cm_publish(h);
    }
}

__device__ void cm_map_clear(cm_u64 *map, cm_u32 id)
{
    atomicAnd(&map[id / 64], ~(1ull << (id % 64)));
}

// A chunk whose count reached 0 (its state is `empty`: the class tag and
// maybe CM_SPANS_BIT) goes back to free_map, unless someone reserved in it
// meanwhile (that thread will see 0 again when it is done).
__device__ void cm_settle(CmHeap *h, cm_u32 id, cm_u32 cls, cm_u32 empty)
{
    cm_enter_transit(h);
    bool settled = atomicCAS(&h->state[id], empty, 0u) == empty;
    if (settled) {
        cm_map_clear(h->room_map[cls - 1], id);
        CM_TRANSIT_HOOK();
        __threadfence();
        atomicOr(&h->free_map[id / 64], 1ull << (id % 64));
    }
    cm_leave_transit(h, settled);
}

// Gives back `n` reserved blocks of chunk `id` whose bits are clear (freed
// blocks, or a reservation's surplus): a chunk whose count reaches 0 goes
// back to the free map, one whose count drops below its blocks gets its
// room mark.
__device__ cm_u32 cm_unreserve(CmHeap *h, cm_u32 id, cm_u32 n)
{
    cm_u32 old = atomicSub(&h->state[id], n);
    cm_u32 tag = old >> CM_CLASS_SHIFT;
    cm_u32 count = old & CM_COUNT_MASK;
    if (tag != 0) {
        cm_u32 blocks = cm_blocks(tag - 1);
        if (count == n) {
            cm_settle(h, id, tag, old - n);
        } else if (count >= blocks && count - n < blocks) {
            cm_map_set(h, h->room_map[tag - 1], id);
        }
    }
    return old;
}

// Reserves up to `want` blocks of class k in chunk `id`; returns how many.
__device__ cm_u32 cm_reserve(CmHeap *h, cm_u32 id, cm_u32 k, cm_u32 want)
{
    cm_u32 blocks = cm_blocks(k);
    cm_u32 peek = cm_load(&h->state[id]);
    if ((peek >> CM_CLASS_SHIFT) != k + 1 || (peek & CM_COUNT_MASK) >= blocks) {
        return 0;
    }
    cm_u32 old = atomicAdd(&h->state[id], want);
    cm_u32 count = old & CM_COUNT_MASK;
    cm_u32 got = 0;
    if ((old >> CM_CLASS_SHIFT) == k + 1 && count < blocks) {
        got = min(want, blocks - count);
    }
    if (got < want) {
        cm_unreserve(h, id, want - got);
    }
    return got;
}

// A free chunk made class k, with up to `want` blocks reserved; 0 if none.
__device__ cm_u32 cm_take_free(CmHeap *h, cm_u32 k, cm_u32 want, cm_u32 start, cm_u32 *got)
{
    cm_u32 words = (h->chunks + 63) / 64;
    for (cm_u32 i = 0; i < words; i++) {
        cm_u32 w = (start + i) % words;
        cm_u64 bits = cm_load64(&h->free_map[w]);
        while (bits != 0) {
            cm_u32 b = __ffsll((long long)bits) - 1;
            bits &= bits - 1;
            cm_enter_transit(h);
            cm_u64 old = atomicAnd(&h->free_map[w], ~(1ull << b));
            if ((old & (1ull << b)) == 0) {
                cm_leave_transit(h, false);
                continue;
            }
            cm_u32 id = w * 64 + b;
            CM_TRANSIT_HOOK();
            // Only the holder of the free bit sets the class; stale
            // reservations in the low bits undo themselves.
            atomicAdd(&h->state[id], (k + 1) << CM_CLASS_SHIFT);
            *got = cm_reserve(h, id, k, want);
            if (*got != 0) {
                // Still in transit: cm_reserve_some publishes it.
                return id + 1;
            }
            // A stale reservation settled it: it is back on the free map.
            cm_leave_transit(h, false);
        }
    }
    return 0;
}

// A chunk of class k other than `skip` with room: another active slot, or
// one from room_map. Reserves up to `want` blocks in it; 0 if none.
__device__ cm_u32 cm_find_room(CmHeap *h, cm_u32 k, cm_u32 want, cm_u32 skip, cm_u32 start, cm_u32 *got)
{
    for (cm_u32 s = 0; s < CM_ACTIVE; s++) {
        cm_u32 a = cm_load(&h->active[k][(start + s) % CM_ACTIVE]);
        if (a != 0 && a != skip) {
            *got = cm_reserve(h, a - 1, k, want);
            if (*got != 0) {
                return a;
            }
        }
    }
    cm_u32 words = (h->chunks + 63) / 64;
    cm_u64 *room = h->room_map[k];
    for (cm_u32 i = 0; i < words; i++) {
        cm_u32 w = (start + i) % words;
        cm_u64 bits = cm_load64(&room[w]);
        while (bits != 0) {
            cm_u32 b = __ffsll((long long)bits) - 1;
            bits &= bits - 1;
            cm_u32 id = w * 64 + b;
            *got = cm_reserve(h, id, k, want);
            if (*got != 0) {
                return id + 1;
            }
            // A free may make room between the two steps: the chunk is in
            // transit until its mark is back or it is known full.
            cm_enter_transit(h);
            cm_map_clear(room, id);
            CM_TRANSIT_HOOK();
            __threadfence();
            cm_u32 now = cm_load(&h->state[id]);
            bool has_room = (now >> CM_CLASS_SHIFT) == k + 1 && (now & CM_COUNT_MASK) < cm_blocks(k);
            if (has_room) {
                cm_map_set(h, room, id);
            }
            cm_leave_transit(h, has_room);
        }
    }
    return 0;
}

// Puts chunk c (id + 1) in the active slot that held a. A chunk that
// leaves the slot with room keeps it visible: it gets its room mark first
// (one that is full now gets it from cm_unreserve when a block is freed).
// If another thread changed the slot, c gets the mark instead.
__device__ void cm_replace_active(CmHeap *h, cm_u32 *slot, cm_u32 k, cm_u32 a, cm_u32 c)
{
    if (a != 0) {
        cm_u32 st = cm_load(&h->state[a - 1]);
        if ((st >> CM_CLASS_SHIFT) == k + 1 && (st & CM_COUNT_MASK) < cm_blocks(k)) {
            cm_map_set(h, h->room_map[k], a - 1);
        }
    }
    if (atomicCAS(slot, a, c) != a) {
        cm_map_set(h, h->room_map[k], c - 1);
    }
}

// The leader's step: up to `want` blocks of class k reserved in one chunk,
// returned with the chunk id + 1 in *chunk. 0 only when one whole search
// (active slots, room map, free map) found nothing while no chunk was in
// transit or published anywhere in the heap: the epoch in the counters
// was the same before and after it, with nothing in transit. Otherwise
// the search runs again, unless not `patient` (the slow path's larger
// classes: a heap busy publishing chunks must not hold a request there).
__device__ cm_u32 cm_reserve_some(CmHeap *h, cm_u32 k, cm_u32 want, cm_u32 hash, cm_u32 *chunk, bool patient)
{
    cm_u32 *slot = &h->active[k][hash % CM_ACTIVE];
    cm_u32 a = cm_load(slot);
    cm_u32 got = 0;
    if (a != 0) {
        got = cm_reserve(h, a - 1, k, want);
        if (got != 0) {
            *chunk = a;
            return got;
        }
    }
    for (;;) {
        cm_u64 seen = cm_load64(&h->counters.epoch);
        __threadfence();
        bool fresh = false;
        cm_u32 c = cm_find_room(h, k, want, a, hash, &got);
        if (c == 0) {
            c = cm_take_free(h, k, want, hash, &got);
            fresh = c != 0;
        }
        if (c != 0) {
            if (c != a || fresh) {
                cm_replace_active(h, slot, k, a, c);
            }
            if (fresh) {
                cm_leave_transit(h, true);
            }
            *chunk = c;
            return got;
        }
        __threadfence();
        if (!patient || (cm_load64(&h->counters.epoch) == seen && (seen & CM_EPOCH_TRANSIT_MASK) == 0)) {
            *chunk = 0;
            return 0;
        }
    }
}

// Claims up to `want` clear bits of one word of a chunk whose count holds a
// reservation for them; returns the bits, the word in *word (at least one
// bit: the reservation guarantees enough clear bits exist).
__device__ cm_u64 cm_claim_bits(cm_u64 *bitmap, cm_u32 k, cm_u32 want, cm_u32 start, cm_u32 *word)
{
    cm_u32 blocks = cm_blocks(k);
    cm_u32 words = (blocks + 63) / 64;
    cm_u64 valid = blocks >= 64 ? ~0ull : (1ull << blocks) - 1;
    for (cm_u32 i = start % words;; i = (i + 1 == words) ? 0 : i + 1) {
        cm_u64 clear = ~cm_load64(&bitmap[i]) & valid;
        while (clear != 0) {
            cm_u64 take = 0;
            cm_u64 rest = clear;
            for (cm_u32 n = 0; n < want && rest != 0; n++) {
                take |= rest & (~rest + 1);
                rest &= rest - 1;
            }
            cm_u64 old = atomicOr(&bitmap[i], take);
            cm_u64 got = take & ~old;
            if (got != 0) {
                *word = i;
                return got;
            }
            clear = ~(old | take) & valid;
        }
    }
}

// The position of the n-th (0-based) set bit of `bits`.
__device__ __forceinline__ cm_u32 cm_nth_bit(cm_u64 bits, cm_u32 n)
{
    cm_u32 low = (cm_u32)bits;
    cm_u32 low_count = __popc(low);
    if (n < low_count) {
        return __fns(low, 0, (int)n + 1);
    }
    return 32 + __fns((cm_u32)(bits >> 32), 0, (int)(n - low_count) + 1);
}

// The first `run` (a power of two) clear bits aligned to `run` among the
// first `blocks` bits of a block map, read only; ~0u if none.
__device__ cm_u32 cm_find_run(const cm_u64 *map, cm_u32 blocks, cm_u32 run)
{
    if (run >= 64) {
        for (cm_u32 index = 0; index + run <= blocks; index += run) {
            bool clear = true;
            for (cm_u32 i = 0; i < run / 64 && clear; i++) {
                clear = cm_load64(&map[index / 64 + i]) == 0;
            }
            if (clear) {
                return index;
            }
        }
        return ~0u;
    }
    cm_u64 ones = (1ull << run) - 1;
    for (cm_u32 w = 0; w * 64 < blocks; w++) {
        cm_u64 bits = cm_load64(&map[w]);
        cm_u32 end = min(64u, blocks - w * 64);
        for (cm_u32 b = 0; b + run <= end; b += run) {
            if ((bits & (ones << b)) == 0) {
                return w * 64 + b;
            }
        }
    }
    return ~0u;
}

// Sets the `run` bits from `index` of a block map; false (nothing set) if
// another thread took one of them first.
__device__ bool cm_claim_run(cm_u64 *map, cm_u32 index, cm_u32 run)
{
    cm_u32 words = run >= 64 ? run / 64 : 1;
    cm_u64 mask = run >= 64 ? ~0ull : ((1ull << run) - 1) << (index % 64);
    for (cm_u32 i = 0; i < words; i++) {
        cm_u64 old = atomicOr(&map[index / 64 + i], mask);
        if ((old & mask) != 0) {
            // Give back only the bits this call set.
            atomicAnd(&map[index / 64 + i], ~(mask & ~old));
            for (cm_u32 j = 0; j < i; j++) {
                atomicAnd(&map[index / 64 + j], ~mask);
            }
            return false;
        }
    }
    return true;
}

// Sets (or clears) the span-map marks of the run of `run` blocks from
// `index`: every block but the first.
__device__ void cm_mark_span(cm_u64 *spans, cm_u32 index, cm_u32 run, bool set)
{
    cm_u32 words = run >= 64 ? run / 64 : 1;
    cm_u64 first = run >= 64 ? ~0ull : ((1ull << run) - 1) << (index % 64);
    for (cm_u32 i = 0; i < words; i++) {
        cm_u64 mask = i == 0 ? first & ~(1ull << (index % 64)) : ~0ull;
        if (set) {
            atomicOr(&spans[index / 64 + i], mask);
        } else {
            atomicAnd(&spans[index / 64 + i], ~mask);
        }
    }
}

// Blocks in the span that starts at block `index` (1: a block alone); 0 if
// `index` is a span's tail.
__device__ cm_u32 cm_span_len(const cm_u64 *spans, cm_u32 index, cm_u32 blocks)
{
    cm_u32 w = index / 64;
    cm_u32 b = index % 64;
    cm_u64 word = cm_load64(&spans[w]);
    if ((word >> b) & 1) {
        return 0;
    }
    if (b == 63) {
        return 1;
    }
    // word >> (b + 1) has zeros on top, so its complement has a set bit.
    cm_u32 ones = min((cm_u32)(__ffsll((long long)~(word >> (b + 1))) - 1), 63u - b);
    if (b != 0 || ones != 63) {
        return ones + 1;
    }
    cm_u32 n = 64;
    for (cm_u32 i = w + 1; i < (blocks + 63) / 64 && cm_load64(&spans[i]) == ~0ull; i++) {
        n += 64;
    }
    return n;
}

// The slow path's first step: a block of class k made of a span of a chunk
// of a smaller class j, 2^(k - j) clear bits aligned to 2^(k - j), found in
// the block map, reserved in the chunk's count, then claimed; one pass over
// the chunks from `start`. Its address, 0 if no chunk of a smaller class
// has a run.
__device__ cm_u64 cm_borrow(CmHeap *h, cm_u32 k, cm_u32 start)
{
    cm_u32 chunks = cm_load(&h->chunks);
    for (cm_u32 i = 0; i < chunks; i++) {
        cm_u32 id = (start + i) % chunks;
        cm_u32 tag = cm_load(&h->state[id]) >> CM_CLASS_SHIFT;
        if (tag == 0 || tag > k) {
            continue;
        }
        cm_u32 j = tag - 1;
        cm_u32 run = 1u << (k - j);
        cm_u32 blocks = cm_blocks(j);
        CmChunk c = cm_chunk(h, id);
        // A run clear in the map but reserved by others in the count is
        // either claimed soon (the map shows it) or given back (the count
        // does): wait for one or the other.
        for (;;) {
            cm_u32 index = cm_find_run(c.bitmap, blocks, run);
            if (index == ~0u) {
                break;
            }
            cm_u32 old = atomicAdd(&h->state[id], run);
            if ((old >> CM_CLASS_SHIFT) != tag) {
                cm_unreserve(h, id, run);
                break;
            }
            if ((old & CM_COUNT_MASK) + run <= blocks && cm_claim_run(c.bitmap, index, run)) {
                atomicOr(&h->state[id], CM_SPANS_BIT);
                cm_mark_span(c.bitmap + CM_BLOCK_MAP_WORDS, index, run, true);
                // The marks land before the block's owner can free it.
                __threadfence();
                return c.data + ((cm_u64)index << (CM_MIN_SHIFT + j));
            }
            cm_unreserve(h, id, run);
            __nanosleep(100);
        }
    }
    return 0;
}

__device__ void cm_fail(CmHeap *h, cm_u32 reason, cm_u64 bytes, cm_u64 n, cm_u64 class_bytes)
{
    atomicAdd(&h->counters.failures, n);
    atomicAdd(&h->counters.reason[reason], n);
    if (reason == CM_FAIL_EXHAUSTED) {
        atomicAdd(&h->counters.failed_bytes, n * class_bytes);
    }
    atomicMax(&h->counters.largest_failed, bytes);
}

// The slow path of a request of class k whose class and the
// CM_FALLBACK_CLASSES above it are out: one span of a smaller class (got 1,
// *kk = CM_CLASSES, *data = the block), else up to `want` blocks of any
// larger class (*kk, *chunk as cm_reserve_some's). 0 if none.
__device__ cm_u32 cm_slow_path(CmHeap *h, cm_u32 k, cm_u32 want, cm_u32 hash, cm_u32 *kk, cm_u32 *chunk,
                               cm_u64 *data)
{
    *data = cm_borrow(h, k, hash);
    if (*data != 0) {
        *kk = CM_CLASSES;
        return 1;
    }
    for (cm_u32 c = k + CM_FALLBACK_CLASSES + 1; c < CM_CLASSES; c++) {
        cm_u32 got = cm_reserve_some(h, c, want, hash, chunk, false);
        if (got != 0) {
            *kk = c;
            return got;
        }
    }
    return 0;
}

// cm_heap_free's step for a block of chunk `id` (class k) that holds spans:
// the blocks of the span that starts at `index` (1: a block alone), their
// span marks cleared. A span of up to 64 blocks is left for the caller to
// clear in the block map (`word`: the word of `index`); a longer one is
// freed here whole. 0: nothing left to do (freed here, or a bad free, which
// is counted).
__device__ cm_u32 cm_free_span(CmHeap *h, cm_u32 id, cm_u32 k, cm_u64 *word, cm_u32 index)
{
    cm_u64 *spans = word - index / 64 + CM_BLOCK_MAP_WORDS;
    cm_u32 run = cm_span_len(spans, index, cm_blocks(k));
    if (run == 0 || (run > 1 && (cm_load64(word) & (1ull << (index % 64))) == 0)) {
        atomicAdd(&h->counters.bad_frees, 1ull);
        return 0;
    }
    if (run == 1) {
        return 1;
    }
    __threadfence();
    // Marks first: a run whose bits are clear has none.
    cm_mark_span(spans, index, run, false);
    __threadfence();
    if (run <= 64) {
        return run;
    }
    for (cm_u32 i = 0; i < run / 64; i++) {
        atomicAnd(&word[i], 0ull);
    }
    cm_unreserve(h, id, run);
    atomicAdd(&h->counters.live_bytes, 0ull - ((cm_u64)run << (CM_MIN_SHIFT + k)));
    atomicAdd(&h->counters.frees, 1ull);
    return 0;
}

// `bytes` from heap `h`, 16-byte aligned (blocks of class k are aligned to
// their size up to 8 KiB); NULL with a reason counted in h->counters.
//
// The order: class k, then the CM_FALLBACK_CLASSES above it (the fast path,
// a warp's requests of one class served together); then, one block at a
// time, a span of a smaller class's chunk (cm_borrow), then a block of any
// larger class. On a heap no other thread frees in meanwhile, NULL only when
// no 2^k-aligned window of the class's size is free (see the top of this
// file). A block counts its own size in live_bytes (a larger class's, or
// the span's).
__device__ void *cm_heap_malloc(CmHeap *h, cm_u64 bytes)
{
    if (bytes == 0 || bytes > CM_MAX_BYTES) {
        cm_fail(h, bytes == 0 ? CM_FAIL_ZERO : CM_FAIL_TOO_LARGE, bytes, 1, 0);
        return NULL;
    }
    cm_u32 k = cm_class(bytes);
    cm_u32 peers = __match_any_sync(__activemask(), k);
    cm_u32 lane = cm_lane();
    cm_u32 leader = __ffs(peers) - 1;
    cm_u32 n = __popc(peers);
    cm_u32 rank = __popc(peers & ((1u << lane) - 1));
    cm_u32 hash = cm_warp_hash();
    cm_u64 mine = 0;
    cm_u32 handed = 0;
    cm_u64 added = 0;
    while (handed < n) {
        cm_u32 chunk = 0;
        cm_u32 got = 0;
        cm_u32 kk = k;
        cm_u64 data = 0;
        cm_u64 *bitmap = NULL;
        if (lane == leader) {
            // Its own class first; when that is out, the next ones up.
            for (; kk <= k + CM_FALLBACK_CLASSES && kk < CM_CLASSES; kk++) {
                got = cm_reserve_some(h, kk, n - handed, hash, &chunk, true);
                if (got != 0) {
                    break;
                }
            }
            if (got == 0) {
                got = cm_slow_path(h, k, n - handed, hash, &kk, &chunk, &data);
                // The loop above may leave kk at CM_CLASSES too: only a
                // block found marks a span.
                if (got != 0 && kk == CM_CLASSES) {
                    added += 1ull << (CM_MIN_SHIFT + k);
                }
            }
            if (got != 0 && kk < CM_CLASSES) {
                CmChunk c = cm_chunk(h, chunk - 1);
                data = c.data;
                bitmap = c.bitmap;
                added += (cm_u64)got << (CM_MIN_SHIFT + kk);
            }
        }
        got = __shfl_sync(peers, got, leader);
        if (got == 0) {
            break;
        }
        kk = __shfl_sync(peers, kk, leader);
        data = __shfl_sync(peers, data, leader);
        if (kk == CM_CLASSES) {
            if (rank == handed) {
                mine = data;
            }
            handed += 1;
            continue;
        }
        cm_u32 claimed = 0;
        while (claimed < got) {
            cm_u64 bits = 0;
            cm_u32 word = 0;
            if (lane == leader) {
                bits = cm_claim_bits(bitmap, kk, got - claimed, hash * 0x9E3779B1u + handed, &word);
            }
            bits = __shfl_sync(peers, bits, leader);
            word = __shfl_sync(peers, word, leader);
            cm_u32 first = handed + claimed;
            cm_u32 count = __popcll(bits);
            if (rank >= first && rank < first + count) {
                cm_u32 index = word * 64 + cm_nth_bit(bits, rank - first);
                mine = data + ((cm_u64)index << (CM_MIN_SHIFT + kk));
            }
            claimed += count;
        }
        handed += got;
    }
    if (lane == leader) {
        cm_u64 class_bytes = 1ull << (CM_MIN_SHIFT + k);
        if (handed != 0) {
            cm_u64 live = atomicAdd(&h->counters.live_bytes, added) + added;
            if (live > cm_load64(&h->counters.peak_bytes)) {
                atomicMax(&h->counters.peak_bytes, live);
            }
            atomicAdd(&h->counters.allocations, (cm_u64)handed);
        }
        if (handed < n) {
            cm_fail(h, CM_FAIL_EXHAUSTED, class_bytes, n - handed, class_bytes);
        }
    }
    return (void *)mine;
}

// Frees a block of heap `h` (NULL: nothing). A pointer that is no live
// block of the heap is counted in bad_frees and otherwise ignored, and so
// is each lane but the first that frees one pointer in the same call. What
// no allocator without tags can tell: a block freed again after it was
// handed out anew frees the new owner's; and two warps that free one span
// of more than 64 blocks at the same moment both free it.
__device__ void cm_heap_free(CmHeap *h, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    cm_u64 a = (cm_u64)ptr;
    // Lanes that free the same pointer at once: the lowest frees it, the
    // others are bad frees (combined below, they would free it twice).
    cm_u32 lane = cm_lane();
    cm_u32 twins = __match_any_sync(__activemask(), a);
    if ((twins & ((1u << lane) - 1)) != 0) {
        atomicAdd(&h->counters.bad_frees, 1ull);
        return;
    }
    cm_u32 r = 0;
    while (r < h->regions && a - h->region_base[r] >= ((cm_u64)h->region_chunks[r] << CM_CHUNK_SHIFT)) {
        r++;
    }
    if (r == h->regions) {
        atomicAdd(&h->counters.bad_frees, 1ull);
        return;
    }
    cm_u32 local = (cm_u32)((a - h->region_base[r]) >> CM_CHUNK_SHIFT);
    cm_u32 id = h->region_first[r] + local;
    cm_u32 st = cm_load(&h->state[id]);
    cm_u32 cls = st >> CM_CLASS_SHIFT;
    // Chunks are 1 MiB from the region's base, which need not be 1 MiB
    // aligned itself.
    cm_u64 offset = a - (h->region_base[r] + ((cm_u64)local << CM_CHUNK_SHIFT));
    if (cls == 0 || (offset & ((1ull << (CM_MIN_SHIFT + cls - 1)) - 1)) != 0) {
        atomicAdd(&h->counters.bad_frees, 1ull);
        return;
    }
    cm_u32 k = cls - 1;
    cm_u32 index = (cm_u32)(offset >> (CM_MIN_SHIFT + k));
    cm_u64 *word = (cm_u64 *)(h->region_base[r] + ((cm_u64)h->region_chunks[r] << CM_CHUNK_SHIFT) +
                              local * CM_BITMAP_BYTES) +
                   index / 64;
    cm_u64 bit = 1ull << (index % 64);
    cm_u64 mask = bit;
    cm_u32 run = 1;
    if ((st & CM_SPANS_BIT) != 0) {
        run = cm_free_span(h, id, k, word, index);
        if (run == 0) {
            return;
        }
        if (run > 1) {
            // A run of 64 is a whole word (shifting by 64 is undefined).
            mask = run >= 64 ? ~0ull : ((1ull << run) - 1) << (index % 64);
        }
    }
    // The block's last writes land before another thread can claim it.
    __threadfence();
    cm_u32 here = __activemask();
    cm_u32 same_word = __match_any_sync(here, (cm_u64)word);
    cm_u32 word_leader = __ffs(same_word) - 1;
    cm_u32 low = __reduce_or_sync(same_word, (cm_u32)mask);
    cm_u32 high = __reduce_or_sync(same_word, (cm_u32)(mask >> 32));
    cm_u64 bad = 0;
    if (lane == word_leader) {
        cm_u64 all = ((cm_u64)high << 32) | low;
        cm_u64 old = atomicAnd(word, ~all);
        bad = all & ~old;
    }
    bad = __shfl_sync(same_word, bad, word_leader);
    cm_u32 valid = (bad & bit) == 0;
    if (!valid) {
        atomicAdd(&h->counters.bad_frees, 1ull);
    }
    cm_u32 same_chunk = __match_any_sync(here, id);
    cm_u32 calls = __reduce_add_sync(same_chunk, valid);
    cm_u32 freed = __reduce_add_sync(same_chunk, valid * run);
    cm_u32 chunk_leader = __ffs(same_chunk) - 1;
    if (lane == chunk_leader && freed != 0) {
        cm_unreserve(h, id, freed);
        atomicAdd(&h->counters.live_bytes, 0ull - ((cm_u64)freed << (CM_MIN_SHIFT + k)));
        atomicAdd(&h->counters.frees, (cm_u64)calls);
    }
}

// cm_heap_malloc / cm_heap_free on the heap bound to this module. With
// CM_LINK_LIBRARY defined (cm_link.cu) they are extern "C" functions that a
// user's module declares (cm_link.cuh) and links against.
#ifdef CM_LINK_LIBRARY
extern "C" __device__ void *cm_malloc(cm_u64 bytes)
{
    return cm_heap_malloc(cm_heap, bytes);
}

extern "C" __device__ void cm_free(void *ptr)
{
    cm_heap_free(cm_heap, ptr);
}
#else
__device__ __forceinline__ void *cm_malloc(cm_u64 bytes)
{
    return cm_heap_malloc(cm_heap, bytes);
}

__device__ __forceinline__ void cm_free(void *ptr)
{
    cm_heap_free(cm_heap, ptr);
}
#endif
