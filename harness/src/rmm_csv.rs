//! RMM `logging_resource_adaptor` CSV logs:
//! `Thread,Time,Action,Pointer,Size,Stream`, one allocator call per line.

use std::io::Read;
use std::path::Path;

use crate::trace::{
    Location, Problem, Trace, TraceBuilder, TraceError, parse_pointer, parse_size, parse_time,
};
use crate::trace_file::describe_read_error;

/// Columns a log must have; the others (thread, time, stream) do not change
/// what an allocator sees. Time, where present, gives the trace's duration.
const REQUIRED: [&str; 3] = ["Action", "Pointer", "Size"];

/// Parse a whole CSV log read from `input` (already decompressed).
pub fn parse(path: &Path, name: &str, input: impl Read) -> Result<Trace, TraceError> {
    let fail = |line: u64, problem| TraceError {
        path: path.to_path_buf(),
        location: Location::Line(line),
        problem,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .buffer_capacity(1 << 16)
        .from_reader(input);
    let headers = reader
        .byte_headers()
        .map_err(|err| fail(1, csv_problem(&err)))?
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
                "header {:?} lacks one of the columns {REQUIRED:?} of an RMM log",
                String::from_utf8_lossy(headers.as_slice())
            )),
        ));
    };

    let time_col = column("Time");
    let mut trace = TraceBuilder::new(name.to_string());
    let mut record = csv::ByteRecord::new();
    let mut line = 1u64;
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(err) => {
                let at = err.position().map_or(line + 1, |position| position.line());
                return Err(fail(at, csv_problem(&err)));
            }
        }
        line = record
            .position()
            .map_or(line + 1, |position| position.line());
        let field = |index: usize| -> Result<&str, Problem> {
            let bytes = record.get(index).ok_or_else(|| {
                Problem::Malformed(format!(
                    "{} fields, but the header puts {} in field {}",
                    record.len(),
                    headers
                        .get(index)
                        .map(String::from_utf8_lossy)
                        .unwrap_or_default(),
                    index + 1
                ))
            })?;
            std::str::from_utf8(bytes).map_err(|_| Problem::Malformed("field is not UTF-8".into()))
        };
        let at = Location::Line(line);
        if let Some(time_col) = time_col {
            let ns = field(time_col)
                .and_then(parse_time)
                .map_err(|problem| fail(line, problem))?;
            trace.observe_time(ns);
        }
        let result = field(action_col).and_then(|action| match action.trim() {
            "allocate" => {
                let pointer = parse_pointer(field(pointer_col)?)?;
                let size = parse_size(field(size_col)?)?;
                trace.allocate(pointer, size, at)
            }
            "free" => trace.free(parse_pointer(field(pointer_col)?)?, at),
            // PyTorch asking the driver for memory: not an allocator call.
            "segment_alloc" | "segment_free" => Ok(()),
            other => Err(Problem::UnknownAction(other.to_string())),
        });
        result.map_err(|problem| fail(line, problem))?;
    }
    Ok(trace.finish())
}

fn csv_problem(err: &csv::Error) -> Problem {
    match err.kind() {
        csv::ErrorKind::Io(io) => Problem::Unreadable(describe_read_error(io)),
        csv::ErrorKind::Utf8 { .. } => Problem::Malformed("field is not UTF-8".into()),
        _ => Problem::Malformed(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<Trace, TraceError> {
        parse(Path::new("t.csv"), "t.csv", text.as_bytes())
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
}
