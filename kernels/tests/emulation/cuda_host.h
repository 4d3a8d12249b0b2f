// Just enough of CUDA for the kernels in kernels/cuda to compile as host C++:
// every qualifier is empty and the thread indices are per-thread globals that
// the driver sets before calling a kernel once per thread. Most kernels run
// one thread after another; a kernel that synchronizes its block
// (__syncthreads) runs each block's threads as real threads, one block after
// another, so `__shared__` variables (statics) are the running block's.
// Atomics are real. malloc and free are the C library's.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#define __device__
#define __global__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __shared__ static

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
static thread_local dim3 blockIdx, threadIdx;
static dim3 blockDim, gridDim;

static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

static inline unsigned int atomicAdd(unsigned int *p, unsigned int v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

static inline int __clzll(long long x)
{
    return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}

static inline unsigned long long min(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}

// Warp functions for a warp of one lane (threads run one after another):
// the mask is the running thread's own bit.
static inline unsigned __activemask()
{
    return 1u << (threadIdx.x % 32);
}

static inline unsigned __ballot_sync(unsigned mask, int predicate)
{
    return predicate ? mask : 0;
}

template <class T>
static inline T __shfl_sync(unsigned, T value, int)
{
    return value;
}

static inline void __syncwarp(unsigned) {}

static inline int __popc(unsigned x)
{
    return __builtin_popcount(x);
}

static inline int __ffs(int x)
{
    return __builtin_ffs(x);
}

static inline void __threadfence()
{
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

// The barrier of the block that runs now (see the top of this file).
struct BlockBarrier {
    std::mutex lock;
    std::condition_variable changed;
    unsigned threads;
    unsigned arrived = 0;
    unsigned long long round = 0;

    explicit BlockBarrier(unsigned n) : threads(n) {}

    void wait()
    {
        std::unique_lock<std::mutex> held(lock);
        unsigned long long mine = round;
        if (++arrived == threads) {
            arrived = 0;
            round++;
            changed.notify_all();
        } else {
            changed.wait(held, [&] { return round != mine; });
        }
    }
};
static BlockBarrier *block_barrier = nullptr;

static inline void __syncthreads()
{
    if (block_barrier == nullptr) {
        printf("FAIL __syncthreads in a kernel launched one thread after another\n");
        exit(1);
    }
    block_barrier->wait();
}
