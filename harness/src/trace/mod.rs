//! A recorded allocation trace, reduced to what a replay needs: a compact list
//! of allocate/free events with pointers replaced by dense ids.
//!
//! Readers (RMM CSV logs, PyTorch snapshots) feed a [`TraceBuilder`], which
//! checks the trace is self-consistent (no free of an unknown pointer, no
//! second allocation at a live pointer) while it builds, so a replay never
//! meets a bad event.

pub mod file;
pub mod rmm_csv;
pub mod snapshot;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The most characters of a value (a field, a header) an error message
/// quotes; see [`quote`].
pub const QUOTE_CHARS: usize = 80;

/// The largest request a trace may carry, in bytes (2^48 = 256 TiB): more
/// than any GPU's virtual address space, and small enough that offset
/// arithmetic on it can never overflow.
pub const MAX_REQUEST_BYTES: u64 = 1 << 48;

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
        device: usize,
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
    /// A file whose (decompressed) contents exceed what cudamem reads.
    #[error(
        "more than {limit_bytes} bytes ({}) once decompressed, the most cudamem \
         reads from one trace file",
        memcore::bytes::human(*limit_bytes)
    )]
    TooLarge {
        /// The limit, bytes.
        limit_bytes: u64,
    },
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
    /// Records the reader passed over, by kind, in order of first sight.
    pub skipped: Vec<Skipped>,
}

/// The recording allocator's own figures over a trace (PyTorch's caching
/// allocator, from a snapshot's segment events).
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
}

impl Trace {
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

/// Builds a [`Trace`] record by record, checking each against the live set.
#[derive(Debug)]
pub struct TraceBuilder {
    name: String,
    live: HashMap<u64, (u32, u64)>,
    /// Pointers allocated at some point of the trace.
    seen: HashSet<u64>,
    /// Blocks freed but never allocated: (id, size, where the free was).
    assumed: Vec<(u32, u64, Location)>,
    events: Vec<Event>,
    locations: Vec<Location>,
    allocations: u32,
    live_bytes: u64,
    peak_live_bytes: u64,
    peak_live_event: usize,
    /// First and last time seen, nanoseconds.
    times: Option<(u64, u64)>,
    skipped: Vec<Skipped>,
}

impl TraceBuilder {
    /// An empty trace named `name`.
    pub fn new(name: String) -> Self {
        Self {
            name,
            live: HashMap::new(),
            seen: HashSet::new(),
            assumed: Vec::new(),
            events: Vec::new(),
            locations: Vec::new(),
            allocations: 0,
            live_bytes: 0,
            peak_live_bytes: 0,
            peak_live_event: 0,
            times: None,
            skipped: Vec::new(),
        }
    }

    /// Count a record at `at` passed over for `reason`.
    pub fn skip(&mut self, reason: SkipReason, at: Location) {
        match self.skipped.iter_mut().find(|kind| kind.reason == reason) {
            Some(kind) => kind.count += 1,
            None => self.skipped.push(Skipped {
                reason,
                count: 1,
                first: at,
            }),
        }
    }

    /// A record was made at `ns` nanoseconds (on any clock): the trace's
    /// duration runs from the earliest to the latest.
    pub fn observe_time(&mut self, ns: u64) {
        let (first, last) = self.times.get_or_insert((ns, ns));
        *first = (*first).min(ns);
        *last = (*last).max(ns);
    }

    /// Record an allocation of `size` bytes at `pointer`.
    pub fn allocate(&mut self, pointer: u64, size: u64, at: Location) -> Result<(), Problem> {
        if size == 0 {
            return Err(Problem::BadSize {
                text: "0".into(),
                why: "is zero (an allocation needs at least one byte)",
            });
        }
        if size > MAX_REQUEST_BYTES {
            return Err(Problem::BadSize {
                text: size.to_string(),
                why: "exceeds 2^48 bytes (256 TiB), more than any GPU can address",
            });
        }
        if self.live.contains_key(&pointer) {
            return Err(Problem::LivePointer(pointer));
        }
        let id = self.allocations;
        let live_bytes = self
            .live_bytes
            .checked_add(size)
            .ok_or(Problem::LiveBytesOverflow {
                live_bytes: self.live_bytes,
                size,
            })?;
        self.allocations = id.checked_add(1).ok_or(Problem::TooManyAllocations)?;
        self.live.insert(pointer, (id, size));
        self.seen.insert(pointer);
        self.events.push(Event::Alloc { id, size });
        self.locations.push(at);
        self.live_bytes = live_bytes;
        if self.live_bytes > self.peak_live_bytes {
            self.peak_live_bytes = self.live_bytes;
            self.peak_live_event = self.events.len() - 1;
        }
        Ok(())
    }

    /// Record the free of the live allocation at `pointer`.
    pub fn free(&mut self, pointer: u64, at: Location) -> Result<(), Problem> {
        let (id, size) = self
            .live
            .remove(&pointer)
            .ok_or(Problem::UnknownPointer(pointer))?;
        self.live_bytes -= size;
        self.events.push(Event::Free { id });
        self.locations.push(at);
        Ok(())
    }

    /// Record the free of `size` bytes at `pointer`, where a free of a
    /// pointer the trace never allocated is a block allocated before the
    /// trace began (a late start, or a wrapped ring buffer). A second free
    /// of a pointer the trace did allocate is still an error.
    pub fn free_or_assume(&mut self, pointer: u64, size: u64, at: Location) -> Result<(), Problem> {
        if self.live.contains_key(&pointer) || self.seen.contains(&pointer) {
            return self.free(pointer, at);
        }
        if size == 0 || size > MAX_REQUEST_BYTES {
            return Err(Problem::UnknownPointer(pointer));
        }
        let id = self.allocations;
        self.allocations = id.checked_add(1).ok_or(Problem::TooManyAllocations)?;
        self.seen.insert(pointer);
        self.assumed.push((id, size, at));
        self.events.push(Event::Free { id });
        self.locations.push(at);
        Ok(())
    }

    /// The finished trace.
    pub fn finish(self) -> Trace {
        let mut trace = Trace {
            name: self.name,
            events: self.events,
            locations: self.locations,
            allocations: self.allocations,
            peak_live_bytes: self.peak_live_bytes,
            peak_live_event: self.peak_live_event,
            unknown_frees: self.assumed.len() as u64,
            device: None,
            recorded: None,
            duration_ns: self.times.map(|(first, last)| last - first),
            skipped: self.skipped,
        };
        if !self.assumed.is_empty() {
            trace.prepend_assumed(&self.assumed);
        }
        trace
    }
}

impl Trace {
    /// Put an allocation of each assumed block before the first event,
    /// renumber ids so they stay in order of first appearance, and find the
    /// peak again (the assumed blocks are live from the start).
    fn prepend_assumed(&mut self, assumed: &[(u32, u64, Location)]) {
        let count = assumed.len() as u32;
        let mut new_id = vec![u32::MAX; self.allocations as usize];
        for (rank, &(id, _, _)) in assumed.iter().enumerate() {
            new_id[id as usize] = rank as u32;
        }
        for (next, id) in (count..).zip(new_id.iter_mut().filter(|id| **id == u32::MAX)) {
            *id = next;
        }
        let mut events = Vec::with_capacity(self.events.len() + assumed.len());
        let mut locations = Vec::with_capacity(events.capacity());
        for (rank, &(_, size, at)) in assumed.iter().enumerate() {
            events.push(Event::Alloc {
                id: rank as u32,
                size,
            });
            locations.push(at);
        }
        events.extend(self.events.iter().map(|event| match *event {
            Event::Alloc { id, size } => Event::Alloc {
                id: new_id[id as usize],
                size,
            },
            Event::Free { id } => Event::Free {
                id: new_id[id as usize],
            },
        }));
        locations.extend_from_slice(&self.locations);
        self.events = events;
        self.locations = locations;
        let (mut peak, mut peak_event) = (0, 0);
        for (index, live) in self.live_bytes_curve().into_iter().enumerate() {
            if live > peak {
                peak = live;
                peak_event = index;
            }
        }
        self.peak_live_bytes = peak;
        self.peak_live_event = peak_event;
    }
}

/// Parse a byte count field: a non-negative decimal integer.
pub fn parse_size(text: &str) -> Result<u64, Problem> {
    let trimmed = text.trim();
    let bad = |why| Problem::BadSize {
        text: trimmed.to_string(),
        why,
    };
    if trimmed.starts_with('-')
        && trimmed[1..].bytes().all(|b| b.is_ascii_digit())
        && trimmed.len() > 1
    {
        return Err(bad("is negative"));
    }
    if trimmed.is_empty() || !trimmed.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("is not a number"));
    }
    trimmed
        .parse::<u64>()
        .map_err(|_| bad("overflows a 64-bit byte count"))
}

/// Parse a time field `[[HH:]MM:]SS[.fraction]` into nanoseconds.
pub fn parse_time(text: &str) -> Result<u64, Problem> {
    let trimmed = text.trim();
    let bad = || {
        Problem::Malformed(format!(
            "time {:?} is not [[HH:]MM:]SS[.fraction]",
            cut(trimmed)
        ))
    };
    let (whole, fraction) = trimmed.split_once('.').unwrap_or((trimmed, ""));
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let parts: Vec<&str> = whole.split(':').collect();
    if parts.len() > 3 {
        return Err(bad());
    }
    let mut seconds = 0u64;
    for part in parts {
        if part.is_empty() || part.len() > 12 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        seconds = seconds * 60 + part.parse::<u64>().map_err(|_| bad())?;
    }
    let nanos = format!("{fraction:0<9}")
        .parse::<u64>()
        .map_err(|_| bad())?;
    seconds
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(nanos))
        .ok_or_else(bad)
}

/// `text` cut to 80 characters for an error message.
fn cut(text: &str) -> String {
    text.chars().take(80).collect()
}

/// Parse a pointer field: hexadecimal, with or without `0x`.
pub fn parse_pointer(text: &str) -> Result<u64, Problem> {
    let trimmed = text.trim();
    let digits = trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
        .unwrap_or(trimmed);
    u64::from_str_radix(digits, 16).map_err(|_| Problem::BadPointer(trimmed.to_string()))
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
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_or_say_why_not() {
        assert_eq!(parse_size(" 4096 "), Ok(4096));
        let why = |text| match parse_size(text) {
            Err(Problem::BadSize { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(why("-5"), "is negative");
        assert_eq!(why("12ab"), "is not a number");
        assert_eq!(why(""), "is not a number");
        assert_eq!(
            why("99999999999999999999999"),
            "overflows a 64-bit byte count"
        );
    }

    #[test]
    fn frees_of_blocks_never_allocated_are_live_from_the_start() {
        let mut trace = TraceBuilder::new("t".into());
        trace.allocate(0x100, 10, Location::Line(2)).unwrap();
        trace.free_or_assume(0x900, 50, Location::Line(3)).unwrap();
        trace.allocate(0x200, 30, Location::Line(4)).unwrap();
        trace.free_or_assume(0x100, 10, Location::Line(5)).unwrap();
        assert_eq!(
            trace.free_or_assume(0x100, 10, Location::Line(6)),
            Err(Problem::UnknownPointer(0x100)),
            "a second free of a block the trace allocated"
        );
        let trace = trace.finish();
        assert_eq!(trace.unknown_frees, 1);
        assert_eq!(
            trace.events,
            vec![
                Event::Alloc { id: 0, size: 50 },
                Event::Alloc { id: 1, size: 10 },
                Event::Free { id: 0 },
                Event::Alloc { id: 2, size: 30 },
                Event::Free { id: 1 },
            ]
        );
        assert_eq!(trace.locations[0], Location::Line(3));
        assert_eq!(trace.live_bytes_curve(), vec![50, 60, 10, 40, 30]);
        assert_eq!((trace.peak_live_bytes, trace.peak_live_event), (60, 1));
    }

    #[test]
    fn times_parse_or_say_why_not() {
        assert_eq!(parse_time("00:00:58.617548"), Ok(58_617_548_000));
        assert_eq!(parse_time("1:02:03.5"), Ok(3_723_500_000_000));
        assert_eq!(parse_time("7"), Ok(7_000_000_000));
        for bad in ["", "1:2:3:4", "00:00:0x.1", "1.2.3", "-1", "1.1234567890"] {
            assert!(
                matches!(parse_time(bad), Err(Problem::Malformed(_))),
                "{bad:?}"
            );
        }
    }

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

    #[test]
    fn live_bytes_past_64_bits_are_an_error_not_a_wrapped_peak() {
        let mut trace = TraceBuilder::new("t".into());
        // 65,536 allocations of 2^48 bytes make exactly 2^64: one too many.
        for pointer in 0..65_535u64 {
            trace
                .allocate(pointer, MAX_REQUEST_BYTES, Location::Line(pointer + 2))
                .unwrap();
        }
        assert_eq!(
            trace.allocate(1 << 40, MAX_REQUEST_BYTES, Location::Line(65_537)),
            Err(Problem::LiveBytesOverflow {
                live_bytes: u64::MAX - MAX_REQUEST_BYTES + 1,
                size: MAX_REQUEST_BYTES,
            })
        );
        let trace = trace.finish();
        assert_eq!(trace.peak_live_bytes, 65_535 * MAX_REQUEST_BYTES);
        assert_eq!(trace.events.len(), 65_535);
    }

    #[test]
    fn builder_tracks_peak_and_rejects_inconsistent_records() {
        let mut trace = TraceBuilder::new("t".into());
        trace.allocate(0x100, 10, Location::Line(2)).unwrap();
        trace.allocate(0x200, 30, Location::Line(3)).unwrap();
        assert_eq!(
            trace.allocate(0x200, 5, Location::Line(4)),
            Err(Problem::LivePointer(0x200))
        );
        trace.free(0x100, Location::Line(5)).unwrap();
        assert_eq!(
            trace.free(0x100, Location::Line(6)),
            Err(Problem::UnknownPointer(0x100))
        );
        trace.allocate(0x100, 5, Location::Line(7)).unwrap();
        trace.observe_time(40);
        trace.observe_time(10);
        trace.observe_time(25);
        let trace = trace.finish();
        assert_eq!(trace.duration_ns, Some(30));
        assert_eq!(trace.peak_live_bytes, 40);
        assert_eq!(trace.peak_live_event, 1);
        assert_eq!(trace.allocations, 3);
        assert_eq!(trace.live_bytes_curve(), vec![10, 40, 30, 35]);
        assert_eq!(trace.lifetimes(), vec![(0, 2), (1, 4), (3, 4)]);
    }
}
