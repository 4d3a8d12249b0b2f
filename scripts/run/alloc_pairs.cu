// The cheap calls `cudamem run` wraps, timed one kind at a time: what the
// interposer adds to each is the difference against the bare program, run
// side by side (gpu_check.sh alternates the two and takes medians).
//   nvcc -O2 -o alloc_pairs alloc_pairs.cu
//   ./alloc_pairs [CALLS]     prints one line per kind: KIND ns_per_call
// Kinds: cudaMalloc+cudaFree pairs of 256 B and of 1 MiB (per pair), a
// cudaMallocAsync+cudaFreeAsync pair of 256 B from the device's pool kept
// warm (per pair), cudaMemGetInfo, and the launch of an empty kernel (the
// launches are timed in batches the launch queue holds, the device drained
// between batches untimed).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void empty_kernel() {}

using Clock = std::chrono::steady_clock;

static double ns_since(Clock::time_point start) {
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count();
}

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(err_));                  \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double malloc_pairs(size_t bytes, long calls) {
    void *p;
    for (int i = 0; i < 200; i++) {
        CHECK(cudaMalloc(&p, bytes));
        CHECK(cudaFree(p));
    }
    auto start = Clock::now();
    for (long i = 0; i < calls; i++) {
        cudaMalloc(&p, bytes);
        cudaFree(p);
    }
    return ns_since(start) / calls;
}

static double async_pairs(long calls) {
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void *p;
    for (int i = 0; i < 200; i++) {
        CHECK(cudaMallocAsync(&p, 256, stream));
        CHECK(cudaFreeAsync(p, stream));
    }
    CHECK(cudaStreamSynchronize(stream));
    auto start = Clock::now();
    for (long i = 0; i < calls; i++) {
        cudaMallocAsync(&p, 256, stream);
        cudaFreeAsync(p, stream);
    }
    double ns = ns_since(start) / calls;
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaStreamDestroy(stream));
    return ns;
}

static double mem_info(long calls) {
    size_t free_bytes, total;
    auto start = Clock::now();
    for (long i = 0; i < calls; i++) cudaMemGetInfo(&free_bytes, &total);
    return ns_since(start) / calls;
}

static double launches(long calls) {
    const long batch = 256;
    empty_kernel<<<1, 1>>>();
    CHECK(cudaDeviceSynchronize());
    double ns = 0;
    long done = 0;
    while (done < calls) {
        long n = std::min(batch, calls - done);
        auto start = Clock::now();
        for (long i = 0; i < n; i++) empty_kernel<<<1, 1>>>();
        ns += ns_since(start);
        done += n;
        CHECK(cudaDeviceSynchronize());
    }
    CHECK(cudaGetLastError());
    return ns / calls;
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 20000;
    if (calls <= 0) {
        fprintf(stderr, "usage: alloc_pairs [CALLS > 0]\n");
        return 2;
    }
    CHECK(cudaFree(0));
    printf("cudaMalloc+cudaFree_256B %.1f\n", malloc_pairs(256, calls));
    printf("cudaMalloc+cudaFree_1MiB %.1f\n", malloc_pairs(1 << 20, calls / 4));
    printf("cudaMallocAsync+cudaFreeAsync_256B %.1f\n", async_pairs(calls));
    printf("cudaMemGetInfo %.1f\n", mem_info(calls));
    printf("launch_empty_kernel %.1f\n", launches(calls));
    return 0;
}
