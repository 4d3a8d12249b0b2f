//! Inputs shaped as no recording can be: segments larger than any device,
//! more devices than PyTorch numbers, reserved figures below the bytes
//! allocated, gzip members split across reads. Each is refused or noted,
//! with the reason said, or (a valid gzip) read whole. Every input is built
//! here.

mod support;

use std::io::Write as _;

use support::pickle::*;
use support::*;

use trace::Oddity;
use trace::file::load;

const MIB: i64 = 1 << 20;
const BASE: i64 = 0x7f00_0000_0000;
/// A size no device reserves: 2^60 bytes.
const HUGE: i64 = 1 << 60;

fn segment(device: i64, address: i64, size: i64, blocks: Vec<Py>) -> Py {
    dict(vec![
        ("device", Py::Int(device)),
        ("address", Py::Int(address)),
        ("total_size", Py::Int(size)),
        ("stream", Py::Int(0)),
        ("segment_type", s("large")),
        ("blocks", Py::List(blocks)),
    ])
}

fn block(address: i64, size: i64) -> Py {
    dict(vec![
        ("address", Py::Int(address)),
        ("size", Py::Int(size)),
        ("requested_size", Py::Int(size)),
        ("state", s("active_allocated")),
    ])
}

fn snapshot_of(segments: Vec<Py>, device_traces: Vec<Vec<Py>>) -> Vec<u8> {
    Pickler::new()
        .value(&dict(vec![
            ("segments", Py::List(segments)),
            (
                "device_traces",
                Py::List(device_traces.into_iter().map(Py::List).collect()),
            ),
        ]))
        .finish()
}

fn said(bytes: &[u8], name: &str, args: &[&str]) -> String {
    let path = write_file(name, bytes);
    let mut argv: Vec<&str> = args.to_vec();
    argv.push(path.to_str().unwrap());
    let said = message(&argv);
    std::fs::remove_file(&path).unwrap();
    said
}

#[test]
fn segments_larger_than_any_device_are_refused_where_they_are() {
    // A CSV's segment row.
    let csv = format!(
        "Thread,Time,Action,Pointer,Size,Stream\n\
         0,00:00:00.0,segment_alloc,0x1000,{},0\n\
         0,00:00:00.1,allocate,0x1000,512,0\n",
        i64::MAX
    );
    let text = said(csv.as_bytes(), "huge-segment.csv", &["replay", "--json"]);
    assert!(
        text.contains("line 2: size \"9223372036854775807\" exceeds 2^48 bytes (256 TiB), more than any GPU can reserve"),
        "{text}"
    );
    // A snapshot's history.
    let history = snapshot_of(
        vec![],
        vec![vec![
            entry("segment_alloc", BASE, HUGE),
            entry("alloc", BASE, MIB),
        ]],
    );
    let text = said(&history, "huge-history.pickle", &["replay", "--json"]);
    assert!(
        text.contains("device_traces[0] entry 0: size \"1152921504606846976\" exceeds 2^48"),
        "{text}"
    );
    // A segment at the dump, read for what was reserved before the
    // history (it used to make PyTorch's reserved bytes 1024 PiB).
    let dump = snapshot_of(
        vec![segment(0, BASE, HUGE, vec![block(BASE, MIB)])],
        vec![vec![entry("alloc", BASE, MIB)]],
    );
    let text = said(&dump, "huge-dump.pickle", &["replay", "--json"]);
    assert!(
        text.contains("segments[0]: size \"1152921504606846976\" exceeds 2^48"),
        "{text}"
    );
}

#[test]
fn more_devices_than_pytorch_numbers_are_refused_at_once() {
    // 200,000 device lists of one entry each (a few MB) used to print a
    // table per device for minutes.
    let mut pickler = Pickler::new();
    pickler.snapshot_traces_start().raw(b"(");
    pickler.raw(b"](").value(&entry("alloc", BASE, 512));
    let one = pickler.memoize();
    pickler.raw(b"e");
    for _ in 1..200_000 {
        pickler.raw(b"](").get(one).raw(b"e");
    }
    let bytes = pickler.raw(b"eu").finish();
    assert!(bytes.len() < 2_000_000, "{}", bytes.len());
    let text = said(&bytes, "devices.pickle", &["replay", "--json"]);
    assert!(
        text.contains(
            "whole file: device_traces lists 200000 devices; PyTorch numbers at most 128 devices \
             (its device index, c10::DeviceIndex, is 8 bits)"
        ),
        "{text}"
    );
    // A segment on a device PyTorch cannot number, or a negative one.
    for device in [128, 4_000_000, -1] {
        let state = snapshot_of(
            vec![
                segment(0, BASE, 2 * MIB, vec![block(BASE, 2 * MIB)]),
                segment(
                    device,
                    BASE + 2 * MIB,
                    2 * MIB,
                    vec![block(BASE + 2 * MIB, 2 * MIB)],
                ),
            ],
            vec![],
        );
        let text = said(&state, "device.pickle", &["explain", "--snapshot"]);
        assert!(text.contains("segments[1]"), "{device}: {text}");
        if device >= 0 {
            assert!(
                text.contains(&format!(
                    "segments[1]: \"device\" is {device}; PyTorch numbers at most 128 devices"
                )),
                "{text}"
            );
        } else {
            assert!(text.contains("negative"), "{text}");
        }
    }
}

#[test]
fn segments_reserving_less_than_the_allocations_hold_are_left_out_and_noted() {
    // A history of allocations with no segment reserved, and none at the
    // dump: PyTorch "reserved 0 B" beside 1 MiB allocated cannot be.
    let bytes = snapshot_of(vec![], vec![vec![entry("alloc", BASE, MIB)]]);
    let path = write_file("below-live.pickle", &bytes);
    let traces = load(&path).unwrap();
    assert_eq!(traces[0].recorded, None);
    assert_eq!(traces[0].noted[0].oddity, Oddity::ReservedBelowLive);
    let json = replay_json(&path, &[]);
    assert!(json["pytorch_recorded"].is_null(), "{json}");
    let conclusion = json["conclusion"].to_string();
    assert!(!conclusion.contains("reserved 0 B"), "{conclusion}");
    std::fs::remove_file(&path).unwrap();
    // A CSV whose segment rows hold less than its allocations.
    let csv = "Action,Pointer,Size\nsegment_alloc,0x1000,1024\nallocate,0x1000,4096\n";
    let path = write_file("below-live.csv", csv.as_bytes());
    let traces = load(&path).unwrap();
    assert_eq!(traces[0].recorded, None);
    assert_eq!(traces[0].noted[0].oddity, Oddity::ReservedBelowLive);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_gzip_of_many_members_reads_whole() {
    // 20,000 members of one row each (as `cat a.gz b.gz` makes): every one
    // is read, wherever a member's start falls in the reader's buffer.
    let gzip = |text: &[u8]| {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(text).unwrap();
        encoder.finish().unwrap()
    };
    let mut bytes = gzip(b"Action,Pointer,Size\n");
    for index in 0..20_000u64 {
        bytes.extend(gzip(
            format!("allocate,{:#x},512\n", 0x1000 + index * 4096).as_bytes(),
        ));
    }
    let path = write_file("members.csv.gz", &bytes);
    let traces = load(&path).unwrap();
    assert_eq!(traces[0].events.len(), 20_000);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_blocks_problem_is_said_once() {
    let weird = dict(vec![
        ("address", Py::Int(BASE)),
        ("size", Py::Int(2 * MIB)),
        ("state", s("weird")),
    ]);
    let state = snapshot_of(vec![segment(0, BASE, 2 * MIB, vec![weird])], vec![]);
    let text = said(&state, "weird-block.pickle", &["explain", "--snapshot"]);
    assert!(
        text.ends_with("segments[0]: malformed record: block 0: unknown \"state\" \"weird\""),
        "{text}"
    );
}
