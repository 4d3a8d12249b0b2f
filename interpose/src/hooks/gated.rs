//! Driver calls that touch device memory, wrapped so that a pause holds
//! them at the gate (every wrapper passes it), and the two questions about
//! a pointer whose answer names the pool's page rather than the block
//! (`cuMemGetAddressRange`, the range attributes of `cuPointerGetAttribute`),
//! answered from the pool's table for a pooled pointer.
//!
//! Not wrapped (so not held by a pause): 2D and 3D copies, peer copies,
//! 16-bit memsets and the per-thread-default-stream variants of the
//! synchronous copies.

use std::ffi::{c_int, c_uchar, c_uint, c_void};

use crate::driver::{CuResult, DevicePtr, SUCCESS};
use crate::hooks::{hook, real};

/// The base names wrapped here, none of them recorded (the table's tests
/// know them).
#[cfg(test)]
pub const NOT_RECORDED: [&str; 16] = [
    "cuMemGetAddressRange",
    "cuPointerGetAttribute",
    "cuMemcpy",
    "cuMemcpyAsync",
    "cuMemcpyHtoD",
    "cuMemcpyDtoH",
    "cuMemcpyDtoD",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoDAsync",
    "cuMemsetD8",
    "cuMemsetD32",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
];

use ctx::driver::pointer_attribute::{RANGE_SIZE, RANGE_START_ADDR};

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn address_range(
    real: Option<usize>,
    _caller: usize,
    base: *mut DevicePtr,
    size: *mut usize,
    ptr: DevicePtr,
) -> CuResult {
    let real = real!(real, fn(*mut DevicePtr, *mut usize, DevicePtr));
    if let Some((start, bytes)) = crate::pool::block_of(ptr) {
        // SAFETY: the program's out pointers, each written where not null.
        unsafe {
            if !base.is_null() {
                *base = start;
            }
            if !size.is_null() {
                *size = bytes as usize;
            }
        }
        return SUCCESS;
    }
    // SAFETY: the program's arguments.
    unsafe { real(base, size, ptr) }
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn pointer_attribute(
    real: Option<usize>,
    _caller: usize,
    data: *mut c_void,
    attribute: c_int,
    ptr: DevicePtr,
) -> CuResult {
    let real = real!(real, fn(*mut c_void, c_int, DevicePtr));
    // SAFETY: the program's arguments.
    let result = unsafe { real(data, attribute, ptr) };
    if result == SUCCESS
        && !data.is_null()
        && let Some((start, bytes)) = crate::pool::block_of(ptr)
    {
        // SAFETY: the driver wrote the attribute there: a device pointer or
        // a size, both 8 bytes.
        unsafe {
            match attribute {
                RANGE_START_ADDR => *data.cast::<u64>() = start,
                RANGE_SIZE => *data.cast::<u64>() = bytes,
                _ => {}
            }
        }
    }
    result
}

/// A wrapper that only passes the gate: `passed!(name(args) as fn(types))`.
macro_rules! passed {
    ($body:ident ($($arg:ident: $ty:ty),*)) => {
        /// # Safety
        ///
        /// A hook's body: `real` is the driver's function of this ABI (or `None`),
        /// and the arguments are the program's, valid as the driver requires them.
        unsafe fn $body(real: Option<usize>, _caller: usize, $($arg: $ty),*) -> CuResult {
            crate::pool::work_queued();
            let real = real!(real, fn($($ty),*));
            // SAFETY: the program's arguments.
            unsafe { real($($arg),*) }
        }
    };
}

passed!(copy(dst: DevicePtr, src: DevicePtr, n: usize));
passed!(copy_async(dst: DevicePtr, src: DevicePtr, n: usize, stream: *mut c_void));
passed!(copy_htod(dst: DevicePtr, src: *const c_void, n: usize));
passed!(copy_dtoh(dst: *mut c_void, src: DevicePtr, n: usize));
passed!(copy_htod_async(dst: DevicePtr, src: *const c_void, n: usize, stream: *mut c_void));
passed!(copy_dtoh_async(dst: *mut c_void, src: DevicePtr, n: usize, stream: *mut c_void));
passed!(set8(dst: DevicePtr, value: c_uchar, n: usize));
passed!(set32(dst: DevicePtr, value: c_uint, n: usize));
passed!(set8_async(dst: DevicePtr, value: c_uchar, n: usize, stream: *mut c_void));
passed!(set32_async(dst: DevicePtr, value: c_uint, n: usize, stream: *mut c_void));
passed!(stream_sync(stream: *mut c_void));
passed!(ctx_sync());
passed!(ctx_sync_v2(ctx: *mut c_void));

hook!(plain cuMemGetAddressRange_v2 = "cuMemGetAddressRange" since 3020 ptsz false
    (base: *mut DevicePtr, size: *mut usize, ptr: DevicePtr) => address_range);
hook!(plain cuPointerGetAttribute = "cuPointerGetAttribute" since 4000 ptsz false
    (data: *mut c_void, attribute: c_int, ptr: DevicePtr) => pointer_attribute);
hook!(plain cuMemcpy = "cuMemcpy" since 4000 ptsz false
    (dst: DevicePtr, src: DevicePtr, n: usize) => copy);
hook!(plain cuMemcpyAsync = "cuMemcpyAsync" since 4000 ptsz false
    (dst: DevicePtr, src: DevicePtr, n: usize, stream: *mut c_void) => copy_async);
hook!(plain cuMemcpyHtoD_v2 = "cuMemcpyHtoD" since 3020 ptsz false
    (dst: DevicePtr, src: *const c_void, n: usize) => copy_htod);
hook!(plain cuMemcpyDtoH_v2 = "cuMemcpyDtoH" since 3020 ptsz false
    (dst: *mut c_void, src: DevicePtr, n: usize) => copy_dtoh);
hook!(plain cuMemcpyDtoD_v2 = "cuMemcpyDtoD" since 3020 ptsz false
    (dst: DevicePtr, src: DevicePtr, n: usize) => copy);
hook!(plain cuMemcpyHtoDAsync_v2 = "cuMemcpyHtoDAsync" since 3020 ptsz false
    (dst: DevicePtr, src: *const c_void, n: usize, stream: *mut c_void) => copy_htod_async);
hook!(plain cuMemcpyDtoHAsync_v2 = "cuMemcpyDtoHAsync" since 3020 ptsz false
    (dst: *mut c_void, src: DevicePtr, n: usize, stream: *mut c_void) => copy_dtoh_async);
hook!(plain cuMemcpyDtoDAsync_v2 = "cuMemcpyDtoDAsync" since 3020 ptsz false
    (dst: DevicePtr, src: DevicePtr, n: usize, stream: *mut c_void) => copy_async);
hook!(plain cuMemsetD8_v2 = "cuMemsetD8" since 3020 ptsz false
    (dst: DevicePtr, value: c_uchar, n: usize) => set8);
hook!(plain cuMemsetD32_v2 = "cuMemsetD32" since 3020 ptsz false
    (dst: DevicePtr, value: c_uint, n: usize) => set32);
hook!(plain cuMemsetD8Async = "cuMemsetD8Async" since 3020 ptsz false
    (dst: DevicePtr, value: c_uchar, n: usize, stream: *mut c_void) => set8_async);
hook!(plain cuMemsetD32Async = "cuMemsetD32Async" since 3020 ptsz false
    (dst: DevicePtr, value: c_uint, n: usize, stream: *mut c_void) => set32_async);
hook!(plain cuStreamSynchronize = "cuStreamSynchronize" since 2000 ptsz false
    (stream: *mut c_void) => stream_sync);
hook!(plain cuCtxSynchronize = "cuCtxSynchronize" since 2000 ptsz false
    () => ctx_sync);
// CUDA 13's ABI of the same name takes the context to wait for (NULL: the
// current one): what the runtime's cudaDeviceSynchronize reaches.
hook!(plain cuCtxSynchronize_v2 = "cuCtxSynchronize" since 13000 ptsz false
    (ctx: *mut c_void) => ctx_sync_v2);
