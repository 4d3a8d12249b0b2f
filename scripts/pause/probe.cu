// One allocation, one kernel that writes it, one synchronize: the smallest
// program that shows whether memory served by `cudamem run --pool` is usable
// by the device. Run once per case (a fault ends the context):
//   probe MIB main|thread   allocate MIB MiB from the main thread or from a
//                           second thread (the first allocation makes the pool)
// Prints "ok PTR" or the first failing call with the runtime's error name;
// exit 0 on ok, 1 on a failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <cuda_runtime.h>

__global__ void fill(unsigned *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned)i;
}

static size_t bytes;
static int failed;

#define STEP(call)                                                                      \
    do {                                                                                \
        cudaError_t e = (call);                                                         \
        if (e != cudaSuccess) {                                                         \
            printf("fail %s: %s (%d)\n", #call, cudaGetErrorName(e), (int)e);           \
            failed = 1;                                                                 \
            return NULL;                                                                \
        }                                                                               \
    } while (0)

static void *one(void *) {
    unsigned *p = NULL;
    STEP(cudaMalloc(&p, bytes));
    fill<<<132, 256>>>(p, bytes / 4);
    STEP(cudaGetLastError());
    STEP(cudaDeviceSynchronize());
    unsigned last = 0;
    STEP(cudaMemcpy(&last, p + bytes / 4 - 1, 4, cudaMemcpyDeviceToHost));
    if (last != (unsigned)(bytes / 4 - 1)) {
        printf("fail: read back %u, wrote %u\n", last, (unsigned)(bytes / 4 - 1));
        failed = 1;
        return NULL;
    }
    STEP(cudaFree(p));
    printf("ok %p\n", (void *)p);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: probe MIB main|thread\n"); return 2; }
    bytes = strtoull(argv[1], NULL, 0) << 20;
    if (cudaFree(0) != cudaSuccess) { printf("fail cudaFree(0)\n"); return 1; }
    if (strcmp(argv[2], "thread") == 0) {
        pthread_t id;
        pthread_create(&id, NULL, one, NULL);
        pthread_join(id, NULL);
    } else {
        one(NULL);
    }
    return failed;
}
