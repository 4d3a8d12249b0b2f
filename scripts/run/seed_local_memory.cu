// The seed's case: a CUDA program (nvcc's default build, static cudart)
// whose kernel has a large stack frame. Its local memory is reserved for
// every thread the device can hold at once (threads per SM x SMs x frame),
// which takes most of the device; the program then allocates little and
// runs out of memory. Under `cudamem run`, the explanation printed at the
// failing cudaMalloc names the kernel and that reservation.
//
//   nvcc -O2 -arch=sm_90 -o seed_local_memory seed_local_memory.cu
//   cudamem run -- ./seed_local_memory
//
// The frame is FRAME_KIB KiB (compile with -DFRAME_KIB=N to change it); the
// program prints what that reserves on this device before it starts.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#ifndef FRAME_KIB
#define FRAME_KIB 448
#endif
constexpr int FRAME_BYTES = FRAME_KIB << 10;

// A local array indexed at run time: the compiler cannot keep it in
// registers, so every thread gets FRAME_BYTES of local memory.
__global__ void big_frame(int *out, int stride) {
    volatile char buf[FRAME_BYTES];
    for (int i = threadIdx.x; i < FRAME_BYTES; i += 977) buf[i] = (char)i;
    out[blockIdx.x * blockDim.x + threadIdx.x] = buf[(stride * threadIdx.x) % FRAME_BYTES];
}

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

static void show(const char *when) {
    size_t free_bytes, total;
    check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    printf("%-40s free %8.2f GiB of %8.2f GiB\n", when, free_bytes / 1073741824.0, total / 1073741824.0);
}

int main() {
    check(cudaFree(0), "cudaFree(0)");
    show("context made:");
    int device = 0, sms = 0, threads = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
    check(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device), "threads per SM");
    cudaFuncAttributes attr;
    check(cudaFuncGetAttributes(&attr, big_frame), "cudaFuncGetAttributes");
    double reserve = (double)attr.localSizeBytes * threads * sms;
    printf("big_frame: %zu bytes of local memory per thread; %d threads/SM x %d SMs -> %.2f GiB reserved\n",
           attr.localSizeBytes, threads, sms, reserve / 1073741824.0);
    // Raise the stack limit to the frame: the driver reserves it now, for
    // every thread the device can hold.
    check(cudaDeviceSetLimit(cudaLimitStackSize, attr.localSizeBytes), "cudaDeviceSetLimit(stack)");
    show("stack limit raised to the frame:");
    int *out;
    const int blocks = 2 * sms, block = 256;
    check(cudaMalloc(&out, sizeof(int) * blocks * block), "cudaMalloc(out)");
    big_frame<<<blocks, block>>>(out, 7);
    check(cudaGetLastError(), "launch");
    check(cudaDeviceSynchronize(), "kernel");
    show("kernel ran:");
    // Now a modest working set, 2 GiB at a time.
    const size_t chunk = 2ull << 30;
    int got = 0;
    for (;;) {
        void *p;
        cudaError_t e = cudaMalloc(&p, chunk);
        if (e != cudaSuccess) {
            printf("after %d x 2 GiB, cudaMalloc of 2 GiB failed: %s\n", got, cudaGetErrorString(e));
            return 2;
        }
        ++got;
    }
}
