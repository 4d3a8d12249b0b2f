// Fill a device buffer with the seeded pattern, and count the bytes that
// differ from it. The GPU suite uses the pair to prove that compaction moved
// contents intact without copying them back to the host.
#include "pattern.cuh"

// Must match kernels::pattern::PatternParams (40 bytes).
struct PatternParams {
    u64 dst;        // device address of the buffer
    u64 len;        // bytes
    u64 seed;       // pattern seed
    u64 mismatches; // device address of a u64 counter (verify only)
    u64 unused;     // keeps the size a multiple of 16 on both sides
};

// Grid-stride over 8-byte words; the bytes before the first aligned word and
// after the last whole word go to thread 0 of the grid.
extern "C" __global__ void pattern_fill(PatternParams p)
{
    unsigned char *dst = (unsigned char *)p.dst;
    u64 head = (8 - p.dst % 8) % 8;
    if (head > p.len) {
        head = p.len;
    }
    u64 words = (p.len - head) / 8;
    u64 tail = head + words * 8;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 *aligned = (u64 *)(dst + head);
    for (u64 w = global_thread_index(); w < words; w += stride) {
        u64 first = head + w * 8;
        if (head == 0) {
            aligned[w] = pattern_word(p.seed, w);
        } else {
            u64 value = 0;
            for (int b = 7; b >= 0; b--) {
                value = (value << 8) | pattern_byte(p.seed, first + b);
            }
            aligned[w] = value;
        }
    }
    if (global_thread_index() == 0) {
        pattern_fill_range(dst, 0, head, p.seed);
        pattern_fill_range(dst + tail, tail, p.len - tail, p.seed);
    }
}

extern "C" __global__ void pattern_verify(PatternParams p)
{
    const unsigned char *src = (const unsigned char *)p.dst;
    u64 head = (8 - p.dst % 8) % 8;
    if (head > p.len) {
        head = p.len;
    }
    u64 words = (p.len - head) / 8;
    u64 tail = head + words * 8;
    u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 *aligned = (const u64 *)(src + head);
    u64 bad = 0;
    for (u64 w = global_thread_index(); w < words; w += stride) {
        u64 first = head + w * 8;
        u64 expected;
        if (head == 0) {
            expected = pattern_word(p.seed, w);
        } else {
            expected = 0;
            for (int b = 7; b >= 0; b--) {
                expected = (expected << 8) | pattern_byte(p.seed, first + b);
            }
        }
        u64 diff = aligned[w] ^ expected;
        if (diff != 0) {
            for (int b = 0; b < 8; b++) {
                bad += ((diff >> (8 * b)) & 0xff) != 0;
            }
        }
    }
    if (global_thread_index() == 0) {
        bad += pattern_check_range(src, 0, head, p.seed);
        bad += pattern_check_range(src + tail, tail, p.len - tail, p.seed);
    }
    if (bad != 0) {
        atomicAdd((u64 *)p.mismatches, bad);
    }
}
