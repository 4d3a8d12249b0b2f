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

use crate::error::Error;
use crate::registry::CallerStream;

mod blocks;
mod pools;
mod snapshot;
mod stats;

pub use blocks::*;
pub use pools::*;
pub use snapshot::*;
pub use stats::*;

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
