// cm_malloc/cm_free (cm_alloc.cuh): the kernels of heap_kernels.cuh on the
// heap the host bound to this module, and mixed sizes.
#include "cm_alloc.cuh"
#include "heap_kernels.cuh"

struct CmMalloc {
    static __device__ __forceinline__ void *alloc(u64 bytes)
    {
        return cm_malloc(bytes);
    }
    static __device__ __forceinline__ void release(void *block)
    {
        cm_free(block);
    }
};

extern "C" __global__ void cm_malloc_free(HeapParams p)
{
    malloc_free<CmMalloc>(p, p.size);
}

extern "C" __global__ void cm_malloc_free_mixed(HeapParams p)
{
    malloc_free_mixed<CmMalloc>(p);
}

extern "C" __global__ void cm_malloc_hold_missing(HeapParams p)
{
    malloc_hold_missing<CmMalloc>(p);
}

extern "C" __global__ void cm_check_free_held(HeapParams p)
{
    check_free_held<CmMalloc>(p);
}

extern "C" __global__ void cm_exhaust(HeapParams p)
{
    exhaust<CmMalloc>(p);
}

extern "C" __global__ void cm_fragment_fill(HeapParams p)
{
    fragment_fill<CmMalloc>(p);
}

extern "C" __global__ void cm_fragment_punch(HeapParams p)
{
    fragment_punch<CmMalloc>(p);
}

extern "C" __global__ void cm_fragment_large(HeapParams p)
{
    fragment_large<CmMalloc>(p);
}

extern "C" __global__ void cm_release_lists(HeapParams p)
{
    release_lists<CmMalloc>(p);
}
