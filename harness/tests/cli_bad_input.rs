//! Bad and unusual input to `cudamem`, as found by trying: bombs, special
//! rows of real RMM logs, numbers past 64 bits, arenas and report paths
//! that cannot work, run in process. Each ends in a clear error or a
//! reported warning, holding memory bounded by what was counted.

mod support;
use support::alloc_count::{Counting, peak_during};
use support::{attempt, failure, gzip, json_lines, message, output, run, temp_path, write_file};

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use trace::{Location, Problem, TraceError};

#[global_allocator]
static COUNTING: Counting = Counting;

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";
/// The real RMM log these tests change.
const RESNET50: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../traces/rmm/resnet50_train.csv.gz"
);
/// The H200 profile's memory, bytes.
const H200_TOTAL: &str = "150109880320";
/// What a reader may hold while it refuses one overlong line: the line's
/// bound and its buffers, far below the bombs' decompressed sizes.
const LINE_REFUSAL_BYTES: u64 = 1 << 20;

/// The message of a failed run, short, holding every needle.
fn assert_error(args: &[&str], needles: &[&str]) -> String {
    let said = message(args);
    assert!(said.len() < 600, "{} bytes of message", said.len());
    for needle in needles {
        assert!(said.contains(needle), "wanted {needle:?} in {said}");
    }
    said
}

/// The trace error of a failed run.
fn trace_error(args: &[&str]) -> TraceError {
    let err = failure(args);
    err.downcast_ref::<TraceError>()
        .unwrap_or_else(|| panic!("not a trace error: {err:#}"))
        .clone()
}

fn real_log() -> String {
    let mut text = String::new();
    GzDecoder::new(std::fs::File::open(RESNET50).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn a_file_that_is_no_snapshot_is_named_for_what_it_is() {
    for (path, problem) in [
        (
            RESNET50,
            Problem::NotSnapshot("it is an RMM log (CSV), which `cudamem replay` reads".into()),
        ),
        (
            "/dev/null",
            Problem::NotSnapshot("the file is empty".into()),
        ),
    ] {
        let err = trace_error(&["explain", "--snapshot", path]);
        assert_eq!(err.location, Location::File);
        assert_eq!(err.problem, problem, "{path}");
    }
}

#[test]
fn dev_zero_is_an_error_in_bounded_memory() {
    let (error, peak) = peak_during(|| trace_error(&["replay", "/dev/zero"]));
    assert_eq!(error.location, Location::Line(1));
    assert!(
        matches!(error.problem, Problem::LineTooLong { limit_bytes: 65536 }),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .starts_with("/dev/zero: line 1: line longer than 65536 bytes")
    );
    assert!(peak < LINE_REFUSAL_BYTES, "{peak} bytes held at once");
}

#[test]
fn gzip_bombs_stop_at_the_line_bound() {
    // A 32 MiB header line and a 32 MiB size field, each a gzip of ~32 KiB.
    let header_bomb = write_file("header.csv.gz", &gzip(&vec![b'A'; 32 << 20]));
    let mut field = format!("{HEADER}0,0,allocate,0x10,").into_bytes();
    field.resize(field.len() + (32 << 20), b'9');
    field.extend_from_slice(b",0\n");
    let field_bomb = write_file("field.csv.gz", &gzip(&field));
    for (path, line) in [(&header_bomb, 1), (&field_bomb, 2)] {
        assert!(std::fs::metadata(path).unwrap().len() < 256 << 10);
        let (error, peak) =
            peak_during(|| trace_error(&["replay", path.to_str().unwrap(), "--policy", "tlsf"]));
        assert_eq!(error.location, Location::Line(line));
        assert!(
            matches!(error.problem, Problem::LineTooLong { .. }),
            "{error}"
        );
        assert!(peak < LINE_REFUSAL_BYTES, "{peak} bytes held at once");
    }
}

#[test]
fn a_long_bad_value_is_quoted_cut_to_80_characters() {
    let body = format!("{HEADER}0,0,allocate,0x10,{}x,0\n", "9".repeat(60_000));
    let path = write_file("long.csv", body.as_bytes());
    let said = assert_error(
        &["replay", path.to_str().unwrap(), "--policy", "tlsf"],
        &["line 2:", "(60001 bytes)"],
    );
    assert!(
        said.contains(&format!("\"{}\"...", "9".repeat(80))),
        "{said}"
    );
}

#[test]
fn special_rows_of_a_real_log_are_counted_and_the_rest_replayed() {
    let log = real_log();
    let lines: Vec<&str> = log.lines().collect();
    // What a killed, out-of-memory run writes: failures, a logger that
    // started over, and half a line at the end.
    let mut changed: Vec<String> = lines.iter().map(|line| line.to_string()).collect();
    changed.insert(
        300,
        "0,00:00:01.000000,allocate failure,0x0,85899345920,0".into(),
    );
    changed.insert(
        100,
        "0,00:00:00.500000,allocate failure,0x0,1099511627776,0".into(),
    );
    changed.insert(200, HEADER.trim_end().into());
    let mut text = changed.join("\n");
    text += "\n0,00:00:09.123456,allocate,0x7fbd2";
    let path = write_file("oom.csv.gz", &gzip(text.as_bytes()));
    let path = path.to_str().unwrap();
    let original = json_lines(&["replay", RESNET50, "--json", "--policy", "tlsf"]);
    let json = &json_lines(&["replay", path, "--json", "--policy", "tlsf"])[0];
    assert_eq!(json["events"], original[0]["events"]);
    assert_eq!(json["peak_live_bytes"], original[0]["peak_live_bytes"]);
    assert_eq!(original[0]["skipped_records"], serde_json::json!([]));
    assert_eq!(
        json["skipped_records"],
        serde_json::json!([
            {"reason": "allocate_failure", "count": 2, "first": "line 101"},
            {"reason": "repeated_header", "count": 1, "first": "line 201"},
            {"reason": "cut_last_line", "count": 1, "first": format!("line {}", lines.len() + 4)},
        ])
    );
    let table = output(&["replay", path, "--policy", "tlsf"]);
    for warning in [
        "warning: skipped 2 `allocate failure` rows",
        "warning: skipped 1 repeated header",
        "warning: skipped 1 cut-off last line",
    ] {
        assert!(table.contains(warning), "{table}");
    }
}

#[test]
fn live_bytes_past_64_bits_are_an_error_naming_the_line() {
    // 65,536 allocations of 2^48 bytes make 2^64: the last one overflows.
    let mut body = String::from(HEADER);
    for index in 0..65_537u64 {
        body += &format!("0,0,allocate,{:#x},281474976710656,0\n", (index + 1) << 8);
    }
    let path = write_file("wrap.csv", body.as_bytes());
    let error = trace_error(&["replay", path.to_str().unwrap(), "--policy", "tlsf"]);
    assert_eq!(error.location, Location::Line(65_537));
    assert!(
        matches!(error.problem, Problem::LiveBytesOverflow { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("live bytes overflow 64 bits"));
}

/// Three 1 MiB blocks.
fn small_trace() -> PathBuf {
    let body = format!(
        "{HEADER}0,0,allocate,0x1000,1048576,0\n0,0,allocate,0x2000,1048576,0\n\
         0,0,free,0x1000,1048576,0\n0,0,allocate,0x3000,1048576,0\n"
    );
    write_file("small.csv", body.as_bytes())
}

#[test]
fn a_capacity_off_the_2_mib_granule_is_refused() {
    let path = small_trace();
    for capacity in ["3MiB", "2097153", "1GB"] {
        assert_error(
            &["replay", path.to_str().unwrap(), "--capacity", capacity],
            &["--capacity", "2 MiB"],
        );
    }
}

#[test]
fn a_policy_that_cannot_take_the_arena_is_skipped_with_a_note() {
    let path = small_trace();
    let path = path.to_str().unwrap();
    let json = &json_lines(&["replay", path, "--capacity", "1TiB", "--json"])[0];
    let names: Vec<&str> = json["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|policy| policy["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "first-fit",
            "best-fit",
            "tlsf",
            "tlsf-compact",
            "pool-vmm",
            "range-alloc",
            "stitch",
            "pytorch-expandable"
        ]
    );
    let skipped = &json["skipped_policies"];
    assert_eq!(skipped.as_array().unwrap().len(), 1, "{skipped}");
    assert_eq!(skipped[0]["name"], "offset-allocator");
    assert_eq!(
        skipped[0]["reason"],
        "offset-allocator manages at most 1099511627264 bytes, less than the \
         1099511627776-byte arena"
    );
    let table = output(&["replay", path, "--capacity", "1TiB"]);
    assert!(table.contains("note: offset-allocator skipped"), "{table}");
    assert!(table.contains("range-alloc"), "{table}");
    // Alone, it leaves nothing to replay: an error.
    assert_error(
        &[
            "replay",
            path,
            "--capacity",
            "1TiB",
            "--policy",
            "offset-allocator",
        ],
        &["no chosen policy can take the arena"],
    );
}

#[test]
fn an_unwritable_report_fails_before_the_replay() {
    let trace = small_trace();
    let report = temp_path("no-such-dir").join("report.html");
    // The error comes before any table: nothing was printed.
    let (printed, result) = attempt(&[
        "replay",
        trace.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    let said = format!("{:#}", result.unwrap_err());
    assert!(
        said.contains("cannot write the report") && said.contains("report.html"),
        "{said}"
    );
    assert!(printed.is_empty(), "{printed}");
}

#[test]
fn a_failed_replay_leaves_no_empty_report_behind() {
    let bad = write_file(
        "bad.csv",
        format!("{HEADER}0,0,resize,0x10,1,0\n").as_bytes(),
    );
    let report = temp_path("never.html");
    let args = [
        "replay",
        bad.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ];
    assert_error(&args, &["unknown action"]);
    assert!(!report.exists());
    // An existing file is left as it was.
    std::fs::write(&report, "old report").unwrap();
    assert_error(&args, &["unknown action"]);
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "old report");
}

#[test]
fn a_report_naming_an_input_trace_is_refused() {
    let trace = small_trace();
    let before = std::fs::read(&trace).unwrap();
    let other = small_trace();
    // The same file, spelled another way.
    let dir = trace.parent().unwrap();
    let spelled = Path::new(dir).join(".").join(trace.file_name().unwrap());
    assert_error(
        &[
            "replay",
            other.to_str().unwrap(),
            trace.to_str().unwrap(),
            "--report",
            spelled.to_str().unwrap(),
        ],
        &["is the same file as the input", "refusing to overwrite it"],
    );
    assert_eq!(std::fs::read(&trace).unwrap(), before);
}

#[test]
fn byte_counts_that_are_not_numbers_are_refused() {
    for text in [
        ".KiB",
        "",
        "KiB",
        "1.2.3MiB",
        "-1",
        "-4KiB",
        "20000000PiB",
        "1.",
    ] {
        // `--size=-1`: spelled apart, clap would take "-1" for a flag.
        let err = run(&["heap", &format!("--size={text}")]).unwrap_err();
        let clap = err
            .downcast_ref::<clap::Error>()
            .unwrap_or_else(|| panic!("{text:?}: not refused by clap: {err:#}"));
        assert_eq!(
            clap.kind(),
            clap::error::ErrorKind::ValueValidation,
            "{text:?}"
        );
        let said = clap.to_string();
        assert!(said.contains("invalid value"), "{text:?}: {said}");
        assert!(!said.contains("--size 0:"), "{text:?} read as 0: {said}");
    }
    let said = message(&["heap", "--size", "20000000PiB"]);
    assert!(said.contains("overflows"), "{said}");
}

#[test]
fn a_local_memory_reservation_larger_than_the_device_is_an_error() {
    for args in [
        &["explain", "--stack-size", "18446744073709551615"][..],
        &["explain", "--lmem", "200GiB"],
        &["explain", "--lmem", "200GiB", "--json"],
    ] {
        assert_error(
            args,
            &["local memory would take", H200_TOTAL, "NVIDIA H200"],
        );
        assert!(attempt(args).0.is_empty(), "{args:?} printed a ledger");
    }
    let said = message(&["explain", "--stack-size", "18446744073709551615"]);
    assert!(said.contains("2^64 bytes or more"), "{said}");
    // 64 KiB per thread is 16.5 GiB: it fits, and is printed.
    assert!(output(&["explain", "--stack-size", "64KiB"]).contains("local memory"));
}

#[test]
fn heap_refuses_a_pattern_no_device_could_hold() {
    // 270,336 threads x 1 GiB: hundreds of TiB, no heap to recommend.
    for size in ["1GiB", "1TiB"] {
        assert_error(
            &["heap", "--size", size],
            &["no heap size can serve the pattern", "fewer"],
        );
    }
    // One thread of 1 GiB fits: (2^30 + 16) B, whole MiB, plus half again.
    let json = &json_lines(&["heap", "--size", "1GiB", "--threads", "1", "--json"])[0];
    assert_eq!(json["prediction"]["minimum_heap_bytes"], 1025u64 << 20);
}
