//! The commands the documentation gives run from a fresh clone: they name
//! only files inside the repository, and each `cudamem` command line in
//! README.md, BENCHMARKS.md and harness/README.md runs (the built binary in
//! place of `cargo run ... --bin cudamem --`) and exits 0. Commands that need
//! a GPU (`--device`) are only checked for the files they name.

use std::path::{Path, PathBuf};
use std::process::Command;

const DOCS: [&str; 3] = ["README.md", "BENCHMARKS.md", "harness/README.md"];

/// How the docs start a `cudamem` command.
const CARGO_RUN: &str = "cargo run --release -p harness --bin cudamem";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn read(doc: &str) -> String {
    std::fs::read_to_string(root().join(doc)).unwrap()
}

/// Each `cudamem` command of `text` as a shell line: continuation lines
/// joined, a trailing `# comment` or closing backtick cut.
fn commands(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(CARGO_RUN) {
        let mut line = String::new();
        let mut tail = &rest[start..];
        loop {
            let end = tail.find('\n').unwrap_or(tail.len());
            let piece = &tail[..end];
            let piece = piece.split('`').next().unwrap_or_default();
            let piece = piece.split(" #").next().unwrap_or_default().trim_end();
            match piece.strip_suffix('\\') {
                Some(continued) => {
                    line.push_str(continued);
                    tail = &tail[(end + 1).min(tail.len())..];
                }
                None => {
                    line.push_str(piece);
                    break;
                }
            }
        }
        found.push(line.split_whitespace().collect::<Vec<_>>().join(" "));
        rest = &rest[start + CARGO_RUN.len()..];
    }
    found
}

#[test]
fn the_docs_name_no_file_outside_the_repository() {
    for doc in DOCS {
        let text = read(doc);
        for outside in ["../shared", "/work/"] {
            assert!(!text.contains(outside), "{doc} names {outside}");
        }
    }
}

#[test]
fn every_cudamem_command_in_the_docs_runs_from_a_clone() {
    // A folder holding only the repository's traces, so the bare command's
    // report does not land in the working tree.
    let dir: PathBuf = std::env::temp_dir().join(format!("cudamem-docs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(root().join("traces"), dir.join("traces")).unwrap();

    let mut ran = 0;
    for doc in DOCS {
        let found = commands(&read(doc));
        assert!(!found.is_empty(), "{doc} has no cudamem command");
        for command in found {
            let args = command[CARGO_RUN.len()..]
                .trim_start()
                .trim_start_matches("--")
                .trim_start();
            if args.contains("--device") {
                continue;
            }
            let line = format!("'{}' {args}", env!("CARGO_BIN_EXE_cudamem"));
            let output = Command::new("sh")
                .arg("-c")
                .arg(&line)
                .current_dir(&dir)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "{doc}: `{command}` failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            ran += 1;
        }
    }
    // README: bare, two replays, explain, heap; BENCHMARKS: one replay;
    // harness/README: one replay.
    assert!(ran >= 7, "ran only {ran} commands");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn commands_are_read_across_continuation_lines() {
    let text = "```sh\ncargo run --release -p harness --bin cudamem -- replay \\\n    a.csv b.csv --json\ncargo run --release -p harness --bin cudamem   # bare\n```\nand `cargo run --release -p harness --bin cudamem -- explain` inline";
    assert_eq!(
        commands(text),
        [
            format!("{CARGO_RUN} -- replay a.csv b.csv --json"),
            CARGO_RUN.to_owned(),
            format!("{CARGO_RUN} -- explain"),
        ]
    );
}
