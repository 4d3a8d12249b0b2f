//! The real driver: its types and constants, the library handle (found
//! lazily, never from a constructor), and [`Sym`], a driver entry point
//! looked up through the real `dlsym` on first use.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdeviceptr`.
pub type DevicePtr = u64;

// The driver's numbers are ctx's (`ctx::driver`); these are their names here.
pub use ctx::driver::SUCCESS;
pub use ctx::driver::device_attribute::{
    MAX_THREADS_PER_MULTIPROCESSOR as ATTR_MAX_THREADS_PER_MULTIPROCESSOR,
    MULTIPROCESSOR_COUNT as ATTR_MULTIPROCESSOR_COUNT,
};
pub use ctx::driver::function_attribute::LOCAL_SIZE_BYTES as FUNC_ATTR_LOCAL_SIZE_BYTES;
pub use ctx::driver::mem_location_type::DEVICE as MEM_LOCATION_TYPE_DEVICE;
pub use ctx::driver::mempool_attribute::RESERVED_MEM_CURRENT as MEMPOOL_ATTR_RESERVED_MEM_CURRENT;
pub use ctx::driver::proc_address_flag::PER_THREAD_DEFAULT_STREAM as PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
/// What a wrapper returns when the driver lacks the function it wraps
/// (`CUDA_ERROR_NOT_FOUND`): only reachable by a program linked against a
/// newer driver than the one loaded.
pub use ctx::driver::result::NOT_FOUND as ERROR_NOT_FOUND;

/// The head of `CUmemAllocationProp`: enough to tell where the memory is.
#[repr(C)]
pub struct AllocationPropHead {
    /// `CUmemAllocationType`.
    pub kind: c_uint,
    /// `CUmemAllocationHandleType`.
    pub handle_types: c_uint,
    /// `CUmemLocation::type`.
    pub location_type: c_uint,
    /// `CUmemLocation::id`.
    pub location_id: c_int,
}

/// The real `dlsym`, found by [`init_real_dlsym`] at load (0 until then:
/// a library whose constructor runs before this one's may look up first).
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// The real `dlvsym`, found by [`init_real_dlvsym`] at load (0 until then,
/// as [`REAL_DLSYM`]).
pub static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// The versions the C library has defined `dlsym`, `dlvsym` and `dlopen`
/// at, newest first: glibc 2.34 moved them into libc under a new version.
#[cfg(target_arch = "aarch64")]
pub const DL_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.17"];
/// The versions the C library has defined `dlsym`, `dlvsym` and `dlopen`
/// at, newest first: glibc 2.34 moved them into libc under a new version.
#[cfg(not(target_arch = "aarch64"))]
pub const DL_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.2.5"];

/// The C library's `dlvsym`, found without calling one (this library
/// exports `dlvsym`: see [`crate::symbols`]); `None` without a C library
/// that defines it.
pub fn real_dlvsym_fn() -> Option<DlvsymFn> {
    init_real_dlvsym();
    let known = REAL_DLVSYM.load(Ordering::Acquire);
    // SAFETY: the C library's dlvsym, of this type.
    (known != 0).then(|| unsafe { std::mem::transmute::<usize, DlvsymFn>(known) })
}

/// Find the C library's `dlvsym` (see [`real_dlvsym_fn`]).
pub extern "C" fn init_real_dlvsym() {
    if REAL_DLVSYM.load(Ordering::Acquire) == 0 {
        let found = crate::symbols::glibc_function(c"dlvsym");
        REAL_DLVSYM.store(found, Ordering::Release);
    }
}

/// `name` at `version` looked up in `handle` by the C library's `dlvsym`,
/// called from here (so `RTLD_NEXT` means the objects after this library).
pub fn real_dlvsym(handle: *mut c_void, name: &CStr, version: &CStr) -> *mut c_void {
    match real_dlvsym_fn() {
        // SAFETY: a handle or pseudo-handle and C strings.
        Some(dlvsym) => unsafe { dlvsym(handle, name.as_ptr(), version.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// Find the real `dlsym` (the next one after this library).
pub extern "C" fn init_real_dlsym() {
    if REAL_DLSYM.load(Ordering::Acquire) != 0 {
        return;
    }
    for version in DL_VERSIONS {
        let found = real_dlvsym(libc::RTLD_NEXT, c"dlsym", version);
        if !found.is_null() {
            REAL_DLSYM.store(found as usize, Ordering::Release);
            return;
        }
    }
}

/// Look `name` up in `handle` through the real `dlsym`.
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    init_real_dlsym();
    let real = REAL_DLSYM.load(Ordering::Acquire);
    if real == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `real` is the C library's dlsym, found by dlvsym, of this type.
    let real: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(real) };
    // SAFETY: a handle from dlopen or a pseudo-handle, and a C string.
    unsafe { real(handle, name.as_ptr()) }
}

static LIBCUDA: AtomicUsize = AtomicUsize::new(0);

/// The driver library's handle: the one the process already loaded, or
/// (when `load`) loaded now. `None` when it is not loaded (and `!load`) or
/// cannot be.
pub fn libcuda(load: bool) -> Option<*mut c_void> {
    let known = LIBCUDA.load(Ordering::Acquire);
    if known != 0 {
        return Some(known as *mut c_void);
    }
    let name = c"libcuda.so.1";
    // SAFETY: dlopen of a constant name; RTLD_NOLOAD loads nothing.
    let mut handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() && load {
        // SAFETY: as above; this may run the driver's constructors, which is
        // what the program's own first call would have done.
        handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
    }
    if handle.is_null() {
        return None;
    }
    LIBCUDA.store(handle as usize, Ordering::Release);
    Some(handle)
}

/// Marks a [`Sym`] the driver does not have.
const MISSING: usize = 1;

/// A driver entry point, looked up in the driver library on first use.
pub struct Sym {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Sym {
    /// The entry point `name`, not looked up yet.
    pub const fn new(name: &'static CStr) -> Self {
        Self {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// Its address in the driver, loading the driver when `load`. `None`
    /// when the driver is not loaded or lacks it (only the second is
    /// remembered).
    pub fn addr(&self, load: bool) -> Option<usize> {
        match self.addr.load(Ordering::Acquire) {
            0 => {}
            MISSING => return None,
            addr => return Some(addr),
        }
        let handle = libcuda(load)?;
        let found = real_dlsym(handle, self.name) as usize;
        let stored = if found == 0 { MISSING } else { found };
        self.addr.store(stored, Ordering::Release);
        (found != 0).then_some(found)
    }
}

/// Call driver entry point `$sym` (a [`Sym`]) as a function of the given
/// type, or evaluate to `None` when the driver lacks it.
macro_rules! call_driver {
    ($sym:expr, fn($($ty:ty),*) $(, $arg:expr)*) => {
        match $sym.addr(false) {
            Some(addr) => {
                // The interposer's own call: never where the program's
                // thread is cancelled.
                let _no_cancel = $crate::thread::NoCancel::hold();
                // SAFETY: the driver exports this name with this C signature
                // (cuda.h), and the arguments are valid for it.
                Some(unsafe {
                    std::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> $crate::driver::CuResult>(addr)($($arg),*)
                })
            }
            None => None,
        }
    };
}

/// Entry points the interposer itself calls (never wrapped).
pub mod own {
    use super::Sym;

    pub static MEM_GET_INFO: Sym = Sym::new(c"cuMemGetInfo_v2");
    pub static CTX_GET_LIMIT: Sym = Sym::new(c"cuCtxGetLimit");
    pub static CTX_GET_DEVICE: Sym = Sym::new(c"cuCtxGetDevice");
    pub static CTX_GET_CURRENT: Sym = Sym::new(c"cuCtxGetCurrent");
    pub static CTX_PUSH: Sym = Sym::new(c"cuCtxPushCurrent_v2");
    pub static CTX_POP: Sym = Sym::new(c"cuCtxPopCurrent_v2");
    pub static DEVICE_GET_ATTRIBUTE: Sym = Sym::new(c"cuDeviceGetAttribute");
    pub static DEVICE_TOTAL_MEM: Sym = Sym::new(c"cuDeviceTotalMem_v2");
    pub static DEVICE_GET_MEM_POOL: Sym = Sym::new(c"cuDeviceGetMemPool");
    pub static MEM_POOL_GET_ATTRIBUTE: Sym = Sym::new(c"cuMemPoolGetAttribute");
    pub static FUNC_GET_ATTRIBUTE: Sym = Sym::new(c"cuFuncGetAttribute");
    pub static KERNEL_GET_ATTRIBUTE: Sym = Sym::new(c"cuKernelGetAttribute");
    pub static FUNC_GET_NAME: Sym = Sym::new(c"cuFuncGetName");
    pub static STREAM_IS_CAPTURING: Sym = Sym::new(c"cuStreamIsCapturing");
}

/// What the interposer reads from the driver, each `None` where the call
/// failed.
pub mod read {
    use std::ffi::{c_char, c_int, c_void};

    use super::{SUCCESS, own};

    /// Free and total memory of the current context's device.
    pub fn mem_info() -> Option<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        let result = call_driver!(
            own::MEM_GET_INFO,
            fn(*mut usize, *mut usize),
            &mut free,
            &mut total
        )?;
        (result == SUCCESS).then_some((free as u64, total as u64))
    }

    /// Free bytes only.
    pub fn free_bytes() -> Option<u64> {
        mem_info().map(|(free, _)| free)
    }

    /// A limit of the current context (`CUlimit` value `which`).
    pub fn limit(which: u32) -> Option<u64> {
        let mut value = 0usize;
        let result = call_driver!(
            own::CTX_GET_LIMIT,
            fn(*mut usize, c_int),
            &mut value,
            which as c_int
        )?;
        (result == SUCCESS).then_some(value as u64)
    }

    /// The current context's device.
    pub fn current_device() -> Option<c_int> {
        let mut device: c_int = 0;
        let result = call_driver!(own::CTX_GET_DEVICE, fn(*mut c_int), &mut device)?;
        (result == SUCCESS).then_some(device)
    }

    /// This thread's current context (0 for none).
    pub fn current_context() -> Option<u64> {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let result = call_driver!(own::CTX_GET_CURRENT, fn(*mut *mut c_void), &mut ctx)?;
        (result == SUCCESS).then_some(ctx as u64)
    }

    /// A device attribute.
    pub fn device_attribute(attribute: c_int, device: c_int) -> Option<u64> {
        let mut value: c_int = 0;
        let result = call_driver!(
            own::DEVICE_GET_ATTRIBUTE,
            fn(*mut c_int, c_int, c_int),
            &mut value,
            attribute,
            device
        )?;
        (result == SUCCESS && value >= 0).then_some(value as u64)
    }

    /// A device's memory in all.
    pub fn device_total(device: c_int) -> Option<u64> {
        let mut total = 0usize;
        let result = call_driver!(
            own::DEVICE_TOTAL_MEM,
            fn(*mut usize, c_int),
            &mut total,
            device
        )?;
        (result == SUCCESS).then_some(total as u64)
    }

    /// Bytes the device's current stream-ordered pool holds.
    pub fn pool_reserved(device: c_int) -> Option<u64> {
        let mut pool: *mut c_void = std::ptr::null_mut();
        let result = call_driver!(
            own::DEVICE_GET_MEM_POOL,
            fn(*mut *mut c_void, c_int),
            &mut pool,
            device
        )?;
        if result != SUCCESS || pool.is_null() {
            return None;
        }
        let mut value = 0u64;
        let result = call_driver!(
            own::MEM_POOL_GET_ATTRIBUTE,
            fn(*mut c_void, c_int, *mut c_void),
            pool,
            super::MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&raw mut value).cast::<c_void>()
        )?;
        (result == SUCCESS).then_some(value)
    }

    /// Local memory per thread of a function, or of a library's kernel (on
    /// the current device) when `kernel`.
    pub fn local_bytes(handle: *mut c_void, kernel: bool) -> Option<u64> {
        let mut value: c_int = 0;
        let result = if kernel {
            let device = current_device()?;
            call_driver!(
                own::KERNEL_GET_ATTRIBUTE,
                fn(*mut c_int, c_int, *mut c_void, c_int),
                &mut value,
                super::FUNC_ATTR_LOCAL_SIZE_BYTES,
                handle,
                device
            )?
        } else {
            call_driver!(
                own::FUNC_GET_ATTRIBUTE,
                fn(*mut c_int, c_int, *mut c_void),
                &mut value,
                super::FUNC_ATTR_LOCAL_SIZE_BYTES,
                handle
            )?
        };
        (result == SUCCESS)
            .then(|| u64::try_from(value).ok())
            .flatten()
    }

    /// Whether work queued on `stream` is being captured into a graph:
    /// then the interposer reads nothing (some calls are not allowed during
    /// a capture, and would end it).
    pub fn capturing(stream: *mut c_void) -> bool {
        let mut status: c_int = 0;
        let result = call_driver!(
            own::STREAM_IS_CAPTURING,
            fn(*mut c_void, *mut c_int),
            stream,
            &mut status
        );
        // Unknown (no such entry point, or a failure): take it as capturing.
        result != Some(SUCCESS) || status != 0
    }

    /// A function's name as the driver knows it.
    pub fn function_name(handle: *mut c_void) -> Option<String> {
        let mut name: *const c_char = std::ptr::null();
        let result = call_driver!(
            own::FUNC_GET_NAME,
            fn(*mut *const c_char, *mut c_void),
            &mut name,
            handle
        )?;
        if result != SUCCESS || name.is_null() {
            return None;
        }
        // SAFETY: the driver returned a NUL-terminated name it owns.
        Some(
            unsafe { std::ffi::CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// Run `f` with `ctx` current on this thread, then restore what was.
    pub fn with_context<T>(ctx: *mut c_void, f: impl FnOnce() -> T) -> Option<T> {
        let pushed = call_driver!(own::CTX_PUSH, fn(*mut c_void), ctx)?;
        if pushed != SUCCESS {
            return None;
        }
        let value = f();
        let mut popped: *mut c_void = std::ptr::null_mut();
        let _ = call_driver!(own::CTX_POP, fn(*mut *mut c_void), &mut popped);
        Some(value)
    }
}
pub(crate) use call_driver;
