// Programs for `cudamem pause`'s GPU check (gpu_check.sh), built with nvcc.
//   pause_job work ROUNDS THREADS MIB  THREADS threads each hold about MIB MiB
//       in buffers of their own sizes, and for ROUNDS rounds launch add_one
//       over them, copy part into a scratch buffer they free and make anew
//       every fourth round, and sleep a little; "pid PID ready" once all hold
//       their buffers; at the end a checksum of every buffer, which depends
//       on the arguments only.
//   pause_job hold GIB DONEFILE  GIB GiB in 256 MiB buffers, filled; "pid PID
//       ready"; waits until DONEFILE exists; then a checksum of all of it.
//   pause_job bandwidth GIB  a plain pinned cudaMemcpy of GIB GiB each way,
//       best of 3: "pinned d2h X GiB/s h2d Y GiB/s".
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <vector>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(10); } } while (0)

__global__ void add_one(unsigned *words, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        words[i] += 1;
}
__global__ void fill(unsigned *words, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        words[i] = (unsigned)(i * 2654435761u) ^ seed;
}
__global__ void fold(const unsigned *words, size_t n, unsigned long long *out) {
    unsigned long long h = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        h += (unsigned long long)words[i] * (2 * i + 1);
    atomicAdd(out, h);
}

static unsigned long long checksum(const unsigned *words, size_t n) {
    unsigned long long *sum;
    CHECK(cudaMalloc(&sum, sizeof *sum));
    CHECK(cudaMemset(sum, 0, sizeof *sum));
    fold<<<264, 256>>>(words, n, sum);
    unsigned long long h;
    CHECK(cudaMemcpy(&h, sum, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(sum));
    return h;
}

static int rounds, threads;
static size_t mib;
static pthread_barrier_t ready;
static unsigned long long sums[256];

static void *work(void *arg) {
    int t = (int)(intptr_t)arg;
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::vector<unsigned *> bufs;
    std::vector<size_t> words;
    size_t left = mib << 20, k = 0;
    while (left > 0) {
        size_t bytes = ((size_t)(t * 7919 + k * 104729) % (8u << 20)) + 256;
        if (bytes > left) bytes = left;
        bytes = (bytes + 3) / 4 * 4;
        unsigned *p;
        CHECK(cudaMalloc(&p, bytes));
        fill<<<64, 256, 0, stream>>>(p, bytes / 4, (unsigned)(t * 131 + k));
        bufs.push_back(p);
        words.push_back(bytes / 4);
        left -= bytes < left ? bytes : left;
        k++;
    }
    size_t sbytes = 4096 + t * 512;
    unsigned *scratch;
    CHECK(cudaMalloc(&scratch, sbytes));
    CHECK(cudaStreamSynchronize(stream));
    pthread_barrier_wait(&ready);
    for (int round = 1; round <= rounds; round++) {
        for (size_t i = 0; i < bufs.size(); i++) add_one<<<64, 256, 0, stream>>>(bufs[i], words[i]);
        if (round % 4 == 0) {
            CHECK(cudaStreamSynchronize(stream));
            CHECK(cudaFree(scratch));
            sbytes = 4096 + (size_t)((t * 104729 + round * 131) % (1 << 20));
            CHECK(cudaMalloc(&scratch, sbytes));
            CHECK(cudaMemsetAsync(scratch, round & 0xff, sbytes, stream));
        }
        size_t part = words[0] * 4 < sbytes ? words[0] * 4 : sbytes;
        CHECK(cudaMemcpyAsync(scratch, bufs[0], part / 2, cudaMemcpyDeviceToDevice, stream));
        CHECK(cudaStreamSynchronize(stream));
        usleep(2000);
    }
    unsigned long long h = 0;
    for (size_t i = 0; i < bufs.size(); i++) h = h * 31 + checksum(bufs[i], words[i]);
    h = h * 31 + checksum(scratch, sbytes / 4);
    sums[t] = h;
    for (unsigned *p : bufs) CHECK(cudaFree(p));
    CHECK(cudaFree(scratch));
    CHECK(cudaStreamDestroy(stream));
    return NULL;
}

static double now(void) { struct timeval tv; gettimeofday(&tv, NULL); return tv.tv_sec + tv.tv_usec * 1e-6; }

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: see the head of pause_job.cu\n"); return 2; }
    CHECK(cudaFree(0));
    if (strcmp(argv[1], "work") == 0 && argc == 5) {
        rounds = atoi(argv[2]); threads = atoi(argv[3]); mib = strtoull(argv[4], NULL, 0);
        if (threads < 1 || threads > 256) return 2;
        pthread_barrier_init(&ready, NULL, threads + 1);
        std::vector<pthread_t> ids(threads);
        for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, work, (void *)(intptr_t)t);
        pthread_barrier_wait(&ready);
        printf("pid %d ready\n", (int)getpid());
        fflush(stdout);
        unsigned long long h = 0;
        for (int t = 0; t < threads; t++) { pthread_join(ids[t], NULL); h = h * 31 + sums[t]; }
        printf("checksum %016llx\n", h);
        return 0;
    }
    if (strcmp(argv[1], "hold") == 0 && argc == 4) {
        size_t gib = strtoull(argv[2], NULL, 0), chunk = 256u << 20;
        std::vector<unsigned *> bufs(gib * 4);
        for (size_t i = 0; i < bufs.size(); i++) {
            CHECK(cudaMalloc(&bufs[i], chunk));
            fill<<<264, 256>>>(bufs[i], chunk / 4, (unsigned)i);
        }
        CHECK(cudaDeviceSynchronize());
        printf("pid %d ready\n", (int)getpid());
        fflush(stdout);
        while (access(argv[3], F_OK) != 0) usleep(10000);
        unsigned long long h = 0;
        for (size_t i = 0; i < bufs.size(); i++) h = h * 31 + checksum(bufs[i], chunk / 4);
        printf("checksum %016llx\n", h);
        return 0;
    }
    if (strcmp(argv[1], "bandwidth") == 0) {
        size_t bytes = strtoull(argv[2], NULL, 0) << 30;
        void *host, *dev;
        CHECK(cudaMallocHost(&host, bytes));
        CHECK(cudaMalloc(&dev, bytes));
        memset(host, 1, bytes);
        double d2h = 0, h2d = 0;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now();
            CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
            double t1 = now();
            CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
            double t2 = now();
            double a = bytes / (t1 - t0) / (1u << 30), b = bytes / (t2 - t1) / (1u << 30);
            if (a > d2h) d2h = a;
            if (b > h2d) h2d = b;
        }
        printf("pinned d2h %.2f GiB/s h2d %.2f GiB/s\n", d2h, h2d);
        return 0;
    }
    fprintf(stderr, "usage: see the head of pause_job.cu\n");
    return 2;
}
