// CUDA IPC of cudamem's blocks: a CUDA tensor shared with another process
// (torch.multiprocessing). cudamem's memory is VMM handles mapped into its pools, so a
// block is shared as the handles that back it, exported as file descriptors, which
// the receiving process fetches over a Unix socket of the sender (SCM_RIGHTS: no
// ptrace rights needed), imports and maps side by side as the sender has them.
//
// The handle string: 'm', a Header, then Header::count Pieces (each mapping's offset
// from the first and its bytes). The receiver also opens PyTorch's own 'c' handles
// (cudaMalloc memory of a process on PyTorch's allocator).

#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace cudamem_backend {

// What a sender exported for one block.
struct Export {
  uint64_t share = 0;
  std::vector<int> fds;
};

// The blocks this process shared, and the socket receivers fetch their handles from.
class Exports {
 public:
  // The handle string of the block at `ptr` (its first byte), exporting it once.
  c10::cuda::CUDACachingAllocator::ShareableHandle share(void* ptr);
  // The block at `ptr` was freed: its exported descriptors are closed.
  void forget(void* ptr);
  // Whether any block was shared (frees skip the lookup until one is).
  bool any() const;

 private:
  void serve();
  void start_server();

  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Export> by_block_;
  std::unordered_map<uint64_t, uint64_t> block_of_share_;
  uint64_t next_share_ = 1;
  int listener_ = -1;
  std::string socket_name_;
  std::atomic<bool> shared_any_{false};
};

// The handles this process opened, each mapped once while anyone holds it.
class Imports {
 public:
  std::shared_ptr<void> open(const std::string& handle);

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<void>> open_;
};

}  // namespace cudamem_backend
