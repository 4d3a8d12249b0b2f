// Copy many blocks in one launch. move_blocks takes the moves of a
// compaction that depend on none of the others in their batch (no move
// writes bytes another one reads or writes, and no move overlaps itself), so
// they may run in any order and all at once; slide_blocks (at the end) takes
// the moves of a slide, which do depend on each other, and orders them
// inside the launch. The host (ctx's CUDA backend) forms the batches; what
// neither kernel takes goes to separate copies, which the stream orders.
//
// The grid runs over (move, chunk) pairs: move i owns the chunks
// [first_chunk[i], first_chunk[i + 1]), each MOVE_CHUNK_BYTES of it, and a
// block copies one chunk per step of a grid-stride loop, so one launch keeps
// the whole device busy whatever the mix of block sizes.

typedef unsigned long long u64;
typedef unsigned int u32;

// Must match kernels::moves::MAX_MOVES and CHUNK_BYTES.
#define MOVE_MAX_MOVES 128
#define MOVE_CHUNK_BYTES 32768ull
// Words each thread loads before it stores any: with 256 threads and 16-byte
// words one step is the whole 32 KiB chunk, 128 bytes a thread in flight.
// Copying is bound by bytes in flight (Little's law: bandwidth times loaded
// DRAM latency, tens of KiB per SM), and a block of one chunk waits for
// memory once per 32 KiB.
#define MOVE_UNROLL 8
// Threads a block is launched with (kernels::moves::MOVE_THREADS), and the
// blocks per SM the register budget is set for: 4 x 256 threads x 128 bytes
// is 128 KiB of loads in flight per SM, at most 64 registers a thread. (512
// threads x 4 words, which scripts/move_bench measured about as fast, spills
// registers at 4 blocks an SM.)
#define MOVE_BLOCK_THREADS 256
#define MOVE_MIN_BLOCKS_PER_SM 4

// Must match kernels::moves::MoveBlocksParams (3,600 bytes: under the 4 KiB
// that every driver accepts for kernel parameters).
struct MoveBlocksParams {
    u64 count;                      // moves used, at most MOVE_MAX_MOVES
    u64 chunks;                     // chunks of all moves together
    u64 src[MOVE_MAX_MOVES];        // device addresses the bytes come from
    u64 dst[MOVE_MAX_MOVES];        // device addresses they go to
    u64 len[MOVE_MAX_MOVES];        // bytes of each move
    u32 first_chunk[MOVE_MAX_MOVES]; // index of each move's first chunk; ascending
};

// The block copies the first whole `Word`s of `len` bytes (at most a chunk)
// and returns how many bytes that was. `src` and `dst` are aligned to a
// `Word`. The work is laid out for MOVE_BLOCK_THREADS lanes, each loading
// MOVE_UNROLL words, MOVE_BLOCK_THREADS words apart, before storing any; a
// compile-time stride makes those addresses one base plus constant offsets
// (few registers). A block of other size runs the lanes in turns, so any
// launch copies everything. Steps in which all of a lane's words lie inside
// `len` (for a whole chunk, all of them) load without a per-word test, so the
// loads issue back to back. Loads and stores are plain: with streaming
// hints (each byte is touched once) the kernel copied a few percent slower
// (scripts/move_bench; BENCHMARKS.md, "Compaction bandwidth").
// Indices are 32-bit: a chunk has far fewer than 2^32 words.
template <class Word>
__device__ __forceinline__ u32 copy_words(const unsigned char *src, unsigned char *dst, u32 len)
{
    const Word *from = (const Word *)src;
    Word *to = (Word *)dst;
    const u32 step = MOVE_BLOCK_THREADS * MOVE_UNROLL;
    u32 words = len / (u32)sizeof(Word);
    // Words covered by whole steps. A lane's `base` is the lane plus a
    // multiple of `step`, so `base < whole` exactly when its step is whole.
    u32 whole = words - words % step;
    for (u32 lane = threadIdx.x; lane < MOVE_BLOCK_THREADS; lane += blockDim.x) {
        u32 base = lane;
        for (; base < whole; base += step) {
            const Word *f = from + base;
            Word *t = to + base;
            Word held[MOVE_UNROLL];
#pragma unroll
            for (int u = 0; u < MOVE_UNROLL; u++) {
                held[u] = f[u * MOVE_BLOCK_THREADS];
            }
#pragma unroll
            for (int u = 0; u < MOVE_UNROLL; u++) {
                t[u * MOVE_BLOCK_THREADS] = held[u];
            }
        }
        // The last, partial step (at most one; `words` > 0 in it). Loads
        // past the end read the last word again instead of being skipped, so
        // they too issue back to back without a branch each; only the
        // stores are tested.
        for (; base < words; base += step) {
            Word held[MOVE_UNROLL];
#pragma unroll
            for (int u = 0; u < MOVE_UNROLL; u++) {
                u32 i = base + (u32)u * MOVE_BLOCK_THREADS;
                held[u] = from[i < words ? i : words - 1];
            }
#pragma unroll
            for (int u = 0; u < MOVE_UNROLL; u++) {
                u32 i = base + (u32)u * MOVE_BLOCK_THREADS;
                if (i < words) {
                    to[i] = held[u];
                }
            }
        }
    }
    return words * (u32)sizeof(Word);
}

// The move that chunk `chunk` belongs to: the last with first_chunk <= chunk.
__device__ __forceinline__ u32 move_of_chunk(const MoveBlocksParams &p, u32 count, u64 chunk)
{
    u32 lo = 0;
    u32 hi = count;
    while (hi - lo > 1) {
        u32 mid = (lo + hi) / 2;
        if (p.first_chunk[mid] <= chunk) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

extern "C" __global__ void __launch_bounds__(MOVE_BLOCK_THREADS, MOVE_MIN_BLOCKS_PER_SM)
move_blocks(const __grid_constant__ MoveBlocksParams p)
{
    u32 count = p.count < MOVE_MAX_MOVES ? (u32)p.count : MOVE_MAX_MOVES;
    if (count == 0) {
        return;
    }
    for (u64 chunk = blockIdx.x; chunk < p.chunks; chunk += gridDim.x) {
        u32 m = move_of_chunk(p, count, chunk);
        u64 offset = (chunk - p.first_chunk[m]) * MOVE_CHUNK_BYTES;
        if (offset >= p.len[m]) {
            continue;
        }
        u64 rest = p.len[m] - offset;
        u32 len = (u32)(rest < MOVE_CHUNK_BYTES ? rest : MOVE_CHUNK_BYTES);
        const unsigned char *src = (const unsigned char *)(p.src[m] + offset);
        unsigned char *dst = (unsigned char *)(p.dst[m] + offset);
        u64 alignment = p.src[m] | p.dst[m];
        u32 done = 0;
        if (alignment % 16 == 0) {
            done = copy_words<ulonglong2>(src, dst, len);
        } else if (alignment % 8 == 0) {
            done = copy_words<unsigned long long>(src, dst, len);
        } else if (alignment % 4 == 0) {
            done = copy_words<unsigned int>(src, dst, len);
        }
        // What no wider word covers (all of it when the addresses are not
        // 4-byte aligned, else under a word), a byte at a time but with
        // MOVE_UNROLL bytes a thread in flight.
        copy_words<unsigned char>(src + done, dst + done, len - done);
    }
}

// ---------------------------------------------------------------------------
// Sliding many blocks down in one launch: moves that depend on each other
// the way a compaction's slide does, which move_blocks cannot take together.
//
// The moves of a launch must form a slide, in order: every move goes down
// (dst < src), sources ascend without overlapping, and destinations ascend
// without overlapping (so no destination reaches a later move's source: it
// ends below its own source's end). Source and destination 16-byte aligned.
// Then the only order that matters is "write after read": a chunk's
// destination may cover the source bytes of earlier chunks (of its own move
// or of moves before it), which must be read before they are overwritten;
// no chunk's destination is anything a later chunk reads, and no chunk
// reads anything an earlier chunk writes.
//
// Blocks take pairs of chunks in order from a counter (`sync[0]`; ticket k
// is chunks 2k and 2k + 1), each half of the block one chunk. A block reads
// both chunks into registers, marks each read (`sync[1 + chunk]`), waits
// until every chunk of an earlier ticket whose source its destinations
// cover is marked read, then writes. Reading never waits, and a block only
// waits for chunks taken before its own, by blocks that were running when
// they took them; so every wait ends, whatever the number of blocks
// resident. Chunks that overlap themselves, or each other within a ticket,
// are safe too: both are read before either is written. Two chunks a ticket
// halve what taking, marking and waiting cost per byte. (Taking the next
// ticket while copying one, to hide the counter's latency, measured no
// faster in scripts/move_bench.)

// Threads of a slide_blocks block (kernels::moves::SLIDE_THREADS): two
// halves of MOVE_BLOCK_THREADS, each holding one chunk in its registers.
#define SLIDE_BLOCK_THREADS (2 * MOVE_BLOCK_THREADS)

// Must match kernels::moves::SlideBlocksParams (3,608 bytes).
struct SlideBlocksParams {
    MoveBlocksParams moves;
    // Device address of 1 + chunks u32 words, zero before the launch: the
    // next chunk to take, then one "read" mark per chunk.
    u64 sync;
};

// What a waiting thread does between two looks at a mark; the host
// emulation bounds the wait there.
#ifndef SLIDE_WAIT_HOOK
#define SLIDE_WAIT_HOOK()
#endif

// The index of the last move whose source starts at or below `addr`
// (sources ascend), or `count` if none does.
__device__ __forceinline__ u32 move_at_or_below(const MoveBlocksParams &p, u32 count, u64 addr)
{
    if (addr < p.src[0]) {
        return count;
    }
    u32 lo = 0;
    u32 hi = count;
    while (hi - lo > 1) {
        u32 mid = (lo + hi) / 2;
        if (p.src[mid] <= addr) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Chunks whose source bytes lie wholly below `addr`: the index of the first
// chunk whose source ends above it.
__device__ __forceinline__ u64 chunks_ending_by(const MoveBlocksParams &p, u32 count, u64 addr)
{
    u32 m = move_at_or_below(p, count, addr);
    if (m == count) {
        return 0;
    }
    u64 into = addr - p.src[m];
    if (into < p.len[m]) {
        return p.first_chunk[m] + into / MOVE_CHUNK_BYTES;
    }
    return m + 1 < count ? p.first_chunk[m + 1] : p.chunks;
}

// Chunks whose source bytes start below `addr`: one past the last of them.
__device__ __forceinline__ u64 chunks_starting_below(const MoveBlocksParams &p, u32 count, u64 addr)
{
    if (addr == 0) {
        return 0;
    }
    u32 m = move_at_or_below(p, count, addr - 1);
    if (m == count) {
        return 0;
    }
    u64 into = addr - p.src[m];
    if (into < p.len[m]) {
        return p.first_chunk[m] + (into + MOVE_CHUNK_BYTES - 1) / MOVE_CHUNK_BYTES;
    }
    return m + 1 < count ? p.first_chunk[m + 1] : p.chunks;
}

extern "C" __global__ void __launch_bounds__(SLIDE_BLOCK_THREADS, MOVE_MIN_BLOCKS_PER_SM / 2)
slide_blocks(const __grid_constant__ SlideBlocksParams s)
{
    const MoveBlocksParams &p = s.moves;
    u32 count = p.count < MOVE_MAX_MOVES ? (u32)p.count : MOVE_MAX_MOVES;
    if (count == 0 || blockDim.x != SLIDE_BLOCK_THREADS) {
        // A chunk is held in the registers of exactly MOVE_BLOCK_THREADS
        // threads, two chunks a block; the launcher never uses another shape.
        return;
    }
    u32 half = threadIdx.x / MOVE_BLOCK_THREADS;
    u32 lane = threadIdx.x % MOVE_BLOCK_THREADS;
    unsigned int *next = (unsigned int *)s.sync;
    volatile unsigned int *read = (volatile unsigned int *)s.sync + 1;
    __shared__ unsigned int taken;
    for (;;) {
        if (threadIdx.x == 0) {
            taken = atomicAdd(next, 1u);
        }
        __syncthreads();
        u64 pair = 2 * (u64)taken;
        if (pair >= p.chunks) {
            return;
        }
        u64 chunk = pair + half;
        u32 len = 0;
        const ulonglong2 *from = 0;
        ulonglong2 *to = 0;
        u64 dst = 0;
        if (chunk < p.chunks) {
            u32 m = move_of_chunk(p, count, chunk);
            u64 offset = (chunk - p.first_chunk[m]) * MOVE_CHUNK_BYTES;
            u64 rest = offset < p.len[m] ? p.len[m] - offset : 0;
            len = (u32)(rest < MOVE_CHUNK_BYTES ? rest : MOVE_CHUNK_BYTES);
            from = (const ulonglong2 *)(p.src[m] + offset);
            dst = p.dst[m] + offset;
            to = (ulonglong2 *)dst;
        }
        u32 words = len / 16;
        u32 tail = len % 16;
        ulonglong2 held[MOVE_UNROLL];
#pragma unroll
        for (int u = 0; u < MOVE_UNROLL; u++) {
            u32 i = lane + (u32)u * MOVE_BLOCK_THREADS;
            if (i < words) {
                held[u] = from[i];
            }
        }
        unsigned char tail_byte = 0;
        if (lane < tail) {
            tail_byte = ((const unsigned char *)(from + words))[lane];
        }
        // Every thread's reads are done before the marks say so.
        __threadfence();
        __syncthreads();
        if (lane == 0 && len > 0) {
            read[chunk] = 1;
            u64 first = chunks_ending_by(p, count, dst);
            u64 end = chunks_starting_below(p, count, dst + len);
            for (u64 c = first; c < end && c < pair; c++) {
                while (read[c] == 0) {
                    SLIDE_WAIT_HOOK();
                }
            }
            __threadfence();
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < MOVE_UNROLL; u++) {
            u32 i = lane + (u32)u * MOVE_BLOCK_THREADS;
            if (i < words) {
                to[i] = held[u];
            }
        }
        if (lane < tail) {
            ((unsigned char *)(to + words))[lane] = tail_byte;
        }
        // `taken` is rewritten only once every thread has read it.
        __syncthreads();
    }
}
