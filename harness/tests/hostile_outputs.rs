//! Outputs never overwrite an input (the same file by device and inode:
//! its own path, a hard link, a symlink), and `explain --snapshot` writes
//! through the one output path: a closed pipe is a quiet success, a full
//! disk an error with a message.

mod support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::pickle::*;
use support::*;

use cudamem::cli::output::SameFile;

/// A small snapshot whose state holds one segment.
fn state_file() -> PathBuf {
    let block = dict(vec![
        ("address", Py::Int(0x1000)),
        ("size", Py::Int(512)),
        ("requested_size", Py::Int(512)),
        ("state", s("active_allocated")),
    ]);
    let segment = dict(vec![
        ("address", Py::Int(0x1000)),
        ("total_size", Py::Int(512)),
        ("segment_type", s("small")),
        ("blocks", Py::List(vec![block])),
    ]);
    let root = dict(vec![
        ("segments", Py::List(vec![segment])),
        ("device_traces", Py::List(vec![])),
    ]);
    write_file("state.pickle", &Pickler::new().value(&root).finish())
}

fn csv_file() -> PathBuf {
    let text = "Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x1000,256,0\n";
    write_file("trace.csv", text.as_bytes())
}

/// The same file as `path` under other names: a hard link and a symlink.
fn aliases(path: &Path) -> [PathBuf; 3] {
    let link = temp_path("hard-link");
    std::fs::hard_link(path, &link).unwrap();
    let symlink = temp_path("symlink");
    std::os::unix::fs::symlink(path, &symlink).unwrap();
    [path.to_path_buf(), link, symlink]
}

fn assert_refused(args: &[&str], input: &Path) {
    let before = std::fs::read(input).unwrap();
    let err = failure(args);
    assert!(err.downcast_ref::<SameFile>().is_some(), "{err:#}");
    assert_eq!(std::fs::read(input).unwrap(), before, "{args:?}");
}

#[test]
fn explain_snapshot_refuses_a_report_over_its_snapshot() {
    let input = state_file();
    for alias in aliases(&input) {
        for json in [false, true] {
            let mut args = vec![
                "explain",
                "--snapshot",
                input.to_str().unwrap(),
                "--report",
                alias.to_str().unwrap(),
            ];
            if json {
                args.push("--json");
            }
            assert_refused(&args, &input);
        }
    }
}

#[test]
fn replay_refuses_a_report_that_is_a_link_to_its_trace() {
    let input = csv_file();
    for alias in aliases(&input) {
        assert_refused(
            &[
                "replay",
                input.to_str().unwrap(),
                "--report",
                alias.to_str().unwrap(),
            ],
            &input,
        );
    }
}

#[test]
fn run_refuses_outputs_over_the_program() {
    let program = write_file("program", b"#!/bin/sh\nexit 0\n");
    let before = std::fs::read(&program).unwrap();
    for flag in ["--trace", "--report"] {
        let output = Command::new(env!("CARGO_BIN_EXE_cudamem"))
            .args(["run", flag, program.to_str().unwrap(), "--"])
            .arg(&program)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{flag}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("same file as the input"), "{stderr}");
        assert_eq!(std::fs::read(&program).unwrap(), before);
    }
}

#[test]
fn explain_snapshot_to_a_closed_pipe_or_a_full_disk() {
    let input = state_file();
    for json in [false, true] {
        let mut args = vec!["explain", "--snapshot", input.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let output = support::with_closed_stdout(&args);
        assert_eq!(output.status.code(), Some(0));
        assert!(output.stderr.is_empty());
        let full = File::options().write(true).open("/dev/full").unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_cudamem"))
            .args(&args)
            .stdout(full)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("writing to standard output"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
