// Kernels with a known amount of local memory per thread, to measure what the
// driver reserves for local memory at load and launch. The array is volatile
// and indexed by a run-time value so the compiler can neither drop it nor keep
// it in registers; ptxas reports it as the kernel's stack frame.
#include "pattern.cuh"

// Must match kernels::local::LocalParams (16 bytes).
struct LocalParams {
    u64 out;     // device address of `threads` u64 results
    u32 threads; // threads that take part
    u32 index;   // run-time index, any value
};

template <u32 BYTES>
__device__ __forceinline__ void touch_local(const LocalParams &p)
{
    u64 t = global_thread_index();
    if (t >= p.threads) {
        return;
    }
    volatile unsigned char scratch[BYTES];
    // Loops stay loops: unrolled, 16 KiB of stores would bloat the PTX.
#pragma unroll 1
    for (u32 i = 0; i < BYTES; i += 4) {
        scratch[(p.index + i) % BYTES] = (unsigned char)(t + i);
    }
    u64 sum = 0;
#pragma unroll 1
    for (u32 i = 0; i < BYTES; i += 64) {
        sum += scratch[(p.index * 7 + i) % BYTES];
    }
    ((u64 *)p.out)[t] = sum;
}

extern "C" __global__ void local_0(LocalParams p)
{
    u64 t = global_thread_index();
    if (t < p.threads) {
        ((u64 *)p.out)[t] = t + p.index;
    }
}

extern "C" __global__ void local_1k(LocalParams p) { touch_local<1024>(p); }
extern "C" __global__ void local_4k(LocalParams p) { touch_local<4096>(p); }
extern "C" __global__ void local_16k(LocalParams p) { touch_local<16384>(p); }
