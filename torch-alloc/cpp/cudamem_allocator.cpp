// cudamem's backend for PyTorch: a c10::cuda::CUDACachingAllocator::CUDAAllocator over
// libcudamem_torch's C ABI (cudamem.h), installed with PyTorch's allocator swap before
// the first CUDA tensor (python/cudamem_torch.py builds and loads it).
//
// A thin shell. What only C++ can do happens here: PyTorch's types in and out, the
// capture filters PyTorch hands to beginAllocateToPool (std::function), the capture
// status of a stream, the stacks PyTorch's recorder gathers (kept here by number; the
// Rust side says when a number is no longer named), exceptions. Every decision
// (placement, stream order, private pools, figures, history) is the Rust side's.

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cudamem.h"
#include "cudamem_ipc.h"

namespace cudamem_backend {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;

// The calling thread's message for the last failed C call.
std::string last_error() {
  const ssize_t n = cudamem_last_error(nullptr, 0);
  if (n <= 0) {
    return "cudamem: the call failed without a message";
  }
  std::string text(static_cast<size_t>(n) + 1, '\0');
  cudamem_last_error(text.data(), text.size());
  text.resize(static_cast<size_t>(n));
  return text;
}

// Throws what a failed call's status says: torch.cuda.OutOfMemoryError for out of
// memory, RuntimeError for the rest.
void check(int code) {
  if (code == CUDAMEM_OK) {
    return;
  }
  const std::string message = last_error();
  TORCH_CHECK_WITH(OutOfMemoryError, code != CUDAMEM_OUT_OF_MEMORY, message);
  TORCH_CHECK(false, message);
}

// The stacks PyTorch's recorder gathered, by the number the Rust side knows them by.
class Stacks {
 public:
  uint64_t keep(std::shared_ptr<c10::GatheredContext> stack) {
    if (!stack) {
      return 0;
    }
    std::lock_guard<std::mutex> guard(mutex_);
    const uint64_t number = next_++;
    by_number_.emplace(number, std::move(stack));
    return number;
  }

  std::shared_ptr<c10::GatheredContext> get(uint64_t number) {
    if (number == 0) {
      return nullptr;
    }
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = by_number_.find(number);
    return it == by_number_.end() ? nullptr : it->second;
  }

  // Drops the stacks no device names any more; they are destroyed after the lock.
  void drop_dead() {
    constexpr size_t kBatch = 256;
    uint64_t dead[kBatch];
    for (;;) {
      const size_t n = cudamem_take_dead_contexts(dead, kBatch);
      if (n == 0) {
        return;
      }
      std::vector<std::shared_ptr<c10::GatheredContext>> gone;
      {
        std::lock_guard<std::mutex> guard(mutex_);
        for (size_t i = 0; i < n; ++i) {
          auto it = by_number_.find(dead[i]);
          if (it != by_number_.end()) {
            gone.push_back(std::move(it->second));
            by_number_.erase(it);
          }
        }
      }
      if (n < kBatch) {
        return;
      }
    }
  }

 private:
  std::mutex mutex_;
  uint64_t next_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<c10::GatheredContext>> by_number_;
};

// A checkpoint of a private pool, held by PyTorch's cudagraph trees.
struct Checkpoint final : cca::AllocatorState {
  Checkpoint(int device, uint64_t number) : device(device), number(number) {}
  ~Checkpoint() override {
    if (cudamem_drop_checkpoint(device, number) != CUDAMEM_OK) {
      try {
        TORCH_WARN(last_error());
      } catch (...) {
      }
    }
  }
  int device;
  uint64_t number;
};

// Whether `stream` is capturing a CUDA graph; a stream that cannot be asked (the legacy
// stream while another stream captures) counts as capturing.
bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

void delete_block(void* ptr);

class Allocator final : public cca::CUDAAllocator {
 public:
  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    void* ptr = nullptr;
    if (size != 0) {
      ptr = malloc_on(device, size, c10::cuda::getCurrentCUDAStream(device).stream());
    }
    return {ptr, ptr, &delete_block, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &delete_block;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const final {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  void* raw_alloc(size_t nbytes) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return raw_alloc_with_stream(nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) {
      return nullptr;
    }
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return malloc_on(device, nbytes, stream);
  }

  void raw_delete(void* ptr) override {
    check(free_block(ptr));
  }

  // Frees a block on whichever device holds it; the status, not thrown.
  int free_block(void* ptr) {
    if (ptr == nullptr) {
      return CUDAMEM_OK;
    }
    if (pool_allocators_any_.load(std::memory_order_acquire) && free_foreign(ptr)) {
      return CUDAMEM_OK;
    }
    const int level = record_level_.load(std::memory_order_acquire);
    uint64_t context = 0;
    if (level >= static_cast<int>(cca::RecordContext::ALL)) {
      context = gather();
    }
    if (exports_.any()) {
      exports_.forget(ptr);
    }
    cudamem_outcome out{};
    const int code = cudamem_free(ptr, context, &out);
    if (level > 0 || context != 0) {
      stacks_.drop_dead();
    }
    if (code == CUDAMEM_OK && trackers_any_.load(std::memory_order_acquire)) {
      try {
        track(cca::TraceEntry::FREE_REQUESTED, static_cast<c10::DeviceIndex>(out.device), ptr,
              out.bytes, nullptr, {0, 0});
      } catch (...) {
        // A tracker that throws must not turn a free into a failure.
      }
    }
    if (code == CUDAMEM_OK) {
      c10::reportMemoryUsageToProfiler(
          ptr,
          -static_cast<int64_t>(out.bytes),
          out.allocated_bytes,
          out.reserved_bytes,
          c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(out.device)));
    }
    return code;
  }

  void init(int device_count) override {
    device_count_ = device_count;
    initialized_ = true;
  }

  bool initialized() override {
    return initialized_;
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    double fraction = 1.0;
    check(cudamem_memory_fraction(device, &fraction));
    return fraction;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    check(cudamem_set_memory_fraction(device, fraction));
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return {};
  }

  // Every device opened waits for its freed blocks and gives back what it can; for a
  // private pool's id too (its memory goes back once the pool is released). For a pool
  // id it warns rather than throws: MemPool's destructor calls it.
  void emptyCache(MempoolId_t mempool_id) override {
    const int code = cudamem_empty_cache(-1, nullptr);
    if (mempool_id.first == 0 && mempool_id.second == 0) {
      check(code);
    } else {
      warn_on_failure(code);
    }
  }

  void enable(bool /*value*/) override {}

  bool isEnabled() const override {
    return true;
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
    uint64_t bytes = 0;
    check(cudamem_largest_block(device, &bytes));
    *largest = static_cast<size_t>(bytes);
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    int device = 0;
    uint64_t base = 0;
    uint64_t bytes = 0;
    check(cudamem_block(ptr, &device, &base, &bytes));
    if (size != nullptr) {
      *size = static_cast<size_t>(bytes);
    }
    return reinterpret_cast<void*>(base);
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // An empty tensor has no block; a block another allocator made (a tensor shared
    // by another process) is not ours to order.
    if (ptr.get() == nullptr || ptr.get_deleter() != &delete_block) {
      return;
    }
    check(cudamem_record_stream(ptr.get(), stream.stream()));
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    c10::CachingDeviceAllocator::DeviceStats stats;
    stats.max_split_size = -1;
    if (!cudamem_is_open(device)) {
      return stats;  // never used: nothing to count, and no context to make for it
    }
    struct cudamem_device_stats raw{};
    check(cudamem_device_stats(device, &raw));
    copy(raw.allocation, stats.allocation);
    copy(raw.segment, stats.segment);
    copy(raw.active, stats.active);
    copy(raw.inactive_split, stats.inactive_split);
    copy(raw.allocated_bytes, stats.allocated_bytes);
    copy(raw.reserved_bytes, stats.reserved_bytes);
    copy(raw.active_bytes, stats.active_bytes);
    copy(raw.inactive_split_bytes, stats.inactive_split_bytes);
    copy(raw.requested_bytes, stats.requested_bytes);
    stats.num_alloc_retries = raw.num_alloc_retries;
    stats.num_ooms = raw.num_ooms;
    copy(raw.oversize_allocations, stats.oversize_allocations);
    copy(raw.oversize_segments, stats.oversize_segments);
    stats.num_sync_all_streams = raw.num_sync_all_streams;
    stats.num_device_alloc = raw.num_device_alloc;
    stats.num_device_free = raw.num_device_free;
    stats.max_split_size = raw.max_split_size;
    return stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    if (cudamem_is_open(device)) {
      check(cudamem_reset_accumulated_stats(device));
    }
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    if (cudamem_is_open(device)) {
      check(cudamem_reset_peak_stats(device));
    }
  }

  cca::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    cca::SnapshotInfo result;
    const int devices = device_count_ > 0 ? device_count_ : static_cast<int>(c10::cuda::device_count());
    for (int device = 0; device < devices; ++device) {
      result.device_traces.emplace_back();
      if (!cudamem_is_open(device)) {
        continue;
      }
      Collector collector{device, &result.segments, &result.device_traces.back(), &stacks_};
      cudamem_snapshot_sink sink{&collector, &Collector::on_segment, &Collector::on_block,
                                 &Collector::on_trace};
      check(cudamem_snapshot(
          device, mempool_id.first, mempool_id.second, include_traces ? 1 : 0, &sink));
    }
    auto& config = result.config_metadata;
    config.garbage_collection_threshold = 0.0;
    config.max_split_size = SIZE_MAX;
    config.pinned_num_register_threads = 1;
    config.expandable_segments = false;
    config.release_lock_on_malloc = false;
    config.pinned_use_host_register = false;
    config.graph_capture_record_stream_reuse = false;
    config.last_allocator_settings = "backend:cudamem";
    return result;
  }

  void beginAllocateToPool(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      std::function<bool(cudaStream_t)> filter) override {
    check(cudamem_begin_allocate_to_pool(device, mempool_id.first, mempool_id.second));
    std::lock_guard<std::mutex> guard(diversions_mutex_);
    diversions_[device].push_back({mempool_id, std::move(filter)});
    diverting_.fetch_add(1, std::memory_order_acq_rel);
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(cudamem_end_allocate_to_pool(device, mempool_id.first, mempool_id.second));
    std::lock_guard<std::mutex> guard(diversions_mutex_);
    auto& list = diversions_[device];
    auto it = std::find_if(list.begin(), list.end(), [&](const Diversion& d) {
      return d.pool == mempool_id;
    });
    if (it != list.end()) {
      list.erase(it);
      diverting_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  // Warns rather than throws: MemPool's destructor calls it.
  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    warn_on_failure(cudamem_release_pool(device, mempool_id.first, mempool_id.second));
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    uint32_t count = 0;
    check(cudamem_pool_use_count(device, mempool_id.first, mempool_id.second, &count));
    return static_cast<int>(count);
  }

  // A MemPool with its own allocator (a CUDAPluggableAllocator) takes its blocks from
  // that allocator, as PyTorch's pools take their segments from it; without one, or with
  // this allocator, the pool is cudamem's.
  void createOrIncrefPool(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      std::shared_ptr<cca::CUDAAllocator> allocator) override {
    check(cudamem_incref_pool(device, mempool_id.first, mempool_id.second));
    if (allocator != nullptr && allocator.get() != this) {
      std::lock_guard<std::mutex> guard(pool_allocators_mutex_);
      pool_allocators_[{device, mempool_id}] = std::move(allocator);
      pool_allocators_any_.store(true, std::memory_order_release);
    }
  }

#if defined(CUDAMEM_HAS_ensureExistsAndIncrefPool)
  void ensureExistsAndIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(cudamem_incref_pool(device, mempool_id.first, mempool_id.second));
  }
#endif

#if defined(CUDAMEM_HAS_setUseOnOOM) && CUDAMEM_HAS_setUseOnOOM == 3
  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    check(cudamem_set_use_on_oom(device, mempool_id.first, mempool_id.second, use_on_oom ? 1 : 0));
  }
#elif defined(CUDAMEM_HAS_setUseOnOOM)
  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(cudamem_set_use_on_oom(device, mempool_id.first, mempool_id.second, 1));
  }
#endif

#if defined(CUDAMEM_HAS_setNoSplit)
  void setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(cudamem_set_no_split(device, mempool_id.first, mempool_id.second));
  }
#endif

  bool checkPoolLiveAllocations(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override {
    std::vector<uint64_t> ptrs;
    ptrs.reserve(expected_live_allocations.size());
    for (void* ptr : expected_live_allocations) {
      ptrs.push_back(reinterpret_cast<uint64_t>(ptr));
    }
    int matches = 0;
    check(cudamem_check_pool_live(
        device, mempool_id.first, mempool_id.second, ptrs.data(), ptrs.size(), &matches));
    return matches != 0;
  }

  // The block's VMM handles, exported once; the receiver fetches them over this
  // process's socket (cudamem_ipc.h).
  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    return exports_.share(ptr);
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    return imports_.open(handle);
  }

  bool isHistoryEnabled() override {
    return history_enabled_.load(std::memory_order_acquire);
  }

  void recordHistory(
      bool enabled,
      cca::CreateContextFn context_recorder,
      size_t alloc_trace_max_entries,
      cca::RecordContext when,
      bool clear_history,
      const std::vector<std::string>& skip_actions) override {
    TORCH_CHECK(
        when == cca::RecordContext::NEVER || context_recorder != nullptr,
        "cudamem: recording stacks needs a recorder");
    uint32_t skip = 0;
    for (const auto& name : skip_actions) {
      skip |= 1u << static_cast<unsigned>(c10::CachingDeviceAllocator::parseTraceEntryAction(name));
    }
    const int level = enabled ? static_cast<int>(when) : 0;
    recorder_.store(enabled ? context_recorder : nullptr, std::memory_order_release);
    check(cudamem_record_history(
        -1, enabled ? 1 : 0, static_cast<uint32_t>(level), alloc_trace_max_entries,
        clear_history ? 1 : 0, skip));
    record_level_.store(level, std::memory_order_release);
    history_enabled_.store(enabled, std::memory_order_release);
    stacks_.drop_dead();
  }

#if defined(CUDAMEM_HAS_getContextForPointer)
  // The Rust side keeps a block's stack by number, not by address: none is given, as
  // PyTorch's own default does.
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* /*ptr*/) override {
    return nullptr;
  }
#endif

#if defined(CUDAMEM_HAS_recordAnnotation)
  // Annotations are not kept in cudamem's snapshots (PyTorch's default does the same).
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& /*md*/) override {}
#endif

#if defined(CUDAMEM_HAS_pushCompileContext)
  void pushCompileContext(std::string& /*md*/) override {}
#endif

#if defined(CUDAMEM_HAS_popCompileContext)
  void popCompileContext() override {}
#endif

#if defined(CUDAMEM_HAS_setUserMetadata)
  void setUserMetadata(const std::string& metadata) override {
    std::lock_guard<std::mutex> guard(observers_mutex_);
    user_metadata_ = metadata;
  }
#endif

#if defined(CUDAMEM_HAS_getUserMetadata)
  std::string getUserMetadata() override {
    std::lock_guard<std::mutex> guard(observers_mutex_);
    return user_metadata_;
  }
#endif

#if defined(CUDAMEM_HAS_attachOomRejectionObserver)
  // PyTorch calls these when its throw-on-cudaMalloc policy refuses a request ahead of
  // time; cudamem refuses only when the pool finds no memory, so they are kept unused.
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override {
    std::lock_guard<std::mutex> guard(observers_mutex_);
    oom_rejection_observers_.push_back(std::move(observer));
  }
#endif

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> guard(observers_mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  // Trace trackers see each block handed out (ALLOC) and freed (FREE_REQUESTED) as it
  // happens; segment entries are not sent (a pool's mappings are not segments a caller
  // could register), so NCCL's registration hook registers nothing.
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> guard(observers_mutex_);
    trace_trackers_.push_back(std::move(tracker));
    trackers_any_.store(true, std::memory_order_release);
  }

  // Lets `dev` reach memory `cudaMalloc` made on `dev_to_access` (what other
  // allocators and CUDA IPC hand out). cudamem's own pools are reached by peers only
  // as CUDAMEM_PEERS says; copies between devices go through memcpyAsync below.
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
  }

  // VMM memory without a grant to the other device: only the peer copy reaches it.
  cudaError_t memcpyAsync(
      void* dst,
      int dstDevice,
      const void* src,
      int srcDevice,
      size_t count,
      cudaStream_t stream,
      bool /*p2p_enabled*/) override {
    if (srcDevice == dstDevice) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(
      c10::DeviceIndex device,
      MempoolId_t id) override {
    uint64_t number = 0;
    check(cudamem_checkpoint_pool(device, id.first, id.second, &number));
    return std::make_shared<Checkpoint>(device, number);
  }

  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device,
      std::shared_ptr<cca::AllocatorState> state) override {
    auto checkpoint = std::dynamic_pointer_cast<Checkpoint>(state);
    TORCH_CHECK(checkpoint != nullptr, "cudamem: not a checkpoint of cudamem's pools");
    TORCH_CHECK(checkpoint->device == device, "cudamem: a checkpoint of another device");
    Restored restored;
    check(cudamem_restore_checkpoint(device, checkpoint->number, &Restored::on_ptr, &restored));
    cca::CheckpointDelta delta;
    for (uint64_t ptr : restored.freed) {
      delta.ptrs_freed.push_back(reinterpret_cast<void*>(ptr));
    }
    for (uint64_t ptr : restored.allocated) {
      void* p = reinterpret_cast<void*>(ptr);
      delta.dataptrs_allocd.emplace_back(
          p, p, &delete_block, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  std::string name() override {
    return "cudamem";
  }

 private:
  struct Diversion {
    MempoolId_t pool;
    std::function<bool(cudaStream_t)> filter;
  };

  struct Restored {
    std::vector<uint64_t> freed;
    std::vector<uint64_t> allocated;
    static void on_ptr(void* user, int allocated, uint64_t ptr) {
      auto* self = static_cast<Restored*>(user);
      (allocated != 0 ? self->allocated : self->freed).push_back(ptr);
    }
  };

  // Builds PyTorch's snapshot from the Rust side's segments, blocks and trace.
  struct Collector {
    int device;
    std::vector<cca::SegmentInfo>* segments;
    std::vector<cca::TraceEntry>* trace;
    Stacks* stacks;

    static void on_segment(void* user, const cudamem_segment* s) {
      auto* self = static_cast<Collector*>(user);
      cca::SegmentInfo info;
      info.device = static_cast<c10::DeviceIndex>(self->device);
      info.address = static_cast<size_t>(s->address);
      info.total_size = static_cast<size_t>(s->total_size);
      info.requested_size = static_cast<size_t>(s->requested_size);
      info.allocated_size = static_cast<size_t>(s->allocated_size);
      info.active_size = static_cast<size_t>(s->active_size);
      info.stream = reinterpret_cast<void*>(s->stream);
      info.is_large = true;
      info.is_expandable = false;
      info.owner_private_pool_id = {s->pool_first, s->pool_second};
      self->segments->push_back(std::move(info));
    }

    static void on_block(void* user, const cudamem_block_info* b) {
      auto* self = static_cast<Collector*>(user);
      cca::BlockInfo info;
      info.size = static_cast<size_t>(b->size);
      info.requested_size = static_cast<size_t>(b->requested_size);
      info.allocated = b->state == 1;
      info.active = b->state != 0;
      info.context_when_allocated = self->stacks->get(b->context);
      self->segments->back().blocks.push_back(std::move(info));
    }

    static void on_trace(void* user, const cudamem_trace_entry* t) {
      auto* self = static_cast<Collector*>(user);
      self->trace->emplace_back(
          static_cast<cca::TraceEntry::Action>(t->action),
          static_cast<c10::DeviceIndex>(self->device),
          static_cast<size_t>(t->addr),
          static_cast<size_t>(t->size),
          reinterpret_cast<void*>(t->stream),
          MempoolId_t{t->pool_first, t->pool_second},
          c10::approx_time_t{},
          self->stacks->get(t->context));
      self->trace->back().time_.t_ = static_cast<time_t>(t->time_us);
    }
  };

  static void copy(const cudamem_stat& from, c10::CachingAllocator::Stat& to) {
    to.current = from.current;
    to.peak = from.peak;
    to.allocated = from.allocated;
    to.freed = from.freed;
  }

  static void copy(const cudamem_stat_array& from, c10::CachingAllocator::StatArray& to) {
    copy(from.aggregate, to[0]);
    copy(from.small_pool, to[1]);
    copy(from.large_pool, to[2]);
  }

  // A failure as a warning, for calls PyTorch makes from destructors.
  static void warn_on_failure(int code) {
    if (code == CUDAMEM_OK) {
      return;
    }
    try {
      TORCH_WARN(last_error());
    } catch (...) {
    }
  }

  // Frees `ptr` through the pool allocator that handed it out; false if none did.
  bool free_foreign(void* ptr) {
    std::shared_ptr<cca::CUDAAllocator> owner;
    {
      std::lock_guard<std::mutex> guard(pool_allocators_mutex_);
      auto it = foreign_blocks_.find(ptr);
      if (it == foreign_blocks_.end()) {
        return false;
      }
      owner = std::move(it->second);
      foreign_blocks_.erase(it);
    }
    try {
      owner->raw_delete(ptr);
    } catch (const std::exception& error) {
      try {
        TORCH_WARN("cudamem: a MemPool's allocator failed to free a block: ", error.what());
      } catch (...) {
      }
    }
    return true;
  }

  // The allocator of the MemPool `pool` on `device`, if it has its own.
  std::shared_ptr<cca::CUDAAllocator> pool_allocator(c10::DeviceIndex device, MempoolId_t pool) {
    if (!pool_allocators_any_.load(std::memory_order_acquire) || (pool.first == 0 && pool.second == 0)) {
      return nullptr;
    }
    std::lock_guard<std::mutex> guard(pool_allocators_mutex_);
    auto it = pool_allocators_.find({device, pool});
    return it == pool_allocators_.end() ? nullptr : it->second;
  }

  // Tells the trace trackers of a block handed out or freed.
  void track(cca::TraceEntry::Action action, c10::DeviceIndex device, void* ptr, size_t size,
             cudaStream_t stream, MempoolId_t pool) {
    std::vector<cca::AllocatorTraceTracker> trackers;
    {
      std::lock_guard<std::mutex> guard(observers_mutex_);
      trackers = trace_trackers_;
    }
    const cca::TraceEntry entry(action, device, reinterpret_cast<size_t>(ptr), size, stream, pool,
                                c10::approx_time_t{}, nullptr);
    for (const auto& tracker : trackers) {
      tracker(entry);
    }
  }

  // The stack of the caller, as a number (0 when no recorder is set).
  uint64_t gather() {
    const cca::CreateContextFn recorder = recorder_.load(std::memory_order_acquire);
    return recorder == nullptr ? 0 : stacks_.keep(recorder());
  }

  // The private pool a filter diverts `stream`'s request to, or (0, 0).
  MempoolId_t pool_for(c10::DeviceIndex device, cudaStream_t stream) {
    if (diverting_.load(std::memory_order_acquire) == 0) {
      return {0, 0};
    }
    std::lock_guard<std::mutex> guard(diversions_mutex_);
    auto it = diversions_.find(device);
    if (it != diversions_.end()) {
      for (const auto& diversion : it->second) {
        if (diversion.filter(stream)) {
          return diversion.pool;
        }
      }
    }
    return {0, 0};
  }

  void* malloc_on(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
    cudamem_request request{};
    request.size = size;
    request.stream = stream;
    const MempoolId_t pool = pool_for(device, stream);
    if (auto own = pool_allocator(device, pool)) {
      void* ptr = own->raw_alloc_with_stream(size, stream);
      std::lock_guard<std::mutex> guard(pool_allocators_mutex_);
      foreign_blocks_[ptr] = std::move(own);
      return ptr;
    }
    request.pool_first = pool.first;
    request.pool_second = pool.second;
    request.capturing = is_capturing(stream) ? 1 : 0;
    const int level = record_level_.load(std::memory_order_acquire);
    if (level >= static_cast<int>(cca::RecordContext::STATE)) {
      request.context = gather();
    }
    cudamem_outcome out{};
    const int code = cudamem_allocate(device, &request, &out);
    if (level > 0 || request.context != 0) {
      stacks_.drop_dead();
    }
    if (code == CUDAMEM_OUT_OF_MEMORY) {
      const std::string message = last_error();
      out_of_memory(device, size);
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    }
    check(code);
    void* ptr = reinterpret_cast<void*>(out.ptr);
    c10::reportMemoryUsageToProfiler(
        ptr,
        static_cast<int64_t>(out.bytes),
        out.allocated_bytes,
        out.reserved_bytes,
        c10::Device(c10::DeviceType::CUDA, device));
    if (trackers_any_.load(std::memory_order_acquire)) {
      track(cca::TraceEntry::ALLOC, device, ptr, size, stream, pool);
    }
    return ptr;
  }

  // Tells the profiler and the observers (e.g. a snapshot dump on out of memory).
  void out_of_memory(c10::DeviceIndex device, size_t size) {
    struct cudamem_device_stats raw{};
    if (cudamem_device_stats(device, &raw) == CUDAMEM_OK) {
      c10::reportOutOfMemoryToProfiler(
          static_cast<int64_t>(size),
          static_cast<size_t>(raw.allocated_bytes.aggregate.current),
          static_cast<size_t>(raw.reserved_bytes.aggregate.current),
          c10::Device(c10::DeviceType::CUDA, device));
    }
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> guard(observers_mutex_);
      observers = oom_observers_;
    }
    if (observers.empty()) {
      return;
    }
    size_t free = 0;
    size_t total = 0;
    c10::cuda::CUDAGuard guard(device);
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    for (const auto& observer : observers) {
      observer(device, size, total, free);
    }
  }

  Stacks stacks_;
  Exports exports_;
  Imports imports_;
  std::atomic<cca::CreateContextFn> recorder_{nullptr};
  std::atomic<int> record_level_{0};
  std::atomic<bool> history_enabled_{false};
  std::mutex diversions_mutex_;
  std::unordered_map<c10::DeviceIndex, std::vector<Diversion>> diversions_;
  std::atomic<int> diverting_{0};
  std::mutex observers_mutex_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::AllocatorTraceTracker> trace_trackers_;
  std::atomic<bool> trackers_any_{false};
#if defined(CUDAMEM_HAS_attachOomRejectionObserver)
  std::vector<cca::OomRejectionObserver> oom_rejection_observers_;
#endif
  std::string user_metadata_;
  // MemPools with their own allocator, and the blocks those allocators handed out.
  std::mutex pool_allocators_mutex_;
  std::map<std::pair<c10::DeviceIndex, MempoolId_t>, std::shared_ptr<cca::CUDAAllocator>>
      pool_allocators_;
  std::unordered_map<void*, std::shared_ptr<cca::CUDAAllocator>> foreign_blocks_;
  std::atomic<bool> pool_allocators_any_{false};
  int device_count_ = 0;
  bool initialized_ = false;
};

// The installed backend; never destroyed, since tensors may be freed during exit.
Allocator* installed = nullptr;

void delete_block(void* ptr) {
  // A deleter runs in a destructor: nothing thrown may leave it.
  try {
    const int code = installed->free_block(ptr);
    if (code != CUDAMEM_OK) {
      TORCH_WARN(last_error());
    }
  } catch (...) {
  }
}

// Makes PyTorch allocate CUDA memory through cudamem. Before the first CUDA tensor.
void install() {
  if (installed != nullptr) {
    return;
  }
  auto allocator = std::make_shared<Allocator>();
  try {
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  } catch (const c10::Error& error) {
    TORCH_CHECK(
        false,
        "cudamem: cudamem_torch.install() must run before the first CUDA tensor "
        "(PyTorch cannot swap an allocator it has used): ",
        error.what_without_backtrace());
  }
  installed = allocator.get();
  new std::shared_ptr<Allocator>(std::move(allocator));  // kept for the process's life
}

}  // namespace cudamem_backend

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cudamem's CUDA allocator backend for PyTorch";
  m.def("install", &cudamem_backend::install, "Allocate CUDA memory through cudamem");
  m.def("installed", [] { return cudamem_backend::installed != nullptr; });
}
