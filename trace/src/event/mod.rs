//! The event log: one line per driver call the interposer saw, in the order
//! it saw them, written by `libcudamem_interpose.so` and read back by `cudamem run`.
//!
//! # Format
//!
//! A UTF-8 text file, one record per line, fields separated by one tab:
//!
//! ```text
//! KIND <tab> TIME_NS <tab> THREAD <tab> FIELD...
//! ```
//!
//! `TIME_NS` is nanoseconds since the process (image) started recording,
//! `THREAD` the kernel thread id. Numbers are decimal; pointers and handles
//! are hexadecimal with `0x`; a `-` is a value the interposer could not read
//! (no current context, say). Strings escape `\`, tab and line end as `\\`,
//! `\t`, `\n` and are cut to [`MAX_NAME_BYTES`]. A log that ends in a run of
//! zero bytes was left by a process that did not exit (killed, or it
//! called `_exit`): the zeros are not records. A line that does not end in
//! a line end was cut by such an end too.
//!
//! The kinds and their fields are declared once, in the table below (the
//! `records!` invocation): it makes [`Event`] (whose docs list the kinds),
//! the encoder [`Line::encode`] and the parser [`parse_line`]. Each field
//! names its codec, its text form: `Dec` (decimal), `Signed`, `Hex` (`0x`
//! hexadecimal), `Maybe` (decimal or `-`), `Text` (escaped string), `Named`
//! (a word of a closed set: [`Call`], [`ContextHow`], [`MemInfoWhy`],
//! [`ResolveHow`]), `Span` (a [`Window`]: three columns). Adding a kind is
//! one row there.
//!
//! `live_change` is how much the interposer's count of live bytes moved
//! while free memory was measured (other threads allocating), so a delta of
//! free memory can be told from those allocations.

use std::borrow::Cow;
use std::fmt;

use ctx::driver::limit;

use crate::image::{Answer, ImageFormat};

mod columns;
mod line;
mod records;
pub(crate) mod words;

pub use line::Line;
pub use words::{Call, CallRole, ContextHow, MemInfoWhy, ResolveHow, Word};

use line::cut;
use records::records;

/// The version written in `process` records.
pub const FORMAT_VERSION: u32 = 1;

/// The longest string field kept, bytes (longer ones are cut on a character
/// boundary).
pub const MAX_NAME_BYTES: usize = 1024;

/// The longest line the interposer writes, bytes: the fixed fields and one
/// escaped string of [`MAX_NAME_BYTES`].
pub const MAX_LINE_BYTES: usize = 512 + 2 * MAX_NAME_BYTES;

records! {
    Process = "process" ("a process image starts recording (again after `exec`)") {
        version: u32 = Dec,
        pid: u32 = Dec,
        ppid: u32 = Dec,
        exe: Cow<'a, str> = Text,
    }
    Library = "library" ("the library that caller id names") {
        id: u32 = Dec,
        path: Cow<'a, str> = Text,
    }
    Alloc = "alloc" ("an allocation returned (`result` 0: it succeeded)") {
        call: Call = Named,
        ptr: u64 = Hex,
        size: u64 = Dec,
        stream: u64 = Hex,
        caller: u32 = Dec,
        result: i32 = Signed,
    }
    Free = "free" ("a free is about to be made (recorded before the driver frees, so no later \
        allocation at `ptr` can come first)") {
        call: Call = Named,
        ptr: u64 = Hex,
        stream: u64 = Hex,
        caller: u32 = Dec,
    }
    FreeFailed = "free-failed" ("that free failed: `ptr` stays allocated") {
        call: Call = Named,
        ptr: u64 = Hex,
        size: u64 = Dec,
        caller: u32 = Dec,
        result: i32 = Signed,
    }
    Reserve = "reserve" ("`cuMemAddressReserve` returned") {
        ptr: u64 = Hex,
        size: u64 = Dec,
        result: i32 = Signed,
    }
    AddressFree = "address-free" ("`cuMemAddressFree` is about to be made") {
        ptr: u64 = Hex,
        size: u64 = Dec,
    }
    Create = "create" ("`cuMemCreate` returned (device -1: host memory)") {
        handle: u64 = Hex,
        size: u64 = Dec,
        /// Device ordinal; -1 for host memory.
        device: i32 = Signed,
        caller: u32 = Dec,
        result: i32 = Signed,
    }
    Release = "release" ("`cuMemRelease` is about to be made") {
        handle: u64 = Hex,
    }
    Map = "map" ("`cuMemMap` returned") {
        ptr: u64 = Hex,
        size: u64 = Dec,
        offset: u64 = Dec,
        handle: u64 = Hex,
        result: i32 = Signed,
    }
    Unmap = "unmap" ("`cuMemUnmap` is about to be made") {
        ptr: u64 = Hex,
        size: u64 = Dec,
    }
    Context = "context" ("a context was created (`create`) or a primary context retained \
        (`primary`), with the device's facts and the context's limits read right after") {
        how: ContextHow = Named,
        device: i32 = Signed,
        ctx: u64 = Hex,
        result: i32 = Signed,
        sm_count: Option<u64> = Maybe,
        threads_per_sm: Option<u64> = Maybe,
        total: Option<u64> = Maybe,
        free: Option<u64> = Maybe,
        stack: Option<u64> = Maybe,
        heap: Option<u64> = Maybe,
        fifo: Option<u64> = Maybe,
    }
    Limit = "limit" ("`cuCtxSetLimit` (`which` its `CUlimit` number), the limit read back, and \
        free memory around it") {
        which: LimitKind = Dec,
        requested: u64 = Dec,
        result: i32 = Signed,
        value: Option<u64> = Maybe,
        window: Window = Span,
    }
    Image = "image" ("what the image a load (`call`) is about to load tells: its format, its bytes \
        (`-` where not known), whether its code calls `malloc` and `printf` (`yes`, `no`, \
        `unknown`), and what could not be read (see [`crate::image`]); the load's `module` record \
        follows") {
        call: Call = Named,
        format: ImageFormat = Named,
        bytes: Option<u64> = Maybe,
        malloc: Answer = Named,
        printf: Answer = Named,
        note: Cow<'a, str> = Text,
    }
    Module = "module" ("a module or library load, or the first lookup, attribute query or \
        explicit load of a function (lazy loading loads its code then; later ones of the same \
        function are not recorded), or the making of a stream, event, executable graph or pool \
        and a graph's first upload or launch (the driver's own objects, `Call::is_object`), and \
        free memory around it") {
        call: Call = Named,
        result: i32 = Signed,
        window: Window = Span,
    }
    Launch = "launch" ("the first launch of a function: its local bytes per thread, the stack \
        limit and free memory around it") {
        call: Call = Named,
        handle: u64 = Hex,
        local_bytes: Option<u64> = Maybe,
        stack_before: Option<u64> = Maybe,
        stack_after: Option<u64> = Maybe,
        window: Window = Span,
        result: i32 = Signed,
        name: Cow<'a, str> = Text,
    }
    MemInfo = "meminfo" ("free and total memory: what the program itself read (`program`), or \
        what the interposer read at a chosen moment (`peak`, `exit`, `oom`)") {
        why: MemInfoWhy = Named,
        device: i32 = Signed,
        free: u64 = Dec,
        total: u64 = Dec,
        pool_reserved: Option<u64> = Maybe,
    }
    Resolve = "resolve" ("a driver entry point handed out through `cuGetProcAddress` (each \
        distinct answer once)") {
        name: Cow<'a, str> = Text,
        version: i32 = Signed,
        flags: u64 = Dec,
        how: ResolveHow = Named,
    }
    DriverMissing = "driver-missing" ("the program asked the loader for the driver library \
        (`dlopen` of `name`, a file named `libcuda.so…`), and by its exit no driver library was \
        loaded: written at exit, by the process that asked") {
        name: Cow<'a, str> = Text,
    }
    Signal = "signal" ("a fatal signal reached the process") {
        number: i32 = Signed,
    }
    Exit = "exit" ("the process exits; `dropped` records did not fit the size bound") {
        dropped: u64 = Dec,
    }
}

/// Which context limit (`CUlimit`, numbered by [`ctx::driver::limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `CU_LIMIT_STACK_SIZE` (0): stack per thread, bytes.
    Stack,
    /// `CU_LIMIT_PRINTF_FIFO_SIZE` (1), bytes.
    PrintfFifo,
    /// `CU_LIMIT_MALLOC_HEAP_SIZE` (2), bytes.
    MallocHeap,
    /// Any other limit, by its `CUlimit` value.
    Other(u32),
}

impl LimitKind {
    /// The limit of `CUlimit` value `value`.
    pub const fn from_cu(value: u32) -> LimitKind {
        match value {
            limit::STACK_SIZE => LimitKind::Stack,
            limit::PRINTF_FIFO_SIZE => LimitKind::PrintfFifo,
            limit::MALLOC_HEAP_SIZE => LimitKind::MallocHeap,
            other => LimitKind::Other(other),
        }
    }

    /// The `CUlimit` value.
    pub const fn to_cu(self) -> u32 {
        match self {
            LimitKind::Stack => limit::STACK_SIZE,
            LimitKind::PrintfFifo => limit::PRINTF_FIFO_SIZE,
            LimitKind::MallocHeap => limit::MALLOC_HEAP_SIZE,
            LimitKind::Other(value) => value,
        }
    }
}

/// Free memory before and after a measured call, and how much the
/// interposer's live bytes moved in between. `None`: not readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Free bytes before the call.
    pub free_before: Option<u64>,
    /// Free bytes after the call.
    pub free_after: Option<u64>,
    /// Live bytes after minus live bytes before (other threads' allocations).
    pub live_change: i64,
}

impl Window {
    /// Device bytes the call itself took: the drop of free memory less what
    /// allocations took meanwhile; `None` when free memory was not read.
    pub fn taken_bytes(&self) -> Option<u64> {
        let (before, after) = (self.free_before?, self.free_after?);
        let dropped = i128::from(before) - i128::from(after) - i128::from(self.live_change);
        Some(u64::try_from(dropped.max(0)).unwrap_or(u64::MAX))
    }
}

/// One line: when, which thread, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Nanoseconds since the process image started recording.
    pub time_ns: u64,
    /// Kernel thread id.
    pub thread: u32,
    /// What happened.
    pub event: Event<'a>,
}

/// Why a line is not a record. Columns are 1-based bytes of the line; the
/// line's number is the reader's ([`crate::event_log::LogError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The first field (column 1) names no kind of record.
    #[error("column 1: unknown record kind {0:?}")]
    UnknownKind(String),
    /// Fewer or more fields than the kind has.
    #[error("column {column}: {kind} record with {found} fields, expected {expected}")]
    FieldCount {
        /// The record's kind.
        kind: &'static str,
        /// Fields found (the kind, time and thread included).
        found: usize,
        /// Fields the kind has.
        expected: usize,
        /// Where the first field too many starts, or the line's end when
        /// fields are missing.
        column: usize,
    },
    /// A field that does not parse.
    #[error("column {column}: field {index} ({text:?}) is not {what}")]
    BadField {
        /// 0-based field index.
        index: usize,
        /// Where the field starts.
        column: usize,
        /// The field, cut to 40 characters.
        text: String,
        /// What it should be.
        what: &'static str,
    },
}

/// The 1-based column where field `index` of `parts` starts (the line's
/// end past the last one).
fn column_of(parts: &[&str], index: usize) -> usize {
    let start: usize = parts.iter().take(index).map(|part| part.len() + 1).sum();
    let line_len = parts
        .iter()
        .map(|part| part.len() + 1)
        .sum::<usize>()
        .saturating_sub(1);
    start.min(line_len) + 1
}

/// Parse one line (without its line end).
pub fn parse_line(line: &str) -> Result<Record<'_>, LineError> {
    let parts: Vec<&str> = line.split('\t').collect();
    let kind_text = parts.first().copied().unwrap_or("");
    let &(kind, expected) = KINDS
        .iter()
        .find(|(name, _)| *name == kind_text)
        .ok_or_else(|| LineError::UnknownKind(cut(kind_text, 40).into()))?;
    if parts.len() != expected {
        return Err(LineError::FieldCount {
            kind,
            found: parts.len(),
            expected,
            column: column_of(&parts, expected.min(parts.len())),
        });
    }
    let bad = |(index, what): (usize, &'static str)| LineError::BadField {
        index,
        column: column_of(&parts, index),
        text: cut(parts.get(index).copied().unwrap_or(""), 40).to_string(),
        what,
    };
    let mut at = 1;
    let time_ns = records::take::<columns::Dec, u64>(&parts, &mut at).map_err(bad)?;
    let thread = records::take::<columns::Dec, u32>(&parts, &mut at).map_err(bad)?;
    let event = parse_event(kind, &parts).map_err(bad)?;
    Ok(Record {
        time_ns,
        thread,
        event,
    })
}

impl fmt::Display for Record<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = Line::default();
        line.encode(self);
        f.write_str(String::from_utf8_lossy(line.as_bytes()).trim_end())
    }
}

#[cfg(test)]
mod tests;
