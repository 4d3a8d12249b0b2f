//! The C ABI: what `torch.cuda.memory.CUDAPluggableAllocator` calls, and the figures
//! the Python module reads. Each function checks its pointers, converts, and calls
//! [`crate::registry`]; no panic crosses the boundary (a panic is reported and the call
//! fails: NULL, -1 or nothing).
//!
//! ```c
//! void* cudamem_malloc(ssize_t size, int device, cudaStream_t stream);
//! void  cudamem_free(void* ptr, ssize_t size, int device, cudaStream_t stream);
//! int   cudamem_stats(int device, struct cudamem_stats* out);   /* 0, or -1 */
//! size_t cudamem_stats_fields(void);      /* uint64_t fields of struct cudamem_stats */
//! void  cudamem_empty_cache(void);
//! ssize_t cudamem_explain(int device, char* buf, size_t len); /* length, or -1 */
//! ```

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use ctx::StreamId;

use crate::allocator::AllocatorStats;
use crate::registry::{self, CallerStream};

/// Runs `call`; a panic is reported and becomes `failed`.
fn guarded<T>(name: &str, failed: T, call: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(call)).unwrap_or_else(|_| {
        eprintln!("cudamem: internal error in {name} (a panic); the call failed");
        failed
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

/// `size` bytes on `device` for use on `stream`; NULL when out of memory (explained on
/// stderr once per device) or on bad arguments (reported).
///
/// # Safety
///
/// `stream` is null, a special stream handle, or a live stream of `device`'s primary
/// context: what PyTorch passes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_malloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller's promise about `stream`, passed on.
    let stream = unsafe { caller_stream(stream) };
    guarded("cudamem_malloc", std::ptr::null_mut(), || {
        registry::malloc(size as i64, device, stream) as usize as *mut c_void
    })
}

/// Frees `ptr`, allocated on `device` with `size` bytes, on `stream`. A pointer this
/// library does not hold live, or another size, is reported and left alone.
///
/// # Safety
///
/// As [`cudamem_malloc`] for `stream`; `ptr` is only compared, never dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    // SAFETY: the caller's promise about `stream`, passed on.
    let stream = unsafe { caller_stream(stream) };
    guarded("cudamem_free", (), || {
        registry::free(ptr as usize as u64, size as i64, device, stream);
    });
}

/// Writes `device`'s figures to `out`; 0, or -1 (reported) when `out` is null or the
/// device has no allocator.
///
/// # Safety
///
/// `out` is null or points to writable memory for one `struct cudamem_stats`
/// ([`cudamem_stats_fields`] `uint64_t`s).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_stats(device: c_int, out: *mut AllocatorStats) -> c_int {
    guarded("cudamem_stats", -1, || {
        if out.is_null() {
            eprintln!("cudamem: cudamem_stats: out is a null pointer");
            return -1;
        }
        match registry::stats(device) {
            Some(stats) => {
                // SAFETY: `out` is not null and, by the caller's promise, writable for one
                // `AllocatorStats`; `write_unaligned` asks nothing of its alignment.
                unsafe { out.write_unaligned(stats) };
                0
            }
            None => -1,
        }
    })
}

/// How many `uint64_t` fields `struct cudamem_stats` has, so a caller can check its
/// declaration.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_stats_fields() -> usize {
    size_of::<AllocatorStats>() / size_of::<u64>()
}

/// Every device waits for its pending frees and gives its free pages at the top back.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_empty_cache() {
    guarded("cudamem_empty_cache", 0, registry::empty_cache);
}

/// Writes `device`'s ledger as text into `buf` (at most `len - 1` bytes and a NUL) and
/// returns its full length in bytes, as `snprintf` does; -1 (reported) on failure.
///
/// # Safety
///
/// `buf` is null (with any `len`: only the length is returned) or points to `len`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_explain(device: c_int, buf: *mut c_char, len: usize) -> isize {
    guarded("cudamem_explain", -1, || {
        let text = match registry::explain(device) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("cudamem: cudamem_explain: {error}");
                return -1;
            }
        };
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
    })
}
