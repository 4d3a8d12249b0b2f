//! The C ABI: what the C++ backend (`torch-alloc/cpp/`, PyTorch's `CUDAAllocator`)
//! calls, and the figures the Python module reads. `torch-alloc/cpp/cudamem.h`
//! declares every function and struct here. Each function checks its pointers,
//! converts, and calls [`crate::registry`]; no panic crosses the boundary (a panic is
//! reported and the call fails).
//!
//! Calls return a status: [`CUDAMEM_OK`], [`CUDAMEM_OUT_OF_MEMORY`] or
//! [`CUDAMEM_ERROR`]; on failure the calling thread's message (for out of memory, the
//! device's ledger) is read with `cudamem_last_error`.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use ctx::StreamId;

use crate::allocator::{AllocatorStats, Outcome};
use crate::device_stats::DeviceStats;
use crate::error::Error;
use crate::history::{HistorySettings, RecordContext, TraceEntry};
use crate::pool_id::PoolId;
use crate::registry::{self, CallerRequest, CallerStream};
use crate::snapshot::{BlockState, Segment, SnapshotBlock};

/// The call succeeded.
pub const CUDAMEM_OK: c_int = 0;
/// The request found no memory; the message holds the device's ledger.
pub const CUDAMEM_OUT_OF_MEMORY: c_int = 1;
/// Any other failure (bad argument, unknown pointer or pool, driver error).
pub const CUDAMEM_ERROR: c_int = 2;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn fail(error: &Error) -> c_int {
    // Out of memory reads as PyTorch's message, whose first words tools match on.
    let text = match error {
        Error::OutOfMemory { .. } => error.to_string(),
        _ => format!("cudamem: {error}"),
    };
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
    match error {
        Error::OutOfMemory { .. } => CUDAMEM_OUT_OF_MEMORY,
        _ => CUDAMEM_ERROR,
    }
}

fn status(result: crate::Result<()>) -> c_int {
    match result {
        Ok(()) => CUDAMEM_OK,
        Err(error) => fail(&error),
    }
}

fn null(call: &'static str, what: &'static str) -> c_int {
    fail(&Error::NullPointer { call, what })
}

/// Runs `call`; a panic becomes [`CUDAMEM_ERROR`] with a message.
fn guarded(name: &'static str, call: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(call)).unwrap_or_else(|_| {
        LAST_ERROR.with(|last| {
            *last.borrow_mut() =
                format!("cudamem: internal error in {name} (a panic); the call failed")
        });
        CUDAMEM_ERROR
    })
}

/// The stream argument as both backends read it.
///
/// # Safety
///
/// `stream` is null, a special stream handle, or a live stream of the device's
/// primary context, as `ctx::ForeignStream::from_raw` requires.
unsafe fn caller_stream(stream: *mut c_void) -> CallerStream {
    let id = StreamId(stream as usize as u64);
    #[cfg(feature = "cuda")]
    {
        // SAFETY: the caller's promise, passed on.
        let cuda = unsafe { ctx::ForeignStream::from_raw(stream) };
        CallerStream::new(id, cuda)
    }
    #[cfg(not(feature = "cuda"))]
    CallerStream::new(id)
}

/// A device argument that may name every device: -1 is every device (`None`), 0 and
/// up one device; any other negative number is refused.
fn selector(device: c_int) -> Result<Option<c_int>, Error> {
    match device {
        -1 => Ok(None),
        d if d >= 0 => Ok(Some(d)),
        d => Err(Error::BadDeviceSelector { device: d }),
    }
}

/// Writes `value` to `out`.
///
/// # Safety
///
/// `out` is null (refused) or points to writable memory for one `T`.
unsafe fn put<T>(call: &'static str, out: *mut T, value: T) -> c_int {
    if out.is_null() {
        return null(call, "out");
    }
    // SAFETY: not null, and writable for one `T` by the caller's promise;
    // `write_unaligned` asks nothing of its alignment.
    unsafe { out.write_unaligned(value) };
    CUDAMEM_OK
}

/// A request, `struct cudamem_request`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemRequest {
    /// Bytes asked for.
    pub size: u64,
    /// The `cudaStream_t` it is used on.
    pub stream: *mut c_void,
    /// Private pool id, first half (`MempoolId_t::first`); 0 and 0: the device's pool.
    pub pool_first: u64,
    /// Private pool id, second half.
    pub pool_second: u64,
    /// Nonzero when the stream is capturing a CUDA graph.
    pub capturing: c_int,
    /// The caller's stack number, 0 for none.
    pub context: u64,
}

/// What an allocation or free did, `struct cudamem_outcome`. Bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CudamemOutcome {
    /// The block's device address.
    pub ptr: u64,
    /// The block's bytes.
    pub bytes: u64,
    /// Bytes of all live blocks of the device, after.
    pub allocated_bytes: u64,
    /// Device memory the pool maps, after.
    pub reserved_bytes: u64,
    /// The device.
    pub device: c_int,
}

impl CudamemOutcome {
    fn of(device: c_int, outcome: Outcome) -> Self {
        Self {
            ptr: outcome.ptr,
            bytes: outcome.bytes,
            allocated_bytes: outcome.allocated_bytes,
            reserved_bytes: outcome.reserved_bytes,
            device,
        }
    }
}

/// Serves `*request` on `device`, writing the block to `*out`.
///
/// # Safety
///
/// `request` and `out` are null (refused) or valid for one struct each; the request's
/// stream is null, a special stream handle, or a live stream of `device`'s primary
/// context: what PyTorch passes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_allocate(
    device: c_int,
    request: *const CudamemRequest,
    out: *mut CudamemOutcome,
) -> c_int {
    guarded("cudamem_allocate", || {
        if request.is_null() {
            return null("cudamem_allocate", "request");
        }
        if out.is_null() {
            // Checked before: a block nobody hears of would be lost.
            return null("cudamem_allocate", "out");
        }
        // SAFETY: not null, and readable for one request by the caller's promise.
        let r = unsafe { request.read_unaligned() };
        // SAFETY: the caller's promise about the stream, passed on.
        let stream = unsafe { caller_stream(r.stream) };
        let request = CallerRequest {
            size: r.size,
            stream,
            pool: PoolId(r.pool_first, r.pool_second),
            capturing: r.capturing != 0,
            context: r.context,
        };
        match registry::allocate(device, request) {
            // SAFETY: the caller's promise about `out`.
            Ok(outcome) => unsafe {
                put("cudamem_allocate", out, CudamemOutcome::of(device, outcome))
            },
            Err(error) => fail(&error),
        }
    })
}

/// Frees `ptr` (whichever device holds it), with the stack number `context` (0: none);
/// writes what the free did to `*out` (may be null).
///
/// # Safety
///
/// `out` is null or valid for one `struct cudamem_outcome`; `ptr` is only compared.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_free(
    ptr: *mut c_void,
    context: u64,
    out: *mut CudamemOutcome,
) -> c_int {
    guarded("cudamem_free", || {
        match registry::free(ptr as usize as u64, context) {
            Ok((device, outcome)) if !out.is_null() => {
                // SAFETY: the caller's promise about `out`.
                unsafe { put("cudamem_free", out, CudamemOutcome::of(device, outcome)) }
            }
            Ok(_) => CUDAMEM_OK,
            Err(error) => fail(&error),
        }
    })
}

/// The block holding `ptr`: its device, first byte and bytes.
///
/// # Safety
///
/// Each out-pointer is null (refused) or writable for one value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_block(
    ptr: *mut c_void,
    device: *mut c_int,
    base: *mut u64,
    bytes: *mut u64,
) -> c_int {
    guarded("cudamem_block", || {
        if device.is_null() || base.is_null() || bytes.is_null() {
            return null("cudamem_block", "an out-pointer");
        }
        match registry::block_of(ptr as usize as u64) {
            Ok((d, b, n)) => {
                // SAFETY: each is not null and writable by the caller's promise.
                unsafe {
                    put("cudamem_block", device, d);
                    put("cudamem_block", base, b);
                    put("cudamem_block", bytes, n)
                }
            }
            Err(error) => fail(&error),
        }
    })
}

/// Writes the physical mappings backing the block at `ptr` as `(address, bytes)`
/// pairs to `out` (room for `max` pairs), sorted, and returns their count; when that
/// is more than `max`, only `max` were written. -1 on failure.
///
/// # Safety
///
/// `out` is writable for `2 * max` `uint64_t`s (null only with `max == 0`); `ptr` is
/// only compared.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_block_mappings(
    ptr: *mut c_void,
    out: *mut u64,
    max: usize,
) -> isize {
    let mut count = -1;
    let code = guarded("cudamem_block_mappings", || {
        if out.is_null() && max > 0 {
            return null("cudamem_block_mappings", "out");
        }
        match registry::block_mappings(ptr as usize as u64) {
            Ok(mappings) => {
                for (i, (addr, bytes)) in mappings.iter().take(max).enumerate() {
                    // SAFETY: `i < max`, and `out` holds `2 * max` values by the
                    // caller's promise.
                    unsafe {
                        out.add(2 * i).write_unaligned(*addr);
                        out.add(2 * i + 1).write_unaligned(*bytes);
                    }
                }
                count = isize::try_from(mappings.len()).unwrap_or(isize::MAX);
                CUDAMEM_OK
            }
            Err(error) => fail(&error),
        }
    });
    if code == CUDAMEM_OK { count } else { -1 }
}

/// `stream` uses the block at `ptr` too (`Tensor.record_stream`).
///
/// # Safety
///
/// As [`cudamem_allocate`] for `stream`; `ptr` is only compared.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_record_stream(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    // SAFETY: the caller's promise about `stream`, passed on.
    let stream = unsafe { caller_stream(stream) };
    guarded("cudamem_record_stream", || {
        status(registry::record_stream(ptr as usize as u64, stream))
    })
}

/// Empties the cache of `device` (-1: every device opened; other negatives are refused); writes the mapped
/// bytes given back to `*given_back` (may be null).
///
/// # Safety
///
/// `given_back` is null or writable for one `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_empty_cache(device: c_int, given_back: *mut u64) -> c_int {
    guarded("cudamem_empty_cache", || {
        let device = match selector(device) {
            Ok(device) => device,
            Err(error) => return fail(&error),
        };
        match registry::empty_cache(device) {
            Ok(bytes) if !given_back.is_null() => {
                // SAFETY: the caller's promise.
                unsafe { put("cudamem_empty_cache", given_back, bytes) }
            }
            Ok(_) => CUDAMEM_OK,
            Err(error) => fail(&error),
        }
    })
}

/// 1 when `device` has been opened (by any call naming it), else 0; asks nothing of
/// the driver.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_is_open(device: c_int) -> c_int {
    c_int::from(registry::is_open(device))
}

/// Writes `device`'s figures in PyTorch's `DeviceStats` form to `*out`.
///
/// # Safety
///
/// `out` is null (refused) or writable for one `struct cudamem_device_stats`
/// ([`cudamem_device_stats_size`] bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_device_stats(device: c_int, out: *mut DeviceStats) -> c_int {
    guarded("cudamem_device_stats", || {
        match registry::device_stats(device) {
            // SAFETY: the caller's promise.
            Ok(stats) => unsafe { put("cudamem_device_stats", out, stats) },
            Err(error) => fail(&error),
        }
    })
}

/// The bytes of `struct cudamem_device_stats`, so a caller can check its declaration.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_device_stats_size() -> usize {
    size_of::<DeviceStats>()
}

/// Every peak of `device` becomes its current value.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_reset_peak_stats(device: c_int) -> c_int {
    guarded("cudamem_reset_peak_stats", || {
        status(registry::reset_peak_stats(device))
    })
}

/// Every accumulated count of `device` becomes zero.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_reset_accumulated_stats(device: c_int) -> c_int {
    guarded("cudamem_reset_accumulated_stats", || {
        status(registry::reset_accumulated_stats(device))
    })
}

/// Writes the largest block `device` could hand out now to `*out` (`cacheInfo`).
///
/// # Safety
///
/// `out` is null (refused) or writable for one `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_largest_block(device: c_int, out: *mut u64) -> c_int {
    guarded("cudamem_largest_block", || {
        match registry::largest_block(device) {
            // SAFETY: the caller's promise.
            Ok(bytes) => unsafe { put("cudamem_largest_block", out, bytes) },
            Err(error) => fail(&error),
        }
    })
}

/// Caps `device`'s pool at `fraction` of its memory.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_set_memory_fraction(device: c_int, fraction: f64) -> c_int {
    guarded("cudamem_set_memory_fraction", || {
        status(registry::set_memory_fraction(device, fraction))
    })
}

/// Writes `device`'s memory fraction (1 when none was set) to `*out`.
///
/// # Safety
///
/// `out` is null (refused) or writable for one `double`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_memory_fraction(device: c_int, out: *mut f64) -> c_int {
    guarded(
        "cudamem_memory_fraction",
        || match registry::memory_fraction(device) {
            // SAFETY: the caller's promise.
            Ok(fraction) => unsafe { put("cudamem_memory_fraction", out, fraction) },
            Err(error) => fail(&error),
        },
    )
}

macro_rules! pool_call {
    ($($(#[$doc:meta])* $c:ident => $rust:ident;)*) => {
        $(
            $(#[$doc])*
            #[unsafe(no_mangle)]
            pub extern "C" fn $c(device: c_int, first: u64, second: u64) -> c_int {
                guarded(stringify!($c), || status(registry::$rust(device, PoolId(first, second))))
            }
        )*
    };
}

pool_call! {
    /// Allocations the C++ side's filter picks go to pool `(first, second)`
    /// (`beginAllocateToPool`); made if new, one more user.
    cudamem_begin_allocate_to_pool => begin_allocate_to_pool;
    /// Allocations stop going to the pool (`endAllocateToPool`).
    cudamem_end_allocate_to_pool => end_allocate_to_pool;
    /// One user of the pool fewer (`releasePool`).
    cudamem_release_pool => release_pool;
    /// One user of the pool more, made if new (`createOrIncrefPool`).
    cudamem_incref_pool => incref_pool;
}

/// Pool `(first, second)` serves the device pool's requests that find no memory
/// (`on` nonzero) or stops doing so (`setUseOnOOM`).
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_set_use_on_oom(
    device: c_int,
    first: u64,
    second: u64,
    on: c_int,
) -> c_int {
    guarded("cudamem_set_use_on_oom", || {
        status(registry::set_use_on_oom(
            device,
            PoolId(first, second),
            on != 0,
        ))
    })
}

/// Pool `(first, second)` hands each block whole segments of its own (`setNoSplit`).
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_set_no_split(device: c_int, first: u64, second: u64) -> c_int {
    guarded("cudamem_set_no_split", || {
        status(registry::set_no_split(device, PoolId(first, second)))
    })
}

/// Writes the use count of pool `(first, second)` to `*out`.
///
/// # Safety
///
/// `out` is null (refused) or writable for one `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_pool_use_count(
    device: c_int,
    first: u64,
    second: u64,
    out: *mut u32,
) -> c_int {
    guarded("cudamem_pool_use_count", || {
        match registry::pool_use_count(device, PoolId(first, second)) {
            // SAFETY: the caller's promise.
            Ok(count) => unsafe { put("cudamem_pool_use_count", out, count) },
            Err(error) => fail(&error),
        }
    })
}

/// Writes 1 to `*matches` when the live blocks of pool `(first, second)` are exactly
/// the `n` addresses at `ptrs`, else 0 (`checkPoolLiveAllocations`).
///
/// # Safety
///
/// `ptrs` is null with `n == 0`, or readable for `n` `uint64_t`s; `matches` is null
/// (refused) or writable for one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_check_pool_live(
    device: c_int,
    first: u64,
    second: u64,
    ptrs: *const u64,
    n: usize,
    matches: *mut c_int,
) -> c_int {
    guarded("cudamem_check_pool_live", || {
        let expected: &[u64] = if n == 0 {
            &[]
        } else if ptrs.is_null() {
            return null("cudamem_check_pool_live", "ptrs");
        } else {
            // SAFETY: not null, readable for `n` values by the caller's promise, and
            // not written while the slice lives.
            unsafe { std::slice::from_raw_parts(ptrs, n) }
        };
        match registry::check_pool_live(device, PoolId(first, second), expected) {
            // SAFETY: the caller's promise.
            Ok(ok) => unsafe { put("cudamem_check_pool_live", matches, c_int::from(ok)) },
            Err(error) => fail(&error),
        }
    })
}

/// Checkpoints pool `(first, second)` (`getCheckpointState`); writes its number.
///
/// # Safety
///
/// `out` is null (refused) or writable for one `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_checkpoint_pool(
    device: c_int,
    first: u64,
    second: u64,
    out: *mut u64,
) -> c_int {
    guarded("cudamem_checkpoint_pool", || {
        match registry::checkpoint_pool(device, PoolId(first, second)) {
            // SAFETY: the caller's promise.
            Ok(number) => unsafe { put("cudamem_checkpoint_pool", out, number) },
            Err(error) => fail(&error),
        }
    })
}

/// Forgets checkpoint `number` of `device`; an unknown number is an error.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_drop_checkpoint(device: c_int, number: u64) -> c_int {
    guarded("cudamem_drop_checkpoint", || {
        status(registry::drop_checkpoint(device, number))
    })
}

/// Receives the addresses a restore changed: `allocated` is 1 for a block handed out
/// again, 0 for a block freed.
pub type CudamemPtrSink = unsafe extern "C" fn(user: *mut c_void, allocated: c_int, ptr: u64);

/// Restores checkpoint `number` of `device` (`setCheckpointPoolState`), telling `sink`
/// every block freed, then every block handed out again.
///
/// # Safety
///
/// `sink` is a function that may be called with `user` (passed through untouched).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_restore_checkpoint(
    device: c_int,
    number: u64,
    sink: Option<CudamemPtrSink>,
    user: *mut c_void,
) -> c_int {
    guarded("cudamem_restore_checkpoint", || {
        let Some(sink) = sink else {
            return null("cudamem_restore_checkpoint", "sink");
        };
        match registry::restore_checkpoint(device, number) {
            Ok(restored) => {
                for ptr in restored.freed {
                    // SAFETY: the caller's promise about `sink` and `user`.
                    unsafe { sink(user, 0, ptr) };
                }
                for ptr in restored.allocated {
                    // SAFETY: as above.
                    unsafe { sink(user, 1, ptr) };
                }
                CUDAMEM_OK
            }
            Err(error) => fail(&error),
        }
    })
}

/// Records history on `device` (-1: every device, now and later; other negatives are
/// refused) as
/// `_record_memory_history` asks: `when` is PyTorch's `RecordContext` (0 to 3),
/// `skip` one bit per `TraceEntry::Action` not to record.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_record_history(
    device: c_int,
    enabled: c_int,
    when: u32,
    max_entries: u64,
    clear: c_int,
    skip: u32,
) -> c_int {
    guarded("cudamem_record_history", || {
        let Some(when) = RecordContext::from_raw(when) else {
            return fail(&Error::Ctx(ctx::Error::InvalidConfig(
                "the record context is not 0 to 3",
            )));
        };
        let settings = HistorySettings {
            enabled: enabled != 0,
            when,
            max_entries: usize::try_from(max_entries).unwrap_or(usize::MAX),
            skip,
        };
        match selector(device) {
            Ok(device) => status(registry::record_history(device, settings, clear != 0)),
            Err(error) => fail(&error),
        }
    })
}

/// Writes up to `max` stack numbers that no device holds any more to `out` and
/// returns how many; the C++ side drops those stacks.
///
/// # Safety
///
/// `out` is writable for `max` `uint64_t`s (null only with `max == 0`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_take_dead_contexts(out: *mut u64, max: usize) -> usize {
    if out.is_null() || max == 0 {
        return 0;
    }
    catch_unwind(|| registry::take_dead_contexts(max))
        .map(|dead| {
            for (i, number) in dead.iter().enumerate() {
                // SAFETY: `i < dead.len() <= max`, and `out` holds `max` values by the
                // caller's promise.
                unsafe { out.add(i).write_unaligned(*number) };
            }
            dead.len()
        })
        .unwrap_or(0)
}

/// A segment of a snapshot, `struct cudamem_segment`. Bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemSegment {
    /// First byte's device address.
    pub address: u64,
    /// Its bytes.
    pub total_size: u64,
    /// Bytes of blocks handed out.
    pub allocated_size: u64,
    /// Bytes of blocks handed out or waiting for streams.
    pub active_size: u64,
    /// Bytes asked for, of active blocks.
    pub requested_size: u64,
    /// The stream of a private pool's segment, else 0.
    pub stream: u64,
    /// Private pool id (0, 0 for the device's pool).
    pub pool_first: u64,
    /// Second half.
    pub pool_second: u64,
    /// The number of blocks that follow.
    pub blocks: u64,
}

/// A block of a snapshot, `struct cudamem_block_info`. Bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemBlockInfo {
    /// Device address.
    pub address: u64,
    /// Its bytes.
    pub size: u64,
    /// What the caller asked for.
    pub requested_size: u64,
    /// 0: free; 1: handed out; 2: freed, waiting for streams.
    pub state: u32,
    /// The stack number it was allocated at, 0 for none.
    pub context: u64,
}

/// A trace entry, `struct cudamem_trace_entry`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemTraceEntry {
    /// PyTorch's `TraceEntry::Action`.
    pub action: u32,
    /// Address (for an out of memory: the device's free bytes).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Stream handle.
    pub stream: u64,
    /// Private pool id.
    pub pool_first: u64,
    /// Second half.
    pub pool_second: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
    /// Stack number, 0 for none.
    pub context: u64,
}

/// Where a snapshot goes, `struct cudamem_snapshot_sink`: each segment, then its
/// blocks, in address order; then the trace, oldest first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemSnapshotSink {
    /// Passed to every function, untouched.
    pub user: *mut c_void,
    /// Gets each segment.
    pub segment: Option<unsafe extern "C" fn(*mut c_void, *const CudamemSegment)>,
    /// Gets each block of the last segment.
    pub block: Option<unsafe extern "C" fn(*mut c_void, *const CudamemBlockInfo)>,
    /// Gets each trace entry.
    pub trace: Option<unsafe extern "C" fn(*mut c_void, *const CudamemTraceEntry)>,
}

fn segment_of(s: &Segment) -> CudamemSegment {
    CudamemSegment {
        address: s.address,
        total_size: s.total_size,
        allocated_size: s.allocated_size(),
        active_size: s.active_size(),
        requested_size: s.requested_size(),
        stream: s.stream,
        pool_first: s.pool.0,
        pool_second: s.pool.1,
        blocks: s.blocks.len() as u64,
    }
}

fn block_of(b: &SnapshotBlock) -> CudamemBlockInfo {
    CudamemBlockInfo {
        address: b.address,
        size: b.size,
        requested_size: b.requested_size,
        state: match b.state {
            BlockState::Inactive => 0,
            BlockState::ActiveAllocated => 1,
            BlockState::ActivePendingFree => 2,
        },
        context: b.context,
    }
}

fn trace_of(t: &TraceEntry) -> CudamemTraceEntry {
    CudamemTraceEntry {
        action: t.action.raw(),
        addr: t.addr,
        size: t.size,
        stream: t.stream,
        pool_first: t.pool.0,
        pool_second: t.pool.1,
        time_us: t.time_us,
        context: t.context,
    }
}

/// Tells `*sink` what `device` holds (every segment for pool (0, 0), else that private
/// pool's) and, with `trace` nonzero, its history.
///
/// # Safety
///
/// `sink` is null (refused) or valid for one sink whose functions may be called with
/// its `user` and a pointer valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_snapshot(
    device: c_int,
    first: u64,
    second: u64,
    trace: c_int,
    sink: *const CudamemSnapshotSink,
) -> c_int {
    guarded("cudamem_snapshot", || {
        if sink.is_null() {
            return null("cudamem_snapshot", "sink");
        }
        // SAFETY: not null, readable for one sink by the caller's promise.
        let sink = unsafe { sink.read_unaligned() };
        let (Some(on_segment), Some(on_block), Some(on_trace)) =
            (sink.segment, sink.block, sink.trace)
        else {
            return null("cudamem_snapshot", "a sink function");
        };
        let snapshot = match registry::snapshot(device, PoolId(first, second), trace != 0) {
            Ok(snapshot) => snapshot,
            Err(error) => return fail(&error),
        };
        for segment in &snapshot.segments {
            let s = segment_of(segment);
            // SAFETY: the caller's promise about the sink; `&s` lives for the call.
            unsafe { on_segment(sink.user, &s) };
            for block in &segment.blocks {
                let b = block_of(block);
                // SAFETY: as above.
                unsafe { on_block(sink.user, &b) };
            }
        }
        for entry in &snapshot.trace {
            let t = trace_of(entry);
            // SAFETY: as above.
            unsafe { on_trace(sink.user, &t) };
        }
        CUDAMEM_OK
    })
}

/// Writes the calling thread's last failure message into `buf` (at most `len - 1`
/// bytes and a NUL) and returns its full length in bytes, as `snprintf` does.
///
/// # Safety
///
/// `buf` is null (with any `len`: only the length is returned) or points to `len`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_last_error(buf: *mut c_char, len: usize) -> isize {
    LAST_ERROR.with(|last| {
        let text = last.borrow();
        // SAFETY: the caller's promise, passed on.
        unsafe { copy_text(&text, buf, len) }
    })
}

/// Copies `text` as `snprintf` would.
///
/// # Safety
///
/// `buf` is null or points to `len` writable bytes.
unsafe fn copy_text(text: &str, buf: *mut c_char, len: usize) -> isize {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `buf` holds `len` writable bytes by the caller's promise; we write
        // `n + 1 <= len` of them, from a live string that cannot overlap them.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
            buf.add(n).write(0);
        }
    }
    isize::try_from(text.len()).unwrap_or(isize::MAX)
}

/// Writes `device`'s figures to `out`.
///
/// # Safety
///
/// `out` is null (refused) or points to writable memory for one `struct cudamem_stats`
/// ([`cudamem_stats_fields`] `uint64_t`s).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_stats(device: c_int, out: *mut AllocatorStats) -> c_int {
    guarded("cudamem_stats", || match registry::stats(device) {
        // SAFETY: the caller's promise.
        Ok(stats) => unsafe { put("cudamem_stats", out, stats) },
        Err(error) => fail(&error),
    })
}

/// How many `uint64_t` fields `struct cudamem_stats` has, so a caller can check its
/// declaration.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_stats_fields() -> usize {
    size_of::<AllocatorStats>() / size_of::<u64>()
}

/// Writes `device`'s ledger as text into `buf` (at most `len - 1` bytes and a NUL) and
/// returns its full length in bytes, as `snprintf` does; -1 on failure (message via
/// `cudamem_last_error`).
///
/// # Safety
///
/// `buf` is null (with any `len`: only the length is returned) or points to `len`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_explain(device: c_int, buf: *mut c_char, len: usize) -> isize {
    let mut length = -1;
    let code = guarded("cudamem_explain", || match registry::explain(device) {
        Ok(text) => {
            // SAFETY: the caller's promise, passed on.
            length = unsafe { copy_text(&text, buf, len) };
            CUDAMEM_OK
        }
        Err(error) => fail(&error),
    });
    if code == CUDAMEM_OK { length } else { -1 }
}
