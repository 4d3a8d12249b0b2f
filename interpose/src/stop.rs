//! What a panic inside the interposer does: it is caught where it
//! happens, recording stops for good (every call still goes to the driver,
//! unrecorded), and it is said once on stderr. Nothing of it crosses into
//! the program.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

/// A test aid, never set by `cudamem run`: the recorder panics on the
/// record after this many (to show that a panic leaves the program as it
/// was).
pub const TEST_PANIC_VAR: &str = "CUDAMEM_TEST_PANIC_AFTER";

/// A test aid, never set by `cudamem run`: milliseconds each of the
/// interposer's one-time setup steps lingers (to show that a `fork` in the
/// middle of one leaves a child that does not hang).
pub const TEST_SLOW_SETUP_VAR: &str = "CUDAMEM_TEST_SLOW_SETUP_MS";

/// Linger as [`TEST_SLOW_SETUP_VAR`] asks, if it is set.
pub fn slow_setup_for_test() {
    let ms = std::env::var_os(TEST_SLOW_SETUP_VAR)
        .and_then(|value| value.to_str()?.parse::<u64>().ok())
        .unwrap_or(0);
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms.min(1000)));
    }
}

/// Set after a panic inside the recorder: nothing is recorded any more, and
/// every call goes straight to the driver.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// Run `f` unless recording stopped; a panic inside it stops recording
/// (said once on stderr) instead of crossing into the program.
pub fn guarded<R>(f: impl FnOnce() -> R) -> Option<R> {
    if STOPPED.load(Ordering::Relaxed) {
        return None;
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => Some(value),
        Err(_) => {
            stop("an internal error");
            None
        }
    }
}

/// Stop recording for good, saying why once.
pub fn stop(why: &str) {
    if !STOPPED.swap(true, Ordering::AcqRel) {
        print(&format!(
            "cudamem: the interposer stopped recording after {why}; the program goes on, \
             its driver calls unrecorded from here\n"
        ));
    }
}

/// Stop recording without a word (a forked child that cannot record).
pub fn stop_quietly() {
    STOPPED.store(true, Ordering::Release);
}

/// Whether recording has stopped.
pub fn stopped() -> bool {
    STOPPED.load(Ordering::Relaxed)
}

/// Print an explanation on stderr, in one write where it fits.
pub fn print(text: &str) {
    let _no_cancel = crate::thread::NoCancel::hold();
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writing our own buffer to descriptor 2.
        let wrote = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if wrote <= 0 {
            return;
        }
        rest = &rest[wrote as usize..];
    }
}
