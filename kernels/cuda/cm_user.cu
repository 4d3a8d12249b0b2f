// An example of a user's module that calls cm_malloc / cm_free through the
// link step: it includes only the declarations (cm_link.cuh), is compiled
// with -rdc=true, and is linked with cm_link.ptx. The first kernel takes a
// block per thread and writes it; the second checks every byte and frees it.
#include "cm_link.cuh"

typedef unsigned long long u64;
typedef unsigned int u32;

// Must match kernels::cm_link::UserParams (40 bytes).
struct UserParams {
    u64 slots;   // device address of `threads` u64s: each thread's block (0: NULL)
    u64 counts;  // device address of 2 u64s: bytes that differed, NULLs
    u64 size;    // bytes per block
    u32 threads; // threads that take part (the grid may be larger)
    u32 seed;    // mixed into the bytes written
};

__device__ __forceinline__ unsigned char user_byte(const UserParams &p, u64 t, u64 i)
{
    return (unsigned char)((t * 131u + i * 7u + p.seed) >> 1);
}

extern "C" __global__ void cm_user_write(UserParams p)
{
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.threads) {
        return;
    }
    unsigned char *block = (unsigned char *)cm_malloc(p.size);
    ((u64 *)p.slots)[t] = (u64)block;
    if (block == 0) {
        atomicAdd(&((u64 *)p.counts)[1], 1ull);
        return;
    }
    for (u64 i = 0; i < p.size; i++) {
        block[i] = user_byte(p, t, i);
    }
}

extern "C" __global__ void cm_user_check_free(UserParams p)
{
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.threads) {
        return;
    }
    unsigned char *block = (unsigned char *)((u64 *)p.slots)[t];
    if (block == 0) {
        return;
    }
    u64 bad = 0;
    for (u64 i = 0; i < p.size; i++) {
        bad += block[i] != user_byte(p, t, i);
    }
    if (bad != 0) {
        atomicAdd(&((u64 *)p.counts)[0], bad);
    }
    cm_free(block);
    ((u64 *)p.slots)[t] = 0;
}
