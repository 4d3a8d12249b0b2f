//! The program's `dlopen` of the driver library, seen without changing it.
//!
//! `dlopen` is answered by a stub that notes the name of a driver library
//! asked for (a file named `libcuda.so…`, loaded for real, not a
//! `RTLD_NOLOAD` query) and then jumps to the real `dlopen` with the
//! program's own return address, so the loader searches as it would for
//! the program (the caller's `RUNPATH` and namespace) and nothing of its
//! answer changes. Whether the load worked is asked at exit: a process that
//! asked for the driver and has none loaded then writes a `driver-missing`
//! record ([`driver_missing`]).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};

use crate::driver;

#[cfg(target_arch = "x86_64")]
/// The real `dlopen` (0 until found).
static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);

/// The longest name kept, bytes.
const NAME_BYTES: usize = 256;

/// 0: no driver asked for; 1: a name being written; 2: `ASKED_NAME` holds it.
static ASKED: AtomicU8 = AtomicU8::new(0);
/// The process that asked (a forked child that never asked says nothing).
static ASKED_PID: AtomicU32 = AtomicU32::new(0);
/// How many bytes of `ASKED_NAME` are the name.
static ASKED_LEN: AtomicUsize = AtomicUsize::new(0);
static ASKED_NAME: [AtomicU8; NAME_BYTES] = [const { AtomicU8::new(0) }; NAME_BYTES];

/// `dlopen`: see the module docs.
///
/// # Safety
///
/// `dlopen`'s contract: `file` is null or a NUL-terminated string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        // The arguments are kept; `opening` sees them in place and answers
        // the real dlopen's address.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {opening}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        // The program's return address is on the stack again: the real
        // dlopen sees the program as its caller.
        "jmp rax",
        "2:",
        "xor eax, eax",
        "ret",
        opening = sym opening,
    )
}

#[cfg(target_arch = "x86_64")]
/// Note `file` when it names the driver, and answer the real `dlopen`.
extern "C" fn opening(file: *const c_char, mode: c_int) -> usize {
    if mode & libc::RTLD_NOLOAD == 0 && !file.is_null() {
        // SAFETY: the program's C string (dlopen's contract); a panic in
        // noting it leaves the call as it was.
        crate::stop::guarded(|| note(unsafe { CStr::from_ptr(file) }));
    }
    real_dlopen()
}

#[cfg(target_arch = "x86_64")]
fn real_dlopen() -> usize {
    let known = REAL_DLOPEN.load(Ordering::Acquire);
    if known != 0 {
        return known;
    }
    for version in driver::DL_VERSIONS {
        let found = driver::real_dlvsym(libc::RTLD_NEXT, c"dlopen", version);
        if !found.is_null() {
            REAL_DLOPEN.store(found as usize, Ordering::Release);
            return found as usize;
        }
    }
    0
}

/// Whether `name` names the driver library: its file name starts with
/// `libcuda.so`.
pub fn is_driver_name(name: &[u8]) -> bool {
    let file = name.rsplit(|&byte| byte == b'/').next().unwrap_or(name);
    file.starts_with(b"libcuda.so")
}

#[cfg(target_arch = "x86_64")]
/// Keep the first driver name this process asks for (no lock, no
/// allocation: `dlopen` may be called anywhere), and make sure the exit
/// handler runs.
fn note(file: &CStr) {
    let bytes = file.to_bytes();
    if !is_driver_name(bytes) {
        return;
    }
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    if ASKED_PID.load(Ordering::Acquire) == pid {
        return;
    }
    if ASKED.swap(1, Ordering::AcqRel) == 1 {
        return;
    }
    let len = bytes.len().min(NAME_BYTES);
    for (slot, &byte) in ASKED_NAME.iter().zip(&bytes[..len]) {
        slot.store(byte, Ordering::Relaxed);
    }
    ASKED_LEN.store(len, Ordering::Relaxed);
    ASKED_PID.store(pid, Ordering::Release);
    ASKED.store(2, Ordering::Release);
    crate::lifecycle::set_up();
}

/// At exit: the driver name this process asked for, when no driver library
/// is loaded now (`None` when it asked for none, or one is loaded).
pub fn driver_missing() -> Option<String> {
    if ASKED.load(Ordering::Acquire) != 2 {
        return None;
    }
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    if ASKED_PID.load(Ordering::Acquire) != pid || driver::libcuda(false).is_some() {
        return None;
    }
    let len = ASKED_LEN.load(Ordering::Relaxed);
    let bytes: Vec<u8> = ASKED_NAME[..len]
        .iter()
        .map(|slot| slot.load(Ordering::Relaxed))
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_are_told_by_their_file_name() {
        for name in [
            "libcuda.so.1",
            "libcuda.so",
            "/usr/lib64/libcuda.so.1",
            "x/libcuda.so.535",
        ] {
            assert!(is_driver_name(name.as_bytes()), "{name}");
        }
        for name in [
            "libcudart.so.13",
            "libcuda.so.1/x",
            "/libcuda/libc.so.6",
            "cuda.so",
            "",
        ] {
            assert!(!is_driver_name(name.as_bytes()), "{name}");
        }
    }
}
