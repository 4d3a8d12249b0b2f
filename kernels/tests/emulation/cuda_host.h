// Just enough of CUDA for the kernels in kernels/cuda to compile as host C++.
// Every qualifier is empty and the thread indices are per-thread globals that
// a launcher sets before it calls a kernel. Three ways to run threads:
// - one thread after another, each a warp of one lane (most kernels);
// - a block's threads as real threads, one block after another, for a kernel
//   that synchronizes its block (__syncthreads), so `__shared__` variables
//   (statics) are the running block's;
// - a HostWarp: up to 32 lanes as real threads that meet in every warp
//   function, as a warp's lanes do, for code whose lanes cooperate
//   (cm_alloc.cuh); any number of HostWarps run at once.
// Atomics are std::atomic operations with the order CUDA gives them:
// relaxed. __threadfence is a sequentially consistent fence, as on the
// device. malloc and free are the C library's.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// Sources that need a host stand-in for a device register or load test this.
#define CUDA_HOST_EMULATION 1

#define __device__
#define __global__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __shared__ static

struct alignas(16) ulonglong2 {
    unsigned long long x, y;
};

// Streaming (evict-first) loads and stores: plain ones on the host.
template <class T>
static inline T __ldcs(const T *p)
{
    return *p;
}

template <class T>
static inline void __stcs(T *p, T value)
{
    *p = value;
}

struct dim3 {
    unsigned x, y, z;
};
inline thread_local dim3 blockIdx, threadIdx;
inline dim3 blockDim, gridDim;

// CUDA's atomic functions: relaxed read-modify-writes (the second argument
// converts to the first's type, as CUDA's overloads do).
template <class T>
static inline std::atomic_ref<T> atomic_at(T *p)
{
    return std::atomic_ref<T>(*p);
}

// atomicAdd, atomicSub, atomicAnd, atomicOr: one fetch_* each.
#define CUDA_HOST_ATOMIC(name, fetch)                                    \
    template <class T>                                                   \
    static inline T name(T *p, std::type_identity_t<T> v)                \
    {                                                                    \
        return atomic_at(p).fetch(v, std::memory_order_relaxed);         \
    }
CUDA_HOST_ATOMIC(atomicAdd, fetch_add)
CUDA_HOST_ATOMIC(atomicSub, fetch_sub)
CUDA_HOST_ATOMIC(atomicAnd, fetch_and)
CUDA_HOST_ATOMIC(atomicOr, fetch_or)
#undef CUDA_HOST_ATOMIC

template <class T>
static inline T atomicMax(T *p, std::type_identity_t<T> v)
{
    std::atomic_ref<T> a = atomic_at(p);
    T old = a.load(std::memory_order_relaxed);
    while (old < v && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
    }
    return old;
}

template <class T>
static inline T atomicCAS(T *p, std::type_identity_t<T> expected, std::type_identity_t<T> desired)
{
    atomic_at(p).compare_exchange_strong(expected, desired, std::memory_order_relaxed);
    return expected;
}

// A relaxed atomic load: what a volatile load is in the device's memory model.
template <class T>
static inline T host_load_relaxed(const T *p)
{
    return atomic_at(const_cast<T *>(p)).load(std::memory_order_relaxed);
}

static inline void __threadfence()
{
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

static inline void __nanosleep(unsigned)
{
    std::this_thread::yield();
}

static inline int __clzll(long long x)
{
    return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}

static inline int __popc(unsigned x)
{
    return __builtin_popcount(x);
}

static inline int __popcll(unsigned long long x)
{
    return __builtin_popcountll(x);
}

static inline int __ffs(int x)
{
    return __builtin_ffs(x);
}

static inline int __ffsll(long long x)
{
    return __builtin_ffsll(x);
}

// The position of the offset-th set bit of `mask` counted from bit `base`
// (up for a positive offset, down for a negative one, `base` itself for 0),
// 0xffffffff if there is none.
static inline unsigned __fns(unsigned mask, unsigned base, int offset)
{
    if (offset == 0) {
        return (mask >> base) & 1 ? base : ~0u;
    }
    int step = offset > 0 ? 1 : -1;
    int left = offset > 0 ? offset : -offset;
    for (int b = (int)base; b >= 0 && b < 32; b += step) {
        if ((mask >> b) & 1 && --left == 0) {
            return (unsigned)b;
        }
    }
    return ~0u;
}

static inline unsigned min(unsigned a, unsigned b)
{
    return a < b ? a : b;
}

static inline unsigned long long min(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}

// A warp's lanes as host threads. run() is one step: every lane of `lanes`
// calls work(lane) once, and run() returns when all have returned. Inside a
// step the warp functions make lanes meet as on the device: __activemask
// waits for every lane of the step that has not returned (those that have
// are the inactive ones), a function with a mask waits for the lanes it
// names. A lane that returns while others wait for it in a warp function, a
// mask that names a lane that returned or leaves out its caller, and a
// shuffle from a lane outside the mask are broken warp code: reported, then
// the process aborts.
class HostWarp;
static thread_local HostWarp *this_warp = nullptr;
static thread_local unsigned this_lane = 0;
// Per lane and step: meetings so far, by mask (0: __activemask).
static thread_local std::map<unsigned, unsigned> *lane_meetings = nullptr;

class HostWarp {
public:
    struct Met {
        unsigned members;
        unsigned long long value[32];
    };

    HostWarp()
    {
        for (unsigned lane = 0; lane < 32; lane++) {
            threads_.emplace_back([this, lane] { lane_loop(lane); });
        }
    }

    HostWarp(const HostWarp &) = delete;
    HostWarp &operator=(const HostWarp &) = delete;

    ~HostWarp()
    {
        {
            std::lock_guard<std::mutex> held(lock_);
            quit_ = true;
        }
        changed_.notify_all();
        for (std::thread &t : threads_) {
            t.join();
        }
    }

    // The warp's slot (what %smid and %warpid say on the device, folded into
    // one number) and how often a lane yields where a hook asks it to.
    void run(unsigned lanes, unsigned slot, unsigned yields, std::function<void(unsigned)> work)
    {
        std::unique_lock<std::mutex> held(lock_);
        work_ = std::move(work);
        lanes_ = lanes;
        running_ = lanes;
        slot_ = slot;
        yields_ = yields;
        step_++;
        changed_.notify_all();
        // Steps take milliseconds; one that has not ended after minutes has
        // a lane that spins forever, which is better told than waited out.
        if (!changed_.wait_for(held, std::chrono::minutes(2), [&] { return running_ == 0; })) {
            broken("a step has not ended after two minutes: a lane loops");
        }
        if (!meetings_.empty()) {
            broken("a warp function still open after every lane returned");
        }
        work_ = nullptr;
    }

    unsigned slot() const
    {
        return slot_;
    }

    unsigned yields() const
    {
        return yields_;
    }

    // The calling lane meets the lanes of `mask` (0: every lane still
    // running), handing in `value`; what each member handed in.
    Met meet(unsigned mask, unsigned long long value)
    {
        unsigned bit = 1u << this_lane;
        unsigned seq = (*lane_meetings)[mask]++;
        std::unique_lock<std::mutex> held(lock_);
        if (mask != 0 && (mask & bit) == 0) {
            broken("a warp function's mask leaves out its caller");
        }
        if ((mask & ~running_) != 0) {
            broken("a warp function's mask names a lane that returned");
        }
        std::pair<unsigned, unsigned> key(mask, seq);
        Meeting &m = meetings_[key];
        m.arrived |= bit;
        m.value[this_lane] = value;
        if (complete(mask, m)) {
            changed_.notify_all();
        } else {
            waiting_ |= bit;
            if (waiting_ == running_) {
                broken("every running lane waits in a warp function that others never reach");
            }
        }
        changed_.wait(held, [&] { return m.done; });
        Met met;
        met.members = m.members;
        memcpy(met.value, m.value, sizeof met.value);
        m.left |= bit;
        if (m.left == m.members) {
            meetings_.erase(key);
        }
        return met;
    }

    [[noreturn]] void broken(const char *what)
    {
        fprintf(stderr, "broken warp code: %s (lane %u, step lanes %#x, running %#x)\n", what, this_lane, lanes_,
                running_);
        fflush(stderr);
        abort();
    }

private:
    struct Meeting {
        unsigned arrived = 0;
        unsigned members = 0;
        unsigned left = 0;
        bool done = false;
        unsigned long long value[32] = {};
    };

    // Whether meeting `m` of `mask` has everyone now; marks it so.
    bool complete(unsigned mask, Meeting &m)
    {
        if (m.done) {
            return false;
        }
        unsigned want = mask == 0 ? running_ : mask;
        if ((want & ~m.arrived) != 0) {
            return false;
        }
        m.members = m.arrived;
        m.done = true;
        waiting_ &= ~m.members;
        return true;
    }

    void lane_loop(unsigned lane)
    {
        this_warp = this;
        this_lane = lane;
        std::map<unsigned, unsigned> met;
        lane_meetings = &met;
        unsigned long long seen = 0;
        std::unique_lock<std::mutex> held(lock_);
        for (;;) {
            changed_.wait(held, [&] { return quit_ || step_ != seen; });
            if (quit_) {
                return;
            }
            seen = step_;
            if ((lanes_ >> lane & 1) == 0) {
                continue;
            }
            met.clear();
            held.unlock();
            work_(lane);
            held.lock();
            leave(lane);
        }
    }

    // Lane `lane` returned: meetings that waited only for it are complete,
    // one that needs it never can be.
    void leave(unsigned lane)
    {
        unsigned bit = 1u << lane;
        running_ &= ~bit;
        for (auto &[key, m] : meetings_) {
            if (!m.done && (key.first & bit) != 0 && (m.arrived & bit) == 0) {
                broken("a lane returned while lanes waited for it in a warp function");
            }
            complete(key.first, m);
        }
        if (running_ != 0 && waiting_ == running_) {
            broken("every running lane waits in a warp function that others never reach");
        }
        changed_.notify_all();
    }

    std::mutex lock_;
    std::condition_variable changed_;
    std::vector<std::thread> threads_;
    std::function<void(unsigned)> work_;
    std::map<std::pair<unsigned, unsigned>, Meeting> meetings_;
    unsigned long long step_ = 0;
    unsigned lanes_ = 0;
    unsigned running_ = 0;
    // Lanes in a meeting that is not complete yet.
    unsigned waiting_ = 0;
    unsigned slot_ = 0;
    unsigned yields_ = 0;
    bool quit_ = false;
};

template <class T>
static inline unsigned long long warp_bits(T value)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "a warp function moves up to 8 bytes");
    unsigned long long bits = 0;
    memcpy(&bits, &value, sizeof value);
    return bits;
}

// The lane's index in its warp: a HostWarp's lane, else (one thread after
// another) the thread's place in its block.
static inline unsigned host_lane_id()
{
    return this_warp != nullptr ? this_lane : threadIdx.x % 32;
}

// The running warp's slot (HostWarp::run), 0 outside one.
static inline unsigned host_warp_slot()
{
    return this_warp != nullptr ? this_warp->slot() : 0;
}

// Yields as often as the running warp asks (HostWarp::run), to widen a
// window that thousands of warps hit on the device and a few threads rarely do.
static inline void host_widen_window()
{
    for (unsigned i = this_warp != nullptr ? this_warp->yields() : 0; i > 0; i--) {
        std::this_thread::yield();
    }
}

// Warp functions. Outside a HostWarp the warp is the running thread alone:
// the mask is its own bit.
static inline unsigned __activemask()
{
    if (this_warp == nullptr) {
        return 1u << (threadIdx.x % 32);
    }
    return this_warp->meet(0, 0).members;
}

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    if (this_warp != nullptr) {
        this_warp->meet(mask, 0);
    }
}

static inline unsigned __ballot_sync(unsigned mask, int predicate)
{
    if (this_warp == nullptr) {
        return predicate ? mask : 0;
    }
    HostWarp::Met met = this_warp->meet(mask, predicate != 0);
    unsigned ballot = 0;
    for (unsigned l = 0; l < 32; l++) {
        ballot |= (met.members >> l & 1) && met.value[l] != 0 ? 1u << l : 0;
    }
    return ballot;
}

template <class T>
static inline T __shfl_sync(unsigned mask, T value, int src)
{
    if (this_warp == nullptr) {
        return value;
    }
    HostWarp::Met met = this_warp->meet(mask, warp_bits(value));
    unsigned from = (unsigned)src % 32;
    if ((met.members >> from & 1) == 0) {
        this_warp->broken("a shuffle from a lane outside its mask");
    }
    T out;
    memcpy(&out, &met.value[from], sizeof out);
    return out;
}

template <class T>
static inline unsigned __match_any_sync(unsigned mask, T value)
{
    if (this_warp == nullptr) {
        return 1u << (threadIdx.x % 32);
    }
    unsigned long long mine = warp_bits(value);
    HostWarp::Met met = this_warp->meet(mask, mine);
    unsigned same = 0;
    for (unsigned l = 0; l < 32; l++) {
        same |= (met.members >> l & 1) && met.value[l] == mine ? 1u << l : 0;
    }
    return same;
}

// The values of the lanes that meet at `mask`, folded by `op` from 0 (a
// thread outside a warp: its own value).
template <class Op>
static inline unsigned reduce_sync(unsigned mask, unsigned value, Op op)
{
    if (this_warp == nullptr) {
        return value;
    }
    HostWarp::Met met = this_warp->meet(mask, value);
    unsigned folded = 0;
    for (unsigned l = 0; l < 32; l++) {
        if (met.members >> l & 1) {
            folded = op(folded, (unsigned)met.value[l]);
        }
    }
    return folded;
}

static inline unsigned __reduce_or_sync(unsigned mask, unsigned value)
{
    return reduce_sync(mask, value, [](unsigned a, unsigned b) { return a | b; });
}

static inline unsigned __reduce_add_sync(unsigned mask, unsigned value)
{
    return reduce_sync(mask, value, [](unsigned a, unsigned b) { return a + b; });
}

// The barrier of the block that runs now (see the top of this file).
struct BlockBarrier {
    std::mutex lock;
    std::condition_variable changed;
    unsigned threads;
    unsigned arrived = 0;
    unsigned long long round = 0;

    explicit BlockBarrier(unsigned n) : threads(n) {}

    void wait()
    {
        std::unique_lock<std::mutex> held(lock);
        unsigned long long mine = round;
        if (++arrived == threads) {
            arrived = 0;
            round++;
            changed.notify_all();
        } else {
            changed.wait(held, [&] { return round != mine; });
        }
    }
};
static BlockBarrier *block_barrier = nullptr;

static inline void __syncthreads()
{
    if (block_barrier == nullptr) {
        printf("FAIL __syncthreads in a kernel launched one thread after another\n");
        exit(1);
    }
    block_barrier->wait();
}
