//! RMM `logging_resource_adaptor` CSV logs:
//! `Thread,Time,Action,Pointer,Size,Stream`, one allocator call per line.
//! A log written from PyTorch's allocator also holds `segment_alloc` and
//! `segment_free` rows (what it reserved from the device): such a log's
//! trace carries [`Recorded`], as a snapshot's does.

pub mod write;

use std::io::{self, Read};
use std::path::Path;

use crate::budget::{Counter, ReadBudget};
use crate::file::read_problem;
use crate::{
    Location, Problem, Recorded, SkipReason, Trace, TraceBuilder, TraceError, parse_pointer,
    parse_size, parse_time, quote,
};

/// Columns a log must have; the others (thread, time, stream) do not change
/// what an allocator sees. Time, where present, gives the trace's duration.
const REQUIRED: [&str; 3] = ["Action", "Pointer", "Size"];

/// The longest line a log may hold, bytes. RMM's lines are under 100 bytes;
/// the bound keeps a corrupt or hostile file (one endless line) from taking
/// memory without end.
pub const MAX_LINE_BYTES: u64 = 64 << 10;

/// Parse a whole CSV log read from `input` (already decompressed), whose
/// lines may hold at most `budget.line_bytes` bytes and whose rows may
/// number at most `budget.events`.
///
/// Rows RMM writes that are not allocator calls a replay can repeat are
/// counted in [`Trace::skipped`] rather than rejected: `allocate failure`
/// (the run hit out-of-memory), a repeated header, and a last line cut off
/// by a killed writer (no line end, and too few fields or unparseable).
pub fn parse(
    path: &Path,
    name: &str,
    input: impl Read,
    budget: &ReadBudget,
) -> Result<Trace, TraceError> {
    let mut rows = Counter::new(budget.events);
    let fail = |line: u64, problem| TraceError {
        path: path.to_path_buf(),
        location: Location::Line(line),
        problem,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        // RMM never quotes; without quoting a record is one line, so the
        // line bound is a record bound too.
        .quoting(false)
        .buffer_capacity(1 << 16)
        .from_reader(LineBounded::new(input, budget.line_bytes));
    let headers = reader
        .byte_headers()
        .map_err(|err| {
            let line = line_too_long(&err).map_or(1, |too_long| too_long.line);
            fail(line, csv_problem(&err))
        })?
        .clone();
    let column = |wanted: &str| {
        headers
            .iter()
            .position(|field| field.trim_ascii() == wanted.as_bytes())
    };
    let [action_col, pointer_col, size_col] = REQUIRED.map(column);
    let (Some(action_col), Some(pointer_col), Some(size_col)) = (action_col, pointer_col, size_col)
    else {
        return Err(fail(
            1,
            Problem::Malformed(format!(
                "header {} lacks one of the columns {REQUIRED:?} of an RMM log",
                quote(&String::from_utf8_lossy(headers.as_slice()))
            )),
        ));
    };

    let time_col = column("Time");
    let mut trace = TraceBuilder::new(name.to_string());
    let mut segments = Segments::default();
    let mut record = csv::ByteRecord::new();
    let mut next = csv::ByteRecord::new();
    // Where a read error is: the record's line when csv knows it, else the
    // line the bounded reader was on.
    let read_error = |err: csv::Error, after: u64| {
        let line = match line_too_long(&err) {
            Some(too_long) => too_long.line,
            None => err.position().map_or(after + 1, |position| position.line()),
        };
        fail(line, csv_problem(&err))
    };
    let mut have = reader
        .read_byte_record(&mut record)
        .map_err(|err| read_error(err, 1))?;
    let mut line = 1u64;
    while have {
        if !rows.take(1) {
            return Err(fail(
                line + 1,
                Problem::OverBudget {
                    what: "rows",
                    limit: rows.limit(),
                },
            ));
        }
        line = record
            .position()
            .map_or(line + 1, |position| position.line());
        // One record of lookahead tells whether this is the last line.
        let more = reader.read_byte_record(&mut next);
        let cut_off = matches!(more, Ok(false)) && !reader.get_ref().ended_with_line_end();
        let at = Location::Line(line);
        let result = if cut_off && record.len() < headers.len() {
            Err(Problem::Malformed("cut-off last line".into()))
        } else {
            row(
                &record,
                &headers,
                [action_col, pointer_col, size_col],
                time_col,
            )
            .and_then(|(row, time)| {
                if let Some(ns) = time {
                    trace.observe_time(ns);
                }
                let pushed = match row {
                    Row::Allocate { pointer, size } => trace.allocate(pointer, size, at),
                    Row::Free {
                        pointer,
                        size: Some(size),
                    } => trace.free_sized(pointer, size, at),
                    Row::Free {
                        pointer,
                        size: None,
                    } => trace.free(pointer, at),
                    Row::Skip(reason) => {
                        trace.skip(reason, at);
                        return Ok(());
                    }
                    Row::Segment { size, alloc } => return segments.add(size, alloc),
                };
                segments.pushed += usize::from(pushed.is_ok());
                pushed
            })
        };
        match result {
            Ok(()) => {}
            Err(_) if cut_off => trace.skip(SkipReason::CutLastLine, at),
            Err(problem) => return Err(fail(line, problem)),
        }
        have = more.map_err(|err| read_error(err, line))?;
        std::mem::swap(&mut record, &mut next);
    }
    let trace = trace.finish();
    Ok(segments.recorded(trace))
}

/// PyTorch's `segment_alloc`/`segment_free` rows: what the recording
/// allocator reserved from the device, as a snapshot's segment events say.
#[derive(Default)]
struct Segments {
    /// Whether any segment row was read.
    seen: bool,
    /// Allocator rows pushed so far: the event index a change holds from
    /// (each pushes one event; a log's frees assume no block).
    pushed: usize,
    /// Reserved bytes the rows add up to so far (below zero: segments
    /// freed that were reserved before the log began).
    reserved: i128,
    high: i128,
    low: i128,
    /// (rows pushed, reserved) at each change.
    curve: Vec<(usize, i128)>,
}

impl Segments {
    fn add(&mut self, size: u64, alloc: bool) -> Result<(), Problem> {
        crate::check_segment_size(size)?;
        self.seen = true;
        if alloc {
            self.reserved += i128::from(size);
            if self.reserved > i128::from(u64::MAX) {
                return Err(Problem::BadSize {
                    text: size.to_string(),
                    why: "makes the reserved bytes overflow 64 bits",
                });
            }
        } else {
            self.reserved -= i128::from(size);
        }
        self.high = self.high.max(self.reserved);
        self.low = self.low.min(self.reserved);
        match self.curve.last_mut() {
            Some(last) if last.0 == self.pushed => last.1 = self.reserved,
            _ => self.curve.push((self.pushed, self.reserved)),
        }
        Ok(())
    }

    /// `trace` with [`Recorded`] from the segment rows, where it has any:
    /// a log PyTorch's allocator wrote gets its reserved bytes (what was
    /// reserved before the log began is read from the frees of segments it
    /// never saw reserved), and its requests counted as PyTorch rounds them.
    fn recorded(self, mut trace: Trace) -> Trace {
        if !self.seen {
            return trace;
        }
        let before = (-self.low).clamp(0, i128::from(u64::MAX));
        let bytes = |history: i128| (before + history).clamp(0, i128::from(u64::MAX)) as u64;
        let mut reserved: Vec<(usize, u64)> = vec![(0, bytes(0))];
        for (event, history) in self.curve {
            match reserved.last_mut() {
                Some(last) if last.0 == event => last.1 = bytes(history),
                _ => reserved.push((event, bytes(history))),
            }
        }
        let mut sizes = vec![0u64; trace.allocations as usize];
        let (mut live, mut peak) = (0u64, 0u64);
        for event in &trace.events {
            match *event {
                crate::Event::Alloc { id, size } => {
                    sizes[id as usize] = memcore::pytorch::round_size(size);
                    live = live.saturating_add(sizes[id as usize]);
                    peak = peak.max(live);
                }
                crate::Event::Free { id } => live = live.saturating_sub(sizes[id as usize]),
            }
        }
        trace.set_recorded(Recorded {
            reserved,
            peak_reserved_bytes: bytes(self.high),
            peak_allocated_bytes: peak,
            expandable_segments: false,
            reserved_before_history_bytes: before as u64,
        });
        trace
    }
}

/// What one row asks for.
enum Row {
    Allocate {
        pointer: u64,
        size: u64,
    },
    Free {
        pointer: u64,
        size: Option<u64>,
    },
    /// A row counted and passed over.
    Skip(SkipReason),
    /// PyTorch asking the driver for memory (`alloc`) or giving it back:
    /// not an allocator call, but what the allocator reserved.
    Segment {
        size: u64,
        alloc: bool,
    },
}

/// Read one row's action and the fields it needs, and its time (nanoseconds)
/// where the log has a Time column and the row is an allocator call.
fn row(
    record: &csv::ByteRecord,
    headers: &csv::ByteRecord,
    [action_col, pointer_col, size_col]: [usize; 3],
    time_col: Option<usize>,
) -> Result<(Row, Option<u64>), Problem> {
    let field = |index: usize| -> Result<&str, Problem> {
        let bytes = record.get(index).ok_or_else(|| {
            Problem::Malformed(format!(
                "{} fields, but the header puts {} in field {}",
                record.len(),
                quote(
                    &headers
                        .get(index)
                        .map(String::from_utf8_lossy)
                        .unwrap_or_default()
                ),
                index + 1
            ))
        })?;
        std::str::from_utf8(bytes).map_err(|_| Problem::Malformed("field is not UTF-8".into()))
    };
    let row = match field(action_col)?.trim() {
        "allocate" => Row::Allocate {
            pointer: parse_pointer(field(pointer_col)?)?,
            size: parse_size(field(size_col)?)?,
        },
        "free" => Row::Free {
            pointer: parse_pointer(field(pointer_col)?)?,
            // RMM writes the size on frees too; a log without it is fine.
            size: field(size_col).ok().and_then(|size| parse_size(size).ok()),
        },
        "allocate failure" => Row::Skip(SkipReason::AllocateFailure),
        "Action" => Row::Skip(SkipReason::RepeatedHeader),
        action @ ("segment_alloc" | "segment_free") => Row::Segment {
            size: parse_size(field(size_col)?)?,
            alloc: action == "segment_alloc",
        },
        other => return Err(Problem::UnknownAction(other.to_string())),
    };
    let time = match (&row, time_col) {
        (Row::Skip(_), _) | (_, None) => None,
        (_, Some(time_col)) => Some(parse_time(field(time_col)?)?),
    };
    Ok((row, time))
}

/// A line longer than the bound, as the bounded reader reports it.
#[derive(Debug, thiserror::Error)]
#[error("line {line} is longer than {limit_bytes} bytes")]
struct LineTooLong {
    /// 1-based line number.
    line: u64,
    limit_bytes: u64,
}

/// A reader that fails once a line passes `limit_bytes`, and remembers
/// whether the input ended with a line end.
struct LineBounded<R> {
    inner: R,
    limit_bytes: u64,
    /// 1-based line of the next byte.
    line: u64,
    /// Bytes of the current line so far.
    run: u64,
    last: Option<u8>,
    /// A line passed the bound; every later read fails.
    over: bool,
}

impl<R> LineBounded<R> {
    fn new(inner: R, limit_bytes: u64) -> Self {
        Self {
            inner,
            limit_bytes,
            line: 1,
            run: 0,
            last: None,
            over: false,
        }
    }

    /// Whether everything read so far ends with `\n` (or nothing was read).
    fn ended_with_line_end(&self) -> bool {
        self.last.is_none_or(|byte| byte == b'\n')
    }
}

impl<R: Read> Read for LineBounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.over {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                LineTooLong {
                    line: self.line,
                    limit_bytes: self.limit_bytes,
                },
            ));
        }
        let read = self.inner.read(buf)?;
        // Hand over the bytes before the first line past the bound, so the
        // records ahead of it are read (and their errors told) first; the
        // next call reports the long line.
        let mut handed = 0;
        for (index, &byte) in buf[..read].iter().enumerate() {
            if byte == b'\n' {
                self.line += 1;
                self.run = 0;
            } else {
                self.run += 1;
                if self.run > self.limit_bytes {
                    self.over = true;
                    break;
                }
            }
            handed = index + 1;
        }
        if handed > 0 {
            self.last = Some(buf[handed - 1]);
        }
        if self.over && handed == 0 {
            return self.read(buf);
        }
        Ok(handed)
    }
}

fn line_too_long(err: &csv::Error) -> Option<&LineTooLong> {
    match err.kind() {
        csv::ErrorKind::Io(io) => io.get_ref()?.downcast_ref::<LineTooLong>(),
        _ => None,
    }
}

fn csv_problem(err: &csv::Error) -> Problem {
    if let Some(too_long) = line_too_long(err) {
        return Problem::LineTooLong {
            limit_bytes: too_long.limit_bytes,
        };
    }
    match err.kind() {
        csv::ErrorKind::Io(io) => read_problem(io),
        csv::ErrorKind::Utf8 { .. } => Problem::Malformed("field is not UTF-8".into()),
        _ => Problem::Malformed(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(line_bytes: u64) -> ReadBudget {
        ReadBudget {
            line_bytes,
            ..ReadBudget::CEILING
        }
    }

    fn parse_text(text: &str) -> Result<Trace, TraceError> {
        parse(
            Path::new("t.csv"),
            "t.csv",
            text.as_bytes(),
            &ReadBudget::CEILING,
        )
    }

    #[test]
    fn reads_allocations_and_frees_and_skips_segments() {
        let trace = parse_text(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             0,00:00:00.0,segment_alloc,0x1000,2097152,0\n\
             0,00:00:00.1,allocate,0x1000,512,0\n\
             0,00:00:00.2,allocate,0x1200,100,0\n\
             0,00:00:00.3,free,0x1000,512,0\n",
        )
        .unwrap();
        assert_eq!(trace.events.len(), 3);
        assert_eq!(trace.peak_live_bytes, 612);
        assert_eq!(trace.locations[2], Location::Line(5));
        assert_eq!(trace.duration_ns, Some(300_000_000));
    }

    #[test]
    fn pytorchs_segment_rows_give_what_it_reserved() {
        let mib = 1u64 << 20;
        let trace = parse_text(&format!(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             0,00:00:00.0,segment_alloc,0x10000000,{},0\n\
             0,00:00:00.1,allocate,0x10000000,{},0\n\
             0,00:00:00.2,segment_alloc,0x20000000,{},0\n\
             0,00:00:00.3,allocate,0x20000000,1000,0\n\
             0,00:00:00.4,segment_free,0x20000000,{},0\n\
             0,00:00:00.5,segment_alloc,0x30000000,{},0\n\
             0,00:00:00.6,free,0x10000000,{},0\n",
            20 * mib,
            8 * mib,
            2 * mib,
            2 * mib,
            4 * mib,
            8 * mib
        ))
        .unwrap();
        let recorded = trace
            .recorded
            .expect("segment rows give what PyTorch reserved");
        assert_eq!(recorded.peak_reserved_bytes, 24 * mib);
        // 8 MiB and 1000 B rounded to PyTorch's 512-byte blocks.
        assert_eq!(recorded.peak_allocated_bytes, 8 * mib + 1024);
        assert_eq!(
            recorded.reserved,
            [(0, 20 * mib), (1, 22 * mib), (2, 24 * mib)]
        );
        assert_eq!(recorded.reserved_before_history_bytes, 0);
        assert!(!recorded.expandable_segments);
        // A log that frees a segment it never saw reserved began late.
        let late = parse_text(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             0,00:00:00.0,allocate,0x1000,512,0\n\
             0,00:00:00.1,segment_free,0x9000000,4194304,0\n",
        )
        .unwrap();
        let recorded = late.recorded.unwrap();
        assert_eq!(recorded.reserved_before_history_bytes, 4 << 20);
        assert_eq!(recorded.peak_reserved_bytes, 4 << 20);
        assert_eq!(recorded.reserved, [(0, 4 << 20), (1, 0)]);
        // An RMM log has none.
        let rmm = parse_text("Action,Pointer,Size\nallocate,0x1000,512\n").unwrap();
        assert_eq!(rmm.recorded, None);
        // A segment row's size is read as any other.
        let err = parse_text("Action,Pointer,Size\nsegment_alloc,0x1000,lots\n").unwrap_err();
        assert_eq!(err.location, Location::Line(2));
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse_text(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             0,00:00:00.1,allocate,0x1000,512,0\n\
             0,00:00:00.2,resize,0x1000,512,0\n",
        )
        .unwrap_err();
        assert_eq!(err.location, Location::Line(3));
        assert_eq!(err.problem, Problem::UnknownAction("resize".into()));
        let err =
            parse_text("Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x10\n").unwrap_err();
        assert_eq!(err.location, Location::Line(2));
        assert!(matches!(err.problem, Problem::Malformed(_)), "{err}");
        let err = parse_text("a,b\n1,2\n").unwrap_err();
        assert_eq!(err.location, Location::Line(1));
    }

    const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

    #[test]
    fn special_rows_of_real_logs_are_counted_and_the_rest_replayed() {
        let trace = parse_text(&format!(
            "{HEADER}\
             0,00:00:00.1,allocate,0x1000,512,0\n\
             0,00:00:00.2,allocate failure,0x0,99999999999,0\n\
             {HEADER}\
             0,00:00:00.3,allocate failure,0x0,77,0\n\
             0,00:00:00.4,free,0x1000,512,0\n\
             0,00:00:00.5,allocate,0x2000,2"
        ))
        .unwrap();
        assert_eq!(trace.events.len(), 2);
        assert_eq!(trace.peak_live_bytes, 512);
        let skipped: Vec<_> = trace
            .skipped
            .iter()
            .map(|kind| (kind.reason, kind.count, kind.first))
            .collect();
        assert_eq!(
            skipped,
            vec![
                (SkipReason::AllocateFailure, 2, Location::Line(3)),
                (SkipReason::RepeatedHeader, 1, Location::Line(4)),
                (SkipReason::CutLastLine, 1, Location::Line(7)),
            ]
        );
    }

    #[test]
    fn a_last_line_without_line_end_is_kept_when_whole() {
        let trace = parse_text(&format!(
            "{HEADER}0,00:00:00.1,allocate,0x1000,512,0\n0,00:00:00.2,allocate,0x2000,64,0"
        ))
        .unwrap();
        assert_eq!(trace.events.len(), 2);
        assert!(trace.skipped.is_empty());
        // Cut inside a field that still parses: whole fields, but a bad value.
        let trace = parse_text(&format!(
            "{HEADER}0,00:00:00.1,allocate,0x1000,512,0\n0,00:00:00.2,allocat"
        ))
        .unwrap();
        assert_eq!(trace.events.len(), 1);
        assert_eq!(trace.skipped[0].reason, SkipReason::CutLastLine);
        // The same bad row with a line end is an error, as any bad row is.
        let err = parse_text(&format!(
            "{HEADER}0,00:00:00.1,allocate,0x1000,512,0\n0,00:00:00.2,allocate,0x2000\n"
        ))
        .unwrap_err();
        assert_eq!(err.location, Location::Line(3));
    }

    #[test]
    fn a_line_past_the_bound_is_an_error_naming_it() {
        let long = format!("{HEADER}0,0,allocate,0x10,{}\n", "9".repeat(5000));
        let err = parse(Path::new("t.csv"), "t.csv", long.as_bytes(), &lines(4096)).unwrap_err();
        assert_eq!(err.location, Location::Line(2));
        assert_eq!(err.problem, Problem::LineTooLong { limit_bytes: 4096 });
        // Exactly at the bound is fine (the line end is not counted).
        let line = format!("0,0,allocate,0x10,{}", "0".repeat(100));
        let text = format!("{HEADER}{line}1\n");
        let trace = parse(
            Path::new("t.csv"),
            "t.csv",
            text.as_bytes(),
            &lines(line.len() as u64 + 1),
        )
        .unwrap();
        assert_eq!(trace.peak_live_bytes, 1);
        // An endless header: stops at the bound, at line 1.
        let err = parse(
            Path::new("t.csv"),
            "t.csv",
            std::io::repeat(b'A').take(1 << 30),
            &lines(1 << 16),
        )
        .unwrap_err();
        assert_eq!(err.location, Location::Line(1));
        assert_eq!(
            err.problem,
            Problem::LineTooLong {
                limit_bytes: 1 << 16
            }
        );
    }

    #[test]
    fn a_huge_value_is_quoted_cut() {
        let text = format!("{HEADER}0,0,allocate,0x10,{}x,0\n", "9".repeat(60_000));
        let err = parse_text(&text).unwrap_err();
        let message = err.to_string();
        assert!(message.len() < 200, "{message}");
        assert!(message.contains("(60001 bytes)"), "{message}");
    }
}
