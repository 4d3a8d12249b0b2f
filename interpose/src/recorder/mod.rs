//! The process's recorder: one lock around the log, the [`Accounting`] the
//! log's records build (so an out-of-memory explanation sees the process as
//! it is), and the moments free memory is read.
//!
//! Set up on first use (the first recorded call), never from a
//! constructor. Everything a wrapper needs outside the lock (naming its
//! caller, calling the driver) happens before or after taking it: the lock
//! is held for a record's worth of work, plus the readings of free memory
//! this module makes at chosen moments.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::os::unix::ffi::OsStrExt as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ctx::driver::result::OUT_OF_MEMORY as CUDA_ERROR_OUT_OF_MEMORY;
use trace::event::{
    Call, ContextHow, Event, FORMAT_VERSION, LimitKind, Line, MemInfoWhy, Record, ResolveHow,
    Window,
};
use trace::event_log::{
    DEFAULT_MAX_LOG_BYTES, LOG_DIR_VAR, MAX_LOG_BYTES_VAR, log_path, parse_max_bytes,
};
use trace::process::Accounting;

use crate::caller::caller_id;
use crate::driver::{self, read};
use crate::lifecycle;
use crate::lock::{Guard, Lock};
use crate::logfile::LogFile;
use crate::stop::{TEST_PANIC_VAR, guarded, print, stopped};
use crate::thread::monotonic_ns;
use crate::thread::thread_id;

mod copies;
mod oom;

use copies::copy_check;
pub use copies::{after_fork_child, after_fork_parent, before_fork};

/// At most one reading of free memory at a new peak of live bytes per this
/// many nanoseconds; a peak inside the interval is read before the next
/// free instead (live bytes are still at that peak then).
const PEAK_INTERVAL_NS: u64 = 5_000_000;

/// Out-of-memory returns explained in full; later ones get one line each.
const FULL_EXPLANATIONS: u64 = 8;

struct Peak {
    live: u64,
    last_read_ns: Option<u64>,
    pending: bool,
}

pub struct State {
    /// `CLOCK_MONOTONIC` when recording started, nanoseconds.
    start_ns: u64,
    log: Option<LogFile>,
    line: Line,
    accounting: Accounting,
    /// Loaded objects named so far: (load address, path); id = index + 1.
    libraries: Vec<(usize, String)>,
    /// Function and kernel handles -> their names, and whether the handle
    /// is a library's kernel (`CUkernel`) rather than a function.
    names: HashMap<u64, (String, bool)>,
    peak: Peak,
    out_of_memory: u64,
    async_seen: bool,
    /// Records written, and the one that panics (a test aid, see
    /// [`TEST_PANIC_VAR`]).
    records: u64,
    panic_at: Option<u64>,
}

/// How long the exit path waits for another thread's record (never for
/// this thread's).
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// How long a fatal signal's handler waits for the lock (`cudamem run`
/// tells an unrecorded one from the wait status).
const SIGNAL_WAIT: Duration = Duration::from_millis(20);

static STATE: Lock<Option<State>> = Lock::new(None);

/// Set in a forked child: the state is its parent's and is replaced on the
/// child's first record.
static FORKED: AtomicBool = AtomicBool::new(false);

/// Live device bytes, readable without the lock (for measurement windows).
static LIVE: AtomicU64 = AtomicU64::new(0);

/// The state's `start_ns`, readable without the lock (0: no state yet), so
/// that the hot paths can stamp and format their record before taking it.
static START_NS: AtomicU64 = AtomicU64::new(0);

/// Whether the state writes a log (records are formatted only then).
static LOGGING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Where the hot paths format their record, outside the lock.
    static LINE: RefCell<Line> = const { RefCell::new(Line::new()) };
}

fn exe_path() -> String {
    std::fs::read_link("/proc/self/exe")
        .map(|path| path.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl State {
    fn new(libraries: Vec<(usize, String)>, names: HashMap<u64, (String, bool)>) -> State {
        let log = open_log();
        // After an `exec`, the log goes on, and so does its time.
        let since_start = log
            .as_ref()
            .and_then(|log| log.last_time_ns)
            .map_or(0, |last| last + 1);
        let start_ns = monotonic_ns().saturating_sub(since_start).max(1);
        START_NS.store(start_ns, Ordering::Release);
        LOGGING.store(log.is_some(), Ordering::Release);
        let mut state = State {
            start_ns,
            log,
            line: Line::default(),
            accounting: Accounting::default(),
            libraries: Vec::new(),
            names,
            peak: Peak {
                live: 0,
                last_read_ns: None,
                pending: false,
            },
            out_of_memory: 0,
            async_seen: false,
            records: 0,
            panic_at: std::env::var(TEST_PANIC_VAR)
                .ok()
                .and_then(|text| text.parse().ok()),
        };
        // SAFETY: getpid and getppid cannot fail.
        let (pid, ppid) = unsafe { (libc::getpid() as u32, libc::getppid() as u32) };
        let exe = exe_path();
        state.emit(
            thread_id(),
            Event::Process {
                version: FORMAT_VERSION,
                pid,
                ppid,
                exe: exe.as_str().into(),
            },
        );
        // A forked child names the libraries its parent's ids mean again.
        for (base, path) in libraries {
            state.add_library(base, path);
        }
        state
    }

    fn now(&self) -> u64 {
        monotonic_ns().saturating_sub(self.start_ns)
    }

    fn emit(&mut self, thread: u32, event: Event<'_>) {
        let record = Record {
            time_ns: self.now(),
            thread,
            event,
        };
        self.emit_record(record);
    }

    /// Count a record, panicking where the test aid asks.
    fn count(&mut self) {
        self.records += 1;
        if self.panic_at.is_some_and(|at| self.records > at) {
            panic!("the panic {TEST_PANIC_VAR} asked for");
        }
    }

    /// Write and apply a record already stamped.
    fn emit_record(&mut self, record: Record<'_>) {
        self.count();
        let last = matches!(record.event, Event::Exit { .. } | Event::Signal { .. });
        if let Some(log) = &mut self.log {
            self.line.encode(&record);
            if last {
                log.append_final(self.line.as_bytes());
            } else {
                log.append(self.line.as_bytes());
            }
        }
        self.accounting.apply(&record);
    }

    /// Append a record formatted outside the lock (by [`record_fast`]) and
    /// apply it.
    fn append(&mut self, line: &Line, record: &Record<'_>) {
        self.count();
        if let Some(log) = &mut self.log {
            log.append(line.as_bytes());
        }
        self.accounting.apply(record);
    }

    fn add_library(&mut self, base: usize, path: String) -> u32 {
        self.libraries.push((base, path));
        let id = self.libraries.len() as u32;
        let path = self.libraries[id as usize - 1].1.clone();
        self.emit(
            thread_id(),
            Event::Library {
                id,
                path: path.as_str().into(),
            },
        );
        id
    }

    /// Read free memory now and record it.
    fn read(&mut self, why: MemInfoWhy, thread: u32) -> Option<(u64, u64)> {
        let (free, total) = read::mem_info()?;
        let device = read::current_device().unwrap_or(-1);
        let pool_reserved = if self.async_seen && device >= 0 {
            read::pool_reserved(device)
        } else {
            None
        };
        self.emit(
            thread,
            Event::MemInfo {
                why,
                device,
                free,
                total,
                pool_reserved,
            },
        );
        Some((free, total))
    }

    /// After live bytes grew: read at a new peak, or mark it for reading.
    /// `stream` is the stream of a stream-ordered allocation: work on it
    /// may be being captured into a graph, and then nothing is read (asked
    /// only when a reading is due, so the common call asks nothing).
    fn grew(&mut self, thread: u32, stream: Option<u64>) {
        let live = self.accounting.live_device_bytes();
        LIVE.store(live, Ordering::Relaxed);
        if live <= self.peak.live {
            return;
        }
        self.peak.live = live;
        let now = self.now();
        let due = self
            .peak
            .last_read_ns
            .is_none_or(|last| now.saturating_sub(last) >= PEAK_INTERVAL_NS)
            && !stream.is_some_and(|stream| read::capturing(stream as *mut c_void));
        if due {
            self.read(MemInfoWhy::Peak, thread);
            self.peak.last_read_ns = Some(now);
            self.peak.pending = false;
        } else {
            self.peak.pending = true;
        }
    }

    /// Before live bytes shrink: a peak not read yet is read now.
    fn shrinking(&mut self, thread: u32) {
        if self.peak.pending {
            self.peak.pending = false;
            self.peak.last_read_ns = Some(self.now());
            self.read(MemInfoWhy::Peak, thread);
        }
    }

    fn shrank(&mut self) {
        LIVE.store(self.accounting.live_device_bytes(), Ordering::Relaxed);
    }
}

fn open_log() -> Option<LogFile> {
    let dir = std::env::var_os(LOG_DIR_VAR).filter(|dir| !dir.is_empty())?;
    let max_bytes = std::env::var(MAX_LOG_BYTES_VAR)
        .ok()
        .and_then(|text| parse_max_bytes(&text))
        .unwrap_or(DEFAULT_MAX_LOG_BYTES);
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let path = log_path(std::path::Path::new(&dir), pid);
    let path = CString::new(path.as_os_str().as_bytes()).ok()?;
    LogFile::open(&path, max_bytes)
}

/// Run `f` on the recorder's state, setting it up on first use (and anew in
/// a forked child); `None` when recording stopped, or when this thread
/// holds the lock already (a signal handler interrupted a record: the
/// inner call is left unrecorded rather than waiting for ever).
fn with<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    if stopped() {
        return None;
    }
    guarded(|| {
        copy_check();
        let guard = STATE.lock()?;
        Some(with_guard(guard, f))
    })
    .flatten()
}

fn with_guard<R>(mut guard: Guard<'_, Option<State>>, f: impl FnOnce(&mut State) -> R) -> R {
    // A load first: the swap's write would be one more shared cache line
    // written by every call of every thread.
    if FORKED.load(Ordering::Acquire) && FORKED.swap(false, Ordering::AcqRel) {
        if let Some(parent) = guard.take() {
            if let Some(log) = parent.log {
                log.close();
            }
            *guard = Some(State::new(parent.libraries, parent.names));
        }
        LIVE.store(0, Ordering::Relaxed);
    }
    let state = guard.get_or_insert_with(|| {
        lifecycle::set_up();
        State::new(Vec::new(), HashMap::new())
    });
    f(state)
}

/// Record `event` with its line formatted before the lock is taken (the
/// hot paths: allocations and frees); `before` runs under the lock before
/// the record is appended, `after` once it is. `None` where [`with`] gives
/// none.
fn record_fast<R>(
    thread: u32,
    event: Event<'_>,
    before: impl FnOnce(&mut State),
    after: impl FnOnce(&mut State) -> R,
) -> Option<R> {
    guarded(|| record_fast_unguarded(thread, event, before, after)).flatten()
}

fn record_fast_unguarded<R>(
    thread: u32,
    event: Event<'_>,
    before: impl FnOnce(&mut State),
    after: impl FnOnce(&mut State) -> R,
) -> Option<R> {
    let start = START_NS.load(Ordering::Acquire);
    let formatted = start != 0 && LOGGING.load(Ordering::Acquire);
    let record = Record {
        time_ns: monotonic_ns().saturating_sub(start),
        thread,
        event,
    };
    let fast = formatted
        && LINE.with(|line| match line.try_borrow_mut() {
            Ok(mut line) => {
                line.encode(&record);
                true
            }
            // A signal handler interrupted this thread while it formatted.
            Err(_) => false,
        });
    if fast {
        LINE.with(|line| {
            let line = line.borrow();
            with(|state| {
                before(state);
                state.append(&line, &record);
                after(state)
            })
        })
    } else {
        with(|state| {
            before(state);
            // Stamped before the state (and its start) existed, or by its
            // parent's: stamp again.
            let time_ns = if start != state.start_ns {
                state.now()
            } else {
                record.time_ns
            };
            state.emit_record(Record { time_ns, ..record });
            after(state)
        })
    }
}

/// Records are stamped from this process's own start once it has one (a
/// copy of the process was noticed: its parent's start is not its own).
pub fn forget_start() {
    START_NS.store(0, Ordering::Release);
}

/// An allocation call returned: record it (`ptr` 0 on failure), and explain
/// an out-of-memory return before the caller sees it.
pub fn allocated(call: Call, ptr: u64, size: u64, stream: u64, immediate: usize, result: c_int) {
    let caller = guarded(|| caller_id(immediate)).unwrap_or(0);
    let thread = thread_id();
    let ordered = matches!(call, Call::MemAllocAsync | Call::MemAllocFromPoolAsync);
    let event = Event::Alloc {
        call,
        ptr,
        size,
        stream,
        caller,
        result,
    };
    let explanation = record_fast(
        thread,
        event,
        |state| {
            if matches!(call, Call::MemAllocAsync | Call::MemAllocFromPoolAsync) {
                state.async_seen = true;
            }
        },
        |state| {
            if result == 0 {
                state.grew(thread, ordered.then_some(stream));
            }
            (result == CUDA_ERROR_OUT_OF_MEMORY)
                .then(|| state.explain(call, Some(size), None, caller, thread))
        },
    )
    .flatten();
    if let Some(text) = explanation {
        print(&text);
    }
}

/// A free is about to be made: record it first (so no allocation that
/// reuses the pointer can come before it in the log). Returns what a
/// `free-failed` record needs, should the free fail.
pub fn freeing(call: Call, ptr: u64, stream: u64, immediate: usize) -> Option<(u64, u32)> {
    let caller = guarded(|| caller_id(immediate)).unwrap_or(0);
    let thread = thread_id();
    let mut block = None;
    record_fast(
        thread,
        Event::Free {
            call,
            ptr,
            stream,
            caller,
        },
        |state| {
            state.shrinking(thread);
            block = state.accounting.block_of(call, ptr);
        },
        State::shrank,
    );
    block
}

/// The free recorded by [`freeing`] failed: the block is live again.
pub fn free_failed(call: Call, ptr: u64, block: (u64, u32), result: c_int) {
    let thread = thread_id();
    with(|state| {
        state.emit(
            thread,
            Event::FreeFailed {
                call,
                ptr,
                size: block.0,
                caller: block.1,
                result,
            },
        );
        state.grew(thread, None);
    });
}

/// A VMM or other record that adds memory (or none) after its call.
pub fn after(event: Event<'_>, immediate: usize) {
    let caller = match &event {
        Event::Create { .. } => guarded(|| caller_id(immediate)).unwrap_or(0),
        _ => 0,
    };
    let thread = thread_id();
    let explanation = with(|state| {
        let mut event = event;
        let mut oom = None;
        if let Event::Create {
            caller: slot,
            size,
            result,
            ..
        } = &mut event
        {
            *slot = caller;
            if *result == CUDA_ERROR_OUT_OF_MEMORY {
                oom = Some(*size);
            }
        }
        state.emit(thread, event);
        state.grew(thread, None);
        oom.map(|size| state.explain(Call::MemCreate, Some(size), None, caller, thread))
    })
    .flatten();
    if let Some(text) = explanation {
        print(&text);
    }
}

/// A VMM record that gives memory back, recorded before its call.
pub fn before(event: Event<'_>) {
    let thread = thread_id();
    with(|state| {
        state.shrinking(thread);
        state.emit(thread, event);
        state.shrank();
    });
}

/// Free memory around a call, and how live bytes moved meanwhile.
pub struct Measure {
    free_before: Option<u64>,
    live_before: u64,
}

impl Measure {
    /// Read free memory before the call.
    pub fn start() -> Measure {
        Measure {
            free_before: read::free_bytes(),
            live_before: LIVE.load(Ordering::Relaxed),
        }
    }

    /// Read free memory after the call.
    pub fn finish(self) -> Window {
        let free_after = self.free_before.and(read::free_bytes());
        let live_after = LIVE.load(Ordering::Relaxed);
        Window {
            free_before: self.free_before,
            free_after,
            live_change: live_after as i64 - self.live_before as i64,
        }
    }
}

/// A call that may run out of memory without allocating (a load, a
/// launch, a limit): record `event`, explaining an out-of-memory return.
pub fn measured(event: Event<'_>, call: Call, request: Option<u64>, result: c_int) {
    let thread = thread_id();
    let limit = match event {
        Event::Limit { which, .. } => Some(which),
        _ => None,
    };
    let (explanation, unexplained) = with(|state| {
        state.emit(thread, event);
        let explanation = (result == CUDA_ERROR_OUT_OF_MEMORY)
            .then(|| state.explain(call, request, limit, 0, thread));
        (explanation, state.accounting.take_unexplained())
    })
    .unwrap_or_default();
    // A drop no cause fits is said at once, with the call that made it.
    if let Some(drop) = unexplained {
        print(&format!("cudamem: {drop}\n"));
    }
    if let Some(text) = explanation {
        print(&text);
    }
}

/// A context was made or retained: record it with the device's facts and
/// the context's limits (read with `ctx` current when it is not).
pub fn context(how: ContextHow, ctx: *mut c_void, device: c_int, result: c_int) {
    let facts = |device: c_int| {
        (
            read::device_attribute(driver::ATTR_MULTIPROCESSOR_COUNT, device),
            read::device_attribute(driver::ATTR_MAX_THREADS_PER_MULTIPROCESSOR, device),
            read::device_total(device),
        )
    };
    let limits = || {
        (
            read::free_bytes(),
            read::limit(LimitKind::Stack.to_cu()),
            read::limit(LimitKind::MallocHeap.to_cu()),
            read::limit(LimitKind::PrintfFifo.to_cu()),
        )
    };
    let (sm_count, threads_per_sm, total) = if result == 0 {
        facts(device)
    } else {
        (None, None, None)
    };
    let (free, stack, heap, fifo) = match (result, how) {
        (0, ContextHow::Create) => limits(),
        (0, ContextHow::Primary) => read::with_context(ctx, limits).unwrap_or_default(),
        _ => Default::default(),
    };
    let thread = thread_id();
    let explanation = with(|state| {
        state.emit(
            thread,
            Event::Context {
                how,
                device,
                ctx: ctx as u64,
                result,
                sm_count,
                threads_per_sm,
                total,
                free,
                stack,
                heap,
                fifo,
            },
        );
        let call = match how {
            ContextHow::Create => Call::CtxCreate,
            ContextHow::Primary => Call::DevicePrimaryCtxRetain,
        };
        (result == CUDA_ERROR_OUT_OF_MEMORY).then(|| state.explain(call, None, None, 0, thread))
    })
    .flatten();
    if let Some(text) = explanation {
        print(&text);
    }
}

/// The last reading the program made, free and total bytes, so a program
/// that polls free memory records each new figure once rather than every
/// poll (each record is a driver call and the lock).
static LAST_PROGRAM_READ: [AtomicU64; 2] = [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)];

/// The program read free memory: record what it saw, unless it saw the
/// same as its previous reading.
pub fn program_read(free: u64, total: u64) {
    let [last_free, last_total] = &LAST_PROGRAM_READ;
    if last_free.swap(free, Ordering::Relaxed) == free
        && last_total.swap(total, Ordering::Relaxed) == total
    {
        return;
    }
    last_total.store(total, Ordering::Relaxed);
    let device = read::current_device().unwrap_or(-1);
    let thread = thread_id();
    with(|state| {
        // The pool is not read here (two more driver calls on a call
        // programs make often): the accounting carries its last reading.
        state.emit(
            thread,
            Event::MemInfo {
                why: MemInfoWhy::Program,
                device,
                free,
                total,
                pool_reserved: None,
            },
        );
    });
}

/// An entry point was handed out through `cuGetProcAddress`.
pub fn resolved(name: &str, version: c_int, flags: u64, how: ResolveHow) {
    let thread = thread_id();
    with(|state| {
        state.emit(
            thread,
            Event::Resolve {
                name: name.into(),
                version,
                flags,
                how,
            },
        );
    });
}

/// The id of the library loaded at `base`, named `path` on first sight.
pub fn register_library(base: usize, path: &str) -> u32 {
    with(
        |state| match state.libraries.iter().position(|(known, _)| *known == base) {
            Some(index) => index as u32 + 1,
            None => state.add_library(base, path.to_string()),
        },
    )
    .unwrap_or(0)
}

/// Remember the name of function (or, when `kernel`, library kernel)
/// `handle`.
pub fn name_function(handle: u64, name: String, kernel: bool) {
    with(|state| {
        state.names.insert(handle, (name, kernel));
    });
}

/// Give function `to` the name kernel `from` has (a kernel's function).
pub fn alias_function(to: u64, from: u64) {
    with(|state| {
        if let Some((name, _)) = state.names.get(&from).cloned() {
            state.names.insert(to, (name, false));
        }
    });
}

/// The name of function `handle`, and whether it is a library kernel, if
/// known.
pub fn function_name(handle: u64) -> Option<(String, bool)> {
    with(|state| state.names.get(&handle).cloned()).flatten()
}

/// The process exits: read free memory one last time, and write the exit
/// record (left out, never waited for, when this thread holds the lock).
///
/// A process that asked the loader for the driver and has none loaded
/// writes a `driver-missing` record first (its log made now, when it made
/// no driver call); a process that made no driver call and asked for no
/// driver writes nothing.
pub fn exiting() {
    guarded(|| {
        copy_check();
        let missing = crate::loading::driver_missing();
        let Some(guard) = STATE.lock_within(EXIT_WAIT) else {
            return;
        };
        if guard.is_none() && missing.is_none() {
            return;
        }
        with_guard(guard, |state| {
            let thread = thread_id();
            if let Some(name) = &missing {
                state.emit(thread, Event::DriverMissing { name: name.into() });
            }
            // Not from a signal handler that interrupted a driver call: the
            // driver may hold a lock of its own on this thread.
            if !state.accounting.devices().is_empty() && !crate::hooks::inside() {
                state.read(MemInfoWhy::Exit, thread);
            }
            let dropped = state.log.as_ref().map_or(0, |log| log.dropped);
            state.emit(thread, Event::Exit { dropped });
            if let Some(log) = &mut state.log {
                log.cut_to_records();
            }
        });
    });
}

/// Run `f` on the process's accounting so far (`None` before the first
/// record).
pub fn with_accounting<R>(f: impl FnOnce(&Accounting) -> R) -> Option<R> {
    copy_check();
    let guard = STATE.lock()?;
    guard.as_ref().map(|state| f(&state.accounting))
}

/// The last destructor: cut the log to its records (anything the program's
/// own teardown did after [`exiting`] is in it).
pub fn finished() {
    guarded(|| {
        copy_check();
        if let Some(mut guard) = STATE.lock_within(EXIT_WAIT)
            && let Some(log) = guard.as_mut().and_then(|state| state.log.as_mut())
        {
            log.cut_to_records();
        }
    });
}

/// A fatal signal arrived: record it if the lock can be had within a
/// moment (never when this thread holds it: the signal interrupted its
/// record). `cudamem run` tells a signal it did not see recorded from the
/// process's wait status.
pub fn signaled(number: c_int) {
    guarded(|| {
        copy_check();
        if let Some(mut guard) = STATE.lock_within(SIGNAL_WAIT)
            && let Some(state) = guard.as_mut()
        {
            state.emit(thread_id(), Event::Signal { number });
        }
    });
}
