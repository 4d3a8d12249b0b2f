// A CUDA program that raises the in-kernel malloc heap to HEAP_GIB GiB
// (default 8), launches a kernel that calls malloc (the driver takes the
// heap at that first launch), then asks for more device memory than is
// left and runs out. Under `cudamem run`, the ledger must name the malloc
// heap as the holder of those gigabytes, not module code, and leave at most
// a sliver unexplained.
//
//   nvcc -O2 -arch=sm_90 -o heap_oom heap_oom.cu
//   cudamem run -- ./heap_oom
//
// Exits 2 at the expected out of memory, 1 on any other failure.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#ifndef HEAP_GIB
#define HEAP_GIB 8
#endif

__global__ void uses_malloc(unsigned long long *out) {
    void *p = malloc(64);
    out[threadIdx.x] = (unsigned long long)(p != nullptr);
    free(p);
}

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

static size_t free_now(const char *when) {
    size_t free_bytes, total;
    check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    printf("%-44s free %9.3f GiB of %9.3f GiB\n", when, free_bytes / 1073741824.0, total / 1073741824.0);
    return free_bytes;
}

int main() {
    check(cudaFree(0), "cudaFree(0)");
    free_now("context made:");
    check(cudaDeviceSetLimit(cudaLimitMallocHeapSize, (size_t)HEAP_GIB << 30), "cudaDeviceSetLimit(heap)");
    free_now("heap limit raised (nothing taken yet):");
    unsigned long long *out;
    check(cudaMalloc(&out, 32 * sizeof(*out)), "cudaMalloc(out)");
    uses_malloc<<<1, 32>>>(out);
    check(cudaGetLastError(), "launch");
    check(cudaDeviceSynchronize(), "synchronize");
    unsigned long long got[32];
    check(cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost), "copy back");
    int ok = 0;
    for (int i = 0; i < 32; i++) ok += (int)got[i];
    printf("in-kernel malloc succeeded in %d of 32 threads\n", ok);
    size_t left = free_now("after the first launch of a malloc kernel:");
    // Ask for what the heap took plus what is left: fits only without the heap.
    size_t ask = left + ((size_t)HEAP_GIB << 30) / 2;
    void *big = nullptr;
    cudaError_t e = cudaMalloc(&big, ask);
    if (e == cudaErrorMemoryAllocation) {
        printf("cudaMalloc(%.3f GiB): out of memory, as expected\n", ask / 1073741824.0);
        return 2;
    }
    check(e, "cudaMalloc(big)");
    printf("cudaMalloc(%.3f GiB) unexpectedly succeeded\n", ask / 1073741824.0);
    return 1;
}
