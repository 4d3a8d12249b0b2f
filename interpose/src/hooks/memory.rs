//! Device, managed, stream-ordered, pinned host and VMM memory, and the
//! program's own reads of free memory.
//!
//! Allocations are recorded after the driver returns; frees, unmaps and
//! releases before the driver is called, so that the log never shows a
//! pointer (or handle) handed out again before its free.

use std::ffi::{c_uint, c_void};

use trace::event::{Call, Event};

use crate::driver::{AllocationPropHead, CuResult, DevicePtr, MEM_LOCATION_TYPE_DEVICE, SUCCESS};
use crate::hooks::{enter, hook, real};
use crate::recorder;

/// What `*out` holds after a call that returned `result` (0 unless it
/// succeeded).
///
/// # Safety
/// `out` is null or points to a value the driver wrote.
unsafe fn written<T: Copy + Default>(result: CuResult, out: *const T) -> T {
    if result == SUCCESS && !out.is_null() {
        // SAFETY: the driver wrote it on success; the caller says `out` is
        // valid.
        unsafe { *out }
    } else {
        T::default()
    }
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_alloc(
    real: Option<usize>,
    caller: usize,
    dptr: *mut DevicePtr,
    size: usize,
) -> CuResult {
    let real = real!(real, fn(*mut DevicePtr, usize));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(dptr, size) };
    };
    let served = if dptr.is_null() {
        None
    } else {
        crate::pool::allocate(size)
    };
    let result = match served {
        Some(Ok(ptr)) => {
            // SAFETY: the program's out pointer, checked above.
            unsafe { *dptr = ptr };
            SUCCESS
        }
        Some(Err(code)) => code,
        // SAFETY: the program's arguments.
        None => unsafe { real(dptr, size) },
    };
    // SAFETY: the driver writes the pointer on success.
    let ptr = unsafe { written(result, dptr) };
    recorder::allocated(Call::MemAlloc, ptr, size as u64, 0, caller, result);
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_alloc_pitch(
    real: Option<usize>,
    caller: usize,
    dptr: *mut DevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CuResult {
    let real = real!(real, fn(*mut DevicePtr, *mut usize, usize, usize, c_uint));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(dptr, pitch, width, height, element) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(dptr, pitch, width, height, element) };
    // SAFETY: the driver writes both on success.
    let (ptr, row) = unsafe { (written(result, dptr), written(result, pitch)) };
    let size = if result == SUCCESS { row } else { width }.saturating_mul(height);
    recorder::allocated(Call::MemAllocPitch, ptr, size as u64, 0, caller, result);
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_alloc_managed(
    real: Option<usize>,
    caller: usize,
    dptr: *mut DevicePtr,
    size: usize,
    flags: c_uint,
) -> CuResult {
    let real = real!(real, fn(*mut DevicePtr, usize, c_uint));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(dptr, size, flags) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(dptr, size, flags) };
    // SAFETY: the driver writes the pointer on success.
    let ptr = unsafe { written(result, dptr) };
    recorder::allocated(Call::MemAllocManaged, ptr, size as u64, 0, caller, result);
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_alloc_async(
    real: Option<usize>,
    caller: usize,
    dptr: *mut DevicePtr,
    size: usize,
    stream: *mut c_void,
) -> CuResult {
    let real = real!(real, fn(*mut DevicePtr, usize, *mut c_void));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(dptr, size, stream) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(dptr, size, stream) };
    // SAFETY: the driver writes the pointer on success.
    let ptr = unsafe { written(result, dptr) };
    recorder::allocated(
        Call::MemAllocAsync,
        ptr,
        size as u64,
        stream as u64,
        caller,
        result,
    );
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_alloc_from_pool_async(
    real: Option<usize>,
    caller: usize,
    dptr: *mut DevicePtr,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> CuResult {
    let real = real!(real, fn(*mut DevicePtr, usize, *mut c_void, *mut c_void));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(dptr, size, pool, stream) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(dptr, size, pool, stream) };
    // SAFETY: the driver writes the pointer on success.
    let ptr = unsafe { written(result, dptr) };
    recorder::allocated(
        Call::MemAllocFromPoolAsync,
        ptr,
        size as u64,
        stream as u64,
        caller,
        result,
    );
    result
}

/// A free: recorded first, then made; a failure puts the block back.
fn free_with(
    call: Call,
    ptr: u64,
    stream: u64,
    caller: usize,
    free: impl FnOnce() -> CuResult,
) -> CuResult {
    let Some(_inside) = enter() else {
        return free();
    };
    if ptr == 0 {
        return free();
    }
    let block = recorder::freeing(call, ptr, stream, caller);
    let result = free();
    if result != SUCCESS
        && let Some(block) = block
    {
        recorder::free_failed(call, ptr, block, result);
    }
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_free(real: Option<usize>, caller: usize, dptr: DevicePtr) -> CuResult {
    let real = real!(real, fn(DevicePtr));
    free_with(Call::MemFree, dptr, 0, caller, || {
        // SAFETY: the program's argument.
        crate::pool::free(dptr).unwrap_or_else(|| unsafe { real(dptr) })
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_free_async(
    real: Option<usize>,
    caller: usize,
    dptr: DevicePtr,
    stream: *mut c_void,
) -> CuResult {
    let real = real!(real, fn(DevicePtr, *mut c_void));
    free_with(Call::MemFreeAsync, dptr, stream as u64, caller, || {
        // SAFETY: the program's arguments.
        unsafe { real(dptr, stream) }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_host_alloc(
    real: Option<usize>,
    caller: usize,
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, usize, c_uint));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(pp, size, flags) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(pp, size, flags) };
    // SAFETY: the driver writes the pointer on success.
    let ptr = unsafe { written(result, pp.cast_const()) } as u64;
    recorder::allocated(Call::MemHostAlloc, ptr, size as u64, 0, caller, result);
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_alloc_host(
    real: Option<usize>,
    caller: usize,
    pp: *mut *mut c_void,
    size: usize,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, usize));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(pp, size) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(pp, size) };
    // SAFETY: the driver writes the pointer on success.
    let ptr = unsafe { written(result, pp.cast_const()) } as u64;
    recorder::allocated(Call::MemAllocHost, ptr, size as u64, 0, caller, result);
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_free_host(real: Option<usize>, caller: usize, p: *mut c_void) -> CuResult {
    let real = real!(real, fn(*mut c_void));
    // SAFETY: the program's argument.
    free_with(Call::MemFreeHost, p as u64, 0, caller, || unsafe {
        real(p)
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_get_info(
    real: Option<usize>,
    _caller: usize,
    free: *mut usize,
    total: *mut usize,
) -> CuResult {
    let real = real!(real, fn(*mut usize, *mut usize));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(free, total) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(free, total) };
    if result == SUCCESS && !free.is_null() && !total.is_null() {
        // SAFETY: the driver wrote both.
        let (free, total) = unsafe { (*free, *total) };
        recorder::program_read(free as u64, total as u64);
    }
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_create(
    real: Option<usize>,
    caller: usize,
    handle: *mut u64,
    size: usize,
    prop: *const AllocationPropHead,
    flags: u64,
) -> CuResult {
    let real = real!(real, fn(*mut u64, usize, *const AllocationPropHead, u64));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(handle, size, prop, flags) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(handle, size, prop, flags) };
    let device = if prop.is_null() {
        -1
    } else {
        // SAFETY: the driver read `prop` as a CUmemAllocationProp, whose head
        // this is.
        let head = unsafe { &*prop };
        if head.location_type == MEM_LOCATION_TYPE_DEVICE {
            head.location_id
        } else {
            -1
        }
    };
    recorder::after(
        Event::Create {
            // SAFETY: the driver writes the handle on success.
            handle: unsafe { written(result, handle) },
            size: size as u64,
            device,
            caller: 0,
            result,
        },
        caller,
    );
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_release(real: Option<usize>, _caller: usize, handle: u64) -> CuResult {
    let real = real!(real, fn(u64));
    let inside = enter();
    if inside.is_some() {
        recorder::before(Event::Release { handle });
    }
    // SAFETY: the program's argument.
    unsafe { real(handle) }
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_map(
    real: Option<usize>,
    _caller: usize,
    ptr: DevicePtr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CuResult {
    let real = real!(real, fn(DevicePtr, usize, usize, u64, u64));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(ptr, size, offset, handle, flags) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(ptr, size, offset, handle, flags) };
    recorder::after(
        Event::Map {
            ptr,
            size: size as u64,
            offset: offset as u64,
            handle,
            result,
        },
        0,
    );
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_unmap(real: Option<usize>, _caller: usize, ptr: DevicePtr, size: usize) -> CuResult {
    let real = real!(real, fn(DevicePtr, usize));
    let inside = enter();
    if inside.is_some() {
        recorder::before(Event::Unmap {
            ptr,
            size: size as u64,
        });
    }
    // SAFETY: the program's arguments.
    unsafe { real(ptr, size) }
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_address_reserve(
    real: Option<usize>,
    _caller: usize,
    ptr: *mut DevicePtr,
    size: usize,
    alignment: usize,
    addr: DevicePtr,
    flags: u64,
) -> CuResult {
    let real = real!(real, fn(*mut DevicePtr, usize, usize, DevicePtr, u64));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(ptr, size, alignment, addr, flags) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(ptr, size, alignment, addr, flags) };
    recorder::after(
        Event::Reserve {
            // SAFETY: the driver writes the address on success.
            ptr: unsafe { written(result, ptr) },
            size: size as u64,
            result,
        },
        0,
    );
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_address_free(
    real: Option<usize>,
    _caller: usize,
    ptr: DevicePtr,
    size: usize,
) -> CuResult {
    let real = real!(real, fn(DevicePtr, usize));
    let inside = enter();
    if inside.is_some() {
        recorder::before(Event::AddressFree {
            ptr,
            size: size as u64,
        });
    }
    // SAFETY: the program's arguments.
    unsafe { real(ptr, size) }
}

hook!(caller cuMemAlloc_v2 [rdx] = "cuMemAlloc" since 3020 ptsz false
    (dptr: *mut DevicePtr, size: usize) => mem_alloc);
hook!(caller cuMemAllocPitch_v2 [r9] = "cuMemAllocPitch" since 3020 ptsz false
    (dptr: *mut DevicePtr, pitch: *mut usize, width: usize, height: usize, element: c_uint)
    => mem_alloc_pitch);
hook!(caller cuMemAllocManaged [rcx] = "cuMemAllocManaged" since 6000 ptsz false
    (dptr: *mut DevicePtr, size: usize, flags: c_uint) => mem_alloc_managed);
hook!(caller cuMemAllocAsync [rcx] = "cuMemAllocAsync" since 11020 ptsz false
    (dptr: *mut DevicePtr, size: usize, stream: *mut c_void) => mem_alloc_async);
hook!(caller cuMemAllocAsync_ptsz [rcx] = "cuMemAllocAsync" since 11020 ptsz true
    (dptr: *mut DevicePtr, size: usize, stream: *mut c_void) => mem_alloc_async);
hook!(caller cuMemAllocFromPoolAsync [r8] = "cuMemAllocFromPoolAsync" since 11020 ptsz false
    (dptr: *mut DevicePtr, size: usize, pool: *mut c_void, stream: *mut c_void)
    => mem_alloc_from_pool_async);
hook!(caller cuMemAllocFromPoolAsync_ptsz [r8] = "cuMemAllocFromPoolAsync" since 11020 ptsz true
    (dptr: *mut DevicePtr, size: usize, pool: *mut c_void, stream: *mut c_void)
    => mem_alloc_from_pool_async);
hook!(caller cuMemFree_v2 [rsi] = "cuMemFree" since 3020 ptsz false
    (dptr: DevicePtr) => mem_free);
hook!(caller cuMemFreeAsync [rdx] = "cuMemFreeAsync" since 11020 ptsz false
    (dptr: DevicePtr, stream: *mut c_void) => mem_free_async);
hook!(caller cuMemFreeAsync_ptsz [rdx] = "cuMemFreeAsync" since 11020 ptsz true
    (dptr: DevicePtr, stream: *mut c_void) => mem_free_async);
hook!(caller cuMemHostAlloc [rcx] = "cuMemHostAlloc" since 2020 ptsz false
    (pp: *mut *mut c_void, size: usize, flags: c_uint) => mem_host_alloc);
hook!(caller cuMemAllocHost_v2 [rdx] = "cuMemAllocHost" since 3020 ptsz false
    (pp: *mut *mut c_void, size: usize) => mem_alloc_host);
hook!(caller cuMemFreeHost [rsi] = "cuMemFreeHost" since 2000 ptsz false
    (p: *mut c_void) => mem_free_host);
hook!(plain cuMemGetInfo_v2 = "cuMemGetInfo" since 3020 ptsz false
    (free: *mut usize, total: *mut usize) => mem_get_info);
hook!(caller cuMemCreate [r8] = "cuMemCreate" since 10020 ptsz false
    (handle: *mut u64, size: usize, prop: *const AllocationPropHead, flags: u64) => mem_create);
hook!(plain cuMemRelease = "cuMemRelease" since 10020 ptsz false
    (handle: u64) => mem_release);
hook!(plain cuMemMap = "cuMemMap" since 10020 ptsz false
    (ptr: DevicePtr, size: usize, offset: usize, handle: u64, flags: u64) => mem_map);
hook!(plain cuMemUnmap = "cuMemUnmap" since 10020 ptsz false
    (ptr: DevicePtr, size: usize) => mem_unmap);
hook!(plain cuMemAddressReserve = "cuMemAddressReserve" since 10020 ptsz false
    (ptr: *mut DevicePtr, size: usize, alignment: usize, addr: DevicePtr, flags: u64)
    => mem_address_reserve);
hook!(plain cuMemAddressFree = "cuMemAddressFree" since 10020 ptsz false
    (ptr: DevicePtr, size: usize) => mem_address_free);
