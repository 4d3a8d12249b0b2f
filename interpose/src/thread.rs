//! This thread's kernel id, the clock records are stamped with, and
//! whether this process is a copy that `fork`'s handlers never saw (a raw
//! `clone` without `CLONE_VM`).
//!
//! Such a copy is noticed through one page the kernel empties in every
//! copy of the process (`MADV_WIPEONFORK`, Linux 4.14): armed (non-zero) at
//! load and by the `fork` child handler, read at every thread id asked
//! for. Where the kernel refuses the advice, copies go unnoticed.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};

/// `PTHREAD_CANCEL_DISABLE` (glibc).
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

unsafe extern "C" {
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}

/// While alive, a `pthread_cancel` of this thread waits: the interposer's
/// own system calls (opening its log, writing to stderr, sleeping) and
/// driver calls are never where a thread of the program is cancelled (a
/// cancellation there would unwind through the interposer, holding its
/// lock). The cancellation acts at the program's next cancellation point,
/// as it would alone.
pub struct NoCancel(libc::c_int);

impl NoCancel {
    /// Hold cancellation off until dropped.
    pub fn hold() -> NoCancel {
        let mut old = 0;
        // SAFETY: sets this thread's cancel state, writing the old one to
        // our local.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        NoCancel(old)
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        let mut old = 0;
        // SAFETY: puts back the state `hold` found.
        unsafe { pthread_setcancelstate(self.0, &mut old) };
    }
}

/// `MADV_WIPEONFORK`.
const MADV_WIPEONFORK: libc::c_int = 18;

/// The page a copy finds empty (null: none could be made).
static COPY_PAGE: AtomicPtr<AtomicU8> = AtomicPtr::new(std::ptr::null_mut());

/// A copy was noticed and the recorder has not taken it yet.
static COPIED: AtomicBool = AtomicBool::new(false);

/// Make the page (at load) and arm it: this image is not a copy.
pub fn arm_copy_page() {
    let mut page = COPY_PAGE.load(Ordering::Acquire);
    if page.is_null() {
        // SAFETY: a fresh private anonymous page, owned by this static for
        // the life of the image.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return;
        }
        // SAFETY: advice on the page just mapped.
        if unsafe { libc::madvise(map, 4096, MADV_WIPEONFORK) } != 0 {
            // SAFETY: unmapping the page just mapped.
            unsafe { libc::munmap(map, 4096) };
            return;
        }
        page = map.cast();
        COPY_PAGE.store(page, Ordering::Release);
    }
    // SAFETY: the page is mapped for the life of the image; an AtomicU8
    // may live at any byte.
    unsafe { &*page }.store(1, Ordering::Release);
}

/// Whether this process is a copy no `fork` handler saw: true once, to the
/// first caller after the copy (the recorder, which makes the copy's own
/// log). The thread id is asked of the kernel anew.
#[inline(always)]
pub fn take_copy() -> bool {
    notice_copy();
    COPIED.load(Ordering::Relaxed) && COPIED.swap(false, Ordering::AcqRel)
}

#[inline(always)]
fn notice_copy() {
    let page = COPY_PAGE.load(Ordering::Relaxed);
    if page.is_null() {
        return;
    }
    // SAFETY: as in `arm_copy_page`.
    let armed = unsafe { &*page };
    if armed.load(Ordering::Relaxed) == 0 {
        noticed(armed);
    }
}

#[cold]
#[inline(never)]
fn noticed(armed: &AtomicU8) {
    armed.store(1, Ordering::Relaxed);
    forget_thread_id();
    // No record is formatted against the parent's start from here on.
    crate::recorder::forget_start();
    COPIED.store(true, Ordering::Release);
}

thread_local! {
    static THREAD: Cell<u32> = const { Cell::new(0) };
}

/// This thread's kernel id, asked of the kernel once per thread.
pub fn thread_id() -> u32 {
    notice_copy();
    THREAD.with(|cached| {
        let known = cached.get();
        if known != 0 {
            return known;
        }
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        cached.set(tid);
        tid
    })
}

/// Forget the cached thread id (a forked child's thread has a new one).
pub fn forget_thread_id() {
    THREAD.with(|cached| cached.set(0));
}

/// `CLOCK_MONOTONIC` now, nanoseconds (read through the vDSO: no system
/// call).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64).saturating_mul(1_000_000_000) + now.tv_nsec as u64
}
