//! Small inputs whose cost used to follow references or string lengths
//! rather than their own bytes, and inputs that used to get a wrong
//! answer: each is read within a bound of its own size, or refused, or
//! warned about, with the reason said. Every input is built here.

mod support;

use std::fs::OpenOptions;
use std::io::Write;

use support::alloc_count::{Counting, peak_during};
use support::pickle::*;
use support::*;

use trace::Problem;

#[global_allocator]
static COUNTING: Counting = Counting;

const MIB: i64 = 1 << 20;
const BASE: i64 = 0x7f00_0000_0000;

/// A segment dict of `size` bytes at `address` holding `blocks`.
fn segment(address: i64, size: i64, blocks: Vec<Py>) -> Py {
    dict(vec![
        ("device", Py::Int(0)),
        ("address", Py::Int(address)),
        ("total_size", Py::Int(size)),
        ("stream", Py::Int(0)),
        ("segment_type", s("large")),
        ("blocks", Py::List(blocks)),
    ])
}

fn block(address: i64, size: i64, state: &str) -> Py {
    dict(vec![
        ("address", Py::Int(address)),
        ("size", Py::Int(size)),
        ("requested_size", Py::Int(size)),
        ("state", s(state)),
    ])
}

/// A snapshot dict of `segments` and one device's `history`.
fn snapshot_of(segments: Vec<Py>, history: Vec<Py>) -> Vec<u8> {
    Pickler::new()
        .value(&dict(vec![
            ("segments", Py::List(segments)),
            ("device_traces", Py::List(vec![Py::List(history)])),
        ]))
        .finish()
}

/// A snapshot with one 2 MiB segment half allocated, whose history is an
/// alloc then `ooms` references to one `oom` entry.
fn many_ooms(ooms: usize) -> Vec<u8> {
    let mut pickler = Pickler::new();
    pickler.raw(b"}");
    pickler.memoize();
    pickler.raw(b"(");
    pickler.value(&s("segments")).value(&Py::List(vec![segment(
        BASE,
        2 * MIB,
        vec![
            block(BASE, MIB, "active_allocated"),
            block(BASE + MIB, MIB, "inactive"),
        ],
    )]));
    pickler.value(&s("device_traces"));
    pickler.raw(b"]");
    pickler.memoize();
    pickler.raw(b"]");
    pickler.memoize();
    pickler.raw(b"(");
    pickler.value(&entry("alloc", BASE, MIB));
    pickler.value(&dict(vec![
        ("action", s("oom")),
        ("addr", Py::Int(0)),
        ("size", Py::Int(4 * MIB)),
        ("device_free", Py::Int(MIB)),
    ]));
    let oom = pickler.memoize();
    for _ in 1..ooms {
        pickler.get(oom);
    }
    pickler.raw(b"ea");
    pickler.raw(b"u");
    pickler.finish()
}

#[test]
fn oom_entries_are_explained_one_state_at_a_time() {
    for ooms in [20_000, 200_000] {
        let bytes = many_ooms(ooms);
        assert!(bytes.len() < 1_100_000, "{}", bytes.len());
        let path = write_file("ooms.pickle", &bytes);
        let target = path.to_str().unwrap();
        let (said, peak) = peak_during(|| run(&["explain", "--snapshot", target, "--at", "oom"]));
        let said = said.unwrap();
        assert!(
            said.contains(&format!("and {} more oom entries", ooms - 10)),
            "{said}"
        );
        assert!(peak < 64 << 20, "{ooms} oom entries: {peak} bytes held");
        // Every state in the JSON, each built and told in turn, or refused
        // at the output bound: never all held at once.
        let (result, peak) =
            peak_during(|| run(&["explain", "--snapshot", target, "--at", "oom", "--json"]));
        match result {
            Ok(out) => {
                let value: serde_json::Value = serde_json::from_str(&out).unwrap();
                assert_eq!(value["moments"].as_array().unwrap().len(), ooms);
                assert_eq!(value["moments"][0]["after_entry"], 1);
            }
            Err(err) => assert!(
                format!("{err:#}").contains("the most cudamem prints for a file of this size"),
                "{err:#}"
            ),
        }
        // What is held follows what is printed (at most 256 bytes per
        // byte of the file), told once and written out once (here into a
        // growing buffer, as the test captures it).
        let printed = (256 * bytes.len() as u64).max(1 << 20);
        assert!(
            peak < 4 * printed + (16 << 20),
            "{ooms} oom entries, --json: {peak} bytes held"
        );
    }
}

#[test]
fn a_long_file_name_shared_a_million_times_is_searched_once() {
    let mut pickler = Pickler::new();
    pickler.raw(b"}");
    pickler.memoize();
    pickler.raw(b"(");
    pickler.value(&s("device_traces"));
    pickler.raw(b"]");
    pickler.memoize();
    pickler.raw(b"]");
    pickler.memoize();
    // One frame of a 2 MiB file name, then a frames list of a million
    // references to it.
    let file = format!("/site-packages/{}.py", "f".repeat(2 << 20));
    pickler.value(&dict(vec![
        ("filename", Py::Str(file)),
        ("name", s("forward")),
        ("line", Py::Int(7)),
    ]));
    let frame = pickler.memoize();
    pickler.raw(b"0]");
    let frames = pickler.memoize();
    for _ in 0..1_000 {
        pickler.raw(b"(");
        for _ in 0..1_000 {
            pickler.get(frame);
        }
        pickler.raw(b"e");
    }
    pickler.raw(b"0(");
    let alloc = |pickler: &mut Pickler, action: &str| {
        pickler.raw(b"}");
        pickler.memoize();
        pickler.raw(b"(");
        pickler.value(&s("action")).value(&s(action));
        pickler.value(&s("addr")).value(&Py::Int(BASE));
        pickler.value(&s("size")).value(&Py::Int(4096));
        pickler.value(&s("frames")).get(frames);
        pickler.raw(b"u");
    };
    alloc(&mut pickler, "alloc");
    alloc(&mut pickler, "free_requested");
    pickler.raw(b"ea");
    pickler.value(&s("segments"));
    pickler.value(&Py::List(vec![segment(
        BASE,
        2 * MIB,
        vec![block(BASE, 2 * MIB, "inactive")],
    )]));
    pickler.raw(b"u");
    let bytes = pickler.finish();
    let path = write_file("long-file.pickle", &bytes);
    let (json, peak) = peak_during(|| replay_json(&path, &[]));
    assert_eq!(json["events"], 2);
    assert!(peak < 64 << 20, "{peak} bytes held");
    let target = path.to_str().unwrap();
    let said = output(&["explain", "--snapshot", target, "--at", "0"]);
    // The frame is cut to 80 characters for people.
    assert!(said.contains("fff..."), "{said}");
    assert!(said.lines().all(|line| line.len() < 400), "{said}");
}

#[test]
fn a_large_dict_keyed_by_long_strings_is_indexed_without_comparing_them() {
    let mut pickler = Pickler::new();
    pickler.raw(b"}");
    pickler.memoize();
    pickler.raw(b"(");
    pickler.value(&s("segments")).value(&Py::List(vec![]));
    pickler.value(&s("device_traces"));
    pickler.raw(b"]");
    pickler.memoize();
    pickler.raw(b"]");
    pickler.memoize();
    pickler.raw(b"(}");
    pickler.memoize();
    pickler.raw(b"(");
    // Two keys of 1 MiB that differ in their last byte, 100,000 pairs.
    let long = "k".repeat(1 << 20);
    pickler.value(&Py::Str(long.clone() + "a"));
    let a = pickler.memoize();
    pickler.raw(b"N");
    pickler.value(&Py::Str(long + "b"));
    let b = pickler.memoize();
    pickler.raw(b"N");
    for pair in 0..100_000 {
        pickler.get(if pair % 2 == 0 { a } else { b });
        pickler.raw(b"N");
    }
    pickler.value(&s("action")).value(&s("alloc"));
    pickler.value(&s("addr")).value(&Py::Int(BASE));
    pickler.value(&s("size")).value(&Py::Int(512));
    pickler.raw(b"ueau");
    let path = write_file("long-keys.pickle", &pickler.finish());
    let (json, peak) = peak_during(|| replay_json(&path, &[]));
    assert_eq!(json["events"], 1);
    assert!(peak < 64 << 20, "{peak} bytes held");
}

#[test]
fn a_long_segment_type_listed_many_times_is_cut_without_copying_it() {
    let mut pickler = Pickler::new();
    pickler.raw(b"}");
    pickler.memoize();
    pickler.raw(b"(");
    pickler.value(&s("segments"));
    pickler.raw(b"]");
    pickler.memoize();
    pickler.raw(b"(");
    let mut kind = segment(BASE, 2 * MIB, vec![block(BASE, 2 * MIB, "inactive")]);
    if let Py::Dict(pairs) = &mut kind {
        pairs[4].1 = Py::Str("\u{1b}".repeat(2 << 20));
    }
    pickler.value(&kind);
    let shared = pickler.memoize();
    for _ in 0..200_000 {
        pickler.get(shared);
    }
    pickler.raw(b"e");
    pickler.value(&s("device_traces")).value(&Py::List(vec![]));
    pickler.raw(b"u");
    let path = write_file("long-type.pickle", &pickler.finish());
    let target = path.to_str().unwrap();
    let (said, peak) = peak_during(|| message(&["explain", "--snapshot", target]));
    // The same segment listed again is its bytes twice: refused.
    assert!(said.contains("overlaps segment 0x7f0000000000"), "{said}");
    assert!(peak < 128 << 20, "{peak} bytes held");
}

#[test]
fn a_string_past_the_memory_ceiling_is_refused_before_it_is_held() {
    // A plain file of one 3 GB string, mostly a hole on disk.
    let length: u64 = 3_000_000_000;
    let path = temp_path("huge-string.pickle");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&[0x80, 4, 0x8d]).unwrap();
    file.write_all(&length.to_le_bytes()).unwrap();
    file.set_len(11 + length + 1).unwrap();
    drop(file);
    let (err, peak) = peak_during(|| replay_trace_error(&path));
    assert!(
        matches!(err.problem, Problem::PickleLimit { memory: true, .. }),
        "{err}"
    );
    let said = err.to_string();
    assert!(said.contains("CUDAMEM_READ_MEMORY"), "{said}");
    assert!(!said.contains("not a PyTorch memory snapshot"), "{said}");
    assert!(peak < 64 << 20, "{peak} bytes held");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_gzip_member_then_a_hole_decodes_no_more_than_the_member_allows() {
    let mut body = vec![0x80, 4, 0x8d];
    body.extend((100u64 << 20).to_le_bytes());
    body.resize(body.len() + (100 << 20), 0);
    body.push(b'.');
    let compressed = gzip(&body);
    let path = temp_path("hole.pickle.gz");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&compressed).unwrap();
    drop(file);
    // Zeros after the member, as far as 3 GB: the file's apparent size.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let (err, peak) = peak_during(|| replay_trace_error(&path));
    assert!(
        matches!(err.problem, Problem::TooLarge { limit_bytes } if limit_bytes < 100 << 20),
        "{err}"
    );
    assert!(peak < 64 << 20, "{peak} bytes held");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_history_that_begins_after_its_segments_is_read_as_partial() {
    // Recording began after the 20 MiB segment was reserved and its block
    // allocated: the history shows only later work.
    let bytes = snapshot_of(
        vec![segment(
            BASE,
            20 * MIB,
            vec![
                block(BASE, 16 * MIB, "active_allocated"),
                block(BASE + 16 * MIB, 4 * MIB, "active_allocated"),
            ],
        )],
        vec![entry("alloc", BASE + 16 * MIB, 4 * MIB)],
    );
    let path = write_file("late.pickle", &bytes);
    let json = replay_json(&path, &[]);
    let recorded = &json["pytorch_recorded"];
    assert_eq!(recorded["peak_reserved_bytes"], 20 * MIB);
    assert_eq!(recorded["reserved_before_history_bytes"], 20 * MIB);
    let said = output(&["replay", path.to_str().unwrap()]);
    assert!(!said.contains("reserved 0 B"), "{said}");
    assert!(!said.contains("00000"), "{said}");
    assert!(said.contains("partial"), "{said}");
}

#[test]
fn a_moment_that_does_not_fit_its_segments_is_warned_of() {
    // The dump: one 4 KiB segment, free. The history: an 8 KiB block at
    // its start, then freed: walked back to entry 0 it cannot fit.
    let bytes = snapshot_of(
        vec![segment(BASE, 4096, vec![block(BASE, 4096, "inactive")])],
        vec![
            entry("alloc", BASE, 8192),
            entry("free_requested", BASE, 8192),
            entry("free_completed", BASE, 8192),
        ],
    );
    let path = write_file("misfit.pickle", &bytes);
    let target = path.to_str().unwrap();
    let said = output(&["explain", "--snapshot", target, "--at", "0"]);
    let said = said.replace("\n  ", " ");
    assert!(
        said.contains(
            "warning: live block 0x7f0000000000 (8192 bytes) runs past the end of segment \
             0x7f0000000000 (4096 bytes)"
        ),
        "{said}"
    );
    assert!(said.contains("not to be trusted"), "{said}");
    let json = json(&["explain", "--snapshot", target, "--at", "0", "--json"]);
    assert!(
        !json["moments"][0]["warnings"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_capacity_suggestion_is_a_whole_number_of_granules() {
    let path = write_file(
        "small.csv",
        b"Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x1000,256,0\n",
    );
    for capacity in ["18446744073709551615", "3000000"] {
        let said = replay_message(&path, &["--capacity", capacity]);
        let suggested: u64 = said
            .split("e.g. ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|number| number.parse().ok())
            .unwrap_or_else(|| panic!("{said}"));
        assert_eq!(suggested % (2 << 20), 0, "{said}");
        assert!(suggested > 0, "{said}");
    }
}

#[test]
fn a_utf16_log_is_named_for_its_encoding() {
    let text = "Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x1000,256,0\n";
    let little: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let big: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
    for (bytes, said) in [
        (
            [&[0xff, 0xfe][..], &little].concat(),
            "UTF-16 (little-endian)",
        ),
        (little.clone(), "UTF-16 (little-endian)"),
        ([&[0xfe, 0xff][..], &big].concat(), "UTF-16 (big-endian)"),
    ] {
        let path = write_file("utf16.csv", &bytes);
        let err = replay_trace_error(&path);
        assert!(err.to_string().contains(said), "{err}");
        assert!(!err.to_string().contains("lacks"), "{err}");
    }
    // A UTF-8 byte order mark is read past.
    let path = write_file(
        "bom.csv",
        &[&[0xef, 0xbb, 0xbf][..], text.as_bytes()].concat(),
    );
    assert_eq!(replay_json(&path, &[])["events"], 1);
}

#[test]
fn help_writes_defaults_as_the_output_writes_sizes_and_says_what_units_mean() {
    let help = |args: &[&str]| {
        let (_, result) = attempt(args);
        format!("{}", result.unwrap_err())
    };
    let explain = help(&["explain", "--help"]).replace('\n', " ");
    let explain = explain.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(explain.contains("default 1.00 KiB (1024 B)"), "{explain}");
    assert!(
        explain.contains("default 8.25 MiB (8650752 B)"),
        "{explain}"
    );
    assert!(explain.contains("16K = 16384 B"), "{explain}");
    assert!(explain.contains("16KB = 16000 B"), "{explain}");
    assert!(!explain.contains("8,650,752"), "{explain}");
    let run = help(&["run", "--help"]);
    let run = run.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(run.contains("default 1.00 GiB (1073741824 B)"), "{run}");
    assert!(!run.contains("[default: 1073741824]"), "{run}");
}

#[test]
fn an_empty_log_stops_replay_with_one_line() {
    let path = write_file("empty.csv", b"Thread,Time,Action,Pointer,Size,Stream\n");
    let said = replay_message(&path, &[]);
    assert!(said.contains("holds no allocation or free"), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
}

#[test]
fn replay_of_a_snapshot_without_history_points_to_explain() {
    let bytes = snapshot_of(
        vec![segment(
            BASE,
            2 * MIB,
            vec![block(BASE, 2 * MIB, "inactive")],
        )],
        vec![],
    );
    let path = write_file("no-history.pickle", &bytes);
    let said = replay_message(&path, &[]);
    assert!(said.contains("cudamem explain --snapshot"), "{said}");
}

#[test]
fn peak_bars_stand_on_an_axis_from_zero() {
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces/pytorch/vit_infer.full.default.pickle.gz");
    let page = temp_path("bars.html");
    output(&[
        "replay",
        trace.to_str().unwrap(),
        "--report",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    let bars = &html[html.find("class=\"peaks\"").unwrap()..];
    let bars = &bars[..bars.find("</svg>").unwrap()];
    assert!(bars.contains("the axis starts at 0"), "{bars}");
    assert!(!bars.contains("past the axis"), "{bars}");
    // Each bar's width over its bytes is one scale for all.
    let mut scales = Vec::new();
    for group in bars.split("<g><title>").skip(1) {
        let bytes: f64 = group
            .split(": peak ")
            .nth(1)
            .unwrap()
            .split(" (")
            .nth(1)
            .unwrap()
            .split(" B)")
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let width: f64 = group
            .split("width=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        if bytes > 0.0 {
            scales.push(width / bytes);
        }
    }
    assert!(scales.len() > 2, "{bars}");
    let (low, high) = scales
        .iter()
        .fold((f64::MAX, 0f64), |(l, h), &s| (l.min(s), h.max(s)));
    assert!(high / low < 1.01, "{scales:?}");
}
