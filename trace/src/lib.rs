//! The recorded formats cudamem reads and writes, and their read budgets.
//!
//! - [`event`] and [`event_log`]: the driver interposer's event log (one
//!   record a line), where it is written and how it is read back;
//! - [`image`]: what a module image (PTX, cubin, fatbin) tells before it is
//!   loaded: whether its code calls the device's `malloc` or `printf`;
//! - [`process`]: what a process's event records add up to (live blocks by
//!   calling library, each device's context, limits, kernels), its ledgers
//!   and the advice they support;
//! - [`rmm_csv`]: RMM `logging_resource_adaptor` CSV logs, read and written;
//! - [`snapshot`]: PyTorch memory snapshots (a pickle reader of its own);
//! - [`budget`]: what a reader may spend, as a function of its input's size.
//!
//! Readers of allocation traces (RMM CSV logs, PyTorch snapshots) feed a
//! [`TraceBuilder`], which checks the trace is self-consistent (no free of an
//! unknown pointer, no second allocation at a live pointer) while it builds,
//! so a replay never meets a bad event: a [`Trace`] is a compact list of
//! allocate/free events with pointers replaced by dense ids.
//!
//! It is not the interposer (`cudamem-interpose`, the only code that runs
//! inside another program) and calls no driver.

#![forbid(unsafe_code)]

pub mod budget;
mod builder;
pub mod event;
pub mod event_log;
mod fields;
pub mod file;
pub mod image;
pub mod process;
pub mod rmm_csv;
pub mod snapshot;

use std::fmt;
use std::path::{Path, PathBuf};

pub use builder::TraceBuilder;
pub use fields::{parse_pointer, parse_size, parse_time};

/// The most characters of a value (a field, a header) an error message
/// quotes; see [`quote`].
pub const QUOTE_CHARS: usize = 80;

/// The largest request a trace may carry, in bytes (2^48 = 256 TiB): more
/// than any GPU's virtual address space, and small enough that offset
/// arithmetic on it can never overflow.
pub const MAX_REQUEST_BYTES: u64 = 1 << 48;

/// A segment the recording allocator reserved or gave back (a snapshot's
/// history, a CSV's segment rows) is held to the bound of a request: no
/// device reserves more at once.
pub(crate) fn check_segment_size(size: u64) -> Result<(), Problem> {
    if size > MAX_REQUEST_BYTES {
        return Err(Problem::BadSize {
            text: size.to_string(),
            why: "exceeds 2^48 bytes (256 TiB), more than any GPU can reserve",
        });
    }
    Ok(())
}

/// One allocator call of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Allocation `id` (dense, in order of first appearance) of `size` bytes.
    Alloc {
        /// Dense id of the allocation; ids are `0..Trace::allocations`.
        id: u32,
        /// Requested size in bytes, never zero.
        size: u64,
    },
    /// Allocation `id` is freed.
    Free {
        /// Dense id of an earlier, still-live allocation.
        id: u32,
    },
}

/// Where an event came from in its source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// A 1-based line of a CSV file.
    Line(u64),
    /// Entry `index` (0-based) of device `device`'s list in a snapshot's
    /// `device_traces`.
    Entry {
        /// CUDA device ordinal.
        device: u32,
        /// Index in that device's trace list.
        index: u64,
    },
    /// Entry `index` (0-based) of a snapshot's `segments` (its state at
    /// the dump).
    Segment {
        /// Index in `segments`.
        index: u64,
    },
    /// The file as a whole (it is not a trace at all, or is truncated).
    File,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Line(line) => write!(f, "line {line}"),
            Location::Entry { device, index } => {
                write!(f, "device_traces[{device}] entry {index}")
            }
            Location::Segment { index } => write!(f, "segments[{index}]"),
            Location::File => f.write_str("whole file"),
        }
    }
}

/// What is wrong with one record of a trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// A row or record that lacks a field or has the wrong shape.
    #[error("malformed record: {}", plain(.0))]
    Malformed(String),
    /// An action that is neither an allocation, a free nor a known
    /// bookkeeping record.
    #[error("unknown action {}", quote(.0))]
    UnknownAction(String),
    /// A size field that is not a usable byte count.
    #[error("size {} {why}", quote(text))]
    BadSize {
        /// The field as written.
        text: String,
        /// Why it is unusable.
        why: &'static str,
    },
    /// A pointer field that is not a number.
    #[error("pointer {} is not a hexadecimal address", quote(.0))]
    BadPointer(String),
    /// A free of a pointer that no live allocation holds.
    #[error("free of unknown pointer {0:#x} (never allocated, or already freed)")]
    UnknownPointer(u64),
    /// An allocation at a pointer that is still live.
    #[error("second allocation at live pointer {0:#x} (its earlier allocation was never freed)")]
    LivePointer(u64),
    /// The file could not be read or decompressed.
    #[error("{}", plain(.0))]
    Unreadable(String),
    /// A pickle that is not a PyTorch memory snapshot.
    #[error("not a PyTorch memory snapshot: {}", plain(.0))]
    NotSnapshot(String),
    /// A snapshot with no events for the device asked for.
    #[error(
        "no events for device {device} (devices with events: {})",
        if present.is_empty() { "none".to_string() } else {
            present.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
        }
    )]
    NoEventsForDevice {
        /// The device asked for.
        device: u32,
        /// The devices whose lists hold events.
        present: Vec<u32>,
    },
    /// More device lists, or a higher device number, than PyTorch can
    /// number (its device index, `c10::DeviceIndex`, is 8 bits).
    #[error(
        "{what}; PyTorch numbers at most {} devices (its device index, c10::DeviceIndex, is 8 \
         bits)",
        snapshot::MAX_DEVICES
    )]
    TooManyDevices {
        /// What the snapshot says: "device_traces lists 200000 devices".
        what: String,
    },
    /// A device the snapshot holds nothing of (no segment, no history).
    #[error(
        "the snapshot holds nothing of device {device} (its devices: {})",
        if present.is_empty() { "none".to_string() } else {
            present.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        }
    )]
    NoSuchDevice {
        /// The device asked for.
        device: u64,
        /// The devices it holds segments or history of.
        present: Vec<u64>,
    },
    /// More allocations than dense ids can name.
    #[error("more than {} allocations", u32::MAX)]
    TooManyAllocations,
    /// Live allocations that together exceed a 64-bit byte count.
    #[error(
        "live bytes overflow 64 bits: {live_bytes} bytes live, and this \
         allocation adds {size} more"
    )]
    LiveBytesOverflow {
        /// Bytes live before this allocation.
        live_bytes: u64,
        /// The allocation's size, bytes.
        size: u64,
    },
    /// A line longer than a reader accepts (no real log comes near it).
    #[error("line longer than {limit_bytes} bytes, the most a trace line may hold")]
    LineTooLong {
        /// The limit, bytes.
        limit_bytes: u64,
    },
    /// More records or objects than the file's [`budget::ReadBudget`]
    /// allows: a file built to cost far more than its size.
    #[error(
        "more than {limit} {what}, the most cudamem reads from a file of this size \
         (shared references count each time they are used; the bound grows with the \
         bytes the file decodes to, up to what the memory ceiling allows: {} raises it)",
        budget::MEMORY_ENV
    )]
    OverBudget {
        /// What was counted.
        what: &'static str,
        /// The bound.
        limit: u64,
    },
    /// A file compressed in a format cudamem does not read.
    #[error(
        "the file is {format}-compressed; cudamem reads gzip and uncompressed files \
         (decompress it first)"
    )]
    Compressed {
        /// The format, by name.
        format: &'static str,
    },
    /// A text file in an encoding cudamem does not read.
    #[error(
        "the file is {encoding} text; cudamem reads CSV logs in UTF-8 (or ASCII): \
         convert it first, e.g. iconv -f UTF-16 -t UTF-8 FILE > FILE.csv"
    )]
    Encoding {
        /// The encoding, by name.
        encoding: &'static str,
    },
    /// A pickle of a protocol older than PyTorch writes.
    #[error("pickle protocol {protocol} unsupported (need 2+)")]
    PickleProtocol {
        /// The protocol.
        protocol: u8,
    },
    /// A file whose (decompressed) contents exceed what cudamem reads.
    #[error(
        "more than {limit_bytes} bytes ({}) once decompressed, the most cudamem \
         reads from this file ({} bytes per compressed byte read, and at most {} times \
         the memory ceiling, which {} raises)",
        memcore::bytes::human(*limit_bytes),
        budget::DECODED_PER_FILE_BYTE,
        budget::DECODED_PER_MEMORY_BYTE,
        budget::MEMORY_ENV
    )]
    TooLarge {
        /// The limit, bytes.
        limit_bytes: u64,
    },
    /// A pickle that would make the reader hold more than the memory
    /// ceiling, or nest deeper than a reader follows.
    #[error("byte {offset} of the pickle: {what} (limit {limit}){}", raise_hint(*memory))]
    PickleLimit {
        /// Bytes of pickle read.
        offset: u64,
        /// Which bound.
        what: &'static str,
        /// The bound.
        limit: u64,
        /// The bound is the memory ceiling ([`budget::MEMORY_ENV`] raises it).
        memory: bool,
    },
}

/// How to raise the memory ceiling, for a refusal at it.
fn raise_hint(memory: bool) -> String {
    if memory {
        format!(
            "; cudamem holds at most {} while it reads one file: set {}=8G (or more) to \
             read it",
            memcore::bytes::human(budget::memory_bytes()),
            budget::MEMORY_ENV
        )
    } else {
        String::new()
    }
}

/// Why a reader passed over a record rather than replaying it or
/// rejecting the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// RMM's record of a request its upstream refused (`allocate failure`,
    /// written on out-of-memory): no block was handed out, so an allocator
    /// under replay has nothing to place.
    AllocateFailure,
    /// The header line again inside the log (logs joined end to end, or a
    /// logger that started over).
    RepeatedHeader,
    /// A last line that stops mid-record with no line end: the writing
    /// process was killed.
    CutLastLine,
}

impl SkipReason {
    /// What the skipped records were, for a warning line.
    pub fn describe(self) -> &'static str {
        match self {
            SkipReason::AllocateFailure => {
                "`allocate failure` rows (requests the recorded allocator refused; nothing to replay)"
            }
            SkipReason::RepeatedHeader => "repeated header lines",
            SkipReason::CutLastLine => "cut-off last line (the writer stopped mid-record)",
        }
    }
}

/// Records of one kind that a reader skipped.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    /// What they were.
    pub reason: SkipReason,
    /// How many.
    pub count: u64,
    /// Where the first one is.
    #[serde(serialize_with = "location_text")]
    pub first: Location,
}

fn location_text<S: serde::Serializer>(
    location: &Location,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(location)
}

/// Something odd a reader accepted and replays as written, told once per
/// kind on stderr with a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oddity {
    /// A free row whose size is not its allocation's (the allocation's
    /// size is the one replayed).
    FreeSizeDiffers,
    /// An allocation whose bytes overlap a live allocation's.
    OverlapsLive,
    /// Segment records that reserve less, at their peak, than the
    /// allocations hold at theirs: the recording allocator's figures
    /// cannot be right, and are left out.
    ReservedBelowLive,
}

impl Oddity {
    /// What the records were, for a warning line.
    pub fn describe(self) -> &'static str {
        match self {
            Oddity::FreeSizeDiffers => {
                "frees whose size differs from their allocation's (the allocation's is replayed)"
            }
            Oddity::OverlapsLive => "allocations overlapping a live allocation's bytes",
            Oddity::ReservedBelowLive => {
                "segment records reserving less than the allocations hold (the recording \
                 allocator's reserved figures are left out)"
            }
        }
    }
}

/// Records of one odd kind a reader accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Noted {
    /// What they were.
    pub oddity: Oddity,
    /// How many.
    pub count: u64,
    /// Where the first one is.
    pub first: Location,
}

/// A trace that cannot be used, with the file and the record that says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {location}: {problem}", path.display())]
pub struct TraceError {
    /// The file.
    pub path: PathBuf,
    /// The record.
    pub location: Location,
    /// What is wrong.
    pub problem: Problem,
}

/// A parsed trace, ready to replay.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Name shown in reports: the file name, plus the device for a
    /// multi-device snapshot.
    pub name: String,
    /// The allocator calls in order.
    pub events: Vec<Event>,
    /// Where each event came from, parallel to `events`.
    pub locations: Vec<Location>,
    /// Number of allocations (dense ids are `0..allocations`).
    pub allocations: u32,
    /// Largest sum of requested bytes alive at once: the lower bound on any
    /// allocator's footprint.
    pub peak_live_bytes: u64,
    /// Event index at which `peak_live_bytes` was first reached.
    pub peak_live_event: usize,
    /// Frees of blocks the trace never allocated (allocated before recording
    /// began, or lost when a ring buffer wrapped): each is taken as
    /// allocated before the first event, with the size its free names.
    pub unknown_frees: u64,
    /// The CUDA device, for a trace from a snapshot.
    pub device: Option<usize>,
    /// What the recording allocator itself held, when the trace says.
    pub recorded: Option<Recorded>,
    /// Time from the first to the last record, nanoseconds, where the
    /// format records time.
    pub duration_ns: Option<u64>,
    /// When the events were recorded, where the format says: (event index
    /// from which on, nanoseconds on the trace's clock), in event order;
    /// empty for a format without time.
    pub clock: Vec<(usize, u64)>,
    /// Records the reader passed over, by kind, in order of first sight.
    pub skipped: Vec<Skipped>,
    /// Odd records the reader accepted, by kind, in order of first sight.
    pub noted: Vec<Noted>,
    /// The recorded stacks, each distinct one once, one `file:line in
    /// function` a line: the innermost frame of the program's own code (an
    /// empty line where none is), then the top [`HOVER_FRAMES`] frames of
    /// the stack, innermost first; empty for a trace without stacks (an RMM
    /// log, a snapshot recorded without frames).
    pub stacks: Vec<String>,
    /// Which of `stacks` each allocation with one was made from: (the
    /// entry's index in its device's list, the stack's index), in entry
    /// order. Keyed by where the event came from, so ids renumbered for
    /// frees of blocks allocated before the trace began do not matter.
    pub alloc_stacks: Vec<(u64, u32)>,
}

/// Frames of a block's stack a report shows where the pointer is on it.
pub const HOVER_FRAMES: usize = 3;

/// The recording allocator's own figures over a trace (PyTorch's caching
/// allocator, from a snapshot's segment events or an RMM log's
/// `segment_alloc`/`segment_free` rows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Bytes reserved from the device, as (event index from which it holds,
    /// bytes); starts at event 0.
    pub reserved: Vec<(usize, u64)>,
    /// Most bytes reserved at once.
    pub peak_reserved_bytes: u64,
    /// Most bytes allocated at once, each request counted as the recording
    /// allocator rounds it.
    pub peak_allocated_bytes: u64,
    /// The recording ran with expandable segments (its history maps and
    /// unmaps segments rather than allocating them).
    pub expandable_segments: bool,
    /// Bytes already reserved when the history begins (recording started
    /// after segments were reserved, or the ring buffer wrapped), read
    /// from the segments the snapshot holds at its dump (an RMM log from
    /// PyTorch: the segments it frees unseen): the figures are
    /// partial, what the history shows on top of those.
    pub reserved_before_history_bytes: u64,
}

impl Trace {
    /// Keep `recorded` only where it can be right: an allocator never holds
    /// less than its live blocks, so segments reserving less at their peak
    /// than the allocations hold at theirs are noted and left out.
    pub(crate) fn set_recorded(&mut self, recorded: Recorded) {
        if recorded.peak_reserved_bytes < self.peak_live_bytes {
            self.noted.push(Noted {
                oddity: Oddity::ReservedBelowLive,
                count: 1,
                first: Location::File,
            });
            self.recorded = None;
        } else {
            self.recorded = Some(recorded);
        }
    }

    /// The stack the allocation at `event` was made from, as an index of
    /// [`Trace::stacks`], where the trace recorded one.
    pub fn stack_at(&self, event: usize) -> Option<u32> {
        let Some(Location::Entry { index, .. }) = self.locations.get(event) else {
            return None;
        };
        let at = self
            .alloc_stacks
            .binary_search_by_key(index, |&(entry, _)| entry)
            .ok()?;
        Some(self.alloc_stacks[at].1)
    }

    /// Requested bytes alive after each event, one value per event.
    pub fn live_bytes_curve(&self) -> Vec<u64> {
        let mut sizes = vec![0u64; self.allocations as usize];
        let mut live = 0u64;
        self.events
            .iter()
            .map(|event| {
                match *event {
                    Event::Alloc { id, size } => {
                        sizes[id as usize] = size;
                        live += size;
                    }
                    Event::Free { id } => live -= sizes[id as usize],
                }
                live
            })
            .collect()
    }

    /// For each allocation id, the index of its allocating event and of the
    /// event that frees it (`events.len()` when it stays live to the end).
    pub fn lifetimes(&self) -> Vec<(usize, usize)> {
        let end = self.events.len();
        let mut spans = vec![(end, end); self.allocations as usize];
        for (index, event) in self.events.iter().enumerate() {
            match *event {
                Event::Alloc { id, .. } => spans[id as usize].0 = index,
                Event::Free { id } => spans[id as usize].1 = index,
            }
        }
        spans
    }
}

/// `text` as an error message quotes it: in double quotes, escaped, and cut
/// to [`QUOTE_CHARS`] characters, with its whole length in bytes said when it
/// was cut. Every reader quotes values from a file through this, so a huge
/// field never reaches a terminal whole.
pub fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_CHARS) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &text[..cut], text.len()),
    }
}

/// The most characters of a composed message (which may carry a library's
/// own quote of the input) a [`Problem`] shows.
const MESSAGE_CHARS: usize = 3 * QUOTE_CHARS;

/// A composed message as a [`Problem`] shows it: control characters
/// escaped, cut to [`MESSAGE_CHARS`] characters. A parser's error may quote
/// raw input (serde-pickle does), and raw input can be anything.
fn plain(text: &str) -> String {
    let mut shown = String::new();
    for (count, c) in text.chars().enumerate() {
        if count >= MESSAGE_CHARS {
            return format!("{shown}... ({} bytes)", text.len());
        }
        shown.push_str(&printable(c.encode_utf8(&mut [0; 4])));
    }
    shown
}

/// `text` with every control character escaped (`\u{1b}`, `\n`), so a
/// string from a file (a segment type, a frame's file name) reaches a
/// terminal as text: no escape sequence of it can move the cursor, set
/// the title or fake a line. Every text output of strings from files goes
/// through this; HTML escapes for HTML besides.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_debug());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// The name a report shows for a trace file: its file name.
pub fn display_name(path: &Path) -> String {
    printable(
        &path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_cut_to_80_characters() {
        assert_eq!(quote("0x1f"), "\"0x1f\"");
        let long = "9".repeat(100_000);
        let quoted = quote(&long);
        assert_eq!(quoted, format!("\"{}\"... (100000 bytes)", "9".repeat(80)));
        // Cut on a character boundary, never inside one.
        let wide = "é".repeat(81);
        assert_eq!(
            quote(&wide),
            format!("\"{}\"... (162 bytes)", "é".repeat(80))
        );
        assert_eq!(quote(&"é".repeat(80)), format!("\"{}\"", "é".repeat(80)));
        let problem = Problem::BadSize {
            text: long,
            why: "is not a number",
        };
        assert!(problem.to_string().len() < 130, "{problem}");
        // Composed messages (a parser quoting raw input) are cut and escaped.
        let raw = format!("literal is invalid: \u{1b}[2J{}", "\u{fffd}".repeat(5000));
        let shown = Problem::NotSnapshot(raw).to_string();
        assert!(shown.chars().count() < 320, "{shown}");
        assert!(
            shown.contains("\\u{1b}[2J") && !shown.contains('\u{1b}'),
            "{shown}"
        );
    }
}
