//! The CUDA driver entry points this backend calls, and how their results become
//! [`Error`]s.
//!
//! The functions are declared here rather than called through `cust::sys` because
//! bindgen declared them returning `CUresult`, a Rust enum generated from the CUDA 11.4
//! headers. A newer driver (580 is CUDA 13) returns codes that enum lacks
//! (`CUDA_ERROR_DEVICE_UNAVAILABLE` = 46, `CUDA_ERROR_INVALID_CLUSTER_SIZE` = 912, ...),
//! and a Rust enum holding an undeclared value is undefined behaviour. Declared with a
//! plain `i32` result, any code is sound; it becomes a [`DriverCode`], which code decides
//! on and which names the codes of the driver API reference. Argument types (structs and enums we pass in, never read back)
//! still come from `cust::sys`, and `cust_raw`'s build script still finds `libcuda`.
//!
//! Every symbol here is also declared by `cust_raw`, so the stub `libcuda` that
//! `cargo xtask` builds from those declarations links these too.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use cust::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUfunction,
    CUfunction_attribute, CUjit_option, CUjitInputType, CUlimit, CUlinkState, CUmemAccessDesc,
    CUmemAllocationGranularity_flags, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemPool_attribute, CUmemoryPool, CUmodule, CUstream,
};

use crate::{DriverCode, Error, Result};

/// A `CUresult` as the driver returns it: any `i32`, 0 meaning success.
pub(crate) type RawResult = i32;

/// `CUDA_SUCCESS`.
pub(crate) const SUCCESS: RawResult = 0;

/// `CUDA_ERROR_NOT_READY`: what `cuEventQuery` returns while work before the event is
/// still queued.
pub(crate) const NOT_READY: RawResult = 600;

#[link(name = "cuda")]
unsafe extern "C" {
    pub(crate) fn cuInit(flags: c_uint) -> RawResult;
    pub(crate) fn cuDriverGetVersion(version: *mut c_int) -> RawResult;

    pub(crate) fn cuDeviceGetCount(count: *mut c_int) -> RawResult;
    pub(crate) fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> RawResult;
    pub(crate) fn cuDeviceGetName(name: *mut c_char, len: c_int, device: CUdevice) -> RawResult;
    pub(crate) fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> RawResult;
    pub(crate) fn cuDeviceGetAttribute(
        value: *mut c_int,
        attribute: CUdevice_attribute,
        device: CUdevice,
    ) -> RawResult;
    pub(crate) fn cuDeviceCanAccessPeer(
        can_access: *mut c_int,
        device: CUdevice,
        peer: CUdevice,
    ) -> RawResult;
    pub(crate) fn cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice) -> RawResult;
    pub(crate) fn cuDevicePrimaryCtxRelease_v2(device: CUdevice) -> RawResult;

    pub(crate) fn cuCtxSetCurrent(context: CUcontext) -> RawResult;
    pub(crate) fn cuCtxGetCurrent(context: *mut CUcontext) -> RawResult;
    pub(crate) fn cuCtxSynchronize() -> RawResult;
    pub(crate) fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> RawResult;
    pub(crate) fn cuCtxGetLimit(value: *mut usize, limit: CUlimit) -> RawResult;
    pub(crate) fn cuCtxSetLimit(limit: CUlimit, value: usize) -> RawResult;

    pub(crate) fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> RawResult;
    pub(crate) fn cuMemAlloc_v2(address: *mut CUdeviceptr, bytes: usize) -> RawResult;
    pub(crate) fn cuMemFree_v2(address: CUdeviceptr) -> RawResult;
    pub(crate) fn cuMemcpyDtoDAsync_v2(
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> RawResult;
    pub(crate) fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> RawResult;
    pub(crate) fn cuMemsetD32Async(
        dst: CUdeviceptr,
        value: c_uint,
        count: usize,
        stream: CUstream,
    ) -> RawResult;
    pub(crate) fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> RawResult;

    pub(crate) fn cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const CUmemAllocationProp,
        option: CUmemAllocationGranularity_flags,
    ) -> RawResult;
    pub(crate) fn cuMemAddressReserve(
        address: *mut CUdeviceptr,
        bytes: usize,
        alignment: usize,
        fixed_address: CUdeviceptr,
        flags: c_ulonglong,
    ) -> RawResult;
    pub(crate) fn cuMemAddressFree(address: CUdeviceptr, bytes: usize) -> RawResult;
    pub(crate) fn cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        bytes: usize,
        prop: *const CUmemAllocationProp,
        flags: c_ulonglong,
    ) -> RawResult;
    pub(crate) fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> RawResult;
    pub(crate) fn cuMemMap(
        address: CUdeviceptr,
        bytes: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: c_ulonglong,
    ) -> RawResult;
    pub(crate) fn cuMemUnmap(address: CUdeviceptr, bytes: usize) -> RawResult;
    pub(crate) fn cuMemSetAccess(
        address: CUdeviceptr,
        bytes: usize,
        desc: *const CUmemAccessDesc,
        count: usize,
    ) -> RawResult;

    pub(crate) fn cuMemAllocAsync(
        address: *mut CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> RawResult;
    pub(crate) fn cuMemFreeAsync(address: CUdeviceptr, stream: CUstream) -> RawResult;
    pub(crate) fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, device: CUdevice)
    -> RawResult;
    pub(crate) fn cuMemPoolSetAttribute(
        pool: CUmemoryPool,
        attribute: CUmemPool_attribute,
        value: *mut c_void,
    ) -> RawResult;

    pub(crate) fn cuModuleLoadDataEx(
        module: *mut CUmodule,
        image: *const c_void,
        option_count: c_uint,
        options: *mut CUjit_option,
        option_values: *mut *mut c_void,
    ) -> RawResult;
    pub(crate) fn cuModuleUnload(module: CUmodule) -> RawResult;
    pub(crate) fn cuLinkCreate_v2(
        option_count: c_uint,
        options: *mut CUjit_option,
        option_values: *mut *mut c_void,
        state: *mut CUlinkState,
    ) -> RawResult;
    pub(crate) fn cuLinkAddData_v2(
        state: CUlinkState,
        input_type: CUjitInputType,
        data: *mut c_void,
        bytes: usize,
        name: *const c_char,
        option_count: c_uint,
        options: *mut CUjit_option,
        option_values: *mut *mut c_void,
    ) -> RawResult;
    pub(crate) fn cuLinkComplete(
        state: CUlinkState,
        image: *mut *mut c_void,
        bytes: *mut usize,
    ) -> RawResult;
    pub(crate) fn cuLinkDestroy(state: CUlinkState) -> RawResult;
    pub(crate) fn cuModuleGetGlobal_v2(
        address: *mut CUdeviceptr,
        bytes: *mut usize,
        module: CUmodule,
        name: *const c_char,
    ) -> RawResult;
    pub(crate) fn cuModuleGetFunction(
        function: *mut CUfunction,
        module: CUmodule,
        name: *const c_char,
    ) -> RawResult;
    pub(crate) fn cuFuncGetAttribute(
        value: *mut c_int,
        attribute: CUfunction_attribute,
        function: CUfunction,
    ) -> RawResult;
    pub(crate) fn cuLaunchKernel(
        function: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> RawResult;

    pub(crate) fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> RawResult;
    pub(crate) fn cuStreamSynchronize(stream: CUstream) -> RawResult;
    pub(crate) fn cuStreamDestroy_v2(stream: CUstream) -> RawResult;

    pub(crate) fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> RawResult;
    pub(crate) fn cuEventRecord(event: CUevent, stream: CUstream) -> RawResult;
    pub(crate) fn cuEventSynchronize(event: CUevent) -> RawResult;
    pub(crate) fn cuEventQuery(event: CUevent) -> RawResult;
    pub(crate) fn cuEventElapsedTime(
        milliseconds: *mut f32,
        start: CUevent,
        end: CUevent,
    ) -> RawResult;
    pub(crate) fn cuEventDestroy_v2(event: CUevent) -> RawResult;
}

/// `Ok(())` for `CUDA_SUCCESS`, else [`Error::Driver`] naming `op` and carrying the code.
pub(crate) fn check(op: &'static str, code: RawResult) -> Result<()> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(Error::driver(op, driver_code(code), ""))
    }
}

/// A `CUresult` other than success as a [`DriverCode`] (the driver returns no
/// negative codes; one would keep its bits).
pub(crate) fn driver_code(code: RawResult) -> DriverCode {
    DriverCode(code as u32)
}

/// `bytes` as a `size_t` argument of `op`, or the invalid value the driver would call
/// a size it cannot hold.
pub(crate) fn size_t(op: &'static str, bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| {
        Error::driver(
            op,
            DriverCode::INVALID_VALUE,
            format!("{bytes} bytes do not fit in size_t"),
        )
    })
}
