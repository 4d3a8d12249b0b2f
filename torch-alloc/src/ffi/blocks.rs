//! Blocks: allocate, free, look up, use on another stream, give the cache back.

use std::ffi::{c_int, c_void};

use super::{CUDAMEM_OK, caller_stream, fail, guarded, null, put, selector, status};
use crate::allocator::Outcome;
use crate::pool_id::PoolId;
use crate::registry::{self, CallerRequest};

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
