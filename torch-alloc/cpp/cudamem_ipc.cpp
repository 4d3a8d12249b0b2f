// CUDA IPC of cudamem's blocks (see cudamem_ipc.h).

#include "cudamem_ipc.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "cudamem.h"

namespace cudamem_backend {

namespace cca = c10::cuda::CUDACachingAllocator;

std::string last_error();

namespace {

constexpr char kCudamemHandle = 'm';
constexpr char kCudaMallocHandle = 'c';  // PyTorch's own allocator, cudaMalloc memory
constexpr uint32_t kVersion = 2;
constexpr size_t kMaxPieces = 1 << 16;

struct Header {
  uint32_t version;
  int32_t pid;
  Token token;
  uint32_t count;
  char socket[64];  // abstract Unix socket name, NUL-terminated
};

// 128 bits from the kernel's random source.
Token random_token() {
  Token token{};
  size_t filled = 0;
  while (filled < sizeof(token.bytes)) {
    const ssize_t n = ::getrandom(token.bytes + filled, sizeof(token.bytes) - filled, 0);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    TORCH_CHECK(n > 0, "cudamem: getrandom failed: ", std::strerror(errno));
    filled += static_cast<size_t>(n);
  }
  return token;
}

// Whether the peer of the connected socket `conn` is this process's user or root.
bool trusted_peer(int conn) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0 ||
      length != sizeof(credentials)) {
    return false;
  }
  return credentials.uid == ::geteuid() || credentials.uid == 0;
}

struct Piece {
  uint64_t offset;  // from the first mapping's address
  uint64_t bytes;
};

// The driver calls IPC of VMM memory needs, found through the runtime (no link to
// libcuda).
struct Driver {
  decltype(&cuMemRetainAllocationHandle) retain = nullptr;
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;

  static const Driver& get() {
    static const Driver driver = load();
    return driver;
  }

 private:
  template <typename F>
  static void resolve(const char* name, F& fn) {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &found, 12000, cudaEnableDefault, &status));
    TORCH_CHECK(
        status == cudaDriverEntryPointSuccess && found != nullptr,
        "cudamem: the CUDA driver lacks ", name, ", which sharing tensors needs");
    fn = reinterpret_cast<F>(found);
  }

  static Driver load() {
    Driver d;
    resolve("cuMemRetainAllocationHandle", d.retain);
    resolve("cuMemExportToShareableHandle", d.export_handle);
    resolve("cuMemImportFromShareableHandle", d.import_handle);
    resolve("cuMemRelease", d.release);
    resolve("cuMemAddressReserve", d.reserve);
    resolve("cuMemAddressFree", d.address_free);
    resolve("cuMemMap", d.map);
    resolve("cuMemUnmap", d.unmap);
    resolve("cuMemSetAccess", d.set_access);
    resolve("cuGetErrorString", d.error_string);
    return d;
  }
};

void drive(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) {
    return;
  }
  const char* name = nullptr;
  Driver::get().error_string(result, &name);
  TORCH_CHECK(false, "cudamem: ", what, " failed: ", name != nullptr ? name : "unknown error");
}

sockaddr_un socket_address(const std::string& name, socklen_t* length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file.
  const size_t n = std::min(name.size(), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, name.data(), n);
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return address;
}

// Moves all `n` bytes at `p` through `step` (`::read` or `::write`), again
// after a signal; false on an error or the end of the stream.
template <typename Byte, typename Step>
bool transfer_all(int fd, Byte* p, size_t n, Step step) {
  while (n > 0) {
    const ssize_t k = step(fd, p, n);
    if (k < 0 && errno == EINTR) {
      continue;
    }
    if (k <= 0) {
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool write_all(int fd, const void* data, size_t n) {
  return transfer_all(fd, static_cast<const char*>(data), n, ::write);
}

bool read_all(int fd, void* data, size_t n) {
  return transfer_all(fd, static_cast<char*>(data), n, ::read);
}

// Descriptors one message carries at most: they go in batches.
constexpr size_t kFdBatch = 64;

// One message of a batch: a byte of data and room for `n` descriptors.
struct FdMessage {
  explicit FdMessage(size_t n) : control(CMSG_SPACE(sizeof(int) * n)) {
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;

  char byte = 0;
  iovec iov{&byte, 1};
  std::vector<char> control;
  msghdr message{};
};

// Sends `fds` over the connected socket `conn`, after their count.
bool send_fds(int conn, const std::vector<int>& fds) {
  const uint32_t count = static_cast<uint32_t>(fds.size());
  size_t sent = 0;
  if (!write_all(conn, &count, sizeof(count))) {
    return false;
  }
  while (sent < fds.size()) {
    const size_t n = std::min(kFdBatch, fds.size() - sent);
    FdMessage batch(n);
    cmsghdr* header = CMSG_FIRSTHDR(&batch.message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(header), fds.data() + sent, sizeof(int) * n);
    if (::sendmsg(conn, &batch.message, 0) != 1) {
      return false;
    }
    sent += n;
  }
  return true;
}

// Receives the descriptors `send_fds` sent; empty on failure.
std::vector<int> receive_fds(int conn) {
  uint32_t count = 0;
  if (!read_all(conn, &count, sizeof(count)) || count > kMaxPieces) {
    return {};
  }
  std::vector<int> fds;
  while (fds.size() < count) {
    const size_t n = std::min<size_t>(kFdBatch, count - fds.size());
    FdMessage batch(n);
    if (::recvmsg(conn, &batch.message, MSG_CMSG_CLOEXEC) != 1) {
      break;
    }
    cmsghdr* header = CMSG_FIRSTHDR(&batch.message);
    if (header == nullptr || header->cmsg_type != SCM_RIGHTS) {
      break;
    }
    const size_t got = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* data = reinterpret_cast<const int*>(CMSG_DATA(header));
    fds.insert(fds.end(), data, data + got);
  }
  if (fds.size() != count) {
    for (int fd : fds) {
      ::close(fd);
    }
    return {};
  }
  return fds;
}

// One mapped share: handles imported and mapped side by side.
struct Opened {
  c10::DeviceIndex device = 0;
  CUdeviceptr base = 0;
  size_t span = 0;
  std::vector<std::pair<size_t, size_t>> mapped;  // offset, bytes
  std::vector<CUmemGenericAllocationHandle> handles;

  // Nothing thrown leaves it: it runs when the last tensor on the share is freed.
  ~Opened() {
    try {
      c10::cuda::CUDAGuard guard(device);
      // Unmapping does not wait for work that still reads the memory.
      if (cudaDeviceSynchronize() != cudaSuccess) {
        (void)cudaGetLastError();
      }
      const Driver& driver = Driver::get();
      for (const auto& [offset, bytes] : mapped) {
        driver.unmap(base + offset, bytes);
      }
      for (auto handle : handles) {
        driver.release(handle);
      }
      if (base != 0) {
        driver.address_free(base, span);
      }
    } catch (...) {
    }
  }
};

}  // namespace

bool Token::operator==(const Token& other) const {
  return std::memcmp(bytes, other.bytes, sizeof(bytes)) == 0;
}

size_t TokenHash::operator()(const Token& token) const {
  uint64_t half = 0;
  std::memcpy(&half, token.bytes, sizeof(half));
  return static_cast<size_t>(half);
}

bool Exports::any() const {
  return shared_any_.load(std::memory_order_acquire);
}

void Exports::start_server() {
  static std::atomic<uint64_t> instances{0};
  socket_name_ = "cudamem-ipc-" + std::to_string(::getpid()) + "-" +
      std::to_string(instances.fetch_add(1));
  listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(listener_ >= 0, "cudamem: socket() failed: ", std::strerror(errno));
  socklen_t length = 0;
  sockaddr_un address = socket_address(socket_name_, &length);
  if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(listener_, 64) != 0) {
    const int err = errno;
    ::close(listener_);
    listener_ = -1;
    TORCH_CHECK(false, "cudamem: cannot serve shared tensors on a Unix socket: ", std::strerror(err));
  }
  std::thread([this] { serve(); }).detach();
}

void Exports::serve() {
  for (;;) {
    const int conn = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      return;
    }
    // Another user's process is answered with nothing, whatever it asks.
    if (!trusted_peer(conn)) {
      ::close(conn);
      continue;
    }
    Token token{};
    std::vector<int> fds;
    if (read_all(conn, &token, sizeof(token))) {
      // Copies, so a free that closes the originals meanwhile cannot pull them away.
      std::lock_guard<std::mutex> guard(mutex_);
      auto block = block_of_token_.find(token);
      if (block != block_of_token_.end()) {
        for (int fd : by_block_[block->second].fds) {
          fds.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
        }
      }
    }
    // An unknown token (freed meanwhile, or never handed out) is sent no descriptors.
    send_fds(conn, fds);
    for (int fd : fds) {
      ::close(fd);
    }
    ::close(conn);
  }
}

cca::ShareableHandle Exports::share(void* ptr) {
  int device = 0;
  uint64_t base = 0;
  uint64_t bytes = 0;
  if (cudamem_block(ptr, &device, &base, &bytes) != CUDAMEM_OK) {
    TORCH_CHECK(false, last_error());
  }
  std::vector<uint64_t> pairs(64);
  ssize_t n = cudamem_block_mappings(ptr, pairs.data(), pairs.size() / 2);
  if (n > static_cast<ssize_t>(pairs.size() / 2)) {
    pairs.resize(static_cast<size_t>(n) * 2);
    n = cudamem_block_mappings(ptr, pairs.data(), pairs.size() / 2);
  }
  TORCH_CHECK(n > 0, last_error());
  const uint64_t first = pairs[0];

  std::lock_guard<std::mutex> guard(mutex_);
  if (listener_ < 0) {
    start_server();
  }
  auto found = by_block_.find(base);
  if (found == by_block_.end()) {
    Export exported;
    exported.token = random_token();
    const Driver& driver = Driver::get();
    for (ssize_t i = 0; i < n; ++i) {
      CUmemGenericAllocationHandle handle = 0;
      drive(driver.retain(&handle, reinterpret_cast<void*>(pairs[2 * i])), "cuMemRetainAllocationHandle");
      int fd = -1;
      const CUresult exported_fd = driver.export_handle(
          &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      driver.release(handle);  // the retain's reference; the pool keeps its own
      if (exported_fd != CUDA_SUCCESS) {
        for (int open_fd : exported.fds) {
          ::close(open_fd);
        }
        drive(exported_fd, "cuMemExportToShareableHandle");
      }
      exported.fds.push_back(fd);
    }
    block_of_token_[exported.token] = base;
    found = by_block_.emplace(base, std::move(exported)).first;
    shared_any_.store(true, std::memory_order_release);
  }
  Header header{};
  header.version = kVersion;
  header.pid = static_cast<int32_t>(::getpid());
  header.token = found->second.token;
  header.count = static_cast<uint32_t>(n);
  std::strncpy(header.socket, socket_name_.c_str(), sizeof(header.socket) - 1);
  std::string text(1, kCudamemHandle);
  text.append(reinterpret_cast<const char*>(&header), sizeof(header));
  for (ssize_t i = 0; i < n; ++i) {
    const Piece piece{pairs[2 * i] - first, pairs[2 * i + 1]};
    text.append(reinterpret_cast<const char*>(&piece), sizeof(piece));
  }
  return {static_cast<ptrdiff_t>(base - first), text};
}

void Exports::forget(void* ptr) {
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto found = by_block_.find(reinterpret_cast<uint64_t>(ptr));
    if (found == by_block_.end()) {
      return;
    }
    fds = std::move(found->second.fds);
    block_of_token_.erase(found->second.token);
    by_block_.erase(found);
  }
  for (int fd : fds) {
    ::close(fd);
  }
}

std::shared_ptr<void> Imports::open(const std::string& handle) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto cached = open_.find(handle);
  if (cached != open_.end()) {
    if (auto alive = cached->second.lock()) {
      return alive;
    }
  }
  TORCH_CHECK(!handle.empty(), "cudamem: an empty CUDA IPC handle");
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  std::shared_ptr<void> result;
  if (handle[0] == kCudaMallocHandle) {
    TORCH_CHECK(handle.size() >= 1 + CUDA_IPC_HANDLE_SIZE, "cudamem: a cut CUDA IPC handle");
    cudaIpcMemHandle_t ipc{};
    std::memcpy(&ipc, handle.data() + 1, CUDA_IPC_HANDLE_SIZE);
    void* ptr = nullptr;
    C10_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, ipc, cudaIpcMemLazyEnablePeerAccess));
    result = std::shared_ptr<void>(ptr, [device](void* p) {
      try {
        c10::cuda::CUDAGuard guard(device);
        (void)cudaIpcCloseMemHandle(p);
      } catch (...) {
      }
    });
  } else {
    TORCH_CHECK(
        handle[0] == kCudamemHandle,
        "cudamem: this CUDA IPC handle comes from an allocator cudamem cannot open "
        "(type '", handle[0], "', e.g. PyTorch's expandable segments)");
    Header header{};
    TORCH_CHECK(handle.size() >= 1 + sizeof(Header), "cudamem: a cut CUDA IPC handle");
    std::memcpy(&header, handle.data() + 1, sizeof(Header));
    TORCH_CHECK(header.version == kVersion, "cudamem: a CUDA IPC handle of another cudamem version");
    TORCH_CHECK(
        header.count > 0 && header.count <= kMaxPieces &&
            handle.size() == 1 + sizeof(Header) + header.count * sizeof(Piece),
        "cudamem: a malformed CUDA IPC handle");
    std::vector<Piece> pieces(header.count);
    std::memcpy(pieces.data(), handle.data() + 1 + sizeof(Header), header.count * sizeof(Piece));
    header.socket[sizeof(header.socket) - 1] = '\0';

    const int conn = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TORCH_CHECK(conn >= 0, "cudamem: socket() failed: ", std::strerror(errno));
    socklen_t length = 0;
    sockaddr_un address = socket_address(header.socket, &length);
    std::vector<int> fds;
    if (::connect(conn, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
        write_all(conn, &header.token, sizeof(header.token))) {
      fds = receive_fds(conn);
    }
    const int err = errno;
    ::close(conn);
    TORCH_CHECK(
        fds.size() == header.count,
        "cudamem: could not fetch a shared tensor's memory from process ", header.pid,
        " (it exited, freed the tensor, or cannot be reached: ", std::strerror(err), ")");

    auto opened = std::make_shared<Opened>();
    opened->device = device;
    const Driver& driver = Driver::get();
    try {
      for (int fd : fds) {
        CUmemGenericAllocationHandle imported = 0;
        drive(
            driver.import_handle(
                &imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle");
        opened->handles.push_back(imported);
      }
      for (int fd : fds) {
        ::close(fd);
      }
      fds.clear();
      const Piece& last = pieces.back();
      opened->span = static_cast<size_t>(last.offset + last.bytes);
      drive(driver.reserve(&opened->base, opened->span, 0, 0, 0), "cuMemAddressReserve");
      for (size_t i = 0; i < pieces.size(); ++i) {
        drive(
            driver.map(opened->base + pieces[i].offset, pieces[i].bytes, 0, opened->handles[i], 0),
            "cuMemMap");
        opened->mapped.emplace_back(pieces[i].offset, pieces[i].bytes);
      }
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      for (const auto& [offset, bytes] : opened->mapped) {
        drive(driver.set_access(opened->base + offset, bytes, &access, 1), "cuMemSetAccess");
      }
    } catch (...) {
      for (int fd : fds) {
        ::close(fd);
      }
      throw;
    }
    void* base = reinterpret_cast<void*>(opened->base);
    result = std::shared_ptr<void>(base, [opened](void*) mutable { opened.reset(); });
  }
  open_[handle] = result;
  return result;
}

}  // namespace cudamem_backend
