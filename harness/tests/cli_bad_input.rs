//! Bad and unusual input to the built `cudamem`, as found by trying: bombs,
//! special rows of real RMM logs, numbers past 64 bits, arenas and report
//! paths that cannot work. Each ends in a clear error or a reported warning,
//! in bounded time and memory.

mod support;
use support::{cudamem, gzip, temp_path, write_file};

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use flate2::read::GzDecoder;

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";
/// The real RMM log these tests change.
const RESNET50: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../traces/rmm/resnet50_train.csv.gz"
);
/// The H200 profile's memory, bytes.
const H200_TOTAL: &str = "150109880320";

/// Run `cudamem` with its address space capped at `mib` MiB and a wall
/// clock limit: a run that needs more memory or time fails the test.
fn cudamem_bounded(args: &[&str], mib: u64, limit: Duration) -> Output {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {} && exec \"$0\" \"$@\"", mib << 10))
        .arg(env!("CARGO_BIN_EXE_cudamem"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("cudamem {args:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Expect exit 1 with one short message holding every needle.
fn assert_error(output: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("cudamem: "), "{stderr}");
    assert!(stderr.len() < 600, "{} bytes of stderr", stderr.len());
    for needle in needles {
        assert!(stderr.contains(needle), "wanted {needle:?} in {stderr}");
    }
    stderr
}

fn json_lines(output: &Output) -> Vec<serde_json::Value> {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn real_log() -> String {
    let mut text = String::new();
    GzDecoder::new(std::fs::File::open(RESNET50).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn dev_zero_is_an_error_in_bounded_time_and_memory() {
    let output = cudamem_bounded(&["replay", "/dev/zero"], 512, Duration::from_secs(60));
    assert_error(
        &output,
        &["/dev/zero", "line 1:", "longer than 65536 bytes"],
    );
}

#[test]
fn gzip_bombs_stop_at_the_line_bound() {
    // A 32 MiB header line and a 32 MiB size field, each a gzip of ~32 KiB.
    let header_bomb = write_file("header.csv.gz", &gzip(&vec![b'A'; 32 << 20]));
    let mut field = format!("{HEADER}0,0,allocate,0x10,").into_bytes();
    field.resize(field.len() + (32 << 20), b'9');
    field.extend_from_slice(b",0\n");
    let field_bomb = write_file("field.csv.gz", &gzip(&field));
    for (path, line) in [(&header_bomb, "line 1:"), (&field_bomb, "line 2:")] {
        assert!(std::fs::metadata(path).unwrap().len() < 256 << 10);
        let output = cudamem_bounded(
            &["replay", path.to_str().unwrap(), "--policy", "tlsf"],
            512,
            Duration::from_secs(30),
        );
        assert_error(&output, &[line, "longer than 65536 bytes"]);
    }
}

#[test]
fn a_long_bad_value_is_quoted_cut_to_80_characters() {
    let body = format!("{HEADER}0,0,allocate,0x10,{}x,0\n", "9".repeat(60_000));
    let path = write_file("long.csv", body.as_bytes());
    let output = cudamem(&["replay", path.to_str().unwrap(), "--policy", "tlsf"]);
    let stderr = assert_error(&output, &["line 2:", "(60001 bytes)"]);
    assert!(
        stderr.contains(&format!("\"{}\"...", "9".repeat(80))),
        "{stderr}"
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
    let original = json_lines(&cudamem(&[
        "replay", RESNET50, "--json", "--policy", "tlsf",
    ]));
    let output = cudamem(&[
        "replay",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "tlsf",
    ]);
    let json = &json_lines(&output)[0];
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
    let table = cudamem(&["replay", path.to_str().unwrap(), "--policy", "tlsf"]);
    assert!(table.status.success());
    let stdout = String::from_utf8_lossy(&table.stdout);
    assert!(
        stdout.contains("warning: skipped 2 `allocate failure` rows"),
        "{stdout}"
    );
    assert!(
        stdout.contains("warning: skipped 1 repeated header"),
        "{stdout}"
    );
    assert!(
        stdout.contains("warning: skipped 1 cut-off last line"),
        "{stdout}"
    );
}

#[test]
fn live_bytes_past_64_bits_are_an_error_naming_the_line() {
    // 65,536 allocations of 2^48 bytes make 2^64: the last one overflows.
    let mut body = String::from(HEADER);
    for index in 0..65_537u64 {
        body += &format!("0,0,allocate,{:#x},281474976710656,0\n", (index + 1) << 8);
    }
    let path = write_file("wrap.csv", body.as_bytes());
    let output = cudamem(&["replay", path.to_str().unwrap(), "--policy", "tlsf"]);
    assert_error(&output, &["line 65537:", "live bytes overflow 64 bits"]);
    assert!(output.stdout.is_empty());
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
        let output = cudamem(&["replay", path.to_str().unwrap(), "--capacity", capacity]);
        assert_error(&output, &["--capacity", "2 MiB"]);
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn a_policy_that_cannot_take_the_arena_is_skipped_with_a_note() {
    let path = small_trace();
    let path = path.to_str().unwrap();
    let json = &json_lines(&cudamem(&["replay", path, "--capacity", "1TiB", "--json"]))[0];
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
    assert!(
        skipped[0]["reason"]
            .as_str()
            .unwrap()
            .contains("at most 1099511627264 bytes"),
        "{skipped}"
    );
    let table = cudamem(&["replay", path, "--capacity", "1TiB"]);
    assert!(table.status.success());
    let stdout = String::from_utf8_lossy(&table.stdout);
    assert!(
        stdout.contains("note: offset-allocator skipped"),
        "{stdout}"
    );
    assert!(stdout.contains("range-alloc"), "{stdout}");
    // Alone, it leaves nothing to replay: an error.
    let output = cudamem(&[
        "replay",
        path,
        "--capacity",
        "1TiB",
        "--policy",
        "offset-allocator",
    ]);
    assert_error(&output, &["no chosen policy can take the arena"]);
}

#[test]
fn an_unwritable_report_fails_before_the_replay() {
    let trace = small_trace();
    let report = temp_path("no-such-dir").join("report.html");
    let output = cudamem(&[
        "replay",
        trace.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_error(&output, &["cannot write the report", "report.html"]);
    // Nothing replayed: no table came out first.
    assert!(
        output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn a_failed_replay_leaves_no_empty_report_behind() {
    let bad = write_file(
        "bad.csv",
        format!("{HEADER}0,0,resize,0x10,1,0\n").as_bytes(),
    );
    let report = temp_path("never.html");
    let output = cudamem(&[
        "replay",
        bad.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_error(&output, &["unknown action"]);
    assert!(!report.exists());
    // An existing file is left as it was.
    std::fs::write(&report, "old report").unwrap();
    let output = cudamem(&[
        "replay",
        bad.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_error(&output, &["unknown action"]);
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
    let output = cudamem(&[
        "replay",
        other.to_str().unwrap(),
        trace.to_str().unwrap(),
        "--report",
        spelled.to_str().unwrap(),
    ]);
    assert_error(&output, &["is the input trace", "refusing to overwrite it"]);
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
        let output = cudamem(&["heap", &format!("--size={text}")]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text:?}: {stderr}");
        assert!(stderr.contains("invalid value"), "{text:?}: {stderr}");
        assert!(
            !stderr.contains("--size 0:"),
            "{text:?} read as 0: {stderr}"
        );
    }
    let stderr =
        String::from_utf8_lossy(&cudamem(&["heap", "--size", "20000000PiB"]).stderr).into_owned();
    assert!(stderr.contains("overflows"), "{stderr}");
}

#[test]
fn a_local_memory_reservation_larger_than_the_device_is_an_error() {
    for args in [
        &["explain", "--stack-size", "18446744073709551615"][..],
        &["explain", "--lmem", "200GiB"],
        &["explain", "--lmem", "200GiB", "--json"],
    ] {
        let output = cudamem(args);
        assert_error(
            &output,
            &["local memory would take", H200_TOTAL, "NVIDIA H200"],
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    let stderr = String::from_utf8_lossy(
        &cudamem(&["explain", "--stack-size", "18446744073709551615"]).stderr,
    )
    .into_owned();
    assert!(stderr.contains("2^64 bytes or more"), "{stderr}");
    // 64 KiB per thread is 16.5 GiB: it fits, and is printed.
    let output = cudamem(&["explain", "--stack-size", "64KiB"]);
    assert!(output.status.success());
}

#[test]
fn heap_works_out_a_terabyte_per_thread() {
    let output = cudamem(&["heap", "--size", "1TiB", "--json"]);
    let json = &json_lines(&output)[0];
    // (2^40 + 16) B x 270,336 threads, rounded up to whole MiB.
    assert_eq!(
        json["prediction"]["minimum_heap_bytes"],
        297_237_575_411_695_616u64
    );
    assert_eq!(
        json["prediction"]["recommended_heap_bytes"],
        445_856_363_117_019_136u64
    );
}
