//! Strings from files reach text output escaped: a snapshot's segment type
//! or frame file name holding an escape sequence cannot clear the screen,
//! set the title or fake a line.

mod support;

use support::pickle::*;
use support::*;

fn hostile_state() -> std::path::PathBuf {
    let frames = Py::List(vec![dict(vec![
        ("filename", s("/home/me/\u{1b}]0;owned\u{7}train.py")),
        ("line", Py::Int(7)),
        ("name", s("step\nfake line: all memory free")),
    ])]);
    let block = dict(vec![
        ("address", Py::Int(0x1000)),
        ("size", Py::Int(512)),
        ("requested_size", Py::Int(512)),
        ("state", s("active_allocated")),
        ("frames", frames),
    ]);
    let free = dict(vec![
        ("address", Py::Int(0x1200)),
        ("size", Py::Int(512)),
        ("state", s("inactive")),
    ]);
    let segment = dict(vec![
        ("address", Py::Int(0x1000)),
        ("total_size", Py::Int(1024)),
        ("segment_type", s("\u{1b}[2Jsmall")),
        ("blocks", Py::List(vec![block, free])),
    ]);
    let root = dict(vec![
        ("segments", Py::List(vec![segment])),
        ("device_traces", Py::List(vec![])),
    ]);
    write_file(
        "\u{1b}[31mstate.pickle",
        &Pickler::new().value(&root).finish(),
    )
}

#[test]
fn control_characters_from_a_snapshot_are_escaped_in_text() {
    let path = hostile_state();
    let text = output(&["explain", "--snapshot", path.to_str().unwrap()]);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(text.contains("\\u{1b}[2Jsmall"), "{text}");
    assert!(text.contains("step\\nfake line"), "{text}");
    assert!(
        !text.lines().any(|line| line.starts_with("fake line")),
        "{text}"
    );
}

#[test]
fn one_escaping_function_leaves_plain_text_alone() {
    use trace::printable;
    assert_eq!(printable("/home/me/train.py"), "/home/me/train.py");
    assert_eq!(printable("a\u{1b}b\tc"), "a\\u{1b}b\\tc");
    assert_eq!(printable("é\u{9b}"), "é\\u{9b}");
}
