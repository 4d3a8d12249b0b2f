//! Reading an event log back ([`read`]), and where the interposer writes
//! one ([`log_path`]) and under which bound.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
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
    /// The last line was cut (the process died while writing it).
    pub cut_last_line: bool,
    /// The file ended in zero bytes: the process never closed it (killed,
    /// or it left through `_exit`), or wrote its records from several
    /// threads (their log keeps its length).
    pub unfinished: bool,
    /// Places in the middle that hold zeros, or a record cut off and
    /// zeros: a thread took the place for a record and the process was
    /// killed before the record was copied there. Skipped.
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

/// Read the log at `path`, at most `max_bytes` of it, calling `visit` with
/// each record and its 0-based index, in order.
///
/// A last line cut off, and the zero bytes a process that never closed the
/// file leaves after its records, are how a killed process's log ends: they
/// are reported in [`LogInfo`], not errors. So are zeros in the middle (a
/// place a thread took for a record it never copied there, with whatever
/// part of it was copied): they are skipped, and with them the first line
/// after them if it is not a whole record. A bad line anywhere else is an
/// error.
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
    let mut reader = BufReader::with_capacity(1 << 16, file.take(max_bytes.saturating_add(1)));
    let mut info = LogInfo::default();
    let mut line = Vec::with_capacity(MAX_LINE_BYTES);
    let mut read_bytes = 0u64;
    let mut number = 0u64;
    // The line after zeros in the middle may be a record's cut-off tail.
    let mut after_hole = false;
    loop {
        line.clear();
        let got = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(io)?;
        if got == 0 {
            break;
        }
        number += 1;
        read_bytes += got as u64;
        if read_bytes > max_bytes {
            return Err(LogError::TooLarge {
                path: path.to_path_buf(),
                limit_bytes: max_bytes,
            });
        }
        if let Some(zero) = line.iter().position(|&byte| byte == 0) {
            match line[zero..].iter().position(|&byte| byte != 0) {
                // Zeros, then the next record on the same line.
                Some(past) => {
                    line.drain(..zero + past);
                    info.holes += 1;
                    after_hole = true;
                }
                None => {
                    let skipped = skip_zeros(&mut reader).map_err(io)?;
                    read_bytes += skipped.bytes;
                    if read_bytes > max_bytes {
                        return Err(LogError::TooLarge {
                            path: path.to_path_buf(),
                            limit_bytes: max_bytes,
                        });
                    }
                    if !skipped.more {
                        info.unfinished = true;
                        info.cut_last_line = zero > 0;
                        break;
                    }
                    info.holes += 1;
                    after_hole = true;
                    continue;
                }
            }
        }
        let ended = line.last() == Some(&b'\n');
        if !ended && line.len() > MAX_LINE_BYTES {
            return Err(LogError::LineTooLong {
                path: path.to_path_buf(),
                line: number,
            });
        }
        let text = String::from_utf8_lossy(if ended {
            &line[..line.len() - 1]
        } else {
            &line
        });
        let tail_of_hole = std::mem::take(&mut after_hole);
        match parse_line(&text) {
            Ok(record) if ended => {
                visit(info.records, &record);
                info.records += 1;
            }
            // The cut-off tail of the record whose place the zeros were.
            Err(_) if ended && tail_of_hole => {}
            // Without a line end this is the last line: the writer stopped
            // in the middle of it, whether or not what is there parses.
            _ if !ended => {
                info.cut_last_line = true;
                break;
            }
            Err(error) => {
                return Err(LogError::BadLine {
                    path: path.to_path_buf(),
                    line: number,
                    error,
                });
            }
            Ok(_) => unreachable!("the arms above cover every case"),
        }
    }
    Ok(info)
}

/// Zeros skipped by [`skip_zeros`].
struct Skipped {
    bytes: u64,
    /// A byte that is not zero follows.
    more: bool,
}

/// Skip zero bytes up to the next byte that is not one, or the end.
fn skip_zeros(reader: &mut impl BufRead) -> io::Result<Skipped> {
    let mut bytes = 0u64;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok(Skipped { bytes, more: false });
        }
        match buffer.iter().position(|&byte| byte != 0) {
            Some(at) => {
                reader.consume(at);
                return Ok(Skipped {
                    bytes: bytes + at as u64,
                    more: true,
                });
            }
            None => {
                let len = buffer.len();
                reader.consume(len);
                bytes += len as u64;
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
        assert_eq!(info.holes, 3);
        assert!(info.unfinished && !info.cut_last_line);
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
        let path = temp(
            &dir,
            "big.events",
            &lines(&vec![Event::Exit { dropped: 0 }; 100]),
        );
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
