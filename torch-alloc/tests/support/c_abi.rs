//! The C functions as a C caller uses them, shared by the tests that call
//! the C ABI (each includes this file by path).

#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void};

use cudamem_torch::ffi::{CudamemOutcome, CudamemRequest, cudamem_allocate, cudamem_last_error};

/// The calling thread's last error message, whole.
pub fn last_error() -> String {
    // SAFETY: a null buffer asks the length only.
    let n = unsafe { cudamem_last_error(std::ptr::null_mut(), 0) };
    let mut buf = vec![0u8; n.max(0) as usize + 1];
    // SAFETY: `buf` holds `n + 1` writable bytes.
    unsafe { cudamem_last_error(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    buf.pop();
    String::from_utf8_lossy(&buf).into_owned()
}

/// A plain request of `size` bytes on the stream `stream` (an opaque handle).
pub fn request(size: u64, stream: usize) -> CudamemRequest {
    CudamemRequest {
        size,
        stream: stream as *mut c_void,
        pool_first: 0,
        pool_second: 0,
        capturing: 0,
        context: 0,
    }
}

/// `cudamem_allocate` of `request` on `device`: its status and outcome.
pub fn allocate_with(device: c_int, request: CudamemRequest) -> (c_int, CudamemOutcome) {
    let mut out = CudamemOutcome::default();
    // SAFETY: both structs are live; the simulated backend only compares streams.
    let code = unsafe { cudamem_allocate(device, &request, &mut out) };
    (code, out)
}
