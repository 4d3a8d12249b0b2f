//! What the harness's integration tests share: commands run in process
//! (their output, JSON or error, as the binary would print them), fresh
//! files, gzip; `pickle` writes PyTorch snapshots, `alloc_count` counts
//! what a call allocates.

#![allow(dead_code)]

pub mod alloc_count;
pub mod pickle;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use clap::Parser;
use cudamem::cli::{self, Cli};
use flate2::Compression;
use flate2::write::GzEncoder;

/// The policies a bare `replay` runs, in the order of the table of
/// policies (its unit tests hold the list), which its table and page keep.
pub fn default_policies() -> Vec<&'static str> {
    cudamem::replay::spec::defaults(false)
        .iter()
        .map(|spec| spec.name)
        .collect()
}

/// The `cudamem` binary run with `args`, its standard output a pipe whose
/// reader goes away before the command writes a byte.
pub fn with_closed_stdout<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> std::process::Output {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_cudamem"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

/// A fresh path in this test process's folder under cargo's temporary
/// folder for tests (inside the target directory, never the system's
/// `/tmp`). Statics are not dropped at exit, so the folder outlives the
/// process: the first call removes the folders of test processes that have
/// ended.
pub fn temp_path(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        remove_ended(root);
        let dir = root.join(format!("{TEMP_PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    dir.join(format!("{}-{name}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

const TEMP_PREFIX: &str = "cudamem-tests-";

/// Remove the folders `temp_path` made for processes no longer running.
fn remove_ended(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(TEMP_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A fresh empty folder, removed when the value is dropped.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cudamem-test-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// `bytes` written to a fresh file named `name`.
pub fn write_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = temp_path(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `cudamem ARGS...` in process: what it printed before it ended, and how
/// it ended (arguments clap refuses included).
pub fn attempt(args: &[&str]) -> (String, anyhow::Result<()>) {
    let mut out = Vec::new();
    let result = Cli::try_parse_from(std::iter::once("cudamem").chain(args.iter().copied()))
        .map_err(anyhow::Error::new)
        .and_then(|cli| cli::run(cli, &mut out));
    (String::from_utf8(out).unwrap(), result)
}

/// `cudamem ARGS...` in process: what it printed, or why it failed.
pub fn run(args: &[&str]) -> anyhow::Result<String> {
    let (out, result) = attempt(args);
    result.map(|()| out)
}

/// What `cudamem ARGS...` printed; the test fails if it failed.
pub fn output(args: &[&str]) -> String {
    run(args).unwrap_or_else(|err| panic!("cudamem {args:?}: {err:#}"))
}

/// Why `cudamem ARGS...` failed; the test fails if it did not.
pub fn failure(args: &[&str]) -> anyhow::Error {
    match run(args) {
        Ok(out) => panic!("cudamem {args:?} succeeded:\n{out}"),
        Err(err) => err,
    }
}

/// Why `cudamem ARGS...` failed, as the binary prints it after `cudamem: `.
pub fn message(args: &[&str]) -> String {
    format!("{:#}", failure(args))
}

/// The one JSON line `cudamem ARGS...` printed.
pub fn json(args: &[&str]) -> serde_json::Value {
    let lines = json_lines(args);
    assert_eq!(lines.len(), 1, "cudamem {args:?}: {lines:?}");
    lines.into_iter().next().unwrap()
}

/// The JSON lines `cudamem ARGS...` printed.
pub fn json_lines(args: &[&str]) -> Vec<serde_json::Value> {
    output(args)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The arguments of `cudamem replay PATH --json --policy tlsf EXTRA...`.
pub fn replay_json_args<'a>(path: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "replay",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "tlsf",
    ];
    args.extend_from_slice(extra);
    args
}

/// The JSON line of `cudamem replay PATH --json --policy tlsf EXTRA...`.
pub fn replay_json(path: &Path, extra: &[&str]) -> serde_json::Value {
    json(&replay_json_args(path, extra))
}

/// Why `cudamem replay PATH --json --policy tlsf EXTRA...` failed, as the
/// binary prints it.
pub fn replay_message(path: &Path, extra: &[&str]) -> String {
    message(&replay_json_args(path, extra))
}

/// The trace error that `cudamem replay PATH --json --policy tlsf` failed with.
pub fn replay_trace_error(path: &Path) -> trace::TraceError {
    let err = failure(&replay_json_args(path, &[]));
    err.downcast_ref::<trace::TraceError>()
        .unwrap_or_else(|| panic!("not a trace error: {err:#}"))
        .clone()
}

/// `bytes`, gzip-compressed.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}
