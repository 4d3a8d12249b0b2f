//! Figures: PyTorch's `DeviceStats`, the allocator's own, the memory fraction and
//! the ledger as text.

use std::ffi::{c_char, c_int};

use super::{CUDAMEM_OK, copy_text, fail, guarded, put, status};
use crate::allocator::AllocatorStats;
use crate::device_stats::DeviceStats;
use crate::registry;

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
