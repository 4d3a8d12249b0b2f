// In-kernel malloc/free (CUDA's own device heap): the kernels of
// heap_kernels.cuh with malloc and free.
#include "heap_kernels.cuh"

struct DeviceMalloc {
    static __device__ __forceinline__ void *alloc(u64 bytes)
    {
        return malloc(bytes);
    }
    static __device__ __forceinline__ void release(void *block)
    {
        free(block);
    }
};

extern "C" __global__ void heap_malloc_free(HeapParams p)
{
    malloc_free<DeviceMalloc>(p, p.size);
}

extern "C" __global__ void heap_malloc_hold(HeapParams p)
{
    malloc_hold<DeviceMalloc>(p);
}

extern "C" __global__ void heap_check_free_held(HeapParams p)
{
    check_free_held<DeviceMalloc>(p);
}

extern "C" __global__ void heap_exhaust(HeapParams p)
{
    exhaust<DeviceMalloc>(p);
}

extern "C" __global__ void heap_fragment_fill(HeapParams p)
{
    fragment_fill<DeviceMalloc>(p);
}

extern "C" __global__ void heap_fragment_punch(HeapParams p)
{
    fragment_punch<DeviceMalloc>(p);
}

extern "C" __global__ void heap_fragment_large(HeapParams p)
{
    fragment_large<DeviceMalloc>(p);
}

extern "C" __global__ void heap_release_lists(HeapParams p)
{
    release_lists<DeviceMalloc>(p);
}

extern "C" __global__ void heap_malloc_free_mixed(HeapParams p)
{
    malloc_free_mixed<DeviceMalloc>(p);
}
