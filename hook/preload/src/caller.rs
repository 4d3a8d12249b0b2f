//! Which library called the driver: the first return address outside the
//! driver, the runtime and this library, named by `dladdr`.
//!
//! The allocation wrappers are entered through a two-instruction stub that
//! hands them their own return address (the immediate caller). Most callers
//! are not CUDA's libraries (a statically linked runtime is part of the
//! program; frameworks call the driver directly), and then that address
//! decides. Only when it lies in the driver or the shared runtime does the
//! wrapper walk the stack with the unwinder, a few frames, to the first
//! frame outside them. Addresses are named once: a lock-free table maps
//! each to its library's id.

use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use cudamem_hook::libraries::{LibraryClass, classify};

use crate::recorder;

/// Slots of the address table (a power of two).
const ADDR_SLOTS: usize = 1 << 12;
/// Slots probed before an address is named again rather than cached.
const PROBES: usize = 8;
/// Library ids the class table holds; ids past it are taken as not CUDA's.
pub const MAX_LIBRARIES: usize = 1 << 12;
/// Frames the unwinder looks at before giving up.
const MAX_FRAMES: usize = 24;

/// `(address << 16) | id` per slot; 0 is empty. User addresses fit in 47
/// bits on x86-64, so the packing never loses one.
static ADDRESSES: [AtomicU64; ADDR_SLOTS] = [const { AtomicU64::new(0) }; ADDR_SLOTS];

/// Per library id: 0 not known yet, 1 CUDA's (looked past), 2 another, 3
/// this library (looked past; the unwinder's own frames come before it).
static CLASSES: [AtomicU8; MAX_LIBRARIES] = [const { AtomicU8::new(0) }; MAX_LIBRARIES];

/// This library's load address, found on first use.
static OWN_BASE: AtomicUsize = AtomicUsize::new(0);

fn slot_of(addr: usize) -> usize {
    ((addr as u64 >> 2).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - 12)) as usize
}

/// The library id of code address `addr` (0: unknown).
pub fn library_of(addr: usize) -> u32 {
    if addr == 0 || addr >> 47 != 0 {
        return 0;
    }
    let key = (addr as u64) << 16;
    let first = slot_of(addr);
    for probe in 0..PROBES {
        let slot = &ADDRESSES[(first + probe) & (ADDR_SLOTS - 1)];
        let value = slot.load(Ordering::Acquire);
        if value == 0 {
            break;
        }
        if value & !0xffff == key {
            return (value & 0xffff) as u32;
        }
    }
    let id = name(addr);
    let value = key | u64::from(id);
    for probe in 0..PROBES {
        let slot = &ADDRESSES[(first + probe) & (ADDR_SLOTS - 1)];
        match slot.compare_exchange(0, value, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(existing) if existing & !0xffff == key => break,
            Err(_) => {}
        }
    }
    id
}

/// Name `addr` with `dladdr` and register its library.
fn name(addr: usize) -> u32 {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // A return address points past its call; the byte before it is inside
    // the calling function.
    // SAFETY: dladdr only reads the loader's tables for this address.
    let found = unsafe { libc::dladdr((addr - 1) as *const c_void, &mut info) };
    if found == 0 || info.dli_fbase.is_null() {
        return 0;
    }
    let path = if info.dli_fname.is_null() {
        String::new()
    } else {
        // SAFETY: dladdr returned the loader's NUL-terminated file name.
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned()
    };
    let base = info.dli_fbase as usize;
    let class = if base == own_base() {
        OWN
    } else {
        match classify(&path) {
            LibraryClass::Cuda => CUDA,
            LibraryClass::Other => OTHER,
        }
    };
    let id = recorder::register_library(base, &path);
    if let Some(slot) = CLASSES.get(id as usize) {
        slot.store(class, Ordering::Release);
    }
    id
}

fn own_base() -> usize {
    let known = OWN_BASE.load(Ordering::Acquire);
    if known != 0 {
        return known;
    }
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let here = own_base as *const c_void;
    // SAFETY: dladdr of a function of this library.
    let base = if unsafe { libc::dladdr(here, &mut info) } != 0 {
        info.dli_fbase as usize
    } else {
        usize::MAX
    };
    OWN_BASE.store(base, Ordering::Release);
    base
}

const CUDA: u8 = 1;
const OTHER: u8 = 2;
const OWN: u8 = 3;

fn class_of(id: u32) -> u8 {
    CLASSES
        .get(id as usize)
        .map_or(OTHER, |class| class.load(Ordering::Acquire))
}

fn is_cuda(id: u32) -> bool {
    matches!(class_of(id), CUDA | OWN)
}

/// The caller library for a wrapper whose immediate caller is `immediate`
/// (0 when the wrapper could not tell).
pub fn caller_id(immediate: usize) -> u32 {
    if immediate != 0 {
        let id = library_of(immediate);
        if id != 0 && !is_cuda(id) {
            return id;
        }
    }
    walk().unwrap_or_else(|| library_of(immediate))
}

#[repr(C)]
struct Walk {
    frames: usize,
    /// A frame of this library was passed: frames before it are the
    /// unwinder's own.
    passed_own: bool,
    found: Option<u32>,
}

unsafe extern "C" {
    fn _Unwind_Backtrace(
        trace: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(context: *mut c_void) -> usize;
}

/// `_URC_NO_REASON`: go on.
const UNWIND_CONTINUE: c_int = 0;
/// `_URC_NORMAL_STOP`: stop here.
const UNWIND_STOP: c_int = 4;

unsafe extern "C" fn visit(context: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` that `walk` passed, alive for the call.
    let walk = unsafe { &mut *arg.cast::<Walk>() };
    walk.frames += 1;
    // SAFETY: the unwinder's context for the frame being visited.
    let ip = unsafe { _Unwind_GetIP(context) };
    let id = library_of(ip);
    match class_of(id) {
        OWN => walk.passed_own = true,
        CUDA => {}
        _ if id != 0 && walk.passed_own => {
            walk.found = Some(id);
            return UNWIND_STOP;
        }
        _ => {}
    }
    if walk.frames >= MAX_FRAMES {
        UNWIND_STOP
    } else {
        UNWIND_CONTINUE
    }
}

/// The first frame of the stack outside CUDA's libraries and this one.
fn walk() -> Option<u32> {
    let mut walk = Walk {
        frames: 0,
        passed_own: false,
        found: None,
    };
    // SAFETY: `visit` matches the callback type and `walk` outlives the call.
    unsafe { _Unwind_Backtrace(visit, (&raw mut walk).cast::<c_void>()) };
    walk.found
}

/// A wrapper entered with its immediate caller: a stub that puts its own
/// return address in the register after its arguments and jumps to the
/// Rust function taking it as its last argument (x86-64 System V: the
/// registers are rdi, rsi, rdx, rcx, r8, r9; every wrapped allocation call
/// has at most five arguments). The jump keeps the stack as the caller
/// left it, so the Rust function returns straight to the caller.
/// `export` makes the stub the exported symbol of its name.
#[cfg(target_arch = "x86_64")]
macro_rules! with_caller {
    (export $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $inner:path) => {
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::driver::CuResult {
            core::arch::naked_asm!(
                concat!("mov ", stringify!($reg), ", qword ptr [rsp]"),
                "jmp {inner}",
                inner = sym $inner,
            )
        }
    };
    (local $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $inner:path) => {
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::driver::CuResult {
            core::arch::naked_asm!(
                concat!("mov ", stringify!($reg), ", qword ptr [rsp]"),
                "jmp {inner}",
                inner = sym $inner,
            )
        }
    };
}

/// Elsewhere the wrapper cannot see its return address: it passes 0, and
/// the caller is found by walking the stack.
#[cfg(not(target_arch = "x86_64"))]
macro_rules! with_caller {
    (export $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $inner:path) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::driver::CuResult {
            // SAFETY: the same arguments, passed on.
            unsafe { $inner($($arg,)* 0) }
        }
    };
    (local $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $inner:path) => {
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::driver::CuResult {
            // SAFETY: the same arguments, passed on.
            unsafe { $inner($($arg,)* 0) }
        }
    };
}
pub(crate) use with_caller;
