/* The C ABI of libcudamem_torch (torch-alloc/src/ffi/): every function and struct
 * the C++ backend calls. Calls return CUDAMEM_OK, CUDAMEM_OUT_OF_MEMORY or
 * CUDAMEM_ERROR; after a failure, cudamem_last_error gives the calling thread's
 * message (for out of memory: the device's ledger). Addresses and sizes are bytes. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDAMEM_OK 0
#define CUDAMEM_OUT_OF_MEMORY 1
#define CUDAMEM_ERROR 2

struct cudamem_request {
  uint64_t size;
  void* stream; /* cudaStream_t */
  uint64_t pool_first; /* MempoolId_t; 0, 0: the device's own pool */
  uint64_t pool_second;
  int capturing; /* nonzero: the stream is capturing a CUDA graph */
  uint64_t context; /* stack number, 0: none */
};

struct cudamem_outcome {
  uint64_t ptr;
  uint64_t bytes;
  uint64_t allocated_bytes; /* the device's totals after the call */
  uint64_t reserved_bytes;
  int device;
};

struct cudamem_stat {
  int64_t current, peak, allocated, freed;
};

struct cudamem_stat_array {
  struct cudamem_stat aggregate, small_pool, large_pool;
};

/* PyTorch's DeviceStats, field for field. */
struct cudamem_device_stats {
  struct cudamem_stat_array allocation, segment, active, inactive_split;
  struct cudamem_stat_array allocated_bytes, reserved_bytes, active_bytes;
  struct cudamem_stat_array inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries, num_ooms;
  struct cudamem_stat oversize_allocations, oversize_segments;
  int64_t num_sync_all_streams, num_device_alloc, num_device_free, max_split_size;
};

struct cudamem_segment {
  uint64_t address, total_size, allocated_size, active_size, requested_size;
  uint64_t stream, pool_first, pool_second;
  uint64_t blocks; /* how many cudamem_block_info follow */
};

struct cudamem_block_info {
  uint64_t address, size, requested_size;
  uint32_t state; /* 0 free, 1 handed out, 2 freed and waiting for streams */
  uint64_t context;
};

struct cudamem_trace_entry {
  uint32_t action; /* PyTorch's TraceEntry::Action */
  uint64_t addr, size, stream, pool_first, pool_second;
  int64_t time_us;
  uint64_t context;
};

struct cudamem_snapshot_sink {
  void* user;
  void (*segment)(void* user, const struct cudamem_segment*);
  void (*block)(void* user, const struct cudamem_block_info*);
  void (*trace)(void* user, const struct cudamem_trace_entry*);
};

typedef void (*cudamem_ptr_sink)(void* user, int allocated, uint64_t ptr);

int cudamem_allocate(int device, const struct cudamem_request* request,
                     struct cudamem_outcome* out);
int cudamem_free(void* ptr, uint64_t context, struct cudamem_outcome* out);
int cudamem_block(void* ptr, int* device, uint64_t* base, uint64_t* bytes);
int cudamem_record_stream(void* ptr, void* stream);
/* The physical mappings backing the block at ptr, as (address, bytes) pairs in out
 * (room for max pairs), sorted: their count (more than max: call again with room), or
 * -1 on failure. */
ssize_t cudamem_block_mappings(void* ptr, uint64_t* out, size_t max);
/* device -1: every device opened; other negatives are an error. */
int cudamem_empty_cache(int device, uint64_t* given_back);
int cudamem_is_open(int device);
int cudamem_device_stats(int device, struct cudamem_device_stats* out);
size_t cudamem_device_stats_size(void);
int cudamem_reset_peak_stats(int device);
int cudamem_reset_accumulated_stats(int device);
int cudamem_largest_block(int device, uint64_t* out);
int cudamem_set_memory_fraction(int device, double fraction);
int cudamem_memory_fraction(int device, double* out);
int cudamem_begin_allocate_to_pool(int device, uint64_t first, uint64_t second);
int cudamem_end_allocate_to_pool(int device, uint64_t first, uint64_t second);
int cudamem_release_pool(int device, uint64_t first, uint64_t second);
int cudamem_incref_pool(int device, uint64_t first, uint64_t second);
int cudamem_set_use_on_oom(int device, uint64_t first, uint64_t second, int on);
int cudamem_set_no_split(int device, uint64_t first, uint64_t second);
int cudamem_pool_use_count(int device, uint64_t first, uint64_t second, uint32_t* out);
int cudamem_check_pool_live(int device, uint64_t first, uint64_t second, const uint64_t* ptrs,
                            size_t n, int* matches);
int cudamem_checkpoint_pool(int device, uint64_t first, uint64_t second, uint64_t* out);
int cudamem_drop_checkpoint(int device, uint64_t checkpoint);
int cudamem_restore_checkpoint(int device, uint64_t checkpoint, cudamem_ptr_sink sink,
                               void* user);
int cudamem_record_history(int device, int enabled, uint32_t when, uint64_t max_entries,
                           int clear, uint32_t skip);
size_t cudamem_take_dead_contexts(uint64_t* out, size_t max);
int cudamem_snapshot(int device, uint64_t first, uint64_t second, int trace,
                     const struct cudamem_snapshot_sink* sink);
ssize_t cudamem_last_error(char* buf, size_t len);
ssize_t cudamem_explain(int device, char* buf, size_t len);

#ifdef __cplusplus
}
#endif
