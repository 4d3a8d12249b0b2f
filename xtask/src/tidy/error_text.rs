//! No decision on an error's text outside tests: code that compares or
//! searches an error's message (`e.to_string().contains(..)`, a variant's
//! `detail.contains(..)`) breaks when the wording changes; it should match
//! on a typed variant or code. Tests may check messages.

use std::path::Path;

use super::test_only::non_test_code;
use super::{word_at, workspace_root};

/// Methods that read a piece of text, and comparisons: applied to an
/// error's message they make code decide on wording that may change.
const TEXT_TESTS: &[&str] = &[
    ".contains(",
    ".starts_with(",
    ".ends_with(",
    ".find(",
    "==",
    "!=",
];

/// Names under which code holds an error's text (a variant's `detail`, a
/// driver's `log`, a `message`).
const ERROR_TEXT_NAMES: &[&str] = &["detail", "message", "msg", "log", "err", "error"];

/// Lines of library or binary code that may test an error's text, as (path
/// suffix, text the line contains, why). A decision belongs on a typed
/// variant or code; keep this empty if possible.
const ERROR_TEXT_ALLOWED: &[(&str, &str, &str)] = &[(
    "gpusuite/cm_heap.rs",
    "log.contains(",
    "the hardware check that the linker's log names the missing function: \
     a check of the message itself",
)];

/// Whether `rest` starts with one of [`TEXT_TESTS`] (spaces before it allowed).
fn starts_with_text_test(rest: &str) -> bool {
    let rest = rest.trim_start();
    TEXT_TESTS.iter().any(|t| rest.starts_with(t.trim_start()))
}

/// How a line of code tests an error's text, if it does: the text of an
/// error made with `to_string()` or `format!`, or held under one of
/// [`ERROR_TEXT_NAMES`], compared or searched.
fn error_text_test(code: &str) -> Option<&'static str> {
    if code
        .match_indices(".to_string()")
        .any(|(at, m)| starts_with_text_test(&code[at + m.len()..]))
    {
        return Some("to_string()");
    }
    if let Some(at) = code.find("format!(") {
        let after = &code[at..];
        if TEXT_TESTS
            .iter()
            .filter(|t| t.starts_with('.'))
            .any(|t| after.contains(&format!("){t}")))
        {
            return Some("format!");
        }
    }
    ERROR_TEXT_NAMES.iter().copied().find(|name| {
        word_at(code, name).any(|at| {
            let rest = &code[at + name.len()..];
            TEXT_TESTS
                .iter()
                .filter(|t| t.starts_with('.'))
                .any(|t| rest.starts_with(t))
        })
    })
}

/// Every line of library or binary code that tests an error's text, less
/// [`ERROR_TEXT_ALLOWED`], as `path:line: how: code`.
fn decisions_on_error_text(root: &Path) -> Vec<String> {
    non_test_code(root)
        .into_iter()
        .filter_map(|(path, n, line)| {
            let how = error_text_test(&line.code)?;
            let allowed = ERROR_TEXT_ALLOWED
                .iter()
                .any(|(p, text, _)| path.ends_with(p) && line.code.contains(text));
            let shown: String = line.code.trim().chars().take(100).collect();
            (!allowed).then(|| format!("{path}:{n}: {how}: {shown:?}"))
        })
        .collect()
}

#[test]
fn no_decisions_on_error_text() {
    let found = decisions_on_error_text(&workspace_root());
    assert!(
        found.is_empty(),
        "code outside tests that tests an error's text (decide on a typed variant or \
         code instead; tests may check messages):\n{}",
        found.join("\n")
    );
}

#[test]
fn error_text_tests_are_told_from_other_text() {
    for (code, expected) in [
        (
            "matches!(e, Error::Device { detail, .. } if detail.contains(\"\"))",
            Some("detail"),
        ),
        ("if e.to_string().contains(\"\") {", Some("to_string()")),
        ("let same = err.to_string() == \"\";", Some("to_string()")),
        ("format!(\"\").starts_with(\"\")", Some("format!")),
        (
            "Err(Error::Link { log, .. }) => log.contains(\"\"),",
            Some("log"),
        ),
        ("self.message.ends_with('.')", Some("message")),
        ("if name.contains(\"\") {", None),
        ("let text = error.to_string();", None),
        ("format!(\"{}\", x.contains(y))", None),
        ("let errors = self.errors.contains(&id);", None),
    ] {
        assert_eq!(error_text_test(code), expected, "{code}");
    }
}
