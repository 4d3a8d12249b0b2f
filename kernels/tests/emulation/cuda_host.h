// Just enough of CUDA for the kernels in kernels/cuda to compile as host C++:
// every qualifier is empty, the thread indices are globals that the driver
// sets before calling a kernel once per thread, and atomics are plain adds
// (threads run one after another). malloc and free are the C library's.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define __device__
#define __global__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)

struct alignas(16) ulonglong2 {
    unsigned long long x, y;
};

// Streaming (evict-first) loads and stores: plain ones on the host.
template <class T>
static inline T __ldcs(const T *p)
{
    return *p;
}

template <class T>
static inline void __stcs(T *p, T value)
{
    *p = value;
}

struct dim3 {
    unsigned x, y, z;
};
static dim3 blockIdx, threadIdx, blockDim, gridDim;

static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    unsigned long long old = *p;
    *p += v;
    return old;
}
