// cm_alloc.cuh itself, run by host threads: a C ABI over HostWarps whose
// lanes call cm_heap_malloc / cm_heap_free at once on a heap in host memory.
// The Rust tests (kernels/tests/cm_alloc/) build this as a shared object,
// lay out and grow the heap through kernels::cm_heap, and check what the
// lanes get. Every function returns 0, or 1 if the host could not do it
// (no C++ exception leaves this file).
#include "cuda_host.h"

#define CM_TRANSIT_HOOK() host_widen_window()
#include "../../cuda/cm_alloc.cuh"

// A step's lane mask: bit l set, lane l takes part.
typedef unsigned cm_lanes;

extern "C" {

// A warp of 32 lanes, idle until a step; NULL if its threads cannot start.
HostWarp *cm_host_warp_new()
{
    try {
        return new HostWarp();
    } catch (...) {
        return nullptr;
    }
}

void cm_host_warp_drop(HostWarp *warp)
{
    delete warp;
}

// Each lane l of `lanes` calls cm_heap_malloc(heap, bytes[l]), all at once,
// in a warp whose slot (%smid * 64 + %warpid on the device) is `slot`, with
// `yields` yields wherever a lane holds a chunk in transit; out[l] is what
// lane l got (0: NULL). `bytes` and `out` hold 32 entries.
int cm_host_malloc(HostWarp *warp, CmHeap *heap, unsigned slot, unsigned yields, cm_lanes lanes,
                   const cm_u64 *bytes, cm_u64 *out)
{
    try {
        warp->run(lanes, slot, yields,
                  [=](unsigned lane) { out[lane] = (cm_u64)cm_heap_malloc(heap, bytes[lane]); });
        return 0;
    } catch (...) {
        return 1;
    }
}

// Each lane l of `lanes` calls cm_heap_free(heap, ptrs[l]), all at once.
int cm_host_free(HostWarp *warp, CmHeap *heap, unsigned slot, unsigned yields, cm_lanes lanes,
                 const cm_u64 *ptrs)
{
    try {
        warp->run(lanes, slot, yields, [=](unsigned lane) { cm_heap_free(heap, (void *)ptrs[lane]); });
        return 0;
    } catch (...) {
        return 1;
    }
}

// sizeof(CmHeap): the Rust side checks it against kernels::cm_heap.
cm_u64 cm_host_descriptor_bytes()
{
    return sizeof(CmHeap);
}
}
