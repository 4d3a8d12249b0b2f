//! Contexts (made, or the primary one retained) and their limits.

use std::ffi::{c_int, c_uint, c_void};

use trace::event::{Call, ContextHow, Event, LimitKind};

use crate::driver::{CuResult, SUCCESS, read};
use crate::hooks::{enter, hook, real};
use crate::recorder::{self, Measure};

/// Record a context call that returned `result`, `*pctx` the context.
///
/// # Safety
/// `pctx` is null or points to where the driver wrote the context.
unsafe fn record_context(how: ContextHow, pctx: *mut *mut c_void, device: c_int, result: CuResult) {
    let ctx = if result == SUCCESS && !pctx.is_null() {
        // SAFETY: the driver wrote the context on success.
        unsafe { *pctx }
    } else {
        std::ptr::null_mut()
    };
    recorder::context(how, ctx, device, result);
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn primary_retain(
    real: Option<usize>,
    _caller: usize,
    pctx: *mut *mut c_void,
    device: c_int,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, c_int));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(pctx, device) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(pctx, device) };
    // SAFETY: `pctx` is the program's, written on success.
    unsafe { record_context(ContextHow::Primary, pctx, device, result) };
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn ctx_create_v2(
    real: Option<usize>,
    _caller: usize,
    pctx: *mut *mut c_void,
    flags: c_uint,
    device: c_int,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, c_uint, c_int));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(pctx, flags, device) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(pctx, flags, device) };
    // SAFETY: as in `primary_retain`.
    unsafe { record_context(ContextHow::Create, pctx, device, result) };
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn ctx_create_v3(
    real: Option<usize>,
    _caller: usize,
    pctx: *mut *mut c_void,
    params: *mut c_void,
    count: c_int,
    flags: c_uint,
    device: c_int,
) -> CuResult {
    let real = real!(
        real,
        fn(*mut *mut c_void, *mut c_void, c_int, c_uint, c_int)
    );
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(pctx, params, count, flags, device) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(pctx, params, count, flags, device) };
    // SAFETY: as in `primary_retain`.
    unsafe { record_context(ContextHow::Create, pctx, device, result) };
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn ctx_create_v4(
    real: Option<usize>,
    _caller: usize,
    pctx: *mut *mut c_void,
    params: *mut c_void,
    flags: c_uint,
    device: c_int,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *mut c_void, c_uint, c_int));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(pctx, params, flags, device) };
    };
    // SAFETY: the program's arguments.
    let result = unsafe { real(pctx, params, flags, device) };
    // SAFETY: as in `primary_retain`.
    unsafe { record_context(ContextHow::Create, pctx, device, result) };
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn ctx_set_limit(
    real: Option<usize>,
    _caller: usize,
    limit: c_int,
    value: usize,
) -> CuResult {
    let real = real!(real, fn(c_int, usize));
    let Some(_inside) = enter() else {
        // SAFETY: the program's arguments.
        return unsafe { real(limit, value) };
    };
    let measure = Measure::start();
    // SAFETY: the program's arguments.
    let result = unsafe { real(limit, value) };
    let window = measure.finish();
    let which = LimitKind::from_cu(limit as u32);
    let read_back = read::limit(limit as u32);
    recorder::measured(
        Event::Limit {
            which,
            requested: value as u64,
            result,
            value: read_back,
            window,
        },
        Call::CtxSetLimit,
        Some(value as u64),
        result,
    );
    result
}

hook!(plain cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain" since 7000 ptsz false
    (pctx: *mut *mut c_void, device: c_int) => primary_retain);
hook!(plain cuCtxCreate_v2 = "cuCtxCreate" since 3020 ptsz false
    (pctx: *mut *mut c_void, flags: c_uint, device: c_int) => ctx_create_v2);
hook!(plain cuCtxCreate_v3 = "cuCtxCreate" since 11040 ptsz false
    (pctx: *mut *mut c_void, params: *mut c_void, count: c_int, flags: c_uint, device: c_int)
    => ctx_create_v3);
hook!(plain cuCtxCreate_v4 = "cuCtxCreate" since 12050 ptsz false
    (pctx: *mut *mut c_void, params: *mut c_void, flags: c_uint, device: c_int) => ctx_create_v4);
hook!(plain cuCtxSetLimit = "cuCtxSetLimit" since 3010 ptsz false
    (limit: c_int, value: usize) => ctx_set_limit);
