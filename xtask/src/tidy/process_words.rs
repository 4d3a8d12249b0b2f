//! No process words: comments, string literals, scripts and docs speak of
//! the product, not of how the project is run (issue numbers, branch names,
//! machine kinds, internal files and folders, "helper", "wave", "session").

use std::path::Path;

use super::{is_ident, sources, sources_skipping, split, word_at, workspace_root};

/// Words of how the project is run rather than of the product (whole words,
/// any case).
const PROCESS_WORDS: &[&str] = &["helper", "helpers", "wave", "waves", "session", "sessions"];

/// Names of the project's own machinery, wherever they stand (any case).
const PROCESS_PHRASES: &[&str] = &["nvidia-h200", "facts.md", "docs/h200/wave"];

/// Files whose text may hold process words, each with why.
const PROCESS_WORDS_ALLOWED: &[(&str, &str)] = &[(
    "xtask/src/tidy/process_words.rs",
    "this file lists the words the check looks for",
)];

/// Markdown files that still hold process words, each to be cleaned and
/// then taken off this list (a file on it that is clean fails the check).
const DOCS_STILL_TO_FIX: &[&str] = &[];

/// The process word or reference in `text`, if it holds one: a
/// [`PROCESS_PHRASES`] entry, a whole [`PROCESS_WORDS`] word, "issue 12" or
/// "issue #12", "#12" (one or two digits, not a format spec or colour), or a
/// branch name like "h/name".
fn process_word(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    if let Some(phrase) = PROCESS_PHRASES.iter().find(|p| lower.contains(*p)) {
        return Some((*phrase).to_string());
    }
    if let Some(word) = PROCESS_WORDS
        .iter()
        .find(|w| word_at(&lower, w).next().is_some())
    {
        return Some((*word).to_string());
    }
    let chars: Vec<char> = lower.chars().collect();
    // One or two digits from `at` that end a word: where they end.
    let number_at = |at: usize| {
        let n = chars
            .iter()
            .skip(at)
            .take_while(|c| c.is_ascii_digit())
            .count();
        let ends = !chars.get(at + n).copied().is_some_and(is_ident);
        ((1..=2).contains(&n) && ends).then_some(at + n)
    };
    for i in 0..chars.len() {
        // Not inside a word, a path, a format spec (`{:#04x}`) or a colour.
        let inside = i
            .checked_sub(1)
            .is_some_and(|b| is_ident(chars[b]) || "{:&#/.-".contains(chars[b]));
        if inside {
            continue;
        }
        let shown = |end: usize| chars[i..end].iter().collect::<String>();
        if chars[i] == '#' {
            if let Some(end) = number_at(i + 1) {
                return Some(shown(end));
            }
        }
        if chars[i] == 'h'
            && chars.get(i + 1) == Some(&'/')
            && chars.get(i + 2).is_some_and(char::is_ascii_lowercase)
        {
            let end = (i + 2..=chars.len())
                .find(|&e| !chars.get(e).is_some_and(|&c| is_ident(c) || c == '-'))
                .unwrap_or(chars.len());
            return Some(shown(end));
        }
        if chars[i..].starts_with(&['i', 's', 's', 'u', 'e']) {
            let mut j = i + 5;
            if chars.get(j) == Some(&'s') {
                j += 1;
            }
            let spaces = chars.iter().skip(j).take_while(|&&c| c == ' ').count();
            j += spaces;
            let hash = chars.get(j) == Some(&'#');
            j += usize::from(hash);
            if spaces + usize::from(hash) > 0 {
                if let Some(end) = number_at(j) {
                    return Some(shown(end));
                }
            }
        }
    }
    None
}

/// Every process word in the comments and string literals of the
/// workspace's Rust and C-family sources, and anywhere in its Python and
/// shell scripts, less [`PROCESS_WORDS_ALLOWED`], as `path:line: word`.
fn process_words_in_code(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let allowed = |path: &str| PROCESS_WORDS_ALLOWED.iter().any(|(p, _)| *p == path);
    for (path, text) in sources(root, &[".rs", ".cu", ".cuh", ".cpp", ".h"]) {
        if allowed(&path) {
            continue;
        }
        for (n, line) in split(&text).iter().enumerate() {
            let words = format!("{} {}", line.comment, line.strings);
            if let Some(word) = process_word(&words) {
                found.push(format!("{path}:{}: {word:?}", n + 1));
            }
        }
    }
    for (path, text) in sources(root, &[".py", ".sh"]) {
        for (n, line) in text.lines().enumerate() {
            if let Some(word) = process_word(line) {
                found.push(format!("{path}:{}: {word:?}", n + 1));
            }
        }
    }
    found
}

/// Every process word in the workspace's Markdown files (the docs folders
/// too), by file, as `path:line: word`.
fn process_words_in_docs(root: &Path) -> Vec<(String, Vec<String>)> {
    sources_skipping(root, &[".md"], &["target", "node_modules"])
        .into_iter()
        .map(|(path, text)| {
            let hits = text
                .lines()
                .enumerate()
                .filter_map(|(n, line)| {
                    process_word(line).map(|w| format!("{path}:{}: {w:?}", n + 1))
                })
                .collect();
            (path, hits)
        })
        .collect()
}

#[test]
fn no_process_words_in_code() {
    let found = process_words_in_code(&workspace_root());
    assert!(
        found.is_empty(),
        "comments, strings or scripts that speak of how the project is run (issue numbers, \
         branches, machine kinds, internal files) instead of the product:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_process_words_in_docs() {
    let mut found = Vec::new();
    let mut clean_but_listed = Vec::new();
    for (path, hits) in process_words_in_docs(&workspace_root()) {
        let listed = DOCS_STILL_TO_FIX.contains(&path.as_str());
        if listed && hits.is_empty() {
            clean_but_listed.push(path);
        } else if !listed {
            found.extend(hits);
        }
    }
    assert!(
        clean_but_listed.is_empty(),
        "clean now, take them off DOCS_STILL_TO_FIX: {clean_but_listed:?}"
    );
    assert!(
        found.is_empty(),
        "docs that speak of how the project is run instead of the product:\n{}",
        found.join("\n")
    );
}

#[test]
fn process_words_are_found_and_look_alikes_are_not() {
    for (text, expected) in [
        ("the goals of issue #13", Some("issue #13")),
        ("(issue 6)", Some("issue 6")),
        ("see #12 for why", Some("#12")),
        ("merged from h/stitchfast", Some("h/stitchfast")),
        ("a helper thread", Some("helper")),
        ("the second wave of runs", Some("wave")),
        ("logs in docs/h200/wave3/", Some("docs/h200/wave")),
        ("on nvidia-h200-x2", Some("nvidia-h200")),
        ("the shared FACTS.md", Some("facts.md")),
        ("border:1px solid #999", None),
        ("{:#04x}", None),
        ("issue 120 of the journal", None),
        ("issues with alignment", None),
        ("bytes/h/s", None),
        ("the wavefront; sessionless", None),
        ("docs/h200/run1.txt", None),
    ] {
        assert_eq!(process_word(text).as_deref(), expected, "{text}");
    }
}
