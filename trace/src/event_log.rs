//! Reading an event log back ([`read`]), and where the interposer writes
//! one ([`log_path`]) and under which bound.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use crate::event::{LineError, MAX_LINE_BYTES, Record, parse_line};

/// The environment variable that tells the interposer the folder to write
/// its logs to, one file per process: `<folder>/<pid>.events`. Unset, it
/// writes none (and still explains out-of-memory errors on stderr).
pub const LOG_DIR_VAR: &str = "CUDAMEM_HOOK_DIR";

/// The environment variable that bounds each process's log, bytes (past
/// it, records are counted and dropped; the default is
/// [`DEFAULT_MAX_LOG_BYTES`]).
pub const MAX_LOG_BYTES_VAR: &str = "CUDAMEM_HOOK_MAX_BYTES";

/// The default bound of one process's log, bytes.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 1 << 30;

/// The extension of event logs.
pub const LOG_EXTENSION: &str = "events";

/// The log process `pid` writes in `dir`.
pub fn log_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.{LOG_EXTENSION}"))
}

/// The process id a log path names, if it is one.
pub fn log_pid(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    name.strip_suffix(&format!(".{LOG_EXTENSION}"))?
        .parse()
        .ok()
}

/// The bound a text (a [`MAX_LOG_BYTES_VAR`] value) sets: a byte count,
/// units allowed (`512MiB`).
pub fn parse_max_bytes(text: &str) -> Option<u64> {
    memcore::bytes::parse(text).ok().filter(|&bytes| bytes > 0)
}

/// How a log ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogInfo {
    /// Records read.
    pub records: u64,
    /// A record was cut off (the process died while writing it).
    pub cut_last_line: bool,
    /// The file ended in zero bytes: the process never closed it (killed,
    /// or it left through `_exit`), or wrote its records from several
    /// threads (their log keeps its length).
    pub unfinished: bool,
    /// Lines right after zeros that were not whole records (the end of a
    /// record whose start a killed writer never copied): skipped.
    pub holes: u64,
}

/// A log that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Reading the file failed.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The log.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// A line in the middle of the log is not a record.
    #[error("{}: line {line}: {error}", path.display())]
    BadLine {
        /// The log.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// What is wrong.
        error: LineError,
    },
    /// A line longer than any the interposer writes.
    #[error("{}: line {line} is longer than {MAX_LINE_BYTES} bytes: not an event log", path.display())]
    LineTooLong {
        /// The log.
        path: PathBuf,
        /// 1-based line.
        line: u64,
    },
    /// More bytes than the bound the log was written under allows.
    #[error("{} holds more than {limit_bytes} bytes, more than its writer's bound", path.display())]
    TooLarge {
        /// The log.
        path: PathBuf,
        /// The bound.
        limit_bytes: u64,
    },
}

/// A log is written in chunks of this many bytes: each thread of a process
/// fills chunks of its own, its records one after the other, and what a
/// chunk does not use is zeros. A record never crosses a chunk's end.
pub const CHUNK: u64 = 16 << 10;

/// The length a log written under a bound of `max_bytes` may reach: the
/// bound rounded up to whole chunks, and at least two (one for the
/// records of the end).
pub fn log_bound(max_bytes: u64) -> u64 {
    max_bytes
        .max(2 * CHUNK)
        .div_ceil(CHUNK)
        .saturating_mul(CHUNK)
}

/// Chunks whose bytes stay in memory at once while records are merged;
/// past this, a chunk is read again for each of its records.
const LOADED_CHUNKS: usize = 4096;

/// Where a chunk's next record is, and its time.
struct Cursor {
    /// The chunk's bytes (the file may end inside the last chunk).
    len: usize,
    /// The next record: its start and end (past its line end) in the chunk.
    line: (usize, usize),
    time_ns: u64,
    /// The chunk's bytes, while loaded.
    bytes: Option<Vec<u8>>,
}

/// What comes next in a chunk from `offset`.
enum Next {
    /// A line `[start, end)` (without its line end) with this time.
    Line {
        start: usize,
        end: usize,
        time_ns: u64,
    },
    /// Nothing more.
    Done,
}

/// Read the log at `path`, at most `max_bytes` of it, calling `visit` with
/// each record and its 0-based index, in the order of the records' times
/// (records of one thread, and records with the same time, in the order
/// they were written).
///
/// A record cut off, and the zero bytes a chunk does not use, are how a
/// killed process's log ends: they are reported in [`LogInfo`], not
/// errors. So are zeros followed by more records in a chunk (a signal
/// handler's record, or a writer killed mid-record): they are skipped, and
/// with them the first line after them if it is not a whole record. A bad
/// line anywhere else is an error.
pub fn read(
    path: &Path,
    max_bytes: u64,
    mut visit: impl FnMut(u64, &Record<'_>),
) -> Result<LogInfo, LogError> {
    let io = |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > log_bound(max_bytes) {
        return Err(LogError::TooLarge {
            path: path.to_path_buf(),
            limit_bytes: max_bytes,
        });
    }
    let mut info = LogInfo::default();
    // The lines before each chunk, for the line numbers errors name.
    let mut lines_before: Vec<u64> = Vec::new();
    let mut heap = BinaryHeap::new();
    let mut cursors: Vec<Cursor> = Vec::new();
    let mut bytes = vec![0u8; CHUNK as usize];
    let mut lines = 0u64;
    for index in 0..len.div_ceil(CHUNK) {
        let chunk_len = (len - index * CHUNK).min(CHUNK) as usize;
        read_chunk(&file, index, &mut bytes[..chunk_len]).map_err(io)?;
        lines_before.push(lines);
        let chunk = &bytes[..chunk_len];
        lines += chunk.iter().filter(|&&byte| byte == b'\n').count() as u64;
        if chunk_len > 0 && index + 1 == len.div_ceil(CHUNK) {
            info.unfinished = chunk[chunk_len - 1] == 0;
        }
        let place = Place {
            path,
            lines_before: lines_before[index as usize],
        };
        if let Next::Line {
            start,
            end,
            time_ns,
        } = next_line(chunk, 0, &place, &mut info)?
        {
            heap.push(Reverse((time_ns, index)));
            cursors.push(Cursor {
                len: chunk_len,
                line: (start, end),
                time_ns,
                bytes: None,
            });
        } else {
            cursors.push(Cursor {
                len: chunk_len,
                line: (0, 0),
                time_ns: 0,
                bytes: None,
            });
        }
    }
    let mut loaded = 0usize;
    while let Some(Reverse((_, index))) = heap.pop() {
        let cursor = &mut cursors[index as usize];
        if cursor.bytes.is_none() {
            let mut chunk = vec![0u8; cursor.len];
            read_chunk(&file, index, &mut chunk).map_err(io)?;
            cursor.bytes = Some(chunk);
            loaded += 1;
        }
        let chunk = cursor.bytes.as_deref().unwrap_or_default();
        let (start, end) = cursor.line;
        let place = Place {
            path,
            lines_before: lines_before[index as usize],
        };
        let text = String::from_utf8_lossy(&chunk[start..end]);
        let record = parse_line(&text).map_err(|error| LogError::BadLine {
            path: path.to_path_buf(),
            line: place.line_at(chunk, start),
            error,
        })?;
        visit(info.records, &record);
        info.records += 1;
        match next_line(chunk, end + 1, &place, &mut info)? {
            Next::Line {
                start,
                end,
                time_ns,
            } => {
                cursor.line = (start, end);
                cursor.time_ns = time_ns;
                heap.push(Reverse((time_ns, index)));
                if loaded > LOADED_CHUNKS {
                    cursor.bytes = None;
                    loaded -= 1;
                }
            }
            Next::Done => {
                cursor.bytes = None;
                loaded -= 1;
            }
        }
    }
    Ok(info)
}

/// Read chunk `index` of `file` into `into` (its length: the chunk's bytes
/// in the file).
fn read_chunk(file: &File, index: u64, into: &mut [u8]) -> io::Result<()> {
    file.read_exact_at(into, index * CHUNK)
}

/// A chunk's place in its log, for the line numbers errors name.
struct Place<'a> {
    path: &'a Path,
    lines_before: u64,
}

impl Place<'_> {
    /// The 1-based line number of the line starting at `at` in `chunk`.
    fn line_at(&self, chunk: &[u8], at: usize) -> u64 {
        self.lines_before + chunk[..at].iter().filter(|&&byte| byte == b'\n').count() as u64 + 1
    }
}

/// The time field of a record's line, if it has one.
fn time_of(line: &[u8]) -> Option<u64> {
    let field = line.split(|&byte| byte == b'\t').nth(1)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// The next line of `chunk` from `offset`, past zeros (a record cut off
/// before zeros is counted and skipped, and so is a line right after zeros
/// that is not a record).
fn next_line(
    chunk: &[u8],
    mut offset: usize,
    place: &Place<'_>,
    info: &mut LogInfo,
) -> Result<Next, LogError> {
    let mut after_zeros = false;
    loop {
        let Some(skip) = chunk
            .get(offset..)
            .and_then(|rest| rest.iter().position(|&b| b != 0))
        else {
            return Ok(Next::Done);
        };
        if skip > 0 && offset > 0 {
            after_zeros = true;
        }
        offset += skip;
        let rest = &chunk[offset..];
        let stop = rest.iter().position(|&b| b == b'\n' || b == 0);
        match stop.map(|at| (at, rest[at])) {
            Some((at, b'\n')) => {
                if at > MAX_LINE_BYTES {
                    return Err(LogError::LineTooLong {
                        path: place.path.to_path_buf(),
                        line: place.line_at(chunk, offset),
                    });
                }
                let line = &rest[..at];
                // Right after zeros, only a whole record counts.
                let whole = !after_zeros || parse_line(&String::from_utf8_lossy(line)).is_ok();
                match time_of(line).filter(|_| whole) {
                    Some(time_ns) => {
                        return Ok(Next::Line {
                            start: offset,
                            end: offset + at,
                            time_ns,
                        });
                    }
                    // The cut-off end of a record whose start was lost.
                    None if after_zeros => {
                        info.holes += 1;
                        after_zeros = false;
                        offset += at + 1;
                    }
                    None => {
                        return match parse_line(&String::from_utf8_lossy(line)) {
                            Ok(record) => Ok(Next::Line {
                                start: offset,
                                end: offset + at,
                                time_ns: record.time_ns,
                            }),
                            Err(error) => Err(LogError::BadLine {
                                path: place.path.to_path_buf(),
                                line: place.line_at(chunk, offset),
                                error,
                            }),
                        };
                    }
                }
            }
            // A record cut off by zeros (its writer stopped mid-copy), or
            // by the end of the file.
            Some((at, _)) => {
                info.cut_last_line = true;
                offset += at;
            }
            None => {
                if rest.len() > MAX_LINE_BYTES {
                    return Err(LogError::LineTooLong {
                        path: place.path.to_path_buf(),
                        line: place.line_at(chunk, offset),
                    });
                }
                info.cut_last_line = true;
                return Ok(Next::Done);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, Line};

    /// A folder for a test's logs, removed when dropped (on a failure too).
    fn folder() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("cudamem-event-log-")
            .tempdir()
            .unwrap()
    }

    fn temp(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn lines(events: &[Event<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut line = Line::default();
        for (index, event) in events.iter().enumerate() {
            line.encode(&Record {
                time_ns: index as u64,
                thread: 7,
                event: event.clone(),
            });
            out.extend_from_slice(line.as_bytes());
        }
        out
    }

    fn collect(path: &Path) -> Result<(Vec<String>, LogInfo), LogError> {
        let mut seen = Vec::new();
        let info = read(path, 1 << 20, |_, record| seen.push(record.to_string()))?;
        Ok((seen, info))
    }

    #[test]
    fn a_killed_writers_zero_tail_and_cut_line_end_the_log() {
        let dir = folder();
        let mut bytes = lines(&[Event::Signal { number: 9 }, Event::Exit { dropped: 0 }]);
        let whole = bytes.len();
        bytes.extend_from_slice(b"alloc\t5\t7\tcuMem");
        bytes.extend_from_slice(&[0; 4096]);
        let path = temp(&dir, "zero.events", &bytes);
        let (seen, info) = collect(&path).unwrap();
        assert_eq!(seen.len(), 2);
        assert!(info.unfinished && info.cut_last_line);
        // Zeros right after a line end: nothing was cut.
        bytes.truncate(whole);
        bytes.extend_from_slice(&[0; 100]);
        let path = temp(&dir, "zero2.events", &bytes);
        let (_, info) = collect(&path).unwrap();
        assert!(info.unfinished && !info.cut_last_line);
        // No line end at all on the last line.
        bytes.truncate(whole);
        bytes.extend_from_slice(b"exit\t1\t2\t0");
        let path = temp(&dir, "cut.events", &bytes);
        let (seen, info) = collect(&path).unwrap();
        assert_eq!(seen.len(), 2);
        assert!(info.cut_last_line && !info.unfinished);
    }

    #[test]
    fn places_taken_and_never_written_are_skipped_with_what_was_cut_off() {
        // Threads place records without a lock: one killed between taking
        // its place and copying its record leaves zeros there, after any
        // part of the record it copied (its start, or from a copy that
        // went backwards, its end).
        let dir = folder();
        let mut bytes = lines(&[Event::Signal { number: 1 }]);
        bytes.extend_from_slice(&[0; 70]);
        bytes.extend_from_slice(&lines(&[Event::Signal { number: 2 }]));
        bytes.extend_from_slice(b"alloc\t5\t7\tcuMem");
        bytes.extend_from_slice(&[0; 20_000]);
        bytes.extend_from_slice(&lines(&[Event::Signal { number: 3 }]));
        bytes.extend_from_slice(&[0; 30]);
        bytes.extend_from_slice(b"\t7\t0x10\t256\n");
        bytes.extend_from_slice(&lines(&[Event::Exit { dropped: 0 }]));
        bytes.extend_from_slice(&[0; 5000]);
        let path = temp(&dir, "holes.events", &bytes);
        let (seen, info) = collect(&path).unwrap();
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert!(seen[0].starts_with("signal") && seen[2].starts_with("signal"));
        assert!(seen[3].starts_with("exit"), "{seen:?}");
        // The record cut off by zeros, and the tail with no start after
        // them.
        assert!(info.cut_last_line);
        assert_eq!(info.holes, 1);
        assert!(info.unfinished);
        // A line that is not a record, with no zeros before it, is still an
        // error.
        let mut bad = lines(&[Event::Signal { number: 1 }]);
        bad.extend_from_slice(b"\t7\t0x10\t256\n");
        let path = temp(&dir, "tail.events", &bad);
        assert!(matches!(
            collect(&path).unwrap_err(),
            LogError::BadLine { line: 2, .. }
        ));
    }

    #[test]
    fn chunks_of_several_threads_are_read_back_in_the_order_of_their_times() {
        let dir = folder();
        let chunk = |thread: u32, times: &[u64]| {
            let mut out = Vec::new();
            let mut line = Line::default();
            for &time_ns in times {
                line.encode(&Record {
                    time_ns,
                    thread,
                    event: Event::Signal {
                        number: time_ns as i32,
                    },
                });
                out.extend_from_slice(line.as_bytes());
            }
            out.resize(CHUNK as usize, 0);
            out
        };
        // Thread 1's first chunk, thread 2's, thread 1's next, and one a
        // thread took and never wrote; equal times keep the file's order.
        let mut bytes = chunk(1, &[1, 4, 5, 9]);
        bytes.extend(chunk(2, &[2, 3, 6, 9]));
        bytes.extend(chunk(1, &[10, 12]));
        bytes.extend(vec![0; CHUNK as usize]);
        bytes.extend(chunk(3, &[11]));
        bytes.truncate(bytes.len() - 100);
        let path = temp(&dir, "chunks.events", &bytes);
        let mut seen = Vec::new();
        let info = read(&path, 1 << 20, |index, record| {
            seen.push((index, record.time_ns, record.thread))
        })
        .unwrap();
        let times: Vec<u64> = seen.iter().map(|&(_, time, _)| time).collect();
        assert_eq!(times, [1, 2, 3, 4, 5, 6, 9, 9, 10, 11, 12]);
        assert_eq!((seen[6].2, seen[7].2), (1, 2));
        assert!(
            seen.iter()
                .enumerate()
                .all(|(at, &(index, _, _))| index == at as u64)
        );
        assert_eq!(info.records, 11);
        assert!(info.unfinished && !info.cut_last_line && info.holes == 0);
    }

    #[test]
    fn a_bad_line_inside_is_an_error_naming_it() {
        let dir = folder();
        let mut bytes = lines(&[Event::Signal { number: 9 }]);
        bytes.extend_from_slice(b"nonsense\n");
        bytes.extend_from_slice(&lines(&[Event::Exit { dropped: 0 }]));
        let path = temp(&dir, "bad.events", &bytes);
        let err = collect(&path).unwrap_err();
        assert!(matches!(err, LogError::BadLine { line: 2, .. }), "{err}");
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let path = temp(&dir, "long.events", &long);
        assert!(matches!(
            collect(&path).unwrap_err(),
            LogError::LineTooLong { line: 1, .. }
        ));
        // Past the bound rounded up to whole chunks (two at least).
        let path = temp(
            &dir,
            "big.events",
            &lines(&vec![Event::Exit { dropped: 0 }; 3000]),
        );
        assert!(std::fs::metadata(&path).unwrap().len() > log_bound(64));
        assert!(matches!(
            read(&path, 64, |_, _| {}).unwrap_err(),
            LogError::TooLarge { .. }
        ));
    }

    #[test]
    fn log_paths_name_their_process() {
        let path = log_path(Path::new("/tmp/x"), 4242);
        assert_eq!(path, Path::new("/tmp/x/4242.events"));
        assert_eq!(log_pid(&path), Some(4242));
        assert_eq!(log_pid(Path::new("/tmp/x/a.events")), None);
        assert_eq!(log_pid(Path::new("/tmp/x/42.csv")), None);
        assert_eq!(parse_max_bytes("64MiB"), Some(64 << 20));
        assert_eq!(parse_max_bytes("0"), None);
        assert_eq!(parse_max_bytes("lots"), None);
    }
}
