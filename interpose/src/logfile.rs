//! A process's event log, written through a shared mapping of the file:
//! every record is in the file's pages the moment it is copied there, so a
//! process that is killed, crashes, calls `_exit` or `exec`s leaves all of
//! its records readable, with no flush. The file grows a window at a time
//! (one `ftruncate` and one `mmap` per window: the only system calls of
//! the writing path); until the process ends its tail past the last record
//! is zeros, which readers stop at. An orderly end cuts the file to its
//! records.
//!
//! The log holds no descriptor between those calls: each opens the file by
//! its path, checks that it is the same file (device and inode), and closes
//! it again. A program that closes every descriptor it did not open (a
//! daemon, a sandbox, a `closefrom` launcher) and reuses the numbers can
//! never have its own files cut, grown or written by the log, and finds no
//! descriptor of ours among its own.

use std::ffi::{CStr, CString, c_int};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::ptr;

use trace::event::MAX_LINE_BYTES;

use crate::thread::NoCancel;

/// Bytes mapped at a time.
const WINDOW: u64 = 4 << 20;
/// Window starts are multiples of this (a multiple of every page size).
const ALIGN: u64 = 64 << 10;
/// `MADV_POPULATE_WRITE` (Linux 5.14).
const MADV_POPULATE_WRITE: libc::c_int = 23;
/// Bytes kept below the bound for the records of the end.
const RESERVE: u64 = 4 * MAX_LINE_BYTES as u64;

/// An open log.
pub struct LogFile {
    /// The file's absolute path, and its identity.
    path: CString,
    dev: u64,
    ino: u64,
    map: *mut u8,
    /// File offset of the mapping.
    map_start: u64,
    map_len: u64,
    /// Where the next record goes.
    pos: u64,
    /// The file's length now.
    file_len: u64,
    max_bytes: u64,
    /// Records dropped at the bound.
    pub dropped: u64,
    /// The time of the last record the file held when it was opened (the
    /// image before an `exec`), so that time goes on from there.
    pub last_time_ns: Option<u64>,
}

// SAFETY: the mapping belongs to this value alone; it moves between threads
// only inside the recorder's lock.
unsafe impl Send for LogFile {}

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
        let mut log = LogFile {
            path,
            dev,
            ino,
            map: ptr::null_mut(),
            map_start: 0,
            map_len: 0,
            pos: end,
            file_len: end,
            max_bytes: max_bytes.max(2 * RESERVE),
            dropped: 0,
            last_time_ns: last_time(fd, end),
        };
        // SAFETY: ftruncate of the descriptor the caller opened.
        unsafe { libc::ftruncate(fd, end as libc::off_t) };
        if !log.reach_with(fd, 1) {
            log.close();
            return None;
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

    /// Append one record; past the bound less the end's reserve it is
    /// dropped (and counted) instead.
    pub fn append(&mut self, bytes: &[u8]) {
        if self.pos + bytes.len() as u64 > self.max_bytes - RESERVE {
            self.dropped += 1;
            return;
        }
        self.write(bytes);
    }

    /// Append one of the records of the end, which may use the reserve.
    pub fn append_final(&mut self, bytes: &[u8]) {
        if self.pos + bytes.len() as u64 > self.max_bytes {
            self.dropped += 1;
            return;
        }
        self.write(bytes);
    }

    fn write(&mut self, bytes: &[u8]) {
        let len = bytes.len() as u64;
        if !self.reach(len) {
            self.dropped += 1;
            return;
        }
        let offset = (self.pos - self.map_start) as usize;
        // SAFETY: `reach` made [pos, pos + len) part of the mapping and of
        // the file; `bytes` does not overlap it.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.add(offset), bytes.len()) };
        self.pos += len;
    }

    /// Make [pos, pos + len) mapped and inside the file (no system call
    /// when it is already).
    fn reach(&mut self, len: u64) -> bool {
        let end = self.pos + len;
        let mapped = !self.map.is_null() && end <= self.map_start + self.map_len;
        if mapped && self.file_len >= end {
            return true;
        }
        let _no_cancel = NoCancel::hold();
        match self.reopen() {
            Some(fd) => self.reach_with(fd.as_raw_fd(), len),
            None => false,
        }
    }

    fn reach_with(&mut self, fd: c_int, len: u64) -> bool {
        let end = self.pos + len;
        if self.map.is_null() || end > self.map_start + self.map_len {
            if !self.map.is_null() {
                // SAFETY: unmapping the mapping this value made.
                unsafe { libc::munmap(self.map.cast(), self.map_len as usize) };
                self.map = ptr::null_mut();
            }
            let start = self.pos / ALIGN * ALIGN;
            let stop = (start + WINDOW).min(self.max_bytes.div_ceil(ALIGN) * ALIGN);
            if stop < end {
                return false;
            }
            // Reserve the window's blocks first: a write through the mapping
            // to a page the file system cannot back (a full disk or tmpfs)
            // would be a SIGBUS in the program; this way it is a refused
            // window, and records are dropped and counted instead. Backed
            // blocks also make the first write to each page cheaper.
            // SAFETY: fallocate of our own descriptor.
            let reserved = unsafe {
                libc::posix_fallocate(fd, start as libc::off_t, (stop - start) as libc::off_t)
            };
            if reserved != 0 {
                return false;
            }
            // SAFETY: a fresh shared mapping of our descriptor at an
            // aligned offset.
            let map = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    (stop - start) as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    start as libc::off_t,
                )
            };
            if map == libc::MAP_FAILED {
                return false;
            }
            // Fault the whole window in, writable, now: one system call per
            // window instead of a fault at the first write to each page,
            // with the recorder's lock held. Kernels without it refuse, and
            // the pages fault one by one as before.
            // SAFETY: advice on the mapping just made.
            unsafe { libc::madvise(map, (stop - start) as usize, MADV_POPULATE_WRITE) };
            self.map = map.cast();
            self.map_start = start;
            self.map_len = stop - start;
        }
        let mapped_end = self.map_start + self.map_len;
        if self.file_len < end {
            // Past the file's end, a mapped page faults: grow the file to
            // the mapping's end first.
            // SAFETY: ftruncate of our own descriptor.
            if unsafe { libc::ftruncate(fd, mapped_end as libc::off_t) } != 0 {
                return false;
            }
            self.file_len = mapped_end;
        }
        true
    }

    /// Cut the file to its records (at an orderly end; writing may go on
    /// afterwards and grows it again).
    pub fn cut_to_records(&mut self) {
        let _no_cancel = NoCancel::hold();
        let pos = self.pos;
        // SAFETY: ftruncate of the log's own file; the mapping past the new
        // end is not written until `reach` grows the file again.
        let Some(fd) = self.reopen() else {
            return;
        };
        if unsafe { libc::ftruncate(fd.as_raw_fd(), pos as libc::off_t) } == 0 {
            self.file_len = pos;
        }
    }

    /// Let go of the log without writing (a forked child's copy of its
    /// parent's, which the parent goes on writing).
    pub fn close(self) {
        if !self.map.is_null() {
            // SAFETY: unmapping this value's mapping; the parent's pages are
            // its own mapping and stay.
            unsafe { libc::munmap(self.map.cast(), self.map_len as usize) };
        }
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

/// The time of the record that ends at `end`, if it reads as one.
fn last_time(fd: c_int, end: u64) -> Option<u64> {
    let start = end.saturating_sub(MAX_LINE_BYTES as u64);
    let mut chunk = vec![0u8; (end - start) as usize];
    // SAFETY: reading into our buffer, within its length.
    let got = unsafe {
        libc::pread(
            fd,
            chunk.as_mut_ptr().cast(),
            chunk.len(),
            start as libc::off_t,
        )
    };
    if got != chunk.len() as isize || chunk.is_empty() {
        return None;
    }
    let body = &chunk[..chunk.len() - 1];
    let line = &body[body
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1)..];
    let record = trace::event::parse_line(std::str::from_utf8(line).ok()?).ok()?;
    Some(record.time_ns)
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
