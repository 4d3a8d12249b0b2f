//! This thread's kernel id, and the clock records are stamped with.

use std::cell::Cell;

thread_local! {
    static THREAD: Cell<u32> = const { Cell::new(0) };
}

/// This thread's kernel id, asked of the kernel once per thread.
pub fn thread_id() -> u32 {
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
