//! Opening a trace file: gzip or plain, CSV log or pickled snapshot, told
//! apart by their first bytes rather than by the file name.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::{rmm_csv, snapshot};
use crate::trace::{Location, Problem, Trace, TraceError, display_name};

/// The trace compiled into the binary: ResNet-50 training and inference on
/// an H200, the repository's `traces/rmm/resnet50_train.csv.gz`.
pub const EMBEDDED_RESNET50: &[u8] = include_bytes!("../../../traces/rmm/resnet50_train.csv.gz");

/// The name reports give the embedded trace.
pub const EMBEDDED_NAME: &str = "resnet50_train.csv.gz (embedded)";

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Pickle protocol 2 and later open with the PROTO opcode.
const PICKLE_PROTO: u8 = 0x80;

/// The most bytes cudamem reads from one trace file once decompressed
/// (16 GiB): far above any real log or snapshot, and a bound on the time and
/// memory a decompression bomb (a small gzip of one byte repeated) can take.
pub const MAX_DECODED_BYTES: u64 = 16 << 30;

/// How much a reader takes from one file before it gives up, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// The file's contents, decompressed.
    pub decoded_bytes: u64,
    /// One line of a CSV log.
    pub line_bytes: u64,
}

impl ReadLimits {
    /// The limits every command uses.
    pub const DEFAULT: ReadLimits = ReadLimits {
        decoded_bytes: MAX_DECODED_BYTES,
        line_bytes: rmm_csv::MAX_LINE_BYTES,
    };
}

/// Read every trace in the file at `path` (a snapshot holds one per device
/// that has events; a CSV log holds one).
pub fn load(path: &Path) -> Result<Vec<Trace>, TraceError> {
    let file = File::open(path).map_err(|err| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: Problem::Unreadable(format!("cannot open: {err}")),
    })?;
    read(path, &display_name(path), BufReader::new(file))
}

/// Read the pickle of the PyTorch snapshot at `path` (gzip or plain).
pub fn load_pickle(path: &Path) -> Result<snapshot::pickle::Pickle, TraceError> {
    let file = File::open(path).map_err(|err| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: Problem::Unreadable(format!("cannot open: {err}")),
    })?;
    let mut input = BufReader::new(file);
    let head = input.fill_buf().map_err(|err| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: Problem::Unreadable(format!("cannot read: {err}")),
    })?;
    if head.starts_with(&GZIP_MAGIC) {
        let decoded = BufReader::with_capacity(1 << 16, MultiGzDecoder::new(input));
        snapshot::read_pickle(path, decoded)
    } else {
        snapshot::read_pickle(path, input)
    }
}

/// Read the trace compiled into the binary.
pub fn load_embedded() -> Result<Vec<Trace>, TraceError> {
    read(Path::new("<embedded>"), EMBEDDED_NAME, EMBEDDED_RESNET50)
}

/// Read traces from `input`, which came from `path` and is shown as `name`.
pub fn read(path: &Path, name: &str, input: impl BufRead) -> Result<Vec<Trace>, TraceError> {
    read_limited(path, name, input, ReadLimits::DEFAULT)
}

/// [`read`] within `limits`.
pub fn read_limited(
    path: &Path,
    name: &str,
    mut input: impl BufRead,
    limits: ReadLimits,
) -> Result<Vec<Trace>, TraceError> {
    let file_error = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    let head = input
        .fill_buf()
        .map_err(|err| file_error(Problem::Unreadable(format!("cannot read: {err}"))))?;
    if head.starts_with(&GZIP_MAGIC) {
        let decoded = MultiGzDecoder::new(input);
        read_decoded(path, name, decoded, limits)
    } else {
        read_decoded(path, name, input, limits)
    }
}

fn read_decoded(
    path: &Path,
    name: &str,
    input: impl Read,
    limits: ReadLimits,
) -> Result<Vec<Trace>, TraceError> {
    let mut input = BufReader::with_capacity(1 << 16, Bounded::new(input, limits.decoded_bytes));
    let file_error = |err: io::Error| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: read_problem(&err),
    };
    let head = input.fill_buf().map_err(file_error)?;
    if head.first() == Some(&PICKLE_PROTO) {
        snapshot::parse(path, name, input)
    } else {
        rmm_csv::parse(path, name, input, limits.line_bytes).map(|trace| vec![trace])
    }
}

/// More decompressed bytes than the limit, as [`Bounded`] reports it.
#[derive(Debug, thiserror::Error)]
#[error("more than {limit_bytes} bytes")]
struct TooLarge {
    limit_bytes: u64,
}

/// A reader that fails once more than `limit_bytes` have come through.
struct Bounded<R> {
    inner: R,
    left: u64,
    limit_bytes: u64,
}

impl<R> Bounded<R> {
    fn new(inner: R, limit_bytes: u64) -> Self {
        Self {
            inner,
            left: limit_bytes,
            limit_bytes,
        }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Ask for one byte past the limit, so reaching it exactly is fine
        // and passing it is seen.
        let want = buf
            .len()
            .min(usize::try_from(self.left.saturating_add(1)).unwrap_or(usize::MAX));
        let read = self.inner.read(&mut buf[..want])?;
        match self.left.checked_sub(read as u64) {
            Some(left) => {
                self.left = left;
                Ok(read)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                TooLarge {
                    limit_bytes: self.limit_bytes,
                },
            )),
        }
    }
}

/// What a failed read means for a trace: too large, cut short, or unreadable.
pub fn read_problem(err: &io::Error) -> Problem {
    match err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<TooLarge>())
    {
        Some(too_large) => Problem::TooLarge {
            limit_bytes: too_large.limit_bytes,
        },
        None => Problem::Unreadable(describe_read_error(err)),
    }
}

/// Say what a read error means for a trace: a gzip stream that stops early
/// is the usual case (a copy cut short).
pub fn describe_read_error(err: &std::io::Error) -> String {
    if err.kind() == std::io::ErrorKind::UnexpectedEof {
        format!("truncated gzip stream (the file ends before the compressed data does): {err}")
    } else {
        format!("cannot read or decompress: {err}")
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn read_with(bytes: &[u8], limits: ReadLimits) -> Result<Vec<Trace>, TraceError> {
        read_limited(Path::new("bomb.gz"), "bomb.gz", bytes, limits)
    }

    /// A valid log of `rows` allocate/free pairs.
    fn log(rows: usize) -> String {
        let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
        for row in 0..rows {
            text += &format!(
                "0,0,allocate,0x{:x},256,0\n0,0,free,0x{:x},256,0\n",
                row + 1,
                row + 1
            );
        }
        text
    }

    #[test]
    fn decompression_stops_at_the_limit_and_names_it() {
        let text = log(2000);
        let small = ReadLimits {
            decoded_bytes: text.len() as u64 - 1,
            ..ReadLimits::DEFAULT
        };
        let err = read_with(&gzip(text.as_bytes()), small).unwrap_err();
        assert!(
            matches!(err.problem, Problem::TooLarge { limit_bytes } if limit_bytes == small.decoded_bytes),
            "{err}"
        );
        // Exactly at the limit is fine.
        let exact = ReadLimits {
            decoded_bytes: text.len() as u64,
            ..ReadLimits::DEFAULT
        };
        assert_eq!(
            read_with(&gzip(text.as_bytes()), exact).unwrap()[0]
                .events
                .len(),
            4000
        );
        // Plain files and snapshots are bounded the same way.
        assert!(matches!(
            read_with(text.as_bytes(), small).unwrap_err().problem,
            Problem::TooLarge { .. }
        ));
        let pickle = [&[PICKLE_PROTO, 2][..], &[0u8; 4096]].concat();
        let err = read_with(
            &pickle,
            ReadLimits {
                decoded_bytes: 1024,
                ..ReadLimits::DEFAULT
            },
        )
        .unwrap_err();
        assert_eq!(err.problem, Problem::TooLarge { limit_bytes: 1024 });
        assert_eq!(err.location, Location::File);
    }

    #[test]
    fn the_default_limit_is_16_gib_and_the_message_says_so() {
        assert_eq!(ReadLimits::DEFAULT.decoded_bytes, 16 << 30);
        let message = Problem::TooLarge {
            limit_bytes: MAX_DECODED_BYTES,
        }
        .to_string();
        assert!(
            message.contains("17179869184 bytes (16.0 GiB)"),
            "{message}"
        );
    }

    #[test]
    fn a_gzip_bomb_of_one_endless_line_stops_at_the_line_bound() {
        // 64 MiB of one byte: a gzip of about 64 KiB.
        let bomb = gzip(&vec![b'A'; 64 << 20]);
        assert!(bomb.len() < 256 << 10, "{}", bomb.len());
        /// A reader that counts the bytes taken from it.
        struct Counted<'a> {
            bytes: &'a [u8],
            taken: usize,
        }
        impl Read for Counted<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let read = self.bytes.read(buf)?;
                self.taken += read;
                Ok(read)
            }
        }
        let mut counted = Counted {
            bytes: &bomb,
            taken: 0,
        };
        let err = read_limited(
            Path::new("bomb.gz"),
            "bomb.gz",
            BufReader::new(&mut counted),
            ReadLimits::DEFAULT,
        )
        .unwrap_err();
        assert_eq!(err.location, Location::Line(1));
        assert_eq!(
            err.problem,
            Problem::LineTooLong {
                limit_bytes: rmm_csv::MAX_LINE_BYTES
            }
        );
        // It reads a few buffers, not the whole stream.
        assert!(
            counted.taken < bomb.len() / 4,
            "{} of {} compressed bytes read",
            counted.taken,
            bomb.len()
        );
    }
}
