//! Which library called the driver: the first return address outside the
//! driver, the runtime and this library, named by `dladdr`.
//!
//! The allocation wrappers are entered through a two-instruction stub that
//! hands them the stack pointer at entry, where their own return address
//! (the immediate caller) is. Most callers are not CUDA's libraries (a
//! statically linked runtime is part of the program; frameworks call the
//! driver directly), and then that address decides. When it lies in the
//! driver or the shared runtime, the stack is walked with the unwinder to
//! the first frame outside them, and where that frame's return address was
//! stored, relative to the stack pointer, is learned for that immediate
//! caller: the next call from the same place reads the word there and takes
//! it when it names a library that is not CUDA's (the runtime's frames have
//! the same layout each time), walking again only when it does not.
//! Addresses are named once: a lock-free table maps each to its library's
//! id.

use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use trace::process::libraries::{LibraryClass, classify};

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

/// Forget every library id handed out (a process copy that starts a log
/// of its own without its parent's list of libraries).
pub fn forget_libraries() {
    for slot in &ADDRESSES {
        slot.store(0, Ordering::Relaxed);
    }
    for class in &CLASSES {
        class.store(0, Ordering::Relaxed);
    }
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

/// Slots of the table of learned offsets (a power of two).
const OFFSET_SLOTS: usize = 1 << 10;
/// The farthest a learned return address may be above the stack pointer.
const MAX_OFFSET: usize = 64 << 10;

/// `(immediate caller << 16) | (offset / 8)` per slot; 0 is empty.
static OFFSETS: [AtomicU64; OFFSET_SLOTS] = [const { AtomicU64::new(0) }; OFFSET_SLOTS];

fn learned(immediate: usize) -> Option<usize> {
    let key = (immediate as u64) << 16;
    let first = slot_of(immediate) & (OFFSET_SLOTS - 1);
    for probe in 0..PROBES {
        let value = OFFSETS[(first + probe) & (OFFSET_SLOTS - 1)].load(Ordering::Acquire);
        if value == 0 {
            return None;
        }
        if value & !0xffff == key {
            return Some((value & 0xffff) as usize * 8);
        }
    }
    None
}

fn learn(immediate: usize, offset: usize) {
    let value = ((immediate as u64) << 16) | (offset / 8) as u64;
    let first = slot_of(immediate) & (OFFSET_SLOTS - 1);
    for probe in 0..PROBES {
        let slot = &OFFSETS[(first + probe) & (OFFSET_SLOTS - 1)];
        let current = slot.load(Ordering::Acquire);
        if current == 0 || current & !0xffff == value & !0xffff {
            slot.store(value, Ordering::Release);
            return;
        }
    }
}

thread_local! {
    /// This thread's stack, (lowest, highest) address; (0, 0) unknown,
    /// (1, 1) not to be asked again.
    static STACK: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// This thread's stack bounds, asked of the thread library once per thread.
fn stack_bounds() -> Option<(usize, usize)> {
    let known = STACK.with(Cell::get);
    match known {
        (0, 0) => {}
        (1, 1) => return None,
        bounds => return Some(bounds),
    }
    // SAFETY: a zeroed attribute object is what pthread_getattr_np fills.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    let (mut addr, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
    // SAFETY: reading this thread's attributes into `attr`, then its stack,
    // then releasing `attr`.
    let ok = unsafe {
        libc::pthread_getattr_np(libc::pthread_self(), &mut attr) == 0 && {
            let got = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
            libc::pthread_attr_destroy(&mut attr);
            got
        }
    };
    let bounds = if ok && !addr.is_null() {
        (addr as usize, addr as usize + size)
    } else {
        (1, 1)
    };
    STACK.with(|cell| cell.set(bounds));
    (bounds != (1, 1)).then_some(bounds)
}

/// The caller library for a wrapper entered with stack pointer `sp` (the
/// address of its return address; 0 where the stub could not tell).
pub fn caller_id(sp: usize) -> u32 {
    if sp == 0 {
        return walk().map_or(0, |(id, _)| id);
    }
    // SAFETY: `sp` is the wrapper's stack pointer at entry: its return
    // address is there.
    let immediate = unsafe { *(sp as *const usize) };
    let id = library_of(immediate);
    if id != 0 && !is_cuda(id) {
        return id;
    }
    if let (Some(offset), Some((low, high))) = (learned(immediate), stack_bounds())
        && sp >= low
        && sp + offset + 8 <= high
    {
        // SAFETY: inside this thread's stack, above the stack pointer.
        let word = unsafe { *((sp + offset) as *const usize) };
        let found = library_of(word);
        if found != 0 && class_of(found) == OTHER {
            return found;
        }
    }
    match walk() {
        Some((found, slot)) => {
            if let Some(slot) = slot
                && slot > sp
                && slot - sp <= MAX_OFFSET
            {
                learn(immediate, slot - sp);
            }
            found
        }
        None => id,
    }
}

#[repr(C)]
struct Walk {
    frames: usize,
    /// A frame of this library was passed: frames before it are the
    /// unwinder's own.
    passed_own: bool,
    /// The previous frame's canonical frame address: the frame after it
    /// returns to the address stored just below it.
    previous_cfa: usize,
    /// The library found, and where its return address is stored.
    found: Option<(u32, Option<usize>)>,
}

unsafe extern "C" {
    fn _Unwind_Backtrace(
        trace: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(context: *mut c_void) -> usize;
    fn _Unwind_GetCFA(context: *mut c_void) -> usize;
}

/// `_URC_NO_REASON`: go on.
const UNWIND_CONTINUE: c_int = 0;
/// `_URC_NORMAL_STOP`: stop here.
const UNWIND_STOP: c_int = 4;

/// # Safety
///
/// Called by `_Unwind_Backtrace` only: `context` is its context of the frame
/// being visited, and `arg` the `Walk` that `walk` passed, alive for the call.
unsafe extern "C" fn visit(context: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` that `walk` passed, alive for the call.
    let walk = unsafe { &mut *arg.cast::<Walk>() };
    walk.frames += 1;
    // SAFETY: the unwinder's context for the frame being visited.
    let (ip, cfa) = unsafe { (_Unwind_GetIP(context), _Unwind_GetCFA(context)) };
    let id = library_of(ip);
    match class_of(id) {
        OWN => walk.passed_own = true,
        CUDA => {}
        _ if id != 0 && walk.passed_own => {
            // x86-64: a call pushes its return address just below the
            // caller's stack pointer, which is the callee's CFA. Which CFA a
            // context holds when it is visited is the unwinder's business:
            // take the one below which `ip` is stored.
            let slot = [cfa, walk.previous_cfa]
                .into_iter()
                .filter_map(|cfa| cfa.checked_sub(8))
                .find(|&slot| {
                    // SAFETY: just below a live frame's CFA, on this thread's
                    // stack.
                    slot != 0
                        && cfg!(target_arch = "x86_64")
                        && unsafe { *(slot as *const usize) } == ip
                });
            walk.found = Some((id, slot));
            return UNWIND_STOP;
        }
        _ => {}
    }
    walk.previous_cfa = cfa;
    if walk.frames >= MAX_FRAMES {
        UNWIND_STOP
    } else {
        UNWIND_CONTINUE
    }
}

/// The first frame of the stack outside CUDA's libraries and this one, and
/// where its return address is stored.
fn walk() -> Option<(u32, Option<usize>)> {
    let mut walk = Walk {
        frames: 0,
        passed_own: false,
        previous_cfa: 0,
        found: None,
    };
    // SAFETY: `visit` matches the callback type and `walk` outlives the call.
    unsafe { _Unwind_Backtrace(visit, (&raw mut walk).cast::<c_void>()) };
    walk.found
}

/// A wrapper entered with its stack pointer: a stub that puts the stack
/// pointer at entry (where its return address is) in the register after its
/// arguments and jumps to the Rust function taking it as its last argument (x86-64 System V: the
/// registers are rdi, rsi, rdx, rcx, r8, r9; every wrapped allocation call
/// has at most five arguments). The jump keeps the stack as the caller
/// left it, so the Rust function returns straight to the caller.
/// `export` makes the stub the exported symbol of its name.
#[cfg(target_arch = "x86_64")]
macro_rules! with_caller {
    (export $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $inner:path) => {
        /// # Safety
        ///
        /// The driver's contract for this ABI: the arguments are valid as the
        /// driver requires them.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::driver::CuResult {
            core::arch::naked_asm!(
                concat!("mov ", stringify!($reg), ", rsp"),
                "jmp {inner}",
                inner = sym $inner,
            )
        }
    };
    (local $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $inner:path) => {
        /// # Safety
        ///
        /// The driver's contract for this ABI: the arguments are valid as the
        /// driver requires them.
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::driver::CuResult {
            core::arch::naked_asm!(
                concat!("mov ", stringify!($reg), ", rsp"),
                "jmp {inner}",
                inner = sym $inner,
            )
        }
    };
}

/// Elsewhere the wrapper cannot see its stack pointer: it passes 0, and the
/// caller is found by walking the stack.
#[cfg(not(target_arch = "x86_64"))]
macro_rules! with_caller {
    (export $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $inner:path) => {
        /// # Safety
        ///
        /// The driver's contract for this ABI: the arguments are valid as the
        /// driver requires them.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::driver::CuResult {
            // SAFETY: the same arguments, passed on.
            unsafe { $inner($($arg,)* 0) }
        }
    };
    (local $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $inner:path) => {
        /// # Safety
        ///
        /// The driver's contract for this ABI: the arguments are valid as the
        /// driver requires them.
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::driver::CuResult {
            // SAFETY: the same arguments, passed on.
            unsafe { $inner($($arg,)* 0) }
        }
    };
}
pub(crate) use with_caller;
