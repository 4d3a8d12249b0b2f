//! How a program reaches the wrappers when it does not link the driver:
//! `dlsym` and `cuGetProcAddress`.
//!
//! - `dlsym` is answered first by a stub that jumps straight to the real
//!   `dlsym` for every name not starting with `cu` and for every
//!   `RTLD_NEXT` lookup, so the real one sees the program's own return
//!   address (which `RTLD_NEXT` depends on) and nothing else pays. A `cu`
//!   name the driver exports and the interposer wraps is answered with the
//!   wrapper; a wrapped name the driver lacks, or that the scope searched
//!   would not reach without this library (a driver loaded `RTLD_LOCAL`
//!   and `RTLD_DEFAULT`), stays missing.
//! - `cuGetProcAddress` (and `_v2`) asks the driver first, and for a name
//!   whose ABI is wrapped hands back the wrapper of the ABI the driver's
//!   pointer is: the wrapper of the export with that very address, or, for
//!   a pointer that is no export, the ABI the driver's published version
//!   table gives for the requested version (keyed by name and version:
//!   `cuMemAlloc` at 3020 and later is `cuMemAlloc_v2`). Anything else is
//!   handed on as the driver gave it.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::Ordering;

use trace::event::ResolveHow;

use crate::driver::{self, CuResult, PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, REAL_DLSYM, SUCCESS};
use crate::hooks::{ENTRIES, Entry, Seen, hook, key_of, real};
use crate::recorder;

/// The newest `cudaVersion` whose ABIs the version table is known to hold.
/// A request for a newer one is handed on unwrapped unless its pointer is
/// an export, since a newer ABI of the same name may exist there.
pub const TABLE_NEWEST: c_int = 13000;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// `dlsym`: see the module docs.
///
/// # Safety
///
/// `dlsym`'s contract: `handle` is a handle `dlopen` returned or a
/// pseudo-handle (`RTLD_DEFAULT`, `RTLD_NEXT`), and `symbol` a NUL-terminated string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "2:",
        // RTLD_NEXT: only the real dlsym can see whose next it is.
        "cmp rdi, -1",
        "je 4f",
        "test rsi, rsi",
        "jz 4f",
        "cmp byte ptr [rsi], 0x63",
        "jne 4f",
        "cmp byte ptr [rsi + 1], 0x75",
        "jne 4f",
        "jmp {driver_name}",
        "4:",
        "jmp rax",
        // Not found yet (a lookup before this library's constructor ran):
        // find the real dlsym, keeping the arguments.
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {init}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jnz 2b",
        "xor eax, eax",
        "ret",
        real = sym REAL_DLSYM,
        driver_name = sym dlsym_driver_name,
        init = sym driver::init_real_dlsym,
    )
}

/// `dlsym` elsewhere: the same answers, with `RTLD_NEXT` lookups seen from
/// this library rather than the caller.
///
/// # Safety
///
/// `dlsym`'s contract: `handle` is a handle `dlopen` returned or a
/// pseudo-handle (`RTLD_DEFAULT`, `RTLD_NEXT`), and `symbol` a NUL-terminated string.
#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: the program's arguments, passed on.
    unsafe { dlsym_driver_name(handle, symbol) }
}

/// `dlvsym`: the real one, except that an `RTLD_NEXT` lookup of a C
/// library function this library also defines (`dlsym`, `dlvsym`,
/// `dlopen`, `sigaction`, `signal`) answers this library's, as the
/// loader's own binding does. A program's wrapper of `dlsym` that finds
/// the next one through `dlvsym` (the C library's versioned lookup skips
/// an export without that version) then reaches this library's and keeps
/// its answers, functions the driver lacks missing included.
///
/// # Safety
///
/// `dlvsym`'s contract: `handle` is a handle `dlopen` returned or a
/// pseudo-handle, and `symbol` and `version` NUL-terminated strings.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    core::arch::naked_asm!(
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "2:",
        "cmp rdi, -1",
        "jne 4f",
        // RTLD_NEXT: this library's own export, or (0) the real dlvsym,
        // which sees whose next it is from the program's return address.
        "push rdi",
        "push rsi",
        "push rdx",
        "mov rdi, rsi",
        "mov rsi, rdx",
        "call {next}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 5f",
        "mov rax, qword ptr [rip + {real}]",
        "4:",
        "jmp rax",
        "5:",
        "ret",
        // Not found yet (a lookup before this library's constructor ran):
        // find the real dlvsym, keeping the arguments.
        "3:",
        "push rdi",
        "push rsi",
        "push rdx",
        "call {init}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jnz 2b",
        "xor eax, eax",
        "ret",
        real = sym driver::REAL_DLVSYM,
        next = sym dlvsym_next,
        init = sym driver::init_real_dlvsym,
    )
}

/// `dlvsym` elsewhere: the same answers, with `RTLD_NEXT` lookups of other
/// names seen from this library rather than the caller.
///
/// # Safety
///
/// `dlvsym`'s contract: `handle` is a handle `dlopen` returned or a
/// pseudo-handle, and `symbol` and `version` NUL-terminated strings.
#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    if handle == libc::RTLD_NEXT {
        let ours = dlvsym_next(symbol, version);
        if ours != 0 {
            return ours as *mut c_void;
        }
    }
    match driver::real_dlvsym_fn() {
        // SAFETY: the program's arguments, passed on.
        Some(real) => unsafe { real(handle, symbol, version) },
        None => std::ptr::null_mut(),
    }
}

/// What `dlvsym(RTLD_NEXT, symbol, version)` answers when it is not the
/// real one's: this library's export of `symbol`, when it defines one and
/// the C library defines `symbol` at `version`; else 0.
extern "C" fn dlvsym_next(symbol: *const c_char, version: *const c_char) -> usize {
    if symbol.is_null() || version.is_null() {
        return 0;
    }
    // Not the interposer's stop: the program's lookups are answered after
    // one too. A panic (none is expected) leaves the real dlvsym's answer.
    std::panic::catch_unwind(|| {
        // SAFETY: the program's C strings (dlvsym's contract).
        let (name, version) = unsafe { (CStr::from_ptr(symbol), CStr::from_ptr(version)) };
        let ours = own_export(name.to_bytes())?;
        let theirs = driver::real_dlvsym(libc::RTLD_NEXT, name, version);
        (!theirs.is_null()).then_some(ours)
    })
    .ok()
    .flatten()
    .unwrap_or(0)
}

/// Where this library's function that stands for the C library's `name`
/// is: its own code, whatever was preloaded before it (exports bind to
/// this library's own definitions: build.rs).
fn own_export(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"dlsym" => dlsym as *const () as usize,
        b"dlvsym" => dlvsym as *const () as usize,
        #[cfg(target_arch = "x86_64")]
        b"dlopen" => crate::loading::dlopen as *const () as usize,
        b"sigaction" => crate::lifecycle::sigaction as *const () as usize,
        b"signal" => crate::lifecycle::signal as *const () as usize,
        _ => return None,
    })
}

fn real_dlsym_fn() -> Option<DlsymFn> {
    driver::init_real_dlsym();
    match REAL_DLSYM.load(Ordering::Acquire) {
        0 => None,
        // SAFETY: glibc's dlsym, of this type.
        addr => Some(unsafe { std::mem::transmute::<usize, DlsymFn>(addr) }),
    }
}

/// `dlsym` of a name that starts with `cu`.
///
/// # Safety
///
/// `dlsym`'s contract: `handle` is a handle `dlopen` returned or a
/// pseudo-handle (`RTLD_DEFAULT`, `RTLD_NEXT`), and `symbol` a NUL-terminated string.
unsafe extern "C" fn dlsym_driver_name(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = real_dlsym_fn() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the program's arguments.
    let found = unsafe { real(handle, symbol) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: a non-null C string from the program; a panic in choosing
    // the answer leaves the real dlsym's.
    crate::stop::guarded(|| unsafe { answer_dlsym(real, symbol, found) }).unwrap_or(found)
}

/// What `dlsym` answers for `symbol`, which the real one found at `found`.
///
/// # Safety
/// `symbol` is a C string.
unsafe fn answer_dlsym(real: DlsymFn, symbol: *const c_char, found: *mut c_void) -> *mut c_void {
    // SAFETY: the caller's C string.
    let name = unsafe { CStr::from_ptr(symbol) };
    let Some(entry) = ENTRIES.iter().find(|entry| entry.name == name) else {
        return found;
    };
    let Some(wrap) = &entry.wrap else {
        return found;
    };
    if found.cast_const() == wrap.export_fn {
        // The lookup found this library's own export (it searched a scope
        // this library is in: `RTLD_DEFAULT`, or the program's handle).
        // Alone, it would have found the next definition there, the one
        // after this library: the driver's (then the wrapper stands for
        // it), another library's (handed on as it is), or none (missing,
        // and dlerror says so: a driver loaded `RTLD_LOCAL`, or one that
        // lacks the function).
        let next = driver::real_dlsym(libc::RTLD_NEXT, name);
        if next.is_null() {
            return if entry.export.addr(false).is_some() {
                // Out of the scope searched: dlerror says so already.
                next
            } else {
                missing(real, symbol)
            };
        }
        if entry.export.addr(false) == Some(next as usize) {
            return found;
        }
        return next;
    }
    match entry.export.addr(false) {
        Some(export) if export == found as usize => wrap.export_fn.cast_mut(),
        _ => found,
    }
}

/// Null, with `dlerror` saying `symbol` is undefined: looked up where it is
/// not, the driver's own scope (or, without a driver, libc's). Never through
/// `RTLD_NEXT`, whose answer depends on the caller's address.
fn missing(real: DlsymFn, symbol: *const c_char) -> *mut c_void {
    let scope = driver::libcuda(false).or_else(|| {
        // SAFETY: dlopen of a constant name, loading nothing.
        let libc =
            unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        (!libc.is_null()).then_some(libc)
    });
    match scope {
        // SAFETY: a loaded object's handle and the program's C string.
        Some(handle) => unsafe { real(handle, symbol) },
        None => std::ptr::null_mut(),
    }
}

/// The wrapper to hand out for the driver's `pointer` to `symbol` at
/// `version` with `flags`, and how it was chosen; `None` for a name whose
/// ABIs are not wrapped.
fn wrap_for(
    symbol: &str,
    pointer: usize,
    version: c_int,
    flags: u64,
) -> Option<(usize, ResolveHow)> {
    let candidates = || {
        ENTRIES
            .iter()
            .copied()
            .filter(move |entry| entry.base == symbol || entry.name.to_bytes() == symbol.as_bytes())
    };
    candidates().next()?;
    // A driver that takes its own functions' addresses through the symbol
    // table gets this library's exports (they come first): already wrapped.
    let ours = ENTRIES
        .iter()
        .filter_map(|entry| entry.wrap.as_ref())
        .any(|wrap| wrap.export_fn as usize == pointer || wrap.resolved_fn as usize == pointer);
    if ours {
        return Some((pointer, ResolveHow::Export));
    }
    // The pointer is an export: its own wrapper (or none, for an ABI that is
    // not recorded).
    for entry in candidates() {
        if entry.export.addr(false) == Some(pointer) {
            return Some(match &entry.wrap {
                Some(wrap) => (wrap.export_fn as usize, ResolveHow::Export),
                None => (pointer, ResolveHow::Unwrapped),
            });
        }
    }
    if version > TABLE_NEWEST {
        return Some((pointer, ResolveHow::Unwrapped));
    }
    let per_thread = flags & PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let newest = |ptsz: bool| -> Option<&'static Entry> {
        candidates()
            .filter(|entry| entry.ptsz == ptsz && entry.since <= version && entry.base == symbol)
            .max_by_key(|entry| entry.since)
    };
    let entry = if per_thread {
        newest(true).or_else(|| newest(false))
    } else {
        newest(false)
    };
    let Some(wrap) = entry.and_then(|entry| entry.wrap.as_ref()) else {
        return Some((pointer, ResolveHow::Unwrapped));
    };
    // One pointer per ABI: the first handed out is the one its resolved
    // wrapper calls; a different one later is passed on unwrapped.
    let slot = wrap.resolved;
    match slot.compare_exchange(0, pointer, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some((wrap.resolved_fn as usize, ResolveHow::Table)),
        Err(existing) if existing == pointer => {
            Some((wrap.resolved_fn as usize, ResolveHow::Table))
        }
        Err(_) => Some((pointer, ResolveHow::Unwrapped)),
    }
}

/// Answers recorded: (name, version, flags, pointer handed out). A library
/// that asks for the same entry point at every call of its own is recorded
/// once.
static ANSWERED: Seen<{ 1 << 12 }> = Seen::new();

/// After the driver answered `cuGetProcAddress(symbol)` with `*pfn`: put
/// the wrapper there instead, where there is one.
///
/// # Safety
/// `symbol` is a C string and `pfn` where the driver wrote its answer.
unsafe fn wrap_answer(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: the driver wrote `*pfn`; the program passed a C string.
    let (pointer, name) = unsafe { (*pfn as usize, CStr::from_ptr(symbol)) };
    let Ok(name) = name.to_str() else {
        return;
    };
    if pointer == 0 || !name.starts_with("cu") {
        return;
    }
    if let Some((handed, how)) = wrap_for(name, pointer, version, flags) {
        // SAFETY: the driver's answer slot, written back with a function of
        // the same ABI.
        unsafe { *pfn = handed as *mut c_void };
        let asked = (handed as u64) ^ ((version as u64) << 48) ^ flags.rotate_left(32);
        if ANSWERED.first(key_of(asked, name.as_bytes())) {
            recorder::resolved(name, version, flags, how);
        }
    }
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn get_proc_address(
    real: Option<usize>,
    _caller: usize,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    let real = real!(real, fn(*const c_char, *mut *mut c_void, c_int, u64));
    // SAFETY: the program's arguments.
    let result = unsafe { real(symbol, pfn, version, flags) };
    if result == SUCCESS {
        // SAFETY: as `wrap_answer` needs: the program's string, the driver's
        // answer (left as it is should choosing panic).
        crate::stop::guarded(|| unsafe { wrap_answer(symbol, pfn, version, flags) });
    }
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn get_proc_address_v2(
    real: Option<usize>,
    _caller: usize,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    let real = real!(
        real,
        fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int)
    );
    // SAFETY: the program's arguments.
    let result = unsafe { real(symbol, pfn, version, flags, status) };
    if result == SUCCESS {
        // SAFETY: as in `get_proc_address`.
        crate::stop::guarded(|| unsafe { wrap_answer(symbol, pfn, version, flags) });
    }
    result
}

hook!(plain cuGetProcAddress = "cuGetProcAddress" since 11030 ptsz false
    (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64)
    => get_proc_address);
hook!(plain cuGetProcAddress_v2 = "cuGetProcAddress" since 12000 ptsz false
    (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64,
     status: *mut c_int) => get_proc_address_v2);
