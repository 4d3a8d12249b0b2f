//! The commands the documentation gives run from a fresh clone: they name
//! only files inside the repository, and each `cudamem` command line in
//! README.md, BENCHMARKS.md and harness/README.md runs (the built binary in
//! place of `cargo run ... --bin cudamem --`) and exits 0. Commands that need
//! a GPU (`--device`) are only checked for the files they name. Every
//! documented `explain` and `replay` (the docs' commands, and each
//! repository trace through replay and `explain --snapshot`) prints no line
//! wider than the line width.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use ctx::text::LINE_WIDTH;

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
    let scratch = support::temp_dir();
    let dir: PathBuf = scratch.path().to_path_buf();
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

/// `args` with each `traces/...` path (a `*` in its file name expanded)
/// made absolute from the repository's root, and each `--report` sent to a
/// fresh file.
fn in_process(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut words = args.split_whitespace().peekable();
    while let Some(word) = words.next() {
        if word == "--report" {
            words.next();
            out.push(word.to_string());
            out.push(support::temp_path("report.html").display().to_string());
        } else if word.starts_with("traces/") {
            let path = root().join(word);
            match path.file_name().and_then(|name| name.to_str()) {
                Some(name) if name.contains('*') => {
                    let (before, after) = name.split_once('*').unwrap();
                    let mut matched: Vec<String> = std::fs::read_dir(path.parent().unwrap())
                        .unwrap()
                        .map(|entry| entry.unwrap().path())
                        .filter(|path| {
                            let name = path.file_name().unwrap().to_str().unwrap();
                            name.starts_with(before) && name.ends_with(after)
                        })
                        .map(|path| path.display().to_string())
                        .collect();
                    matched.sort();
                    out.extend(matched);
                }
                _ => out.push(path.display().to_string()),
            }
        } else {
            out.push(word.to_string());
        }
    }
    out
}

/// The lines of `text` wider than [`LINE_WIDTH`], with their widths.
fn too_wide(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .map(|line| (line.chars().count(), line))
        .filter(|&(width, _)| width > LINE_WIDTH)
        .collect()
}

#[test]
fn every_documented_explain_replay_and_help_fits_the_line_width() {
    let mut invocations: Vec<Vec<String>> = Vec::new();
    for doc in DOCS {
        for command in commands(&read(doc)) {
            let args = command[CARGO_RUN.len()..]
                .trim_start()
                .trim_start_matches("--")
                .trim_start();
            let first = args.split_whitespace().next();
            // Text only (JSON is one line a trace), and no GPU.
            let text_here = !["--json", "--device", "--gpu"]
                .iter()
                .any(|flag| args.contains(flag));
            if matches!(first, Some("replay" | "explain")) && text_here {
                invocations.push(in_process(args));
            }
        }
    }
    // What `explain --help` and `replay --help` offer: every trace of the
    // repository, and each snapshot at every moment --at names.
    let mut traces: Vec<PathBuf> = ["traces/pytorch", "traces/rmm"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(root().join(dir)).unwrap())
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_str().unwrap().ends_with(".gz"))
        .collect();
    traces.sort();
    for path in &traces {
        let path = path.display().to_string();
        invocations.push(vec!["replay".into(), path.clone()]);
        if path.contains(".pickle") {
            for at in ["dump", "peak", "oom"] {
                invocations.push(
                    ["explain", "--snapshot", &path, "--at", at]
                        .map(String::from)
                        .to_vec(),
                );
            }
        }
    }
    for profile in ["h200", "a100-80gb", "t4"] {
        invocations.push(
            [
                "explain",
                "--profile",
                profile,
                "--lmem",
                "16KiB",
                "--cm-heap",
                "256MiB",
            ]
            .map(String::from)
            .to_vec(),
        );
    }
    assert!(invocations.len() > 40, "{invocations:?}");

    let mut wide = Vec::new();
    for args in &invocations {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (printed, result) = support::attempt(&args);
        if let Err(err) = result {
            panic!("cudamem {args:?}: {err:#}");
        }
        for (width, line) in too_wide(&printed) {
            wide.push(format!("cudamem {}: {width}: {line}", args.join(" ")));
        }
    }
    // The bare command, as `cli::run` runs it, its report sent elsewhere.
    let mut bare = cudamem::cli::replay_command::ReplayArgs::defaults().unwrap();
    bare.report = Some(support::temp_path("bare.html"));
    let mut printed = Vec::new();
    cudamem::cli::replay_command::run(bare, &mut printed).unwrap();
    let printed = String::from_utf8(printed).unwrap();
    for (width, line) in too_wide(&printed) {
        wide.push(format!("cudamem: {width}: {line}"));
    }
    // Every --help, as clap writes it (the help is clap's error value).
    for command in [&[][..], &["replay"], &["explain"], &["heap"], &["run"]] {
        let mut args = command.to_vec();
        args.push("--help");
        let (_, result) = support::attempt(&args);
        let help = result.unwrap_err().to_string();
        for (width, line) in too_wide(&help) {
            wide.push(format!("cudamem {}: {width}: {line}", args.join(" ")));
        }
    }
    assert!(
        wide.is_empty(),
        "lines wider than {LINE_WIDTH}:\n{}",
        wide.join("\n")
    );
}
