//! Tidy checks over the workspace's sources, run as ordinary tests by
//! `cargo test --workspace` (as rust-analyzer's `xtask tidy` does):
//!
//! - no measured figure in a code comment or rustdoc: a number followed by a
//!   time or bandwidth unit, or "on an/the H200" (figures live in
//!   BENCHMARKS.md, with the command and the machine);
//! - no `unsafe` outside the places [`UNSAFE_ALLOWED`] names;
//! - no file under `ctx/src/cuda/` without `unsafe`: the backend stays the
//!   thin unsafe layer, and code that needs no `unsafe` lives outside it,
//!   where CPU tests run it;
//! - no decision on an error's text outside tests (error_text.rs);
//! - one home for byte units, memcore's `bytes` (byte_units.rs);
//! - no process words (issue numbers, branches, machine kinds, internal
//!   files) in comments, strings, scripts and docs (process_words.rs).
//!
//! Sources are read from the workspace root (the parent of this crate's
//! manifest directory). The scanner tells code from comments and string
//! literals by a small lexer, not by regular expressions; test_only.rs says
//! which lines only tests compile.

mod byte_units;
mod error_text;
mod process_words;
mod test_only;

use std::fs;
use std::path::{Path, PathBuf};

/// Where `unsafe` may appear, path prefixes relative to the workspace root,
/// each with why.
const UNSAFE_ALLOWED: &[(&str, &str)] = &[
    (
        "ctx/src/cuda/",
        "the CUDA backend: the only code that calls the driver",
    ),
    (
        "torch-alloc/src/ffi/",
        "the C ABI shell PyTorch's pluggable allocator calls through",
    ),
    (
        "torch-alloc/tests/c_abi.rs",
        "tests that call the C ABI as C code does",
    ),
    (
        "torch-alloc/tests/support/c_abi.rs",
        "the C calls the C ABI tests share, made as C code makes them",
    ),
    (
        "torch-alloc/tests/support/env_child.rs",
        "the child process of the tests that set environment variables, calling the C ABI as C code does",
    ),
    (
        "torch-alloc/tests/oom_env.rs",
        "a test that exhausts a device through the C ABI as C code does, under each policy",
    ),
    (
        "torch-alloc/benches/alloc_free.rs",
        "a bench that calls the C ABI as the C++ backend does",
    ),
    (
        "harness/tests/support/alloc_count.rs",
        "a counting global allocator: tests bound what a reader allocates",
    ),
    (
        "kernels/tests/cm_alloc/host.rs",
        "loads cm_alloc.cuh compiled for the host and calls its C ABI",
    ),
    (
        "interpose/src/",
        "the driver interposer: C ABI entry points the program calls in place of the \
         driver's, the real driver called through looked-up pointers, the log's shared \
         mapping, and fork, exit and signal handlers",
    ),
];

/// Files under `ctx/src/cuda/` that need no `unsafe`, each with why.
const CUDA_WITHOUT_UNSAFE: &[(&str, &str)] = &[(
    "ctx/src/cuda/mod.rs",
    "the backend's root: module declarations, re-exports and docs only",
)];

/// Comment lines that may keep a figure, as (path, text the line contains,
/// why). Keep it short: a figure belongs in BENCHMARKS.md.
const FIGURES_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "xtask/src/tidy.rs",
        "",
        "this file describes what the check looks for",
    ),
    (
        "ctx/src/ledger/mod.rs",
        "as read on the H200 (driver 580)",
        "where the built-in defaults the function returns come from",
    ),
    (
        "ctx/src/profile.rs",
        "on the H200",
        "where the built-in constant below it comes from",
    ),
    (
        "harness/tests/snapshot_real.rs",
        "PyTorch 2.11 on an H200",
        "where the recorded traces come from",
    ),
];

/// Units that make a number a measured time or bandwidth.
const UNITS: &[&str] = &[
    "ns", "us", "µs", "μs", "ms", "GB/s", "TB/s", "MB/s", "GiB/s", "TiB/s", "MiB/s",
];

/// Phrases that tie a statement to one measured machine.
const MACHINE_PHRASES: &[&str] = &["on an h200", "on the h200"];

/// Directories under the root that hold no sources of ours.
const SKIPPED_DIRS: &[&str] = &["target", "traces", "docs", "node_modules"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lies one level below the workspace root")
        .to_path_buf()
}

/// Every file under `dir` whose name ends in one of `extensions`, as paths
/// relative to the root with `/` separators, sorted.
fn sources(root: &Path, extensions: &[&str]) -> Vec<(String, String)> {
    sources_skipping(root, extensions, SKIPPED_DIRS)
}

/// As [`sources`], skipping the directories named `skipped` (and hidden ones).
fn sources_skipping(root: &Path, extensions: &[&str], skipped: &[&str]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if !name.starts_with('.') && !skipped.contains(&name) {
                    pending.push(path);
                }
            } else if extensions.iter().any(|ext| name.ends_with(ext)) {
                let relative = path
                    .strip_prefix(root)
                    .expect("walked from the root")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
                found.push((relative, text));
            }
        }
    }
    found.sort();
    found
}

/// What ends each string literal in [`Line::strings`].
const LITERAL_END: char = '\0';

/// One source line split into its code (string and char literals blanked),
/// its comment text and the text of its string literals (escapes as spaces,
/// each literal ended by [`LITERAL_END`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Line {
    code: String,
    comment: String,
    strings: String,
}

/// Splits C-family source (Rust, CUDA C) into lines of code and comment.
/// Knows line and nested block comments, string literals with escapes, raw
/// strings (`r#"..."#`) and char literals (told from lifetimes).
fn split(text: &str) -> Vec<Line> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Code,
        LineComment,
        Block(u32),
        Str,
        RawStr(usize),
    }
    let chars: Vec<char> = text.chars().collect();
    let mut lines = vec![Line::default()];
    let mut state = State::Code;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let line = lines.last_mut().expect("never empty");
        if c == '\n' {
            if state == State::LineComment {
                state = State::Code;
            }
            lines.push(Line::default());
            i += 1;
            continue;
        }
        match state {
            State::Code => {
                if c == '/' && next == Some('/') {
                    state = State::LineComment;
                    i += 2;
                    continue;
                }
                if c == '/' && next == Some('*') {
                    state = State::Block(1);
                    i += 2;
                    continue;
                }
                if c == '"' {
                    state = State::Str;
                    line.code.push('"');
                } else if c == 'r'
                    && matches!(next, Some('"' | '#'))
                    && !chars[..i]
                        .last()
                        .is_some_and(|p| p.is_alphanumeric() || *p == '_')
                {
                    let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
                    if chars.get(i + 1 + hashes) == Some(&'"') {
                        state = State::RawStr(hashes);
                        line.code.push('"');
                        i += 2 + hashes;
                        continue;
                    }
                    line.code.push(c);
                } else if c == '\'' {
                    // A char literal ('x', '\n', '\u{..}'); otherwise a lifetime.
                    let close = if next == Some('\\') {
                        chars[i + 2..]
                            .iter()
                            .position(|&d| d == '\'')
                            .map(|p| i + 2 + p)
                    } else if chars.get(i + 2) == Some(&'\'') {
                        Some(i + 2)
                    } else {
                        None
                    };
                    if let Some(end) = close {
                        line.code.push_str("' '");
                        i = end + 1;
                        continue;
                    }
                    line.code.push(c);
                } else {
                    line.code.push(c);
                }
            }
            State::LineComment => line.comment.push(c),
            State::Block(depth) => {
                if c == '*' && next == Some('/') {
                    state = if depth == 1 {
                        State::Code
                    } else {
                        State::Block(depth - 1)
                    };
                    i += 2;
                    continue;
                }
                if c == '/' && next == Some('*') {
                    state = State::Block(depth + 1);
                    i += 2;
                    continue;
                }
                line.comment.push(c);
            }
            State::Str => {
                if c == '\\' {
                    // The escaped character may be a newline: keep lines counted.
                    if next == Some('\n') {
                        i += 1;
                    } else {
                        line.strings.push(' ');
                        i += 2;
                    }
                    continue;
                }
                if c == '"' {
                    state = State::Code;
                    line.code.push('"');
                    line.strings.push(LITERAL_END);
                } else {
                    line.strings.push(c);
                }
            }
            State::RawStr(hashes) => {
                if c == '"'
                    && chars[i + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == '#')
                        .count()
                        == hashes
                {
                    state = State::Code;
                    line.code.push('"');
                    line.strings.push(LITERAL_END);
                    i += 1 + hashes;
                    continue;
                }
                line.strings.push(c);
            }
        }
        i += 1;
    }
    lines
}

/// Whether `code` holds the keyword `unsafe` (not `unsafe_code` or a longer
/// identifier).
fn has_unsafe(code: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices("unsafe").any(|(at, word)| {
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The measured figure in a comment, if it holds one: a number followed by
/// one of [`UNITS`] (a space between them allowed), or one of
/// [`MACHINE_PHRASES`].
fn figure(comment: &str) -> Option<String> {
    let lower = comment.to_lowercase();
    if let Some(phrase) = MACHINE_PHRASES.iter().find(|p| lower.contains(*p)) {
        return Some((*phrase).to_string());
    }
    let chars: Vec<char> = comment.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts_number = chars[i].is_ascii_digit()
            && !(i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'));
        if !starts_number {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len()
            && (chars[i].is_ascii_digit()
                || (matches!(chars[i], '.' | ',' | '_')
                    && chars.get(i + 1).is_some_and(char::is_ascii_digit)))
        {
            i += 1;
        }
        let mut rest = i;
        if chars.get(rest) == Some(&' ') {
            rest += 1;
        }
        let tail: String = chars[rest..].iter().collect();
        for unit in UNITS {
            if let Some(after) = tail.strip_prefix(unit) {
                if !after.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                    let number: String = chars[start..i].iter().collect();
                    return Some(format!("{number} {unit}"));
                }
            }
        }
    }
    None
}

/// Every comment line of the workspace's Rust and CUDA C sources holding a
/// figure, less the allowed ones, as `path:line: figure: comment`.
fn figures_in_comments(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in sources(root, &[".rs", ".cu", ".cuh"]) {
        for (n, line) in split(&text).iter().enumerate() {
            let Some(figure) = figure(&line.comment) else {
                continue;
            };
            let allowed = FIGURES_ALLOWED
                .iter()
                .any(|(p, text, _)| *p == path && line.comment.contains(text));
            if !allowed {
                let shown: String = line.comment.trim().chars().take(80).collect();
                found.push(format!("{path}:{}: {figure:?} in {shown:?}", n + 1));
            }
        }
    }
    found
}

/// Every line of Rust code with `unsafe` outside [`UNSAFE_ALLOWED`].
fn unsafe_outside_backend(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in sources(root, &[".rs"]) {
        if UNSAFE_ALLOWED.iter().any(|(p, _)| path.starts_with(p)) {
            continue;
        }
        for (n, line) in split(&text).iter().enumerate() {
            if has_unsafe(&line.code) {
                let shown: String = line.code.trim().chars().take(80).collect();
                found.push(format!("{path}:{}: {shown:?}", n + 1));
            }
        }
    }
    found
}

/// Every file under `ctx/src/cuda/` without `unsafe` code, less
/// [`CUDA_WITHOUT_UNSAFE`].
fn cuda_files_without_unsafe(root: &Path) -> Vec<String> {
    sources(&root.join("ctx/src/cuda"), &[".rs"])
        .into_iter()
        .map(|(path, text)| (format!("ctx/src/cuda/{path}"), text))
        .filter(|(path, _)| !CUDA_WITHOUT_UNSAFE.iter().any(|(p, _)| p == path))
        .filter(|(_, text)| !split(text).iter().any(|line| has_unsafe(&line.code)))
        .map(|(path, _)| path)
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Where `word` stands in `text` as a whole identifier.
fn word_at(text: &str, word: &str) -> impl Iterator<Item = usize> {
    text.match_indices(word)
        .map(|(at, _)| at)
        .filter(move |&at| {
            !text[..at].chars().next_back().is_some_and(is_ident)
                && !text[at + word.len()..].chars().next().is_some_and(is_ident)
        })
}

#[test]
fn no_measured_figures_in_comments() {
    let found = figures_in_comments(&workspace_root());
    assert!(
        found.is_empty(),
        "measured figures in code comments or rustdoc (move them to BENCHMARKS.md, \
         with the command and machine, and point there):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_unsafe_outside_the_cuda_backend() {
    let found = unsafe_outside_backend(&workspace_root());
    assert!(
        found.is_empty(),
        "`unsafe` outside {:?}:\n{}",
        UNSAFE_ALLOWED.iter().map(|(p, _)| p).collect::<Vec<_>>(),
        found.join("\n")
    );
}

#[test]
fn every_cuda_backend_file_needs_unsafe() {
    let found = cuda_files_without_unsafe(&workspace_root());
    assert!(
        found.is_empty(),
        "files in ctx/src/cuda/ with no `unsafe`: move what needs none out of the \
         backend, where CPU CI tests it:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_tells_code_from_comments_and_strings() {
    let lines = split(
        "let s = \"unsafe // not a comment\"; // 3.8 TB/s\n\
         /* unsafe\n on an H200 */ unsafe { x }\n\
         let c = '\"'; let r = r#\"unsafe \"# ; fn f<'a>(x: &'a u8) {}\n\
         let t = \"a\\\n b\"; // 40 us",
    );
    // The escaped newline inside the last string ends a line too.
    assert_eq!(lines.len(), 6);
    assert!(!has_unsafe(&lines[0].code), "{:?}", lines[0]);
    assert_eq!(figure(&lines[0].comment).as_deref(), Some("3.8 TB/s"));
    assert!(!has_unsafe(&lines[1].code) && lines[1].comment.contains("unsafe"));
    assert!(has_unsafe(&lines[2].code), "{:?}", lines[2]);
    assert_eq!(figure(&lines[2].comment).as_deref(), Some("on an h200"));
    assert!(!has_unsafe(&lines[3].code), "{:?}", lines[3]);
    assert!(lines[3].code.contains("fn f<'a>"), "{:?}", lines[3]);
    assert_eq!(lines[4].comment, "");
    assert_eq!(figure(&lines[5].comment).as_deref(), Some("40 us"));
    assert!(!has_unsafe("#![deny(unsafe_code)] let not_unsafe = 1;"));
}

#[test]
fn figures_are_numbers_with_units_not_any_number() {
    for (comment, expected) in [
        (" about 40 us on a large pool", Some("40 us")),
        (" ~3.8 TB/s", Some("3.8 TB/s")),
        (" 10µs", Some("10 µs")),
        (" 1,200 ns a pair", Some("1,200 ns")),
        (" 2 MiB pages, 32 KiB chunks", None),
        (" u32 words; 16 users; 5 msgs", None),
        (" x86 must use", None),
        (" the H200 holds 141 GB", None),
    ] {
        assert_eq!(figure(comment).as_deref(), expected, "{comment:?}");
    }
}
