//! Opening a trace file: gzip or plain, CSV log or pickled snapshot, told
//! apart by their first bytes rather than by the file name.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

use flate2::bufread::GzDecoder;

use super::budget::{DECODED_PER_FILE_BYTE, MIN_DECODED_BYTES, ReadBudget};
use super::{rmm_csv, snapshot};
use crate::{Location, Problem, Trace, TraceError, display_name};

/// A trace compiled into the binary: a file of the repository's traces/.
#[derive(Debug, Clone, Copy)]
pub struct Embedded {
    /// Its path under traces/.
    pub path: &'static str,
    /// The file's bytes.
    pub bytes: &'static [u8],
}

impl Embedded {
    /// The name reports give it: the file's name, marked as built in.
    pub fn name(&self) -> String {
        let file = self.path.rsplit('/').next().unwrap_or(self.path);
        format!("{file} (embedded)")
    }
}

/// The traces compiled into the binary, in the order a bare `cudamem`
/// replays them: ResNet-50 training as PyTorch's memory snapshot (what a
/// PyTorch user asks about first), then the same workload as an RMM log
/// (traces/README.md says where they were recorded).
pub const EMBEDDED: [Embedded; 2] = [
    Embedded {
        path: "pytorch/resnet50_train.full.default.pickle.gz",
        bytes: include_bytes!("../../traces/pytorch/resnet50_train.full.default.pickle.gz"),
    },
    Embedded {
        path: "rmm/resnet50_train.csv.gz",
        bytes: include_bytes!("../../traces/rmm/resnet50_train.csv.gz"),
    },
];

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Pickle protocol 2 and later open with the PROTO opcode.
const PICKLE_PROTO: u8 = 0x80;

/// Compressed formats cudamem does not read, by their first bytes, so such
/// a file is named for what it is rather than read as a CSV with a bad
/// header.
const OTHER_COMPRESSION: [(&[u8], &str); 7] = [
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz"),
    (b"BZh", "bzip2"),
    (&[0x78, 0x01], "zlib"),
    (&[0x78, 0x5e], "zlib"),
    (&[0x78, 0x9c], "zlib"),
    (&[0x78, 0xda], "zlib"),
];

fn open(path: &Path) -> Result<(BufReader<File>, ReadBudget), TraceError> {
    let unreadable = |what: &str, err: io::Error| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: Problem::Unreadable(format!("{what}: {err}")),
    };
    let file = File::open(path).map_err(|err| unreadable("cannot open", err))?;
    let bytes = file
        .metadata()
        .map_err(|err| unreadable("cannot read", err))?
        .len();
    Ok((BufReader::new(file), ReadBudget::for_file(bytes)))
}

/// Read every trace in the file at `path` (a snapshot holds one per device
/// that has events; a CSV log holds one), within the budget of its size.
pub fn load(path: &Path) -> Result<Vec<Trace>, TraceError> {
    load_device(path, None)
}

/// [`load`], keeping of a PyTorch snapshot only `device`'s trace when one
/// is given (the other devices' entries are not read into events); an RMM
/// log, which names no device, is refused with [`Problem::NotSnapshot`].
pub fn load_device(path: &Path, device: Option<u32>) -> Result<Vec<Trace>, TraceError> {
    let (input, budget) = open(path)?;
    read_device(path, &display_name(path), input, &budget, device)
}

/// Read the pickle of the PyTorch snapshot at `path` (gzip or plain),
/// within the budget of its size.
pub fn load_pickle(path: &Path) -> Result<(snapshot::pickle::Pickle, ReadBudget), TraceError> {
    let (input, budget) = open(path)?;
    let mut decoded = decoded(path, input, &budget)?;
    let head = decoded.fill_buf().map_err(|err| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: read_problem(&err),
    })?;
    if let Some(protocol) = old_pickle_protocol(head) {
        return Err(TraceError {
            path: path.to_path_buf(),
            location: Location::File,
            problem: Problem::PickleProtocol { protocol },
        });
    }
    // Pickle protocol 2 and later open with PROTO (0x80).
    if head.first() != Some(&0x80) {
        let what = if head.is_empty() {
            "the file is empty".to_string()
        } else if head.starts_with(b"Thread,") {
            "it is an RMM log (CSV), which `cudamem replay` reads".to_string()
        } else {
            format!(
                "a snapshot is a pickle, which starts with byte 0x80; this file starts with \
                 0x{:02x}",
                head[0]
            )
        };
        return Err(TraceError {
            path: path.to_path_buf(),
            location: Location::File,
            problem: Problem::NotSnapshot(what),
        });
    }
    let pickle = snapshot::read_pickle(path, decoded, &budget)?;
    Ok((pickle, budget))
}

/// Read the traces compiled into the binary ([`EMBEDDED`]), in order.
pub fn load_embedded() -> Result<Vec<Trace>, TraceError> {
    let mut traces = Vec::new();
    for embedded in EMBEDDED {
        traces.extend(read_limited(
            Path::new("<embedded>"),
            &embedded.name(),
            embedded.bytes,
            &ReadBudget::for_file(embedded.bytes.len() as u64),
        )?);
    }
    Ok(traces)
}

/// Read traces from `input`, which came from `path` and is shown as
/// `name`, within `budget`.
pub fn read_limited(
    path: &Path,
    name: &str,
    input: impl BufRead,
    budget: &ReadBudget,
) -> Result<Vec<Trace>, TraceError> {
    read_device(path, name, input, budget, None)
}

/// [`read_limited`], of one snapshot device when `device` is given.
pub fn read_device(
    path: &Path,
    name: &str,
    input: impl BufRead,
    budget: &ReadBudget,
    device: Option<u32>,
) -> Result<Vec<Trace>, TraceError> {
    let mut input = decoded(path, input, budget)?;
    let file_error = |err: io::Error| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: read_problem(&err),
    };
    let head = input.fill_buf().map_err(file_error)?;
    if head.first() == Some(&PICKLE_PROTO) {
        snapshot::parse(path, name, input, budget, device)
    } else if let Some(device) = device {
        Err(TraceError {
            path: path.to_path_buf(),
            location: Location::File,
            problem: Problem::NotSnapshot(format!(
                "an RMM log names no devices, so device {device} cannot be picked from it"
            )),
        })
    } else if let Some(protocol) = old_pickle_protocol(head) {
        Err(TraceError {
            path: path.to_path_buf(),
            location: Location::File,
            problem: Problem::PickleProtocol { protocol },
        })
    } else if let Some(encoding) = text_encoding(head) {
        Err(TraceError {
            path: path.to_path_buf(),
            location: Location::File,
            problem: Problem::Encoding { encoding },
        })
    } else {
        // A UTF-8 byte order mark is no part of the header.
        if head.starts_with(UTF8_BOM) {
            input.consume(UTF8_BOM.len());
        }
        rmm_csv::parse(path, name, input, budget).map(|trace| vec![trace])
    }
}

const UTF8_BOM: &[u8] = &[0xef, 0xbb, 0xbf];

/// The encoding of a text file cudamem does not read (UTF-16 or UTF-32,
/// by its byte order mark or by the zero bytes between ASCII letters),
/// so it is named rather than read as a CSV with a garbled header.
fn text_encoding(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(&[0xff, 0xfe, 0, 0]) || head.starts_with(&[0, 0, 0xfe, 0xff]) {
        return Some("UTF-32");
    }
    if head.starts_with(&[0xff, 0xfe]) {
        return Some("UTF-16 (little-endian)");
    }
    if head.starts_with(&[0xfe, 0xff]) {
        return Some("UTF-16 (big-endian)");
    }
    // ASCII text in UTF-16 without a mark: every other byte zero.
    let pairs = head.len().min(64) / 2;
    if pairs >= 4 {
        let zero = |offset: usize| (0..pairs).all(|pair| head[2 * pair + offset] == 0);
        if zero(1) && !zero(0) {
            return Some("UTF-16 (little-endian)");
        }
        if zero(0) && !zero(1) {
            return Some("UTF-16 (big-endian)");
        }
    }
    None
}

/// The protocol of a pickle written with protocol 0 or 1 (which open
/// with no PROTO opcode), told by its first opcodes.
fn old_pickle_protocol(head: &[u8]) -> Option<u8> {
    let text = [b"(dp".as_slice(), b"(lp", b"(t", b"(S'", b"(V", b"(I"];
    let binary = [b"}q".as_slice(), b"]q", b"}(", b"](", b"}.", b"]."];
    if text.iter().any(|start| head.starts_with(start)) {
        Some(0)
    } else if binary.iter().any(|start| head.starts_with(start)) {
        Some(1)
    } else {
        None
    }
}

/// The decompressed contents of `input` (gzip, or plain), bounded by the
/// budget's decoded bytes.
fn decoded<'a>(
    path: &Path,
    mut input: impl BufRead + 'a,
    budget: &ReadBudget,
) -> Result<BufReader<Bounded<Box<dyn Read + 'a>>>, TraceError> {
    let file_error = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    let head = input
        .fill_buf()
        .map_err(|err| file_error(Problem::Unreadable(format!("cannot read: {err}"))))?;
    if let Some((_, format)) = OTHER_COMPRESSION
        .iter()
        .find(|(magic, _)| head.starts_with(magic))
    {
        return Err(file_error(Problem::Compressed { format }));
    }
    let gzip = head.starts_with(&GZIP_MAGIC);
    let consumed = Rc::new(Cell::new(0u64));
    let inner: Box<dyn Read + 'a> = if gzip {
        Box::new(Members::new(Counted {
            inner: input,
            consumed: Rc::clone(&consumed),
        }))
    } else {
        Box::new(input)
    };
    let mut bounded = Bounded::new(inner, budget.decoded_bytes);
    if gzip {
        bounded.compressed = Some(consumed);
    }
    Ok(BufReader::with_capacity(1 << 16, bounded))
}

/// A compressed input that counts the bytes the decoder took from it, so
/// the bytes it may decode to follow what was really read, not the
/// file's apparent size (a sparse file, a hole after a small member).
struct Counted<R> {
    inner: R,
    consumed: Rc<Cell<u64>>,
}

impl<R: BufRead> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.consumed.set(self.consumed.get() + read as u64);
        Ok(read)
    }
}

impl<R: BufRead> BufRead for Counted<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.consumed.set(self.consumed.get() + amount as u64);
        self.inner.consume(amount);
    }
}

/// The members of a gzip file one after another, as gzip(1) reads them:
/// zero bytes after the last member (padding some writers add to fill a
/// block) end the stream, anything else there is an error.
struct Members<R: BufRead> {
    member: Option<GzDecoder<Lookahead<R>>>,
}

impl<R: BufRead> Members<R> {
    fn new(input: R) -> Self {
        Self {
            member: Some(GzDecoder::new(Lookahead {
                inner: input,
                held: [0; 2],
                held_len: 0,
                held_at: 0,
            })),
        }
    }
}

/// A buffered input that can look at its next two bytes even where they
/// straddle the end of the inner buffer (a member's magic split there is
/// still a member).
struct Lookahead<R> {
    inner: R,
    /// Bytes taken from `inner` to look at, not yet consumed.
    held: [u8; 2],
    held_len: usize,
    held_at: usize,
}

impl<R: BufRead> Lookahead<R> {
    /// Whether the next bytes are a gzip member's magic; `None` at the end.
    fn at_member(&mut self) -> io::Result<Option<bool>> {
        let rest = self.fill_buf()?;
        if rest.len() >= GZIP_MAGIC.len() || rest.is_empty() {
            return Ok((!rest.is_empty()).then(|| rest.starts_with(&GZIP_MAGIC)));
        }
        // One byte here (or held): take it and the next into `held`.
        let first = rest[0];
        self.consume(1);
        self.held = [first, 0];
        self.held_len = 1;
        self.held_at = 0;
        let next = self.inner.fill_buf()?;
        if let Some(&second) = next.first() {
            self.inner.consume(1);
            self.held[1] = second;
            self.held_len = 2;
        }
        Ok(Some(self.held[..self.held_len] == GZIP_MAGIC))
    }
}

impl<R: BufRead> Read for Lookahead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let rest = self.fill_buf()?;
        let length = rest.len().min(buf.len());
        buf[..length].copy_from_slice(&rest[..length]);
        self.consume(length);
        Ok(length)
    }
}

impl<R: BufRead> BufRead for Lookahead<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.held_at < self.held_len {
            return Ok(&self.held[self.held_at..self.held_len]);
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        let held = self.held_len - self.held_at;
        if held > 0 {
            self.held_at += amount.min(held);
            self.inner.consume(amount.saturating_sub(held));
        } else {
            self.inner.consume(amount);
        }
    }
}

impl<R: BufRead> Read for Members<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(member) = self.member.as_mut() else {
                return Ok(0);
            };
            let read = member.read(buf)?;
            if read > 0 || buf.is_empty() {
                return Ok(read);
            }
            let Some(mut input) = self.member.take().map(GzDecoder::into_inner) else {
                return Ok(0);
            };
            if input.at_member()? == Some(true) {
                self.member = Some(GzDecoder::new(input));
                continue;
            }
            // Only zeros may follow the last member.
            loop {
                let rest = input.fill_buf()?;
                if rest.is_empty() {
                    return Ok(0);
                }
                if rest.iter().any(|&byte| byte != 0) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "bytes after the last gzip member that are neither a member nor zero padding",
                    ));
                }
                let length = rest.len();
                input.consume(length);
            }
        }
    }
}

/// More decompressed bytes than the limit, as [`Bounded`] reports it.
#[derive(Debug, thiserror::Error)]
#[error("more than {limit_bytes} bytes")]
struct TooLarge {
    limit_bytes: u64,
}

/// A reader that fails once more than `limit_bytes` have come through, or
/// (for a compressed input) more than [`DECODED_PER_FILE_BYTE`] bytes per
/// compressed byte read.
struct Bounded<R> {
    inner: R,
    left: u64,
    limit_bytes: u64,
    /// Compressed bytes read so far, for a compressed input.
    compressed: Option<Rc<Cell<u64>>>,
}

impl<R> Bounded<R> {
    fn new(inner: R, limit_bytes: u64) -> Self {
        Self {
            inner,
            left: limit_bytes,
            limit_bytes,
            compressed: None,
        }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(compressed) = &self.compressed {
            let decoded = self.limit_bytes - self.left;
            let allowed = compressed
                .get()
                .saturating_mul(DECODED_PER_FILE_BYTE)
                .max(MIN_DECODED_BYTES);
            if decoded > allowed {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    TooLarge {
                        limit_bytes: allowed,
                    },
                ));
            }
        }
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

    #[test]
    fn members_split_anywhere_by_the_buffer_are_read_whole() {
        // Three members, zero padding after them: read through buffers of
        // every small size, so a member's magic falls across each boundary.
        let mut bytes = gzip(b"first,");
        bytes.extend(gzip(b"second,"));
        bytes.extend(gzip(b"third"));
        bytes.extend([0; 5]);
        for capacity in 1..=8 {
            let input = io::BufReader::with_capacity(capacity, io::Cursor::new(&bytes));
            let mut text = String::new();
            Members::new(input).read_to_string(&mut text).unwrap();
            assert_eq!(text, "first,second,third", "buffer of {capacity}");
        }
        // A byte that is neither a member nor padding is still refused,
        // split or not.
        let mut bad = gzip(b"x");
        bad.extend([0x1f, 0x00]);
        for capacity in 1..=4 {
            let input = io::BufReader::with_capacity(capacity, io::Cursor::new(&bad));
            let err = Members::new(input)
                .read_to_end(&mut Vec::new())
                .unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::InvalidData,
                "buffer of {capacity}"
            );
        }
    }

    fn read_with(bytes: &[u8], limits: ReadBudget) -> Result<Vec<Trace>, TraceError> {
        read_limited(Path::new("bomb.gz"), "bomb.gz", bytes, &limits)
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
        let small = ReadBudget {
            decoded_bytes: text.len() as u64 - 1,
            ..ReadBudget::CEILING
        };
        let err = read_with(&gzip(text.as_bytes()), small).unwrap_err();
        assert!(
            matches!(err.problem, Problem::TooLarge { limit_bytes } if limit_bytes == small.decoded_bytes),
            "{err}"
        );
        // Exactly at the limit is fine.
        let exact = ReadBudget {
            decoded_bytes: text.len() as u64,
            ..ReadBudget::CEILING
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
            ReadBudget {
                decoded_bytes: 1024,
                ..ReadBudget::CEILING
            },
        )
        .unwrap_err();
        assert_eq!(err.problem, Problem::TooLarge { limit_bytes: 1024 });
        assert_eq!(err.location, Location::File);
    }

    #[test]
    fn the_ceiling_is_4_gib_and_the_message_says_so() {
        assert_eq!(ReadBudget::CEILING.decoded_bytes, 4 << 30);
        let message = Problem::TooLarge {
            limit_bytes: ReadBudget::CEILING.decoded_bytes,
        }
        .to_string();
        assert!(message.contains("4294967296 bytes (4.00 GiB)"), "{message}");
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
            &ReadBudget::CEILING,
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
