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
