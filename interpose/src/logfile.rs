//! A process's event log, written through a shared mapping of the file:
//! every record is in the file's pages the moment it is copied there, so a
//! process that is killed, crashes, calls `_exit` or `exec`s leaves all of
//! its records readable, with no flush.
//!
//! Threads write without a lock and without sharing a cache line: the file
//! is cut into chunks of [`CHUNK`] bytes, each thread takes a chunk of its
//! own with one atomic add and copies its records into it one after the
//! other; what a chunk does not use stays zeros. Readers put the records
//! of all chunks back in order by their times (a free is stamped before
//! its driver call, an allocation after, so a free comes before any
//! allocation that reuses its pointer). The whole bound is mapped once;
//! the file grows a window at a time ahead of the writers (blocks
//! reserved, then the length), under a lock that only growing takes, and
//! the window's pages are faulted in after that lock is let go, so that
//! several windows can fill at once while writers fill the ones before.
//! Windows are a quarter of the file's length (within bounds), so a log
//! written fast grows in few large steps. Writing never goes past the
//! backed length, and the file is never cut while the process runs, so no
//! write can meet a page the file system cannot back. An orderly end gives
//! the blocks past the last chunk back.
//!
//! The log holds no descriptor between system calls: each opens the file
//! by its path, checks that it is the same file (device and inode), and
//! closes it again. A program that closes every descriptor it did not open
//! (a daemon, a sandbox, a `closefrom` launcher) and reuses the numbers can
//! never have its own files cut, grown or written by the log, and finds no
//! descriptor of ours among its own.

use std::cell::Cell;
use std::ffi::{CStr, CString, c_int};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use trace::event::MAX_LINE_BYTES;

use crate::lock::Lock;
use crate::thread::NoCancel;

/// The least the file grows by at a time.
const WINDOW: u64 = 4 << 20;
/// The most the file grows by at a time.
const MOST_WINDOW: u64 = 64 << 20;
/// Window starts are multiples of this (a multiple of every page size).
const ALIGN: u64 = 64 << 10;
/// `MADV_POPULATE_WRITE` (Linux 5.14).
const MADV_POPULATE_WRITE: libc::c_int = 23;
/// The chunk a thread writes its records into (a multiple of every page
/// size is not needed: chunks only need to hold the longest record).
pub const CHUNK: u64 = trace::event_log::CHUNK;
/// The last chunk of the bound is kept for the records of the end.
const RESERVE: u64 = CHUNK;
const _: () = assert!(CHUNK >= MAX_LINE_BYTES as u64 && ALIGN % CHUNK == 0);
/// The smallest mapping tried when the bound cannot be mapped whole.
const SMALLEST_MAP: u64 = 4 << 20;

/// An open log, shared by every thread of the process.
pub struct LogFile {
    /// The file's absolute path, and its identity.
    path: CString,
    dev: u64,
    ino: u64,
    /// The mapping of the file's first `map_len` bytes.
    map: *mut u8,
    map_len: u64,
    /// Where the next chunk starts.
    pos: AtomicU64,
    /// Where the next record of the end goes once the bound is reached (in
    /// the reserve, `[bound - RESERVE, bound)`).
    end_pos: AtomicU64,
    /// The file's length, every block below it backed: records below it
    /// can be copied without meeting a page the file system cannot back.
    ready: AtomicU64,
    /// Taken to grow the file.
    grow: Lock<()>,
    /// The bound: the mapping's length.
    bound: u64,
    /// Records dropped at the bound, or because the file could not grow.
    dropped: AtomicU64,
    /// The time of the last record the file held when it was opened (the
    /// image before an `exec`), so that time goes on from there.
    pub last_time_ns: Option<u64>,
}

// SAFETY: the mapping belongs to this value alone; every thread writes only
// the places it took with an atomic add, and growing is under a lock.
unsafe impl Send for LogFile {}
// SAFETY: as above.
unsafe impl Sync for LogFile {}

impl LogFile {
    /// Open (or, after `exec`, reopen) the log at `path`, at most
    /// `max_bytes` long. Records already there stay; writing continues after
    /// the last whole one.
    pub fn open(path: &CStr, max_bytes: u64) -> Option<LogFile> {
        let _no_cancel = NoCancel::hold();
        // Only the owner reads a log: it names what the program allocated
        // and the libraries it loaded. A link in its place is not followed.
        // SAFETY: open of a C string path; the descriptor is owned here.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return None;
        }
        let log = Self::opened(fd, max_bytes);
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::close(fd) };
        log
    }

    fn opened(fd: c_int, max_bytes: u64) -> Option<LogFile> {
        let (dev, ino) = identity(fd).filter(|&(_, _)| regular(fd))?;
        // Reopened by this path later, after the program may have changed
        // its working directory.
        let path = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
        let path = CString::new(path.as_os_str().as_bytes()).ok()?;
        let end = valid_end(fd);
        let last_time_ns = last_time(fd, end);
        let (map, map_len) = map_bound(fd, trace::event_log::log_bound(max_bytes))?;
        // Chunks go on after the image before an `exec` wrote.
        let end = end.div_ceil(CHUNK) * CHUNK;
        let log = LogFile {
            path,
            dev,
            ino,
            map,
            map_len,
            pos: AtomicU64::new(end),
            end_pos: AtomicU64::new(map_len - RESERVE),
            ready: AtomicU64::new(0),
            grow: Lock::new(()),
            bound: map_len,
            dropped: AtomicU64::new(0),
            last_time_ns,
        };
        // Past the records, the image before an `exec` may have left a
        // tail: it is overwritten from `end` on.
        match log.extend(fd, end, end.saturating_add(1)) {
            Some(grown) => log.populate(grown),
            None => {
                log.close();
                return None;
            }
        }
        Some(log)
    }

    /// A descriptor of the log, opened by path and checked to be the same
    /// file; `None` when it is not (removed or replaced: nothing is done to
    /// what is there now).
    fn reopen(&self) -> Option<OwnedFd> {
        // SAFETY: open of our C string path, read-write, no link followed,
        // nothing created.
        let fd = unsafe {
            libc::open(
                self.path.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: the descriptor just opened, owned (and closed) by this.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        (identity(fd.as_raw_fd()) == Some((self.dev, self.ino))).then_some(fd)
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Append one record to this thread's chunk; past the bound less the
    /// end's reserve it is dropped (and counted) instead.
    pub fn append(&self, bytes: &[u8]) {
        if !self.place(bytes) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Append one of the records of the end, which may use the reserve.
    pub fn append_final(&self, bytes: &[u8]) {
        if self.place(bytes) {
            return;
        }
        let len = bytes.len() as u64;
        let at = self.end_pos.fetch_add(len, Ordering::Relaxed);
        if at + len > self.bound || !self.write(at, bytes) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Copy `bytes` into this thread's chunk, taking a new one when it is
    /// full (or is another log's); `false` when no chunk can be had.
    fn place(&self, bytes: &[u8]) -> bool {
        let len = bytes.len() as u64;
        let me = std::ptr::from_ref(self) as usize;
        // A signal handler that interrupted this thread's copy writes its
        // record into a chunk of its own, leaving the interrupted one alone.
        let interrupted = WRITING
            .try_with(|writing| writing.replace(true))
            .unwrap_or(true);
        let mut place = if interrupted {
            Place::default()
        } else {
            PLACE.try_with(Cell::get).unwrap_or_default()
        };
        if place.log != me || place.next + len > place.end {
            let at = self.pos.fetch_add(CHUNK, Ordering::Relaxed);
            if at + CHUNK > self.bound - RESERVE {
                if !interrupted {
                    let _ = WRITING.try_with(|writing| writing.set(false));
                }
                return false;
            }
            place = Place {
                log: me,
                next: at,
                end: at + CHUNK,
            };
            if !interrupted {
                self.grow_ahead(at + CHUNK);
            }
        }
        let written = self.write(place.next, bytes);
        if !interrupted {
            place.next += len;
            let _ = PLACE.try_with(|cell| cell.set(place));
            let _ = WRITING.try_with(|writing| writing.set(false));
        }
        written
    }

    /// Copy `bytes` to `[at, at + len)`, a place no other thread writes:
    /// `false` when the file cannot grow to hold it.
    fn write(&self, at: u64, bytes: &[u8]) -> bool {
        let end = at + bytes.len() as u64;
        if end > self.ready.load(Ordering::Acquire) && !self.grow_to(end) {
            return false;
        }
        // SAFETY: [at, end) is inside the mapping (end <= bound = map_len)
        // and below the file's backed length; the place is this thread's
        // alone (its chunk, taken by an atomic add); `bytes` does not
        // overlap it.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.add(at as usize), bytes.len()) };
        true
    }

    /// Grow the file past `end`: `false` when it cannot (a full disk, the
    /// file replaced, or this thread is growing it already: a signal
    /// handler that interrupted a growth).
    #[cold]
    fn grow_to(&self, end: u64) -> bool {
        let _no_cancel = NoCancel::hold();
        let grown = {
            let Some(_guard) = self.grow.lock() else {
                return false;
            };
            let ready = self.ready.load(Ordering::Acquire);
            if end <= ready {
                return true;
            }
            let Some(fd) = self.reopen() else {
                return false;
            };
            self.extend(fd.as_raw_fd(), ready, end)
        };
        match grown {
            Some(grown) => {
                self.populate(grown);
                true
            }
            None => false,
        }
    }

    /// Keep a whole window backed past `end` (the end of a chunk just
    /// taken), so that writers seldom reach the backed length and wait for
    /// a growth: the thread that takes the first chunk of the last window
    /// grows the next one, unless another thread is growing the file now.
    fn grow_ahead(&self, end: u64) {
        let ready = self.ready.load(Ordering::Acquire);
        if end + window(ready) <= ready || ready >= self.bound {
            return;
        }
        let _no_cancel = NoCancel::hold();
        let grown = {
            let Some(_guard) = self.grow.try_lock() else {
                return;
            };
            let ready = self.ready.load(Ordering::Acquire);
            if end + window(ready) <= ready {
                return;
            }
            let Some(fd) = self.reopen() else {
                return;
            };
            self.extend(fd.as_raw_fd(), ready, ready.max(end).min(self.bound))
        };
        if let Some(grown) = grown {
            self.populate(grown);
        }
    }

    /// Back `[from, end)` and a window past it (within the bound): blocks
    /// first, then the length, then `ready` moved on. The range grown
    /// (whole windows), for [`LogFile::populate`]; `None` when the file
    /// cannot grow. Called holding the growth lock, or before the log is
    /// shared.
    fn extend(&self, fd: c_int, from: u64, end: u64) -> Option<(u64, u64)> {
        if end > self.bound {
            return None;
        }
        let start = from / ALIGN * ALIGN;
        let stop = (end.div_ceil(ALIGN) * ALIGN + window(from)).min(self.bound);
        // Blocks first: a write through the mapping to a page the file
        // system cannot back (a full disk or tmpfs) would be a SIGBUS in the
        // program; this way it is a refused window, and records are dropped
        // and counted instead.
        // SAFETY: fallocate of our own descriptor.
        let reserved = unsafe {
            libc::posix_fallocate(fd, start as libc::off_t, (stop - start) as libc::off_t)
        };
        if reserved != 0 {
            return None;
        }
        // The length only ever grows here (fallocate may have grown it).
        // SAFETY: lseek of our own descriptor.
        let size = unsafe { libc::lseek(fd, 0, libc::SEEK_END) };
        if size < stop as libc::off_t {
            // SAFETY: ftruncate of our own descriptor, lengthening it.
            if unsafe { libc::ftruncate(fd, stop as libc::off_t) } != 0 {
                return None;
            }
        }
        self.ready.store(stop, Ordering::Release);
        Some((start, stop))
    }

    /// Fault the pages of `[start, stop)` in, writable, keeping what they
    /// hold: one system call per window instead of a fault at the first
    /// write to each page (faults by many writers at once cost each of them
    /// several times more). Outside the growth lock: writers already
    /// copying into the window meanwhile fault their own pages. Kernels
    /// without it refuse, and the pages fault one by one.
    fn populate(&self, (start, stop): (u64, u64)) {
        // SAFETY: advice on our mapping, inside it ([start, stop) is below
        // the bound, and backed).
        unsafe {
            libc::madvise(
                self.map.add(start as usize).cast(),
                (stop - start) as usize,
                MADV_POPULATE_WRITE,
            )
        };
    }

    /// At an orderly end: give back the blocks past the records (the file
    /// keeps its length, so a thread still writing cannot fault; a record
    /// placed past this point while it runs may be lost).
    pub fn trim(&self) {
        let _no_cancel = NoCancel::hold();
        let pos = self.pos.load(Ordering::Acquire).min(self.bound);
        let from = pos.div_ceil(ALIGN) * ALIGN;
        let ready = self.ready.load(Ordering::Acquire);
        if from >= ready {
            return;
        }
        let Some(fd) = self.reopen() else {
            return;
        };
        // SAFETY: fallocate of the log's own file, punching a hole past the
        // records (the length stays).
        unsafe {
            libc::fallocate(
                fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                from as libc::off_t,
                (ready - from) as libc::off_t,
            )
        };
    }

    /// Let go of the log without writing (a process copy's view of its
    /// parent's, which the parent goes on writing). Only by the copy's one
    /// thread.
    pub fn close(&self) {
        // SAFETY: unmapping this value's mapping; the parent's pages are its
        // own mapping and stay. Nothing writes here afterwards (the caller's
        // contract).
        unsafe { libc::munmap(self.map.cast(), self.map_len as usize) };
    }
}

/// What the file grows by when it is `length` long: a quarter of it,
/// between [`WINDOW`] and [`MOST_WINDOW`] (a log written fast grows in few
/// large steps, and what is grown ahead of the records stays a fraction of
/// the file).
fn window(length: u64) -> u64 {
    (length / 4 / ALIGN * ALIGN).clamp(WINDOW, MOST_WINDOW)
}

/// Where a thread's next record goes: in its chunk `[next, end)` of the
/// log at address `log` (another log's chunk, after a process copy made a
/// new log, is never written).
#[derive(Clone, Copy, Default)]
struct Place {
    log: usize,
    next: u64,
    end: u64,
}

thread_local! {
    static PLACE: Cell<Place> = const { Cell::new(Place { log: 0, next: 0, end: 0 }) };
    /// This thread is copying a record.
    static WRITING: Cell<bool> = const { Cell::new(false) };
}

/// Map the first `bytes` of the file `fd`, or as much as the address space
/// allows (halving down to [`SMALLEST_MAP`]): the mapping and its length.
fn map_bound(fd: c_int, bytes: u64) -> Option<(*mut u8, u64)> {
    let mut len = bytes;
    loop {
        // SAFETY: a fresh shared mapping of our descriptor from offset 0;
        // pages past the file's end are never touched (see `LogFile::write`).
        let map = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if map != libc::MAP_FAILED {
            return Some((map.cast(), len));
        }
        if len <= SMALLEST_MAP {
            return None;
        }
        len = (len / 2).div_ceil(CHUNK) * CHUNK;
    }
}

/// The device and inode of the file `fd` names.
fn identity(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: a zeroed stat is valid to fill in.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of a descriptor we opened, into our buffer.
    (unsafe { libc::fstat(fd, &mut stat) } == 0).then_some((stat.st_dev, stat.st_ino))
}

/// Whether `fd` names a regular file (a log is never written to a FIFO, a
/// device or anything else).
fn regular(fd: c_int) -> bool {
    // SAFETY: as in `identity`.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as in `identity`.
    unsafe { libc::fstat(fd, &mut stat) == 0 && stat.st_mode & libc::S_IFMT == libc::S_IFREG }
}

/// The latest time of the records before `end`: the last whole line of
/// each chunk is its latest (a thread's records go in order), and the
/// latest of those is the log's.
fn last_time(fd: c_int, end: u64) -> Option<u64> {
    let mut chunk = vec![0u8; CHUNK as usize];
    let mut latest = None;
    let mut start = 0;
    while start < end {
        let want = (end - start).min(CHUNK) as usize;
        // SAFETY: reading into our buffer, within its length.
        let got = unsafe { libc::pread(fd, chunk.as_mut_ptr().cast(), want, start as libc::off_t) };
        if got != want as isize {
            return latest;
        }
        let content = &chunk[..chunk[..want].iter().position(|&b| b == 0).unwrap_or(want)];
        if let Some(last_end) = content.iter().rposition(|&b| b == b'\n') {
            let body = &content[..last_end];
            let line = &body[body
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |at| at + 1)..];
            if let Some(time) = std::str::from_utf8(line)
                .ok()
                .and_then(|line| trace::event::parse_line(line).ok())
                .map(|record| record.time_ns)
            {
                latest = latest.max(Some(time));
            }
        }
        start += CHUNK;
    }
    latest
}

/// Where the records of a log end: after the last line end before the
/// zeros a process that did not end in order left.
fn valid_end(fd: c_int) -> u64 {
    // SAFETY: lseek of our own descriptor.
    let size = unsafe { libc::lseek(fd, 0, libc::SEEK_END) };
    if size <= 0 {
        return 0;
    }
    let mut end = size as u64;
    let mut chunk = [0u8; 1 << 16];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let want = (end - start) as usize;
        // SAFETY: reading into our buffer, within its length.
        let got = unsafe { libc::pread(fd, chunk.as_mut_ptr().cast(), want, start as libc::off_t) };
        if got != want as isize {
            return 0;
        }
        // The last line end: what follows it is zeros, or a line cut off
        // mid-write, and the next record overwrites either.
        if let Some(at) = chunk[..want].iter().rposition(|&b| b == b'\n') {
            return start + at as u64 + 1;
        }
        end = start;
    }
    0
}
