//! The process's life as the recorder needs it: `fork` (the child writes
//! its own log), exit (a last reading and the exit record), the last
//! destructor (the log cut to its records), and fatal signals (recorded,
//! then passed on to whatever the program asked for).
//!
//! The fork handlers are registered when the library is loaded, before any
//! lock exists (registered later, inside the lock, a `fork` on another
//! thread could copy the lock held into a child that never releases it).
//! Exit and signal handlers are installed by the recorder's first use.
//!
//! Signals stay the program's: the interposer's handler for a fatal signal
//! is installed with the flags and mask of the program's action (so
//! `SA_RESETHAND`, `SA_NODEFER` and the mask act as they would alone),
//! calls the program's handler as the kernel would have, and the exported
//! [`sigaction`] and [`signal`] answer and change the program's action,
//! never showing the interposer's.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::driver;
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

/// Signal numbers the tables below hold (1 to 64).
const SIGNALS: usize = 65;

/// `SA_RESTORER`: set by the C library on every action it installs.
const SA_RESTORER: c_int = 0x0400_0000;

/// `sigset_t` as words (the kernel's and the C library's layout).
const MASK_WORDS: usize = size_of::<libc::sigset_t>() / 8;
const _: () = assert!(size_of::<libc::sigset_t>() == MASK_WORDS * 8);

static SET_UP: AtomicBool = AtomicBool::new(false);

/// Per signal: whether the kernel's action is the interposer's handler.
static INSTALLED: [AtomicBool; SIGNALS] = [const { AtomicBool::new(false) }; SIGNALS];

/// An action, readable in a signal handler without a lock.
struct Action {
    handler: AtomicUsize,
    flags: AtomicI32,
    mask: [AtomicU64; MASK_WORDS],
    restorer: AtomicUsize,
}

impl Action {
    const fn new() -> Action {
        Action {
            handler: AtomicUsize::new(0),
            flags: AtomicI32::new(0),
            mask: [const { AtomicU64::new(0) }; MASK_WORDS],
            restorer: AtomicUsize::new(0),
        }
    }

    fn store(&self, action: &libc::sigaction) {
        // SAFETY: sigset_t is plain words (checked above).
        let words: [u64; MASK_WORDS] = unsafe { std::mem::transmute_copy(&action.sa_mask) };
        for (slot, word) in self.mask.iter().zip(words) {
            slot.store(word, Ordering::Relaxed);
        }
        self.flags.store(action.sa_flags, Ordering::Relaxed);
        self.restorer.store(
            action.sa_restorer.map_or(0, |f| f as usize),
            Ordering::Relaxed,
        );
        self.handler.store(action.sa_sigaction, Ordering::Release);
    }

    fn load(&self) -> libc::sigaction {
        // SAFETY: a zeroed sigaction is a valid value to fill in.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = self.handler.load(Ordering::Acquire);
        action.sa_flags = self.flags.load(Ordering::Relaxed);
        let words: [u64; MASK_WORDS] =
            std::array::from_fn(|at| self.mask[at].load(Ordering::Relaxed));
        // SAFETY: as in `store`.
        action.sa_mask = unsafe { std::mem::transmute_copy(&words) };
        let restorer = self.restorer.load(Ordering::Relaxed);
        // SAFETY: the C library's restorer read from the kernel, or none.
        action.sa_restorer = (restorer != 0)
            .then(|| unsafe { std::mem::transmute::<usize, extern "C" fn()>(restorer) });
        action
    }
}

/// Per signal: the program's action while the interposer's handler is
/// installed (what the program's `sigaction` reads).
static PROGRAM: [Action; SIGNALS] = [const { Action::new() }; SIGNALS];

extern "C" fn prepare() {
    recorder::before_fork();
}

extern "C" fn parent() {
    recorder::after_fork_parent();
}

extern "C" fn child() {
    // A child these handlers saw is not taken for a raw copy.
    crate::thread::arm_copy_page();
    recorder::after_fork_child();
}

extern "C" fn at_exit() {
    recorder::exiting();
}

extern "C" fn at_fini() {
    recorder::finished();
}

/// At load: the fork handlers, a panic hook that prints nothing (a panic
/// inside the interposer is caught, and said once, by the recorder), and
/// the C library's `dlvsym` and `dlsym`, found now, before the program has
/// threads: the search walks the loaded objects under the loader's list
/// lock, which a child forked while another thread held it never gets back
/// (the C library does not reset it in the child), so that the child's own
/// walks (a C++ exception, a backtrace) would wait for ever.
extern "C" fn at_load() {
    // SAFETY: registering functions of this library, which is never
    // unloaded (it is preloaded).
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    crate::thread::arm_copy_page();
    std::panic::set_hook(Box::new(|_| {}));
    driver::init_real_dlsym();
}

/// Runs when the library is loaded, before the program's constructors.
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = at_load;

/// Runs after every `atexit` handler and the destructors of the libraries
/// loaded after this one (a preloaded library is finalized late).
#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = at_fini;

/// Install the exit and signal handlers, once per process image.
pub fn set_up() {
    if SET_UP.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: registering a function of this library, never unloaded.
    unsafe { libc::atexit(at_exit) };
    for signal in FATAL {
        install(signal);
    }
}

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
type SignalFn = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;

static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);
static REAL_SIGNAL: AtomicUsize = AtomicUsize::new(0);

/// The C library's function `name`, the next after this library.
fn next(cache: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let known = cache.load(Ordering::Acquire);
    if known != 0 {
        return known;
    }
    let found = driver::real_dlsym(libc::RTLD_NEXT, name) as usize;
    cache.store(found, Ordering::Release);
    found
}

/// The C library's `sigaction`.
///
/// # Safety
/// As `sigaction(2)`: `act` and `old` are null or valid.
unsafe fn real_sigaction(
    signal: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    match next(&REAL_SIGACTION, c"sigaction") {
        0 => -1,
        // SAFETY: the C library's sigaction, of this type; the caller's
        // pointers.
        addr => unsafe { std::mem::transmute::<usize, SigactionFn>(addr)(signal, act, old) },
    }
}

fn slot(signal: c_int) -> Option<usize> {
    usize::try_from(signal)
        .ok()
        .filter(|&at| at > 0 && at < SIGNALS)
}

fn install(signal: c_int) {
    let Some(at) = slot(signal) else { return };
    // SAFETY: a zeroed sigaction is a valid "no handler" value to read into.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reading the current action of a valid signal.
    if unsafe { real_sigaction(signal, std::ptr::null(), &mut old) } != 0 {
        return;
    }
    if old.sa_sigaction == libc::SIG_IGN {
        // The program ignores it: it does not end the process.
        return;
    }
    PROGRAM[at].store(&old);
    if install_over(signal, &old) {
        INSTALLED[at].store(true, Ordering::Release);
    }
}

/// Make the interposer's handler the kernel's action for `signal`, acting
/// as the program's `action` would: its flags (delivery with `SA_SIGINFO`
/// added, to reach the program's handler with what it asked for) and mask.
fn install_over(signal: c_int, action: &libc::sigaction) -> bool {
    // SAFETY: as above, a zeroed sigaction is valid to fill in.
    let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
    ours.sa_sigaction = on_signal as *const () as usize;
    ours.sa_mask = action.sa_mask;
    ours.sa_flags = if action.sa_sigaction == libc::SIG_DFL {
        // Only the interposer's handler runs: it puts the default back and
        // raises again, blocked until it returns.
        libc::SA_SIGINFO | libc::SA_ONSTACK
    } else {
        (action.sa_flags & !SA_RESTORER) | libc::SA_SIGINFO
    };
    // SAFETY: installing a handler of the right type for a valid signal.
    unsafe { real_sigaction(signal, &ours, std::ptr::null_mut()) == 0 }
}

/// `sigaction`: for a fatal signal the interposer watches, the program's
/// action is read and changed here (its handler reached through the
/// interposer's); otherwise the C library's.
///
/// # Safety
/// As `sigaction(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(
    signal: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let Some(at) = slot(signal).filter(|&at| INSTALLED[at].load(Ordering::Acquire)) else {
        // SAFETY: the program's arguments.
        return unsafe { real_sigaction(signal, act, old) };
    };
    let previous = PROGRAM[at].load();
    if !act.is_null() {
        // SAFETY: the program passed a valid action.
        let mut new = unsafe { *act };
        if new.sa_sigaction == libc::SIG_IGN {
            // Ignored, the signal ends nothing: the program's action alone.
            INSTALLED[at].store(false, Ordering::Release);
            // SAFETY: the program's action and our buffer for the old one.
            let done = unsafe { real_sigaction(signal, &new, std::ptr::null_mut()) };
            if done != 0 {
                INSTALLED[at].store(true, Ordering::Release);
                return done;
            }
        } else if !install_over(signal, &new) {
            // SAFETY: the program's arguments: the C library says why.
            return unsafe { real_sigaction(signal, act, old) };
        }
        // What the C library would have stored: its restorer with it.
        // SAFETY: a zeroed sigaction is valid to read into.
        let mut kernel: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reading the action just installed.
        unsafe { real_sigaction(signal, std::ptr::null(), &mut kernel) };
        new.sa_flags |= kernel.sa_flags & SA_RESTORER;
        new.sa_restorer = kernel.sa_restorer;
        PROGRAM[at].store(&new);
    }
    if !old.is_null() {
        // SAFETY: the program passed a valid buffer.
        unsafe { *old = previous };
    }
    0
}

/// `signal`: as the C library's (BSD semantics: the signal blocked in its
/// handler, system calls restarted), through [`sigaction`] for a signal
/// the interposer watches.
///
/// # Safety
/// As `signal(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if !slot(signal).is_some_and(|at| INSTALLED[at].load(Ordering::Acquire)) {
        return match next(&REAL_SIGNAL, c"signal") {
            0 => libc::SIG_ERR,
            // SAFETY: the C library's signal, of this type.
            addr => unsafe { std::mem::transmute::<usize, SignalFn>(addr)(signal, handler) },
        };
    }
    // SAFETY: a zeroed sigaction is valid to fill in.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: the set is ours.
    unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaddset(&mut act.sa_mask, signal);
    }
    // SAFETY: a zeroed sigaction is valid to read into.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: our own valid action and buffer.
    if unsafe { sigaction(signal, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

extern "C" fn on_signal(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    recorder::signaled(signal);
    let Some(at) = slot(signal) else { return };
    let program = PROGRAM[at].load();
    if program.sa_flags & libc::SA_RESETHAND != 0 {
        // The kernel put the default back as it delivered this: the
        // program's action is the default now, and no longer ours.
        INSTALLED[at].store(false, Ordering::Release);
        let mut reset = program;
        reset.sa_sigaction = libc::SIG_DFL;
        PROGRAM[at].store(&reset);
    }
    if program.sa_sigaction == libc::SIG_DFL {
        // Put the default back and raise the signal again: it is blocked
        // while this handler runs, and ends the process as it would have
        // the moment the handler returns.
        INSTALLED[at].store(false, Ordering::Release);
        // SAFETY: restoring the program's (default) action, then raising.
        unsafe {
            real_sigaction(signal, &program, std::ptr::null_mut());
            libc::raise(signal);
        }
        return;
    }
    if program.sa_sigaction == libc::SIG_IGN {
        return;
    }
    if program.sa_flags & libc::SA_SIGINFO != 0 {
        let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            // SAFETY: SA_SIGINFO says the program's handler has this type.
            unsafe { std::mem::transmute(program.sa_sigaction) };
        handler(signal, info, context);
    } else {
        // SAFETY: without SA_SIGINFO, the program's handler takes the
        // signal number alone.
        let handler: extern "C" fn(c_int) = unsafe { std::mem::transmute(program.sa_sigaction) };
        handler(signal);
    }
}
