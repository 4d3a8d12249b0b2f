//! PyTorch snapshots built byte by byte: every action and key PyTorch
//! writes, shared and recursive objects, and hostile pickles (deep nesting,
//! huge integers, truncation, wrapped histories), through the `cudamem`
//! commands run in process.

mod support;

use support::alloc_count::{Counting, peak_during};
use support::pickle::*;
use support::*;

use trace::{Location, Problem, TraceError};

#[global_allocator]
static COUNTING: Counting = Counting;

const MIB: i64 = 1 << 20;

#[test]
fn a_pytorch_snapshot_replays() {
    let base = 0x7f00_0000_0000;
    let bytes = snapshot(vec![vec![
        entry("segment_alloc", base, 2 * MIB),
        entry("alloc", base, 512),
        entry("alloc", base + 512, 1536),
        entry("free_requested", base, 512),
        entry("free_completed", base, 512),
        entry("alloc", base, 256),
        entry("free_requested", base + 512, 1536),
        entry("free_completed", base + 512, 1536),
        entry("snapshot", 0, 0),
    ]]);
    let json = replay_json(&write_file("snapshot.pickle", &bytes), &[]);
    assert_eq!(json["events"], 5);
    assert_eq!(json["peak_live_bytes"], 2048);
    assert_eq!(json["unknown_frees"], 0);
    assert_eq!(json["pytorch_recorded"]["peak_reserved_bytes"], 2 * MIB);
    assert_eq!(json["pytorch_recorded"]["peak_allocated_bytes"], 2048);

    // Frees only requested (no completions recorded), gzipped.
    let requested_only = snapshot(vec![vec![
        entry("segment_alloc", base, 2 * MIB),
        entry("alloc", base, 100),
        entry("free_requested", base, 100),
        entry("alloc", base, 300),
    ]]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &requested_only).unwrap();
    let path = write_file("snapshot.pickle.gz", &gz.finish().unwrap());
    let json = replay_json(&path, &[]);
    assert_eq!(json["events"], 3);
    assert_eq!(json["peak_live_bytes"], 300);
    // Both rounded up to 512 bytes, as PyTorch counts them.
    assert_eq!(json["pytorch_recorded"]["peak_allocated_bytes"], 512);
}

#[test]
fn every_action_several_devices_and_streams() {
    let base = 0x7f00_0000_0000;
    let on_stream = |action: &str, addr: i64, size: i64, stream: i64| {
        dict(vec![
            ("action", s(action)),
            ("addr", Py::Int(addr)),
            ("size", Py::Int(size)),
            ("stream", Py::Int(stream)),
            ("time_us", Py::Int(1_796_070_102_229_348)),
            ("compile_context", s("N/A")),
            ("user_metadata", s("")),
        ])
    };
    let device0 = vec![
        on_stream("segment_alloc", base, 20 * MIB, 0),
        on_stream("alloc", base, 3 * MIB, 0),
        on_stream("segment_alloc", base + 20 * MIB, 2 * MIB, 7),
        on_stream("alloc", base + 20 * MIB, 4096, 7),
        on_stream("free_requested", base + 20 * MIB, 4096, 7),
        on_stream("free_completed", base + 20 * MIB, 4096, 7),
        on_stream("segment_free", base + 20 * MIB, 2 * MIB, 7),
        on_stream("oom", 0, 64 * MIB, 0),
        dict(vec![
            ("action", s("user_defined")),
            ("user_metadata", s("step 1")),
        ]),
        on_stream("snapshot", 0, 0, 0),
    ];
    let device1 = vec![
        on_stream("segment_map", 0x3_0000_0000, 4 * MIB, 0),
        on_stream("alloc", 0x3_0000_0000, 3 * MIB + 1, 5),
        on_stream("free_requested", 0x3_0000_0000, 3 * MIB + 1, 5),
        on_stream("free_completed", 0x3_0000_0000, 3 * MIB + 1, 5),
        on_stream("segment_unmap", 0x3_0000_0000, 2 * MIB, 0),
    ];
    let root = dict(vec![
        ("segments", Py::List(vec![])),
        (
            "device_traces",
            Py::List(vec![Py::List(device0), Py::List(device1)]),
        ),
        (
            "allocator_settings",
            dict(vec![
                ("expandable_segments", Py::Bool(false)),
                ("max_split_size", Py::Int(-1)),
            ]),
        ),
        ("external_annotations", Py::List(vec![])),
    ]);
    let path = write_file("two-devices.pickle", &Pickler::new().value(&root).finish());
    let lines = json_lines(&[
        "replay",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "tlsf",
    ]);
    assert_eq!(lines.len(), 2);
    assert!(lines[0]["trace"].as_str().unwrap().ends_with("[device 0]"));
    assert_eq!(
        lines[0]["pytorch_recorded"]["peak_reserved_bytes"],
        22 * MIB
    );
    assert_eq!(lines[0]["peak_live_bytes"], 3 * MIB + 4096);
    assert_eq!(lines[1]["pytorch_recorded"]["peak_reserved_bytes"], 4 * MIB);

    let json = replay_json(&path, &["--device", "1"]);
    assert!(json["trace"].as_str().unwrap().ends_with("[device 1]"));
    assert_eq!(json["events"], 2);
    let said = replay_message(&path, &["--device", "3"]);
    assert!(
        said.contains("no events for device 3 (devices with events: 0, 1)"),
        "{said}"
    );

    // The table has PyTorch's own row beside the policies.
    let table = output(&[
        "replay",
        path.to_str().unwrap(),
        "--policy",
        "tlsf",
        "--device",
        "0",
    ]);
    assert!(
        table.contains("pytorch (recorded)") && table.contains("22.0 MiB"),
        "{table}"
    );
}

/// Entries that share one frames list and frame dicts, as PyTorch writes them.
fn shared_frames_snapshot(entries: usize) -> Vec<u8> {
    let mut pickler = Pickler::new();
    pickler.snapshot_traces_start();
    pickler.raw(b"]");
    pickler.memoize();
    let frame = dict(vec![
        ("filename", s("/home/me/train.py")),
        ("line", Py::Int(42)),
        ("name", s("step")),
    ]);
    let mut frames_memo = None;
    for index in 0..entries {
        let addr = Py::Int(0x1000 + (index as i64 / 2) * 4096);
        let action = if index % 2 == 0 {
            "alloc"
        } else {
            "free_completed"
        };
        pickler.open_dict();
        pickler.value(&s("action")).value(&s(action));
        pickler.value(&s("addr")).value(&addr);
        pickler.value(&s("size")).value(&Py::Int(4096));
        pickler.value(&s("frames"));
        pickler.shared_list(&mut frames_memo, &[frame.clone(), frame.clone()]);
        pickler.raw(b"u");
        pickler.raw(b"a");
    }
    pickler.raw(b"a");
    pickler.raw(b"u");
    pickler.finish()
}

#[test]
fn shared_objects_load() {
    let path = write_file("shared.pickle", &shared_frames_snapshot(40));
    let json = replay_json(&path, &[]);
    assert_eq!(json["events"], 40);
    assert_eq!(json["peak_live_bytes"], 4096);
}

#[test]
fn true_recursion_is_harmless() {
    // The root dict holds itself, and an entry's frames list holds itself.
    let mut pickler = Pickler::new();
    let root = pickler.open_dict();
    pickler.value(&s("self")).get(root);
    pickler.value(&s("segments")).value(&Py::List(vec![]));
    pickler.value(&s("device_traces")).raw(b"]");
    pickler.memoize();
    pickler.raw(b"]");
    pickler.memoize();
    pickler.value(&entry("alloc", 0x1000, 100));
    // Reopen the entry dict on the stack: add a recursive "frames".
    pickler.value(&s("frames")).raw(b"]");
    let frames = pickler.memoize();
    pickler.get(frames).raw(b"a");
    pickler.raw(b"s");
    pickler.raw(b"a").raw(b"a").raw(b"u");
    let path = write_file("recursive.pickle", &pickler.finish());
    let json = replay_json(&path, &[]);
    assert_eq!(json["peak_live_bytes"], 100);
}

#[test]
fn deep_nesting_is_bounded_without_recursion() {
    // 8,000 nested lists (which aborted the old reader): read, then refused
    // as not a snapshot.
    let mut bytes = vec![0x80, 4];
    bytes.extend(std::iter::repeat_n(b']', 8000));
    bytes.extend(std::iter::repeat_n(b'a', 7999));
    bytes.push(b'.');
    let said = replay_message(&write_file("deep.pickle", &bytes), &[]);
    assert!(
        said.contains(
            "deep.pickle: whole file: not a PyTorch memory snapshot: the pickle holds a list"
        ),
        "{said}"
    );

    // Past the bound: a clear error, not a crash.
    let mut bytes = vec![0x80, 4];
    bytes.extend(std::iter::repeat_n(b']', 1_000_001));
    let said = replay_message(&write_file("deeper.pickle", &bytes), &[]);
    assert!(
        said.contains("too many values open at once (nesting too deep)"),
        "{said}"
    );

    let mut bytes = vec![0x80, 4];
    bytes.extend(std::iter::repeat_n(b'(', 5000));
    let said = replay_message(&write_file("marks.pickle", &bytes), &[]);
    assert!(said.contains("too many MARKs open"), "{said}");
}

#[test]
fn a_huge_integer_is_a_fast_short_error() {
    let mut pickler = Pickler::new();
    pickler.open_dict();
    pickler.value(&s("segments")).value(&Py::List(vec![]));
    pickler.value(&s("device_traces")).raw(b"]");
    pickler.memoize();
    pickler.raw(b"]");
    pickler.memoize();
    pickler.open_dict();
    pickler.value(&s("action")).value(&s("alloc"));
    pickler.value(&s("addr")).value(&Py::Int(4096));
    pickler.value(&s("size"));
    let width: u32 = 4 << 20;
    pickler.raw(&[0x8b]).raw(&width.to_le_bytes());
    pickler
        .out
        .extend(std::iter::repeat_n(0x7f, width as usize));
    pickler.raw(b"u").raw(b"a").raw(b"a").raw(b"u");
    let path = write_file("huge-int.pickle", &pickler.finish());
    // The reader holds the integer's bytes once, and little beside.
    let (said, peak) = peak_during(|| replay_message(&path, &[]));
    assert!(
        peak < 3 * u64::from(width),
        "{peak} bytes allocated at once"
    );
    assert!(
        said.contains("huge-int.pickle: device_traces[0] entry 0: size \"(an integer of 4194304 bytes)\" overflows 64 bits"),
        "{said}"
    );
    assert!(said.len() < 300, "{} bytes of message", said.len());
}

#[test]
fn a_wrapped_ring_buffer_counts_frees_of_unknown_blocks() {
    let bytes = snapshot(vec![vec![
        entry("alloc", 0x1000, 1000),
        // Allocated before the history begins.
        entry("free_requested", 0x9000, 4096),
        entry("free_completed", 0x9000, 4096),
        entry("alloc", 0x2000, 512),
        entry("free_requested", 0x1000, 1000),
        entry("free_completed", 0x1000, 1000),
    ]]);
    let path = write_file("wrapped.pickle", &bytes);
    let json = replay_json(&path, &[]);
    assert_eq!(json["unknown_frees"], 1);
    assert_eq!(json["events"], 5, "the assumed allocation comes first");
    assert_eq!(json["peak_live_bytes"], 5096);
    let table = output(&["replay", path.to_str().unwrap(), "--policy", "tlsf"]);
    assert!(
        table.contains("1 frees of blocks allocated before the trace began"),
        "{table}"
    );

    // A second free of a block the history did allocate is still an error.
    let bytes = snapshot(vec![vec![
        entry("alloc", 0x1000, 64),
        entry("free_completed", 0x1000, 64),
        entry("free_completed", 0x1000, 64),
    ]]);
    let said = replay_message(&write_file("double-free.pickle", &bytes), &[]);
    assert!(
        said.contains(
            "double-free.pickle: device_traces[0] entry 2: free of unknown pointer 0x1000"
        ),
        "{said}"
    );
}

#[test]
fn malformed_snapshots_name_the_file_and_entry() {
    let bytes = snapshot(vec![vec![
        entry("alloc", 0x1000, 64),
        entry("alloc", 0x2000, -64),
    ]]);
    let path = write_file("negative.pickle", &bytes);
    let said = replay_message(&path, &[]);
    assert!(
        said.contains("negative.pickle: device_traces[0] entry 1: size \"-64\" is negative"),
        "{said}"
    );
    let error = replay_trace_error(&path);
    assert_eq!(error.path, path);
    assert_eq!(
        error.location,
        Location::Entry {
            device: 0,
            index: 1
        }
    );
    assert!(
        matches!(
            error.problem,
            Problem::BadSize {
                why: "is negative",
                ..
            }
        ),
        "{error:?}"
    );

    let no_addr = snapshot(vec![vec![dict(vec![
        ("action", s("alloc")),
        ("size", Py::Int(8)),
    ])]]);
    let said = replay_message(&write_file("no-addr.pickle", &no_addr), &[]);
    assert!(
        said.contains("device_traces[0] entry 0: malformed record: entry has no \"addr\""),
        "{said}"
    );

    let long_action = "x".repeat(500);
    let bytes = snapshot(vec![vec![entry(&long_action, 0, 0)]]);
    let said = replay_message(&write_file("action.pickle", &bytes), &[]);
    assert!(
        said.contains(&format!(
            "unknown action \"{}\"... (500 bytes)",
            "x".repeat(80)
        )),
        "{said}"
    );
    assert!(!said.contains(&"x".repeat(81)), "{said}");

    let list = Pickler::new().value(&Py::List(vec![Py::Int(1)])).finish();
    let path = write_file("list.pickle", &list);
    assert!(matches!(
        replay_trace_error(&path),
        TraceError {
            location: Location::File,
            problem: Problem::NotSnapshot(_),
            ..
        }
    ));
    let said = replay_message(&path, &[]);
    assert!(
        said.contains(
            "list.pickle: whole file: not a PyTorch memory snapshot: the pickle holds a list"
        ),
        "{said}"
    );

    let other = Pickler::new()
        .value(&dict(vec![("weights", Py::List(vec![]))]))
        .finish();
    let said = replay_message(&write_file("dict.pickle", &other), &[]);
    assert!(said.contains("no \"segments\" key"), "{said}");

    let mut full = snapshot(vec![vec![entry("alloc", 0x1000, 64)]]);
    full.truncate(full.len() - 7);
    let said = replay_message(&write_file("truncated.pickle", &full), &[]);
    assert!(said.contains("truncated.pickle: whole file: not a PyTorch memory snapshot: unreadable pickle: truncated at byte"), "{said}");

    let object = [
        0x80, 4, b'c', b'o', b's', b'\n', b's', b'y', b's', b't', b'e', b'm', b'\n', b'.',
    ];
    let said = replay_message(&write_file("object.pickle", &object), &[]);
    assert!(
        said.contains("byte 2: opcode GLOBAL is not supported"),
        "{said}"
    );
}

/// A snapshot whose state holds two segments: one pinned by a block
/// allocated in user code, one empty.
fn state_snapshot(total: i64) -> Vec<u8> {
    let frames = torch_and_user_frames("step");
    let block = state_block;
    let segment = |address: i64, total: i64, blocks: Vec<Py>| {
        dict(vec![
            ("device", Py::Int(0)),
            ("address", Py::Int(address)),
            ("total_size", Py::Int(total)),
            ("stream", Py::Int(0)),
            ("segment_type", s("large")),
            ("is_expandable", Py::Bool(false)),
            ("blocks", Py::List(blocks)),
        ])
    };
    let root = dict(vec![
        (
            "segments",
            Py::List(vec![
                segment(
                    0x10_0000_0000,
                    20 * MIB,
                    vec![
                        block(0x10_0000_0000, 2 * MIB, "inactive", Py::List(vec![])),
                        block(0x10_0020_0000, MIB, "active_allocated", frames),
                        block(0x10_0030_0000, 17 * MIB, "inactive", Py::List(vec![])),
                    ],
                ),
                segment(
                    0x20_0000_0000,
                    total,
                    vec![block(
                        0x20_0000_0000,
                        40 * MIB,
                        "inactive",
                        Py::List(vec![]),
                    )],
                ),
            ]),
        ),
        ("device_traces", Py::List(vec![Py::List(vec![])])),
    ]);
    Pickler::new().value(&root).finish()
}

#[test]
fn explain_snapshot_describes_the_state() {
    let path = write_file("state.pickle", &state_snapshot(40 * MIB));
    let json = json(&["explain", "--snapshot", path.to_str().unwrap(), "--json"]);
    assert_eq!(json["reserved_bytes"], 60 * MIB);
    assert_eq!(json["allocated_bytes"], MIB);
    assert_eq!(json["free_bytes"], 59 * MIB);
    assert_eq!(json["largest_free_bytes"], 40 * MIB);
    assert_eq!(json["fragmented_bytes"], 19 * MIB);
    assert_eq!(json["pinned_free_bytes"], 19 * MIB);
    let frame = &json["segments"][0]["live_blocks"][0]["frame"];
    assert_eq!(frame["file"], "/home/me/train.py");
    assert_eq!(frame["line"], 42);
    assert_eq!(frame["function"], "step");

    let report = temp_path("state.html");
    let text = output(&[
        "explain",
        "--snapshot",
        path.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(
        text.contains("live blocks keep 1 segments from being returned: 19.0 MiB free"),
        "{text}"
    );
    assert!(text.contains("/home/me/train.py:42 in step"), "{text}");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("/home/me/train.py:42 in step"));

    // A segment whose blocks do not add up to its size names the segment.
    let path = write_file("bad-state.pickle", &state_snapshot(41 * MIB));
    let said = message(&["explain", "--snapshot", path.to_str().unwrap()]);
    assert!(said.contains("bad-state.pickle: segments[1]: malformed record: its blocks hold 41943040 bytes but \"total_size\" is 42991616"), "{said}");
}
