// The byte pattern shared by every kernel that writes memory it later checks.
//
// Byte `i` of a pattern with seed `s` is byte `i % 8` (little-endian) of the
// `i / 8`-th SplitMix64 output for state `s`. kernels/src/pattern.rs computes
// the same bytes on the host; keep the two in step (the GPU suite compares
// them on every run).
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;

// SplitMix64 output number `word` (0-based) for initial state `seed`.
__device__ __forceinline__ u64 pattern_word(u64 seed, u64 word)
{
    u64 z = seed + (word + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned char pattern_byte(u64 seed, u64 index)
{
    return (unsigned char)(pattern_word(seed, index / 8) >> (8 * (index % 8)));
}

// Writes bytes [first, first + len) of the pattern at `dst` (which holds byte
// `first` at dst[0]), one thread alone. 8-byte stores where `dst` allows.
__device__ void pattern_fill_range(unsigned char *dst, u64 first, u64 len, u64 seed)
{
    u64 i = 0;
    bool aligned = ((u64)dst % 8) == 0 && first % 8 == 0;
    if (aligned) {
        u64 *words = (u64 *)dst;
        for (; i + 8 <= len; i += 8) {
            words[i / 8] = pattern_word(seed, (first + i) / 8);
        }
    }
    for (; i < len; i++) {
        dst[i] = pattern_byte(seed, first + i);
    }
}

// Counts the bytes of [first, first + len) at `src` that differ from the
// pattern, one thread alone.
__device__ u64 pattern_check_range(const unsigned char *src, u64 first, u64 len, u64 seed)
{
    u64 bad = 0;
    u64 i = 0;
    bool aligned = ((u64)src % 8) == 0 && first % 8 == 0;
    if (aligned) {
        const u64 *words = (const u64 *)src;
        for (; i + 8 <= len; i += 8) {
            u64 diff = words[i / 8] ^ pattern_word(seed, (first + i) / 8);
            if (diff != 0) {
                for (int b = 0; b < 8; b++) {
                    bad += ((diff >> (8 * b)) & 0xff) != 0;
                }
            }
        }
    }
    for (; i < len; i++) {
        bad += src[i] != pattern_byte(seed, first + i);
    }
    return bad;
}

__device__ __forceinline__ u64 global_thread_index()
{
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}
