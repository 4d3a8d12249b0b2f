// The bodies of the heap kernels, written once for any in-kernel allocator
// `A` (a type with static `alloc(bytes)` and `release(ptr)`): throughput,
// allocations held across launches, heap exhaustion and heap fragmentation.
// heap.cu instantiates them with CUDA's malloc, cm_heap.cu with cm_malloc.
// Every block is filled with the pattern seeded by its own address, so two
// blocks that overlap show up as mismatches when either is checked.
#pragma once
#include "pattern.cuh"

// Must match kernels::heap::HeapCounters (48 bytes). Kernels add to it with
// atomics; the host zeroes it before a launch.
struct HeapCounters {
    u64 allocations; // malloc calls that returned a block
    u64 nulls;       // malloc calls that returned NULL
    u64 mismatches;  // bytes that differed from the pattern when checked
    u64 bytes;       // bytes requested by the successful malloc calls (punch: bytes freed)
    u64 capped;      // threads that stopped at max_per_thread without a NULL
    u64 frees;       // free calls
};

// Must match kernels::heap::HeapParams (40 bytes).
struct HeapParams {
    u64 counters;       // device address of a HeapCounters
    u64 slots;          // device address of `threads` u64s: held blocks or list heads
    u64 size;           // bytes per malloc call
    u32 threads;        // threads that take part (the grid may be larger)
    u32 max_per_thread; // bound on malloc calls per thread (lists only)
    u64 seed;           // pattern seed, mixed with each block's address
};

__device__ __forceinline__ HeapCounters *counters_of(const HeapParams &p)
{
    return (HeapCounters *)p.counters;
}

__device__ __forceinline__ u64 block_seed(const HeapParams &p, const void *block)
{
    return p.seed ^ (u64)block;
}

// Fills (CHECK false) or checks (CHECK true) the block of every lane of
// `have` with the pattern, all lanes of `group` (a superset) working on one
// block at a time: the r-th of the n lanes takes 8-byte words r, r + n, ...,
// so one warp store or load covers 256 contiguous bytes instead of 32
// blocks' worth of scattered words. Each lane then does its own block's
// last size % 8 bytes. Returns the bytes this lane found differing.
template <bool CHECK>
__device__ u64 pattern_warp(unsigned group, unsigned have, unsigned char *block, u64 size, u64 seed)
{
    unsigned lane = threadIdx.x % 32;
    unsigned n = __popc(group);
    unsigned rank = __popc(group & ((1u << lane) - 1));
    u64 bad = 0;
    for (unsigned rest = have; rest != 0; rest &= rest - 1) {
        int owner = __ffs(rest) - 1;
        u64 base = __shfl_sync(group, (u64)block, owner);
        u64 len = __shfl_sync(group, size, owner);
        u64 sd = __shfl_sync(group, seed, owner);
        if (base % 8 != 0) {
            continue; // the owner does it alone below
        }
        u64 *words = (u64 *)base;
        for (u64 w = rank; w < len / 8; w += n) {
            if (CHECK) {
                u64 diff = words[w] ^ pattern_word(sd, w);
                for (int b = 0; diff != 0 && b < 8; b++) {
                    bad += ((diff >> (8 * b)) & 0xff) != 0;
                }
            } else {
                words[w] = pattern_word(sd, w);
            }
        }
    }
    if ((have >> lane) & 1) {
        u64 done = (u64)block % 8 == 0 ? size / 8 * 8 : 0;
        if (CHECK) {
            bad += pattern_check_range(block + done, done, size - done, seed);
        } else {
            pattern_fill_range(block + done, done, size - done, seed);
        }
    }
    __syncwarp(group);
    return bad;
}

// Each thread: A::alloc(size), then the warp fills and checks every block
// it got (pattern_warp), then each thread frees its own.
template <class A>
__device__ void malloc_free(const HeapParams &p, u64 size)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    HeapCounters *c = counters_of(p);
    unsigned group = __activemask();
    unsigned char *block = (unsigned char *)A::alloc(size);
    unsigned have = __ballot_sync(group, block != NULL);
    u64 seed = block_seed(p, block);
    pattern_warp<false>(group, have, block, size, seed);
    u64 bad = pattern_warp<true>(group, have, block, size, seed);
    if (bad != 0) {
        atomicAdd(&c->mismatches, bad);
    }
    if (block == NULL) {
        atomicAdd(&c->nulls, 1ull);
        return;
    }
    A::release(block);
    atomicAdd(&c->allocations, 1ull);
    atomicAdd(&c->bytes, size);
    atomicAdd(&c->frees, 1ull);
}

// Like malloc_free with a size per thread, log-uniform from 16 B to
// p.size: a power of two picked uniformly, then uniform up to the next one.
template <class A>
__device__ void malloc_free_mixed(const HeapParams &p)
{
    u64 r = pattern_word(p.seed, global_thread_index());
    u32 octaves = 64 - __clzll(p.size) - 4;
    u64 low = 16ull << (r % octaves);
    u64 size = min(low + (r >> 32) % low, p.size);
    malloc_free<A>(p, size);
}

// Each thread: A::alloc(size), fill, keep the block in slots[t] (0 for NULL).
// check_free_held, launched later, checks and frees what this left.
template <class A>
__device__ void malloc_hold(const HeapParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    HeapCounters *c = counters_of(p);
    u64 *slots = (u64 *)p.slots;
    unsigned char *block = (unsigned char *)A::alloc(p.size);
    slots[t] = (u64)block;
    if (block == NULL) {
        atomicAdd(&c->nulls, 1ull);
        return;
    }
    pattern_fill_range(block, 0, p.size, block_seed(p, block));
    atomicAdd(&c->allocations, 1ull);
    atomicAdd(&c->bytes, p.size);
}

// Like malloc_hold, but a thread whose slot holds a block already keeps it
// and allocates nothing: a relaunch after the heap grew retries only the
// threads that got NULL.
template <class A>
__device__ void malloc_hold_missing(const HeapParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads || ((u64 *)p.slots)[t] != 0) {
        return;
    }
    malloc_hold<A>(p);
}

template <class A>
__device__ void check_free_held(const HeapParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    HeapCounters *c = counters_of(p);
    u64 *slots = (u64 *)p.slots;
    unsigned char *block = (unsigned char *)slots[t];
    if (block == NULL) {
        return;
    }
    u64 bad = pattern_check_range(block, 0, p.size, block_seed(p, block));
    A::release(block);
    slots[t] = 0;
    atomicAdd(&c->frees, 1ull);
    if (bad != 0) {
        atomicAdd(&c->mismatches, bad);
    }
}

// Lists: each thread keeps its blocks in a singly linked list whose links
// live in the blocks themselves, head in slots[t]. A block starts with a
// ListHeader; the pattern covers the rest. Blocks must be at least
// LIST_MIN_BYTES; smaller requests are raised to it.
struct ListHeader {
    u64 next; // device address of the next block, 0 at the end
    u64 size; // bytes of this block
};
#define LIST_MIN_BYTES 16ull

__device__ __forceinline__ u64 list_block_bytes(u64 size)
{
    return size < LIST_MIN_BYTES ? LIST_MIN_BYTES : size;
}

// A::alloc(size) until NULL or max_per_thread, pushing each block on the
// thread's list. Returns the number of blocks pushed.
template <class A>
__device__ u32 list_push_until_null(const HeapParams &p, u64 *head, u64 size, u64 *bytes, bool *saw_null)
{
    u32 pushed = 0;
    *saw_null = false;
    while (pushed < p.max_per_thread) {
        unsigned char *block = (unsigned char *)A::alloc(size);
        if (block == NULL) {
            *saw_null = true;
            break;
        }
        ListHeader *h = (ListHeader *)block;
        h->next = *head;
        h->size = size;
        pattern_fill_range(block + sizeof(ListHeader), sizeof(ListHeader), size - sizeof(ListHeader),
                           block_seed(p, block));
        *head = (u64)block;
        *bytes += size;
        pushed++;
    }
    return pushed;
}

__device__ void count_pushes(const HeapParams &p, u32 pushed, u64 bytes, bool saw_null)
{
    HeapCounters *c = counters_of(p);
    atomicAdd(&c->allocations, (u64)pushed);
    atomicAdd(&c->bytes, bytes);
    if (saw_null) {
        atomicAdd(&c->nulls, 1ull);
    } else {
        atomicAdd(&c->capped, 1ull);
    }
}

// Heap exhaustion, first half: every thread allocates `size`-byte blocks
// until malloc returns NULL (or max_per_thread), all kept. `bytes` over the
// heap limit is the usable fraction of the heap for that size.
template <class A>
__device__ void exhaust(const HeapParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    u64 *head = &((u64 *)p.slots)[t];
    *head = 0;
    u64 bytes = 0;
    bool saw_null;
    u32 pushed = list_push_until_null<A>(p, head, list_block_bytes(p.size), &bytes, &saw_null);
    count_pushes(p, pushed, bytes, saw_null);
}

// Fragmentation, first step: like heap_exhaust, but the sizes cycle through
// size, 2*size, 3*size, 4*size.
template <class A>
__device__ void fragment_fill(const HeapParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    u64 *head = &((u64 *)p.slots)[t];
    *head = 0;
    u64 bytes = 0;
    u32 pushed = 0;
    bool saw_null = false;
    while (pushed < p.max_per_thread && !saw_null) {
        u64 size = list_block_bytes(p.size * (1 + pushed % 4));
        HeapParams one = p;
        one.max_per_thread = 1;
        pushed += list_push_until_null<A>(one, head, size, &bytes, &saw_null);
    }
    count_pushes(p, pushed, bytes, saw_null);
}

// Fragmentation, second step: free every other block of each thread's list
// (the 2nd, 4th, ...), checking each freed block first. Adds the freed
// blocks' bytes to `bytes`.
template <class A>
__device__ void fragment_punch(const HeapParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    HeapCounters *c = counters_of(p);
    ListHeader *keep = (ListHeader *)((u64 *)p.slots)[t];
    u64 bad = 0;
    u64 freed = 0;
    u64 freed_bytes = 0;
    while (keep != NULL) {
        ListHeader *drop = (ListHeader *)keep->next;
        if (drop == NULL) {
            break;
        }
        keep->next = drop->next;
        bad += pattern_check_range((unsigned char *)drop + sizeof(ListHeader), sizeof(ListHeader),
                                   drop->size - sizeof(ListHeader), block_seed(p, drop));
        freed_bytes += drop->size;
        A::release(drop);
        freed++;
        keep = (ListHeader *)keep->next;
    }
    atomicAdd(&c->frees, freed);
    atomicAdd(&c->bytes, freed_bytes);
    if (bad != 0) {
        atomicAdd(&c->mismatches, bad);
    }
}

// Fragmentation, third step: `size`-byte requests (meant to be larger than
// the freed holes) until NULL or max_per_thread, pushed on the same list.
template <class A>
__device__ void fragment_large(const HeapParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    u64 *head = &((u64 *)p.slots)[t];
    u64 bytes = 0;
    bool saw_null;
    u32 pushed = list_push_until_null<A>(p, head, list_block_bytes(p.size), &bytes, &saw_null);
    count_pushes(p, pushed, bytes, saw_null);
}

// Frees every block of each thread's list, checking each first; the end of
// heap_exhaust and of the fragmentation steps.
template <class A>
__device__ void release_lists(const HeapParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    HeapCounters *c = counters_of(p);
    u64 *head = &((u64 *)p.slots)[t];
    ListHeader *block = (ListHeader *)*head;
    u64 bad = 0;
    u64 freed = 0;
    while (block != NULL) {
        ListHeader *next = (ListHeader *)block->next;
        bad += pattern_check_range((unsigned char *)block + sizeof(ListHeader), sizeof(ListHeader),
                                   block->size - sizeof(ListHeader), block_seed(p, block));
        A::release(block);
        freed++;
        block = next;
    }
    *head = 0;
    atomicAdd(&c->frees, freed);
    if (bad != 0) {
        atomicAdd(&c->mismatches, bad);
    }
}
