// Runs the kernels of kernels/cuda on the host, one thread after another,
// and checks what they compute. Prints FAIL lines and exits 1 on any failure;
// prints the first pattern words so the Rust test can compare them with
// kernels::pattern::word. Built and run by kernels/tests/host_emulation.rs.
#include <initializer_list>

#include <thread>
#include <vector>

#include "cuda_host.h"

// Blocks run one after another here, so every chunk taken before a block's
// own is read already: any wait at all means the kernel waits on a chunk
// taken after its own.
static void slide_wait_hook()
{
    printf("FAIL slide_blocks waited on a chunk not taken yet\n");
    exit(1);
}
#define SLIDE_WAIT_HOOK() slide_wait_hook()

#include "../../cuda/heap.cu"
#include "../../cuda/local.cu"
#include "../../cuda/moves.cu"
#include "../../cuda/pattern.cu"

static int failures = 0;

template <class P>
static void launch_grid(void (*kernel)(P), P params, unsigned grid, unsigned block)
{
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < gridDim.x; b++) {
        for (unsigned t = 0; t < block; t++) {
            blockIdx.x = b;
            threadIdx.x = t;
            kernel(params);
        }
    }
}

// One block after another, each block's threads as real threads (for
// kernels that synchronize their block).
template <class P>
static void launch_threads(void (*kernel)(P), P params, unsigned grid, unsigned block)
{
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < gridDim.x; b++) {
        BlockBarrier barrier(block);
        block_barrier = &barrier;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block; t++) {
            threads.emplace_back([=] {
                blockIdx.x = b;
                threadIdx.x = t;
                kernel(params);
            });
        }
        for (std::thread &thread : threads) {
            thread.join();
        }
        block_barrier = nullptr;
    }
}

static void expect(bool ok, const char *what, unsigned long long got, unsigned long long want)
{
    if (!ok) {
        printf("FAIL %s: got %llu, want %llu\n", what, got, want);
        failures++;
    }
}

template <class P>
static void launch(void (*kernel)(P), P params, unsigned threads, unsigned block = 64)
{
    launch_grid(kernel, params, (threads + block - 1) / block, block);
}

static void moves_kernel()
{
    // Two buffers: moves read from `from` and write into `to`, so any set of
    // moves is independent; the expected result is memcpy of each.
    const u64 size = 9 * MOVE_CHUNK_BYTES;
    static unsigned char from[9 * MOVE_CHUNK_BYTES] __attribute__((aligned(64)));
    static unsigned char to[9 * MOVE_CHUNK_BYTES] __attribute__((aligned(64)));
    static unsigned char want[9 * MOVE_CHUNK_BYTES] __attribute__((aligned(64)));
    for (u64 i = 0; i < size; i++) {
        from[i] = (unsigned char)(pattern_word(7, i / 8) >> (8 * (i % 8)));
    }
    // (source offset, destination offset, length): every alignment class,
    // lengths off the word sizes, and moves longer than a chunk (so whole
    // steps and a partial one) in every word size.
    const u64 cases[][3] = {
        {0, 0, 2 * MOVE_CHUNK_BYTES + 100},
        {2 * MOVE_CHUNK_BYTES + 256, 2 * MOVE_CHUNK_BYTES + 512, 4095},
        {3 * MOVE_CHUNK_BYTES + 8, 3 * MOVE_CHUNK_BYTES + 24, 1000},
        {3 * MOVE_CHUNK_BYTES + 1100, 3 * MOVE_CHUNK_BYTES + 1108, 77},
        {3 * MOVE_CHUNK_BYTES + 2004, 3 * MOVE_CHUNK_BYTES + 2052, 333},
        {3 * MOVE_CHUNK_BYTES + 3001, 3 * MOVE_CHUNK_BYTES + 3003, MOVE_CHUNK_BYTES + 5},
        {4 * MOVE_CHUNK_BYTES + 4200, 4 * MOVE_CHUNK_BYTES + 5000, 15},
        {4 * MOVE_CHUNK_BYTES + 5100, 4 * MOVE_CHUNK_BYTES + 5100, 0},
        {5 * MOVE_CHUNK_BYTES + 8, 5 * MOVE_CHUNK_BYTES + 24, MOVE_CHUNK_BYTES + 40},
        {6 * MOVE_CHUNK_BYTES + 100, 6 * MOVE_CHUNK_BYTES + 204, MOVE_CHUNK_BYTES + 3},
        {7 * MOVE_CHUNK_BYTES + 256, 7 * MOVE_CHUNK_BYTES + 512, MOVE_CHUNK_BYTES},
    };
    const unsigned n = sizeof cases / sizeof cases[0];
    // Blocks of the size the launcher uses (MOVE_BLOCK_THREADS) and smaller
    // ones, whose threads take the lanes in turns.
    for (unsigned block : {(unsigned)MOVE_BLOCK_THREADS, 64u, 32u}) {
        for (unsigned grid : {1u, 3u, 64u}) {
            memset(to, 0, size);
            memset(want, 0, size);
            static MoveBlocksParams p;
            memset(&p, 0, sizeof p);
            u64 chunks = 0;
            for (unsigned i = 0; i < n; i++) {
                p.src[p.count] = (u64)(from + cases[i][0]);
                p.dst[p.count] = (u64)(to + cases[i][1]);
                p.len[p.count] = cases[i][2];
                p.first_chunk[p.count] = (u32)chunks;
                chunks += (cases[i][2] + MOVE_CHUNK_BYTES - 1) / MOVE_CHUNK_BYTES;
                p.count++;
                memcpy(want + cases[i][1], from + cases[i][0], cases[i][2]);
            }
            p.chunks = chunks;
            launch_grid(move_blocks, p, grid, block);
            u64 wrong = 0;
            for (u64 i = 0; i < size; i++) {
                wrong += to[i] != want[i];
            }
            expect(wrong == 0, "move_blocks copies every move, nothing else", wrong, 0);
        }
    }

    // The most moves a launch takes, one 256-byte block each.
    static MoveBlocksParams p;
    memset(&p, 0, sizeof p);
    memset(to, 0, size);
    for (unsigned i = 0; i < MOVE_MAX_MOVES; i++) {
        p.src[i] = (u64)(from + 256 * i);
        p.dst[i] = (u64)(to + 256 * (MOVE_MAX_MOVES - 1 - i));
        p.len[i] = 256;
        p.first_chunk[i] = i;
    }
    p.count = MOVE_MAX_MOVES;
    p.chunks = MOVE_MAX_MOVES;
    launch_grid(move_blocks, p, 50, 32);
    u64 wrong = 0;
    for (unsigned i = 0; i < MOVE_MAX_MOVES; i++) {
        wrong += memcmp(to + 256 * (MOVE_MAX_MOVES - 1 - i), from + 256 * i, 256) != 0;
    }
    expect(wrong == 0, "move_blocks finds the move of every chunk", wrong, 0);
}

// Slides of blocks (offset, length, distance down) as a compaction plans
// them (sources and destinations ascend without overlapping, 16-byte
// aligned), copied by slide_blocks and by memmove one block after another.
static void slide_kernel()
{
    const u64 C = MOVE_CHUNK_BYTES;
    const u64 size = 12 * C;
    static unsigned char mem[12 * MOVE_CHUNK_BYTES] __attribute__((aligned(64)));
    static unsigned char want[12 * MOVE_CHUNK_BYTES] __attribute__((aligned(64)));
    static unsigned int sync[1 + 12 * MOVE_CHUNK_BYTES / 16];
    struct Block {
        u64 offset, len, down;
    };
    // Contiguous blocks of 2.5 chunks sliding half a chunk (each overlaps
    // itself and covers the one before); small blocks, several to a chunk,
    // sliding by 16 bytes; mixed lengths (not multiples of 16) and growing
    // distances; one block sliding by less than a word's worth of chunks.
    const std::vector<std::vector<Block>> slides = {
        {{C / 2, 5 * C / 2, C / 2}, {3 * C, 5 * C / 2, C / 2}, {11 * C / 2, 5 * C / 2, C / 2}},
        {{16, 48, 16}, {64, 48, 16}, {112, 48, 16}, {160, 4000, 16}, {4160, 100, 16}},
        {{256, 1000, 256}, {1536, C + 7, 512}, {C + 2048, 3 * C + 5, 1008}, {5 * C, 33, 4096}, {6 * C, 2 * C, C}},
        {{C + 16, 4 * C, 32}},
    };
    for (const std::vector<Block> &slide : slides) {
        for (unsigned grid : {1u, 4u}) {
            for (u64 i = 0; i < size; i++) {
                mem[i] = (unsigned char)(i * 131 + i / 251);
            }
            memcpy(want, mem, size);
            static SlideBlocksParams s;
            memset(&s, 0, sizeof s);
            memset(sync, 0, sizeof sync);
            u64 chunks = 0;
            u64 src_end = 0, dst_end = 0;
            for (const Block &b : slide) {
                u64 dst = b.offset - b.down;
                bool sound = b.down > 0 && b.offset >= src_end && dst >= dst_end &&
                             (b.offset | dst) % 16 == 0 && b.offset + b.len <= size;
                expect(sound, "the test's slide is one slide_blocks takes", b.offset, dst);
                src_end = b.offset + b.len;
                dst_end = dst + b.len;
                MoveBlocksParams &p = s.moves;
                p.src[p.count] = (u64)(mem + b.offset);
                p.dst[p.count] = (u64)(mem + b.offset - b.down);
                p.len[p.count] = b.len;
                p.first_chunk[p.count] = (u32)chunks;
                chunks += (b.len + C - 1) / C;
                p.count++;
                memmove(want + b.offset - b.down, want + b.offset, b.len);
            }
            s.moves.chunks = chunks;
            s.sync = (u64)sync;
            launch_threads(slide_blocks, s, grid, SLIDE_BLOCK_THREADS);
            u64 wrong = 0;
            for (u64 i = 0; i < size; i++) {
                wrong += mem[i] != want[i];
            }
            expect(wrong == 0, "slide_blocks copies as memmove one by one would", wrong, 0);
            u64 tickets = (chunks + 1) / 2 + grid;
            expect(sync[0] == tickets, "every block takes chunks until none is left", sync[0], tickets);
            u64 unread = 0;
            for (u64 c = 0; c < chunks; c++) {
                unread += sync[1 + c] != 1;
            }
            expect(unread == 0, "every chunk is marked read", unread, 0);

            // Which chunks each chunk's destination covers, against a
            // chunk-by-chunk search.
            const MoveBlocksParams &p = s.moves;
            u64 mismatched = 0;
            for (u32 m = 0; m < p.count; m++) {
                for (u64 off = 0; off < p.len[m]; off += C) {
                    u64 len = p.len[m] - off < C ? p.len[m] - off : C;
                    u64 dst = p.dst[m] + off;
                    u64 first = chunks_ending_by(p, (u32)p.count, dst);
                    u64 end = chunks_starting_below(p, (u32)p.count, dst + len);
                    u64 lo = chunks, hi = 0;
                    for (u32 n = 0; n < p.count; n++) {
                        for (u64 o = 0; o < p.len[n]; o += C) {
                            u64 l = p.len[n] - o < C ? p.len[n] - o : C;
                            u64 src = p.src[n] + o;
                            if (src < dst + len && dst < src + l) {
                                u64 c = p.first_chunk[n] + o / C;
                                lo = c < lo ? c : lo;
                                hi = c + 1 > hi ? c + 1 : hi;
                            }
                        }
                    }
                    if (hi == 0) {
                        mismatched += first < end;
                    } else {
                        mismatched += first != lo || end != hi;
                    }
                }
            }
            expect(mismatched == 0, "slide_blocks waits on exactly the chunks a destination covers", mismatched, 0);
        }
    }
}

static void pattern_kernels()
{
    static unsigned char buf[1 << 14] __attribute__((aligned(64)));
    u64 counter = 0;
    for (u64 offset = 0; offset < 9; offset++) {
        for (u64 len : {0ull, 1ull, 7ull, 8ull, 9ull, 100ull, 4097ull}) {
            memset(buf, 0, sizeof buf);
            PatternParams p{(u64)(buf + offset), len, 42, (u64)&counter, 0};
            launch(pattern_fill, p, 32);
            u64 wrong = 0;
            for (u64 i = 0; i < len; i++) {
                wrong += buf[offset + i] != (unsigned char)(pattern_word(42, i / 8) >> (8 * (i % 8)));
            }
            expect(wrong == 0, "fill writes the pattern", wrong, 0);
            expect(offset == 0 || buf[offset - 1] == 0, "fill stays inside (before)", buf[offset - 1], 0);
            expect(buf[offset + len] == 0, "fill stays inside (after)", buf[offset + len], 0);
            counter = 0;
            launch(pattern_verify, p, 32);
            expect(counter == 0, "verify of a filled buffer", counter, 0);
            if (len > 0) {
                buf[offset + len / 2] ^= 0x10;
                buf[offset + len - 1] ^= 0x01;
                counter = 0;
                launch(pattern_verify, p, 32);
                u64 want = len == 1 ? 1 : 2; // len 1: one byte, flipped twice
                expect(counter == want, "verify counts flipped bytes", counter, want);
            }
        }
    }
}

static void heap_kernels()
{
    const unsigned threads = 64;
    u64 slots[threads];
    HeapCounters c{};
    HeapParams p{(u64)&c, (u64)slots, 100, threads, 1, 7};

    launch(heap_malloc_free, p, threads + 36);
    expect(c.allocations == threads && c.frees == threads, "malloc_free counts", c.allocations, threads);
    expect(c.mismatches == 0 && c.bytes == threads * 100, "malloc_free bytes", c.bytes, threads * 100);

    c = HeapCounters{};
    launch(heap_malloc_hold, p, threads);
    launch(heap_check_free_held, p, threads);
    expect(c.allocations == threads && c.frees == threads, "held blocks freed later", c.frees, threads);
    expect(c.mismatches == 0, "held blocks intact", c.mismatches, 0);

    // Ten blocks per thread of 1, 2, 3, 4, 1, 2, 3, 4, 1, 2 KiB: 23 KiB.
    c = HeapCounters{};
    p.size = 1024;
    p.max_per_thread = 10;
    launch(heap_fragment_fill, p, threads);
    expect(c.allocations == threads * 10, "fragment fill blocks", c.allocations, threads * 10);
    expect(c.bytes == threads * 23 * 1024ull, "fragment fill bytes", c.bytes, threads * 23 * 1024ull);
    expect(c.capped == threads && c.nulls == 0, "fragment fill stops at the bound", c.capped, threads);

    // The list runs newest first: blocks 9..0; the 2nd, 4th, ... are blocks
    // 8, 6, 4, 2, 0 of 1, 3, 1, 3, 1 KiB.
    c = HeapCounters{};
    launch(heap_fragment_punch, p, threads);
    expect(c.frees == threads * 5, "punch frees every other block", c.frees, threads * 5);
    expect(c.bytes == threads * 9 * 1024ull, "punch counts freed bytes", c.bytes, threads * 9 * 1024ull);
    expect(c.mismatches == 0, "punched blocks intact", c.mismatches, 0);

    c = HeapCounters{};
    p.size = 8192;
    p.max_per_thread = 3;
    launch(heap_fragment_large, p, threads);
    expect(c.allocations == threads * 3, "large requests", c.allocations, threads * 3);

    c = HeapCounters{};
    launch(heap_release_lists, p, threads);
    expect(c.frees == threads * 8, "release frees what is left", c.frees, threads * 8);
    expect(c.mismatches == 0, "released blocks intact", c.mismatches, 0);
    for (unsigned t = 0; t < threads; t++) {
        expect(slots[t] == 0, "release empties the lists", slots[t], 0);
    }

    // Sizes under the list header are raised to it.
    c = HeapCounters{};
    p.size = 3;
    p.max_per_thread = 4;
    launch(heap_exhaust, p, threads);
    expect(c.bytes == threads * 4 * 16ull, "exhaust raises tiny sizes", c.bytes, threads * 4 * 16ull);
    launch(heap_release_lists, p, threads);
    expect(c.frees == threads * 4 && c.mismatches == 0, "exhaust lists release", c.frees, threads * 4);
}

// What touch_local<bytes> leaves in out[t]: byte q of the array holds
// (t + i) mod 256 for the i (a multiple of 4) with (index + i) mod bytes = q;
// the sum reads bytes (7 index + i) mod bytes for i = 0, 64, ...
static u64 expected_local(u32 bytes, u32 index, u64 t)
{
    u64 sum = 0;
    for (u32 i = 0; i < bytes; i += 64) {
        u32 q = (index * 7 + i) % bytes;
        u32 writer = (q + bytes - index % bytes) % bytes;
        sum += (unsigned char)(t + writer);
    }
    return sum;
}

static void local_kernels()
{
    const unsigned threads = 8;
    u64 out[threads];
    // index 2: 6 * index is a multiple of 4, so every byte read was written.
    LocalParams p{(u64)out, threads, 2};
    launch(local_0, p, threads);
    expect(out[3] == 5, "local_0 result", out[3], 5);
    void (*kernels[])(LocalParams) = {local_1k, local_4k, local_16k};
    u32 sizes[] = {1024, 4096, 16384};
    for (int k = 0; k < 3; k++) {
        launch(kernels[k], p, threads);
        for (unsigned t = 0; t < threads; t++) {
            u64 want = expected_local(sizes[k], 2, t);
            expect(out[t] == want, "local kernel reads back what it wrote", out[t], want);
        }
    }
}

int main()
{
    pattern_kernels();
    heap_kernels();
    local_kernels();
    moves_kernel();
    slide_kernel();
    for (u64 i = 0; i < 4; i++) {
        printf("word %llu %llu\n", i, pattern_word(1234567, i));
    }
    printf("%s\n", failures == 0 ? "ok" : "failed");
    return failures == 0 ? 0 : 1;
}
