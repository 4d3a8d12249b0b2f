// cudaMalloc + cudaFree pairs, timed: what `cudamem run` adds to each.
//   nvcc -O2 -o alloc_pairs alloc_pairs.cu
//   ./alloc_pairs BYTES PAIRS     prints: BYTES PAIRS ns_per_pair
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

int main(int argc, char **argv) {
    size_t bytes = argc > 1 ? strtoull(argv[1], nullptr, 0) : 256;
    long pairs = argc > 2 ? atol(argv[2]) : 20000;
    if (cudaFree(0) != cudaSuccess) return 1;
    void *p;
    for (int i = 0; i < 200; i++) {
        if (cudaMalloc(&p, bytes) != cudaSuccess) return 1;
        cudaFree(p);
    }
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < pairs; i++) {
        if (cudaMalloc(&p, bytes) != cudaSuccess) return 1;
        cudaFree(p);
    }
    double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    printf("%zu %ld %.1f\n", bytes, pairs, ns / pairs);
    return 0;
}
