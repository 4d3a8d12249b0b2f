// CUDA IPC of cudamem's blocks: a CUDA tensor shared with another process
// (torch.multiprocessing). cudamem's memory is VMM handles mapped into its pools, so a
// block is shared as the handles that back it, exported as file descriptors, which
// the receiving process fetches over a Unix socket of the sender (SCM_RIGHTS: no
// ptrace rights needed), imports and maps side by side as the sender has them.
//
// The handle string: 'm', a Header, then Header::count Pieces (each mapping's offset
// from the first and its bytes). The receiver also opens PyTorch's own 'c' handles
// (cudaMalloc memory of a process on PyTorch's allocator).
//
// Who may fetch: the server answers only a peer of the same user or root
// (SO_PEERCRED, checked on every connection), and only for a share's token, 128 random
// bits from getrandom(2) that only the handle string carries: another local user cannot
// connect, and a process of the same user that was not handed the string cannot guess
// a token.

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

// A share's token: unguessable, it is what a receiver presents.
struct Token {
  uint8_t bytes[16];
  bool operator==(const Token& other) const;
};

struct TokenHash {
  size_t operator()(const Token& token) const;
};

// What a sender exported for one block.
struct Export {
  Token token{};
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
  std::unordered_map<Token, uint64_t, TokenHash> block_of_token_;
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
