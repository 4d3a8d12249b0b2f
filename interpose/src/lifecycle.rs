//! The process's life as the recorder needs it: `fork` (the child writes
//! its own log), exit (a last reading and the exit record), the last
//! destructor (the log cut to its records), and fatal signals (recorded,
//! then passed on to whatever handler the program had).
//!
//! Set up by the recorder's first use, not by a constructor.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::recorder;

/// The signals whose default is to end the process, recorded on the way.
/// (Terminal interrupts are left alone: programs commonly handle them, and
/// the log loses nothing when they end the process.)
const FATAL: [c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
    libc::SIGTERM,
];

static SET_UP: AtomicBool = AtomicBool::new(false);

/// The handlers the program had, per signal number (set once, before
/// this library's handler is installed for that signal).
static PREVIOUS: [OnceLock<libc::sigaction>; 32] = [const { OnceLock::new() }; 32];

extern "C" fn prepare() {
    recorder::before_fork();
}

extern "C" fn parent() {
    recorder::after_fork_parent();
}

extern "C" fn child() {
    recorder::after_fork_child();
}

extern "C" fn at_exit() {
    recorder::exiting();
}

extern "C" fn at_fini() {
    recorder::finished();
}

/// Runs after every `atexit` handler and the destructors of the libraries
/// loaded after this one (a preloaded library is finalized late).
#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = at_fini;

/// Install the fork, exit and signal handlers, once per process image.
pub fn set_up() {
    if SET_UP.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: registering functions of this library, which is never
    // unloaded (it is preloaded).
    unsafe {
        libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
        libc::atexit(at_exit);
    }
    for signal in FATAL {
        install(signal);
    }
}

fn install(signal: c_int) {
    // SAFETY: a zeroed sigaction is a valid "no handler" value to read into.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reading the current action of a valid signal.
    if unsafe { libc::sigaction(signal, std::ptr::null(), &mut old) } != 0 {
        return;
    }
    if old.sa_sigaction == libc::SIG_IGN {
        // The program ignores it: it does not end the process.
        return;
    }
    if PREVIOUS[signal as usize].set(old).is_err() {
        return;
    }
    // SAFETY: as above, a zeroed sigaction is valid to fill in.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_signal as *const () as usize;
    // Keep the program's restart behaviour: handled signals must interrupt
    // (or not) the system calls they interrupted before.
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | (old.sa_flags & libc::SA_RESTART);
    // SAFETY: the set is ours to fill.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: installing a handler of the right type for a valid signal.
    unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
}

extern "C" fn on_signal(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    recorder::signaled(signal);
    let Some(&previous) = PREVIOUS.get(signal as usize).and_then(OnceLock::get) else {
        return;
    };
    if previous.sa_sigaction == libc::SIG_DFL {
        // Put the default back and raise the signal again: it is blocked
        // while this handler runs, and ends the process as it would have
        // the moment the handler returns.
        // SAFETY: restoring the action read at installation, then raising.
        unsafe {
            libc::sigaction(signal, &previous, std::ptr::null_mut());
            libc::raise(signal);
        }
        return;
    }
    if previous.sa_flags & libc::SA_SIGINFO != 0 {
        let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            // SAFETY: SA_SIGINFO says the program's handler has this type.
            unsafe { std::mem::transmute(previous.sa_sigaction) };
        handler(signal, info, context);
    } else {
        // SAFETY: without SA_SIGINFO, the program's handler takes the
        // signal number alone.
        let handler: extern "C" fn(c_int) = unsafe { std::mem::transmute(previous.sa_sigaction) };
        handler(signal);
    }
}
