//! What the harness's integration tests share: fresh files, gzip, the built
//! `cudamem` and its JSON output; `pickle` writes PyTorch snapshots.

#![allow(dead_code)]

pub mod pickle;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use flate2::Compression;
use flate2::write::GzEncoder;

/// A fresh path in the temporary folder, unique to this test process.
pub fn temp_path(name: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!("cudamem-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}-{name}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// `bytes` written to a fresh file named `name`.
pub fn write_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = temp_path(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The built `cudamem` with `args`.
pub fn cudamem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudamem"))
        .args(args)
        .output()
        .unwrap()
}

/// `cudamem replay PATH --json --policy tlsf EXTRA...`.
pub fn replay_json(path: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "replay",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "tlsf",
    ];
    args.extend_from_slice(extra);
    cudamem(&args)
}

/// The JSON line of a successful run.
pub fn json_of(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The stderr of a failed run (exit code 1).
pub fn failure_of(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `bytes`, gzip-compressed.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}
