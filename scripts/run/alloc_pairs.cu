// The cheap calls `cudamem run` wraps, timed one kind at a time: what the
// interposer adds to each is the difference against the bare program, run
// side by side (gpu_check.sh alternates the two, pinned to one core).
//   nvcc -O2 -o alloc_pairs alloc_pairs.cu
//   ./alloc_pairs [CALLS]     prints one line per kind:
//                             KIND median_ns_per_call fastest_batch_ns_per_call
// Each kind runs as BATCHES batches of CALLS / BATCHES calls; the median
// batch is the typical cost, the fastest the cost on a quiet machine (a
// batch the host's other work did not interrupt).
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
#include <vector>
#include <cuda_runtime.h>

__global__ void empty_kernel() {}

using Clock = std::chrono::steady_clock;

static const long BATCHES = 25;

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

struct Figures {
    double median, fastest;
};

// Run `batch(n)` (which times n calls and returns the nanoseconds they
// took) BATCHES times over `calls` calls in all: per call, the median
// batch and the fastest.
template <typename Batch> static Figures batches(long calls, Batch batch) {
    long n = std::max(1L, calls / BATCHES);
    std::vector<double> per_call;
    for (long b = 0; b < BATCHES; b++) per_call.push_back(batch(n) / n);
    std::sort(per_call.begin(), per_call.end());
    return {per_call[per_call.size() / 2], per_call.front()};
}

static Figures malloc_pairs(size_t bytes, long calls) {
    void *p;
    for (int i = 0; i < 200; i++) {
        CHECK(cudaMalloc(&p, bytes));
        CHECK(cudaFree(p));
    }
    return batches(calls, [&](long n) {
        auto start = Clock::now();
        for (long i = 0; i < n; i++) {
            cudaMalloc(&p, bytes);
            cudaFree(p);
        }
        return ns_since(start);
    });
}

static Figures async_pairs(long calls) {
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
    Figures figures = batches(calls, [&](long n) {
        auto start = Clock::now();
        for (long i = 0; i < n; i++) {
            cudaMallocAsync(&p, 256, stream);
            cudaFreeAsync(p, stream);
        }
        double ns = ns_since(start);
        CHECK(cudaStreamSynchronize(stream));
        return ns;
    });
    CHECK(cudaStreamDestroy(stream));
    return figures;
}

static Figures mem_info(long calls) {
    size_t free_bytes, total;
    return batches(calls, [&](long n) {
        auto start = Clock::now();
        for (long i = 0; i < n; i++) cudaMemGetInfo(&free_bytes, &total);
        return ns_since(start);
    });
}

static Figures launches(long calls) {
    const long queue = 256;
    empty_kernel<<<1, 1>>>();
    CHECK(cudaDeviceSynchronize());
    return batches(calls, [&](long n) {
        double ns = 0;
        long done = 0;
        while (done < n) {
            long k = std::min(queue, n - done);
            auto start = Clock::now();
            for (long i = 0; i < k; i++) empty_kernel<<<1, 1>>>();
            ns += ns_since(start);
            done += k;
            CHECK(cudaDeviceSynchronize());
        }
        CHECK(cudaGetLastError());
        return ns;
    });
}

static void print(const char *kind, Figures figures) {
    printf("%s %.1f %.1f\n", kind, figures.median, figures.fastest);
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 20000;
    if (calls <= 0) {
        fprintf(stderr, "usage: alloc_pairs [CALLS > 0]\n");
        return 2;
    }
    CHECK(cudaFree(0));
    print("cudaMalloc+cudaFree_256B", malloc_pairs(256, calls));
    print("cudaMalloc+cudaFree_1MiB", malloc_pairs(1 << 20, calls / 4));
    print("cudaMallocAsync+cudaFreeAsync_256B", async_pairs(calls));
    print("cudaMemGetInfo", mem_info(calls));
    print("launch_empty_kernel", launches(calls));
    return 0;
}
