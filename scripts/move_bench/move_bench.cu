// Copy kernels for compaction, side by side with cudaMemcpy: the kernel ctx
// launches (kernels/cuda/moves.cu, included below as variant "current") and
// variants with the same MoveBlocksParams layout, on the same moves, timed
// with events (median of 10 after 2 warm-ups), every result verified.
// Build and run on a GPU machine with nvcc: scripts/move_bench/run.sh.
// Measured figures: BENCHMARKS.md.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <string>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #x); \
    exit(1); } } while (0)

// The kernel ctx launches, compiled from its own source, as variant "current".
#include "../../kernels/cuda/moves.cu"

// ============================== variants ==============================
// All take the same MoveBlocksParams, but first_chunk is built for each
// variant's own chunk size CHUNK (host side, build_params).

enum Hint { PLAIN = 0, STREAM = 1, NC = 2 };

template <int HINT>
__device__ __forceinline__ ulonglong2 ld16(const ulonglong2 *p)
{
    if (HINT == STREAM) return __ldcs(p);
    if (HINT == NC) return __ldg(p);
    return *p;
}
template <int HINT>
__device__ __forceinline__ void st16(ulonglong2 *p, ulonglong2 v)
{
    if (HINT == STREAM) { __stcs(p, v); return; }
    *p = v;
}

// Generic chunked copy: T threads, U 16-byte loads per thread in flight
// before the stores, CHUNK bytes per (move, chunk) work item, grid-stride.
template <int T, int U, unsigned long long CHUNK, int HINT>
__global__ void __launch_bounds__(T)
gen_copy(const __grid_constant__ MoveBlocksParams p)
{
    u32 count = p.count < MOVE_MAX_MOVES ? (u32)p.count : MOVE_MAX_MOVES;
    if (count == 0) return;
    for (u64 chunk = blockIdx.x; chunk < p.chunks; chunk += gridDim.x) {
        u32 m = move_of_chunk(p, count, chunk);
        u64 offset = (chunk - p.first_chunk[m]) * CHUNK;
        if (offset >= p.len[m]) continue;
        u64 rest = p.len[m] - offset;
        u32 len = (u32)(rest < CHUNK ? rest : CHUNK);
        const unsigned char *src = (const unsigned char *)(p.src[m] + offset);
        unsigned char *dst = (unsigned char *)(p.dst[m] + offset);
        u32 done = 0;
        if (((p.src[m] | p.dst[m]) % 16) == 0) {
            const ulonglong2 *f = (const ulonglong2 *)src;
            ulonglong2 *t = (ulonglong2 *)dst;
            const u32 step = T * U;
            u32 words = len / 16;
            u32 whole = words - words % step;
            u32 base = threadIdx.x;
            for (; base < whole; base += step) {
                ulonglong2 h[U];
#pragma unroll
                for (int u = 0; u < U; u++) h[u] = ld16<HINT>(f + base + u * T);
#pragma unroll
                for (int u = 0; u < U; u++) st16<HINT>(t + base + u * T, h[u]);
            }
            for (u32 i = whole + threadIdx.x; i < words; i += T) st16<HINT>(t + i, ld16<HINT>(f + i));
            done = words * 16;
        }
        for (u32 i = done + threadIdx.x; i < len; i += T) dst[i] = src[i];
    }
}

// D: simplest possible; one block per (move, chunk), plain int4 loop.
template <unsigned long long CHUNK>
__global__ void __launch_bounds__(1024)
simple_copy(const __grid_constant__ MoveBlocksParams p)
{
    u32 count = p.count < MOVE_MAX_MOVES ? (u32)p.count : MOVE_MAX_MOVES;
    if (count == 0) return;
    for (u64 chunk = blockIdx.x; chunk < p.chunks; chunk += gridDim.x) {
        u32 m = move_of_chunk(p, count, chunk);
        u64 offset = (chunk - p.first_chunk[m]) * CHUNK;
        if (offset >= p.len[m]) continue;
        u64 rest = p.len[m] - offset;
        u32 len = (u32)(rest < CHUNK ? rest : CHUNK);
        const int4 *s = (const int4 *)(p.src[m] + offset);
        int4 *d = (int4 *)(p.dst[m] + offset);
        u32 n16 = len / 16; // workloads here are 16-byte aligned and sized
        for (u32 i = threadIdx.x; i < n16; i += blockDim.x) d[i] = s[i];
        const unsigned char *sb = (const unsigned char *)s;
        unsigned char *db = (unsigned char *)d;
        for (u32 i = n16 * 16 + threadIdx.x; i < len; i += blockDim.x) db[i] = sb[i];
    }
}

// Fill a source with a pattern; count the mismatches of one move.
__global__ void fill_pattern(unsigned int *a, u64 words)
{
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x)
        a[i] = (unsigned int)(i * 2654435761ull) ^ (unsigned int)(i >> 32) ^ 0x5bd1e995u;
}
__global__ void count_mismatch(const unsigned int *s, const unsigned int *d, u64 words, unsigned long long *bad)
{
    unsigned long long n = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x)
        n += s[i] != d[i];
    if (n) atomicAdd(bad, n);
}

// The slide kernel as it was before it took two chunks a ticket: one chunk
// a block of MOVE_BLOCK_THREADS, for workload 3.
__global__ void __launch_bounds__(MOVE_BLOCK_THREADS, MOVE_MIN_BLOCKS_PER_SM)
slide_one(const __grid_constant__ SlideBlocksParams s)
{
    const MoveBlocksParams &p = s.moves;
    u32 count = p.count < MOVE_MAX_MOVES ? (u32)p.count : MOVE_MAX_MOVES;
    if (count == 0 || blockDim.x != MOVE_BLOCK_THREADS) {
        // A chunk is held in the registers of exactly MOVE_BLOCK_THREADS
        // threads; the launcher never uses another shape.
        return;
    }
    unsigned int *next = (unsigned int *)s.sync;
    volatile unsigned int *read = (volatile unsigned int *)s.sync + 1;
    __shared__ unsigned int taken;
    for (;;) {
        if (threadIdx.x == 0) {
            taken = atomicAdd(next, 1u);
        }
        __syncthreads();
        u64 chunk = taken;
        if (chunk >= p.chunks) {
            return;
        }
        u32 m = move_of_chunk(p, count, chunk);
        u64 offset = (chunk - p.first_chunk[m]) * MOVE_CHUNK_BYTES;
        u64 rest = offset < p.len[m] ? p.len[m] - offset : 0;
        u32 len = (u32)(rest < MOVE_CHUNK_BYTES ? rest : MOVE_CHUNK_BYTES);
        const ulonglong2 *from = (const ulonglong2 *)(p.src[m] + offset);
        ulonglong2 *to = (ulonglong2 *)(p.dst[m] + offset);
        u32 words = len / 16;
        u32 tail = len % 16;
        ulonglong2 held[MOVE_UNROLL];
#pragma unroll
        for (int u = 0; u < MOVE_UNROLL; u++) {
            u32 i = threadIdx.x + (u32)u * MOVE_BLOCK_THREADS;
            if (i < words) {
                held[u] = from[i];
            }
        }
        unsigned char tail_byte = 0;
        if (threadIdx.x < tail) {
            tail_byte = ((const unsigned char *)(from + words))[threadIdx.x];
        }
        // Every thread's reads are done before the mark says so.
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            read[chunk] = 1;
            u64 dst = p.dst[m] + offset;
            u64 first = chunks_ending_by(p, count, dst);
            u64 end = chunks_starting_below(p, count, dst + len);
            for (u64 c = first; c < end && c < chunk; c++) {
                while (read[c] == 0) {
                    SLIDE_WAIT_HOOK();
                }
            }
            __threadfence();
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < MOVE_UNROLL; u++) {
            u32 i = threadIdx.x + (u32)u * MOVE_BLOCK_THREADS;
            if (i < words) {
                to[i] = held[u];
            }
        }
        if (threadIdx.x < tail) {
            ((unsigned char *)(to + words))[threadIdx.x] = tail_byte;
        }
        // `taken` is rewritten only once every thread has read it.
        __syncthreads();
    }
}

// ================================ host ================================
struct Move { u64 src, dst, len; };
typedef void (*KernelFn)(MoveBlocksParams);

static std::vector<MoveBlocksParams> build_params(const std::vector<Move> &moves, u64 chunk_bytes)
{
    std::vector<MoveBlocksParams> out;
    for (size_t b = 0; b < moves.size(); b += MOVE_MAX_MOVES) {
        MoveBlocksParams p;
        memset(&p, 0, sizeof p);
        u64 chunks = 0;
        size_t n = std::min((size_t)MOVE_MAX_MOVES, moves.size() - b);
        for (size_t i = 0; i < n; i++) {
            const Move &m = moves[b + i];
            p.src[i] = m.src; p.dst[i] = m.dst; p.len[i] = m.len;
            p.first_chunk[i] = (u32)chunks;
            chunks += (m.len + chunk_bytes - 1) / chunk_bytes;
        }
        p.count = n; p.chunks = chunks;
        out.push_back(p);
    }
    return out;
}

struct Variant {
    std::string name;
    KernelFn fn;
    int threads;
    u64 chunk;
    bool persistent; // grid = SMs * occupancy instead of one block per chunk
    int occ;         // blocks per SM (filled in)
};

static int g_sms = 0;

static void launch_variant(const Variant &v, const std::vector<MoveBlocksParams> &ps, cudaStream_t st)
{
    for (const MoveBlocksParams &p0 : ps) {
        MoveBlocksParams p = p0;
        u64 grid = v.persistent ? (u64)g_sms * v.occ : std::min<u64>(p.chunks, 1u << 16);
        if (grid == 0) grid = 1;
        void *args[] = { &p };
        CK(cudaLaunchKernel((const void *)v.fn, dim3((unsigned)grid), dim3(v.threads), args, 0, st));
    }
    CK(cudaGetLastError());
}

static float median(std::vector<float> t) { std::sort(t.begin(), t.end()); size_t n = t.size(); return n % 2 ? t[n / 2] : 0.5f * (t[n / 2 - 1] + t[n / 2]); }

template <class F>
static float time_it(F f, cudaStream_t st)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    for (int i = 0; i < 2; i++) f();
    CK(cudaStreamSynchronize(st));
    std::vector<float> ts;
    for (int r = 0; r < 10; r++) {
        CK(cudaEventRecord(a, st));
        f();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms);
    }
    CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
    return median(ts);
}

static unsigned long long verify(const std::vector<Move> &moves, unsigned long long *d_bad, cudaStream_t st)
{
    CK(cudaMemsetAsync(d_bad, 0, sizeof *d_bad, st));
    for (const Move &m : moves) {
        count_mismatch<<<264, 512, 0, st>>>((const unsigned int *)m.src, (const unsigned int *)m.dst, m.len / 4, d_bad);
        CK(cudaGetLastError());
    }
    unsigned long long bad = 0;
    CK(cudaMemcpyAsync(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    return bad;
}

int main()
{
    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    g_sms = prop.multiProcessorCount;
    printf("device: %s, %d SMs\n", prop.name, g_sms);

    const u64 BUF = 5ull << 29; // 2.5 GiB
    unsigned char *A = nullptr, *B = nullptr;
    CK(cudaMalloc(&A, BUF));
    CK(cudaMalloc(&B, BUF));
    unsigned long long *d_bad = nullptr;
    CK(cudaMalloc(&d_bad, sizeof *d_bad));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    fill_pattern<<<g_sms * 8, 512, 0, st>>>((unsigned int *)A, BUF / 4);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));

    std::vector<Variant> vs = {
        { "current (verbatim moves.cu)",  (KernelFn)move_blocks,                          256,  32768, false, 0 },
        { "B0 current kernel, persistent grid",    (KernelFn)move_blocks,                          256,  32768, true,  0 },
        { "A  256t u8 32K plain",                  (KernelFn)gen_copy<256, 8, 32768, PLAIN>,       256,  32768, false, 0 },
        { "A' 256t u8 32K .cs (generic)",          (KernelFn)gen_copy<256, 8, 32768, STREAM>,      256,  32768, false, 0 },
        { "A2 256t u8 32K ldg.nc",                 (KernelFn)gen_copy<256, 8, 32768, NC>,          256,  32768, false, 0 },
        { "B  256t u8 32K plain persistent",       (KernelFn)gen_copy<256, 8, 32768, PLAIN>,       256,  32768, true,  0 },
        { "C1 256t u8 64K plain",                  (KernelFn)gen_copy<256, 8, 65536, PLAIN>,       256,  65536, false, 0 },
        { "C2 256t u8 128K plain",                 (KernelFn)gen_copy<256, 8, 131072, PLAIN>,      256, 131072, false, 0 },
        { "C3 256t u8 64K .cs",                    (KernelFn)gen_copy<256, 8, 65536, STREAM>,      256,  65536, false, 0 },
        { "C4 256t u8 128K .cs",                   (KernelFn)gen_copy<256, 8, 131072, STREAM>,     256, 131072, false, 0 },
        { "D1 simple 1024t int4 32K",              (KernelFn)simple_copy<32768>,                  1024,  32768, false, 0 },
        { "D2 simple 1024t int4 64K",              (KernelFn)simple_copy<65536>,                  1024,  65536, false, 0 },
        { "D3 simple 1024t int4 128K",             (KernelFn)simple_copy<131072>,                 1024, 131072, false, 0 },
        { "D4 simple 1024t int4 64K persistent",   (KernelFn)simple_copy<65536>,                  1024,  65536, true,  0 },
        { "E1 512t u4 32K plain",                  (KernelFn)gen_copy<512, 4, 32768, PLAIN>,       512,  32768, false, 0 },
        { "E2 512t u4 64K plain",                  (KernelFn)gen_copy<512, 4, 65536, PLAIN>,       512,  65536, false, 0 },
        { "E3 256t u4 32K plain",                  (KernelFn)gen_copy<256, 4, 32768, PLAIN>,       256,  32768, false, 0 },
        { "E4 1024t u4 128K plain",                (KernelFn)gen_copy<1024, 4, 131072, PLAIN>,    1024, 131072, false, 0 },
        { "E5 512t u4 64K plain persistent",       (KernelFn)gen_copy<512, 4, 65536, PLAIN>,       512,  65536, true,  0 },
        { "E6 128t u8 16K plain",                  (KernelFn)gen_copy<128, 8, 16384, PLAIN>,       128,  16384, false, 0 },
    };
    for (Variant &v : vs) {
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v.occ, (const void *)v.fn, v.threads, 0));
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, (const void *)v.fn));
        printf("  %-40s occ %2d blocks/SM (%4d thr/SM), %3d regs/thread\n", v.name.c_str(), v.occ, v.occ * v.threads, fa.numRegs);
        if (v.occ < 1) v.occ = 1;
    }

    for (int wl = 1; wl <= 2; wl++) {
        std::vector<Move> moves;
        u64 total = 0;
        if (wl == 1) {
            for (int i = 0; i < 256; i++) {
                moves.push_back({ (u64)A + (u64)i * (2 << 20), (u64)B + (u64)i * (2 << 20), 2ull << 20 });
                total += 2ull << 20;
            }
        } else {
            u64 off = 0;
            for (int i = 0; i < 1024; i++) {
                u64 k = (u64)((i * 37) % 1024);
                u64 len = (2ull << 20) + k * 256;
                moves.push_back({ (u64)A + off, (u64)B + off, len });
                off += len;
            }
            total = off;
        }
        if (total > BUF) { fprintf(stderr, "workload too big\n"); return 1; }
        printf("\nworkload %d: %zu moves, %.1f MiB total, %zu launches of <=128 moves\n",
               wl, moves.size(), total / 1048576.0, (moves.size() + 127) / 128);
        // Both workloads place the moves back to back from offset 0 in A and B,
        // so one cudaMemcpy of `total` bytes copies exactly the same bytes.
        CK(cudaMemsetAsync(B, 0, BUF, st));
        float ms1 = time_it([&] { CK(cudaMemcpyAsync(B, A, total, cudaMemcpyDeviceToDevice, st)); }, st);
        unsigned long long bad1 = verify(moves, d_bad, st);
        CK(cudaMemsetAsync(B, 0, BUF, st));
        float msn = time_it([&] { for (const Move &m : moves) CK(cudaMemcpyAsync((void *)m.dst, (const void *)m.src, m.len, cudaMemcpyDeviceToDevice, st)); }, st);
        unsigned long long badn = verify(moves, d_bad, st);
        double ref = total / (ms1 * 1e-3) / 1e9;
        printf("  %-40s %9s %9s %7s %10s\n", "variant", "ms", "GB/s", "ratio", "mismatch");
        printf("  %-40s %9.3f %9.1f %7.3f %10llu\n", "cudaMemcpyAsync x1 (reference)", ms1, ref, 1.0, bad1);
        printf("  %-40s %9.3f %9.1f %7.3f %10llu\n", "cudaMemcpyAsync per move", msn, total / (msn * 1e-3) / 1e9, ms1 / msn, badn);
        for (const Variant &v : vs) {
            std::vector<MoveBlocksParams> ps = build_params(moves, v.chunk);
            CK(cudaMemsetAsync(B, 0, BUF, st));
            float ms = time_it([&] { launch_variant(v, ps, st); }, st);
            unsigned long long bad = verify(moves, d_bad, st);
            printf("  %-40s %9.3f %9.1f %7.3f %10llu%s\n", v.name.c_str(), ms, total / (ms * 1e-3) / 1e9, ms1 / ms, bad,
                   ms1 / ms >= 0.9 ? "  <= >=0.9" : "");
        }
    }
    // Workload 3: a slide. 1023 blocks of 2 MiB, back to back in A from 1 MiB
    // on, each moving down by 1 MiB (overlapping itself and the block before):
    // slide_blocks (moves.cu) and the one-chunk-a-block version, against one
    // cudaMemcpy of the same bytes between A and B.
    {
        const u64 block = 2ull << 20, down = 1ull << 20;
        std::vector<Move> moves;
        for (u64 i = 0; i < 1023; i++) {
            moves.push_back({ (u64)A + down + i * block, (u64)A + i * block, block });
        }
        const u64 total = 1023 * block;
        std::vector<MoveBlocksParams> ps = build_params(moves, MOVE_CHUNK_BYTES);
        unsigned int *sync = nullptr;
        u64 most = 0;
        for (const MoveBlocksParams &p : ps) most = std::max<u64>(most, p.chunks);
        CK(cudaMalloc(&sync, (1 + most) * 4));
        printf("\nworkload 3: a slide, 1023 moves of 2 MiB down by 1 MiB, %.1f MiB, %zu launches\n",
               total / 1048576.0, ps.size());
        float ms1 = time_it([&] { CK(cudaMemcpyAsync(B, A, total, cudaMemcpyDeviceToDevice, st)); }, st);
        double ref = total / (ms1 * 1e-3) / 1e9;
        printf("  %-40s %9s %9s %7s %10s\n", "variant", "ms", "GB/s", "ratio", "mismatch");
        printf("  %-40s %9.3f %9.1f %7.3f %10s\n", "cudaMemcpyAsync x1 (reference)", ms1, ref, 1.0, "-");
        struct SlideVariant { const char *name; void (*fn)(SlideBlocksParams); int threads; u64 per_block; };
        const SlideVariant svs[] = {
            { "slide_blocks (verbatim moves.cu)", slide_blocks, SLIDE_BLOCK_THREADS, 2 },
            { "one chunk a block of 256", slide_one, MOVE_BLOCK_THREADS, 1 },
        };
        for (const SlideVariant &v : svs) {
            auto run = [&] {
                for (const MoveBlocksParams &p : ps) {
                    SlideBlocksParams s{ p, (u64)sync };
                    CK(cudaMemsetAsync(sync, 0, (1 + p.chunks) * 4, st));
                    u64 grid = std::min<u64>((p.chunks + v.per_block - 1) / v.per_block, 1024);
                    void *args[] = { &s };
                    CK(cudaLaunchKernel((const void *)v.fn, dim3((unsigned)grid), dim3(v.threads), args, 0, st));
                }
                CK(cudaGetLastError());
            };
            // Check once from a known state: A's slid bytes against a copy
            // of them taken before.
            fill_pattern<<<264, 512, 0, st>>>((unsigned int *)A, BUF / 4);
            CK(cudaMemcpyAsync(B, A + down, total, cudaMemcpyDeviceToDevice, st));
            run();
            CK(cudaMemsetAsync(d_bad, 0, sizeof *d_bad, st));
            count_mismatch<<<264, 512, 0, st>>>((const unsigned int *)A, (const unsigned int *)B, total / 4, d_bad);
            unsigned long long bad = 0;
            CK(cudaMemcpyAsync(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            float ms = time_it(run, st);
            printf("  %-40s %9.3f %9.1f %7.3f %10llu\n", v.name, ms, total / (ms * 1e-3) / 1e9, ms1 / ms, bad);
        }
        CK(cudaFree(sync));
    }
    CK(cudaStreamDestroy(st));
    CK(cudaFree(d_bad)); CK(cudaFree(A)); CK(cudaFree(B));
    printf("\ndone\n");
    return 0;
}
