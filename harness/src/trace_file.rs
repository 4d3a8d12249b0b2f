//! Opening a trace file: gzip or plain, CSV log or pickled snapshot, told
//! apart by their first bytes rather than by the file name.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::trace::{Location, Problem, Trace, TraceError, display_name};
use crate::{rmm_csv, snapshot};

/// The trace compiled into the binary: ResNet-50 training and inference on
/// an H200, as recorded in `shared/traces/resnet50_train.csv.gz`.
pub const EMBEDDED_RESNET50: &[u8] = include_bytes!("../data/resnet50_train.csv.gz");

/// The name reports give the embedded trace.
pub const EMBEDDED_NAME: &str = "resnet50_train.csv.gz (embedded)";

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Pickle protocol 2 and later open with the PROTO opcode.
const PICKLE_PROTO: u8 = 0x80;

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
pub fn read(path: &Path, name: &str, mut input: impl BufRead) -> Result<Vec<Trace>, TraceError> {
    let file_error = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    let head = input
        .fill_buf()
        .map_err(|err| file_error(Problem::Unreadable(format!("cannot read: {err}"))))?;
    if head.starts_with(&GZIP_MAGIC) {
        let decoded = BufReader::with_capacity(1 << 16, MultiGzDecoder::new(input));
        read_decoded(path, name, decoded)
    } else {
        read_decoded(path, name, input)
    }
}

fn read_decoded(
    path: &Path,
    name: &str,
    mut input: impl BufRead,
) -> Result<Vec<Trace>, TraceError> {
    let head = input.fill_buf().map_err(|err| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: Problem::Unreadable(describe_read_error(&err)),
    })?;
    if head.first() == Some(&PICKLE_PROTO) {
        snapshot::parse(path, name, input)
    } else {
        rmm_csv::parse(path, name, input).map(|trace| vec![trace])
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
