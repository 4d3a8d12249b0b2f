//! The process's recorder: the log, the [`Accounting`] the log's records
//! build (so an out-of-memory explanation sees the process as it is), and
//! the moments free memory is read.
//!
//! Set up on first use (the first recorded call), never from a
//! constructor. Allocations and frees, the calls a program makes most and
//! from many threads at once, take no lock: each thread stamps and formats
//! its record, places it in the log with one atomic add, and changes the
//! live blocks in [`hot`]'s shards. Every other record, and what reads
//! free memory, goes through the one lock around the state.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::os::unix::ffi::OsStrExt as _;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
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
mod hot;
mod oom;

pub use hot::HotBlock;

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
    log: Option<&'static LogFile>,
    line: Line,
    accounting: Accounting,
    /// Loaded objects named so far: (load address, path); id = index + 1.
    libraries: Vec<(usize, String)>,
    /// Function and kernel handles -> their names, and whether the handle
    /// is a library's kernel (`CUkernel`) rather than a function.
    names: HashMap<u64, (String, bool)>,
    peak: Peak,
    out_of_memory: u64,
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

/// Live device bytes the state holds (VMM handles: the blocks are in
/// [`hot`]), readable without the lock.
static LIVE_HANDLES: AtomicU64 = AtomicU64::new(0);

/// The state's log, for the hot paths (null: none).
static LOG: AtomicPtr<LogFile> = AtomicPtr::new(std::ptr::null_mut());

/// A stream-ordered allocation was seen (the pool's reserve is read with
/// free memory from then on).
static ASYNC_SEEN: AtomicBool = AtomicBool::new(false);

/// Records counted, and the count past which one panics (a test aid, see
/// [`TEST_PANIC_VAR`]; `u64::MAX`: off, and nothing is counted).
static RECORDS: AtomicU64 = AtomicU64::new(0);
static PANIC_AT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Live device bytes: the blocks' (as shared between threads) and the
/// handles'.
fn live_bytes() -> u64 {
    hot::live_bytes() + LIVE_HANDLES.load(Ordering::Relaxed)
}

/// Count a record, panicking where the test aid asks.
fn count() {
    let at = PANIC_AT.load(Ordering::Relaxed);
    if at != u64::MAX && RECORDS.fetch_add(1, Ordering::Relaxed) + 1 > at {
        panic!("the panic {TEST_PANIC_VAR} asked for");
    }
}

/// The state's `start_ns`, readable without the lock (0: no state yet), so
/// that the hot paths can stamp and format their record before taking it.
static START_NS: AtomicU64 = AtomicU64::new(0);

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
        let log: Option<&'static LogFile> = open_log().map(|log| &*Box::leak(Box::new(log)));
        LOG.store(
            log.map_or(std::ptr::null_mut(), |log| {
                std::ptr::from_ref(log).cast_mut()
            }),
            Ordering::Release,
        );
        RECORDS.store(0, Ordering::Relaxed);
        PANIC_AT.store(
            std::env::var(TEST_PANIC_VAR)
                .ok()
                .and_then(|text| text.parse().ok())
                .unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        // After an `exec`, the log goes on, and so does its time.
        let since_start = log
            .as_ref()
            .and_then(|log| log.last_time_ns)
            .map_or(0, |last| last + 1);
        let start_ns = monotonic_ns().saturating_sub(since_start).max(1);
        START_NS.store(start_ns, Ordering::Release);
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

    fn emit(&mut self, thread: u32, event: Event<'_>) -> Option<HotBlock> {
        let record = Record {
            time_ns: self.now(),
            thread,
            event,
        };
        self.emit_record(record)
    }

    /// Write and apply a record already stamped; a free returns the block
    /// it took.
    fn emit_record(&mut self, record: Record<'_>) -> Option<HotBlock> {
        count();
        let last = matches!(record.event, Event::Exit { .. } | Event::Signal { .. });
        if let Some(log) = self.log {
            self.line.encode(&record);
            if last {
                log.append_final(self.line.as_bytes());
            } else {
                log.append(self.line.as_bytes());
            }
        }
        self.apply(&record)
    }

    /// Apply a record: allocations and frees to [`hot`]'s blocks (a failed
    /// free's block is put back by its caller), the rest to the state's
    /// accounting.
    fn apply(&mut self, record: &Record<'_>) -> Option<HotBlock> {
        match record.event {
            Event::Alloc {
                call,
                ptr,
                size,
                caller,
                result: 0,
                ..
            } => {
                hot::allocated(call, ptr, size, caller);
                None
            }
            Event::Free { call, ptr, .. } => hot::freed(call, ptr),
            Event::FreeFailed { .. } => None,
            _ => {
                self.accounting.apply(record);
                LIVE_HANDLES.store(self.accounting.live_device_bytes(), Ordering::Relaxed);
                None
            }
        }
    }

    /// The accounting with the live blocks in it: the process as a whole.
    fn whole(&self) -> Accounting {
        hot::with_blocks(&self.accounting)
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
        let pool_reserved = if ASYNC_SEEN.load(Ordering::Relaxed) && device >= 0 {
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
        let live = live_bytes();
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
        // The hot paths compare the blocks' bytes alone.
        hot::set_peak(
            live.saturating_sub(LIVE_HANDLES.load(Ordering::Relaxed)),
            self.peak.pending,
        );
    }

    /// Before live bytes shrink: a peak not read yet is read now.
    fn shrinking(&mut self, thread: u32) {
        if self.peak.pending {
            self.peak.pending = false;
            hot::peak_read();
            self.peak.last_read_ns = Some(self.now());
            self.read(MemInfoWhy::Peak, thread);
        }
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
        LIVE_HANDLES.store(0, Ordering::Relaxed);
        if let Some(parent) = guard.take() {
            if let Some(log) = parent.log {
                // This copy's one thread: nothing else writes there.
                LOG.store(std::ptr::null_mut(), Ordering::Release);
                log.close();
            }
            *guard = Some(State::new(parent.libraries, parent.names));
        }
    }
    let state = guard.get_or_insert_with(|| {
        lifecycle::set_up();
        State::new(Vec::new(), HashMap::new())
    });
    f(state)
}

/// Place the record of a hot path (an allocation or a free) in the log
/// without the lock: stamped and formatted by this thread. `false` when
/// the recorder must take it under the lock instead: no state yet (or a
/// copy of the process, whose state is its parent's until its first
/// record), or a signal handler interrupted this thread while it formatted.
fn place(thread: u32, event: Event<'_>) -> bool {
    copy_check();
    let start = START_NS.load(Ordering::Acquire);
    if start == 0 {
        return false;
    }
    let record = Record {
        time_ns: monotonic_ns().saturating_sub(start),
        thread,
        event,
    };
    let log = LOG.load(Ordering::Acquire);
    if log.is_null() {
        count();
        return true;
    }
    // Not when this thread's line is gone (its destructors run) or in use
    // (a signal handler interrupted this thread while it formatted).
    LINE.try_with(|line| match line.try_borrow_mut() {
        Ok(mut line) => {
            count();
            line.encode(&record);
            // SAFETY: a log once shared is never freed (a process copy lets
            // go of its parent's only while it is its one thread).
            unsafe { &*log }.append(line.as_bytes());
            true
        }
        Err(_) => false,
    })
    .unwrap_or(false)
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
    if ordered && !ASYNC_SEEN.load(Ordering::Relaxed) {
        ASYNC_SEEN.store(true, Ordering::Relaxed);
    }
    let event = Event::Alloc {
        call,
        ptr,
        size,
        stream,
        caller,
        result,
    };
    let stream = ordered.then_some(stream);
    // A success, placed without the lock: the recorder is asked only when
    // live bytes may have made a new peak.
    let placed = result == 0
        && guarded(|| {
            place(thread, event.clone()) && {
                if hot::allocated(call, ptr, size, caller) {
                    with(|state| state.grew(thread, stream));
                }
                true
            }
        })
        .unwrap_or(false);
    if placed {
        return;
    }
    let explanation = with(|state| {
        state.emit(thread, event);
        if result == 0 {
            state.grew(thread, stream);
        }
        (result == CUDA_ERROR_OUT_OF_MEMORY)
            .then(|| state.explain(call, Some(size), None, caller, thread))
    })
    .flatten();
    if let Some(text) = explanation {
        print(&text);
    }
}

/// A free is about to be made: record it first (so no allocation that
/// reuses the pointer can come before it in the log). Returns what a
/// `free-failed` record needs, should the free fail.
pub fn freeing(call: Call, ptr: u64, stream: u64, immediate: usize) -> Option<HotBlock> {
    let caller = guarded(|| caller_id(immediate)).unwrap_or(0);
    let thread = thread_id();
    let event = Event::Free {
        call,
        ptr,
        stream,
        caller,
    };
    if hot::peak_pending() {
        with(|state| state.shrinking(thread));
    }
    let placed = guarded(|| place(thread, event.clone()).then(|| hot::freed(call, ptr)));
    match placed {
        Some(Some(block)) => block,
        Some(None) | None => with(|state| {
            state.shrinking(thread);
            state.emit(thread, event)
        })
        .flatten(),
    }
}

/// The free recorded by [`freeing`] failed: the block is live again.
pub fn free_failed(call: Call, ptr: u64, block: HotBlock, result: c_int) {
    let thread = thread_id();
    with(|state| {
        state.emit(
            thread,
            Event::FreeFailed {
                call,
                ptr,
                size: block.size,
                caller: block.caller,
                result,
            },
        );
        hot::restored(ptr, block);
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
            live_before: live_bytes(),
        }
    }

    /// Read free memory after the call.
    pub fn finish(self) -> Window {
        let free_after = self.free_before.and(read::free_bytes());
        let live_after = live_bytes();
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
            let dropped = state.log.map_or(0, LogFile::dropped);
            state.emit(thread, Event::Exit { dropped });
            if let Some(log) = state.log {
                log.trim();
            }
        });
    });
}

/// Run `f` on the process's accounting so far (`None` before the first
/// record).
pub fn with_accounting<R>(f: impl FnOnce(&Accounting) -> R) -> Option<R> {
    copy_check();
    let guard = STATE.lock()?;
    guard.as_ref().map(|state| f(&state.whole()))
}

/// The last destructor: cut the log to its records (anything the program's
/// own teardown did after [`exiting`] is in it).
pub fn finished() {
    guarded(|| {
        copy_check();
        if let Some(guard) = STATE.lock_within(EXIT_WAIT)
            && let Some(log) = guard.as_ref().and_then(|state| state.log)
        {
            log.trim();
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
