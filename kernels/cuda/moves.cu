// Copy many blocks in one launch: the moves of a compaction that depend on
// none of the others in their batch (no move writes bytes another one reads
// or writes, and no move overlaps itself), so they may run in any order and
// all at once. The host (ctx's CUDA backend) forms the batches; moves that
// depend on each other go to separate launches, which the stream orders.
//
// The grid runs over (move, chunk) pairs: move i owns the chunks
// [first_chunk[i], first_chunk[i + 1]), each MOVE_CHUNK_BYTES of it, and a
// block copies one chunk per step of a grid-stride loop, so one launch keeps
// the whole device busy whatever the mix of block sizes.

typedef unsigned long long u64;
typedef unsigned int u32;

// Must match kernels::moves::MAX_MOVES and CHUNK_BYTES.
#define MOVE_MAX_MOVES 128
#define MOVE_CHUNK_BYTES 16384ull
// Words each thread loads before it stores any: with 256 threads and 16-byte
// words, one step of a chunk is the whole 16 KiB chunk in flight.
#define MOVE_UNROLL 4

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

// The block copies the first whole `Word`s of `len` bytes (all of its
// threads, each loading MOVE_UNROLL words before storing them) and returns
// how many bytes that was. `src` and `dst` are aligned to a `Word`. Loads and
// stores are global and marked streaming (each byte is touched once), which
// the addresses, integers from the parameters, would not tell the compiler.
template <class Word>
__device__ __forceinline__ u64 copy_words(const unsigned char *src, unsigned char *dst, u64 len)
{
    const Word *from = (const Word *)src;
    Word *to = (Word *)dst;
    u64 words = len / sizeof(Word);
    u64 step = (u64)blockDim.x * MOVE_UNROLL;
    for (u64 base = threadIdx.x; base < words; base += step) {
        Word held[MOVE_UNROLL];
#pragma unroll
        for (int u = 0; u < MOVE_UNROLL; u++) {
            u64 i = base + (u64)u * blockDim.x;
            if (i < words) {
                held[u] = __ldcs(from + i);
            }
        }
#pragma unroll
        for (int u = 0; u < MOVE_UNROLL; u++) {
            u64 i = base + (u64)u * blockDim.x;
            if (i < words) {
                __stcs(to + i, held[u]);
            }
        }
    }
    return words * sizeof(Word);
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

extern "C" __global__ void move_blocks(const __grid_constant__ MoveBlocksParams p)
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
        u64 len = rest < MOVE_CHUNK_BYTES ? rest : MOVE_CHUNK_BYTES;
        const unsigned char *src = (const unsigned char *)(p.src[m] + offset);
        unsigned char *dst = (unsigned char *)(p.dst[m] + offset);
        u64 alignment = p.src[m] | p.dst[m];
        u64 done = 0;
        if (alignment % 16 == 0) {
            done = copy_words<ulonglong2>(src, dst, len);
        } else if (alignment % 8 == 0) {
            done = copy_words<unsigned long long>(src, dst, len);
        } else if (alignment % 4 == 0) {
            done = copy_words<unsigned int>(src, dst, len);
        }
        for (u64 i = done + threadIdx.x; i < len; i += blockDim.x) {
            __stcs(dst + i, __ldcs(src + i));
        }
    }
}
