//! `cudamem replay` as a user runs it: the built binary on trace files
//! written to a temporary folder.

mod support;
use support::{cudamem, gzip, temp_path, write_file};

use std::path::{Path, PathBuf};
use std::process::Output;

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

fn replay(path: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["replay", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    cudamem(&args)
}

/// Replay `body` (CSV rows after the header) and expect a failure whose
/// message names the file, `line` and `needle`.
fn assert_rejected(body: &str, line: u64, needle: &str) {
    let path = write_file("bad.csv", format!("{HEADER}{body}").as_bytes());
    let output = replay(&path, &["--policy", "tlsf"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "accepted:\n{body}");
    assert!(
        stderr.contains(path.file_name().unwrap().to_str().unwrap()),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("line {line}:")), "{stderr}");
    assert!(stderr.contains(needle), "wanted {needle:?} in {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_rows_are_errors_naming_file_and_line() {
    let ok = "0,00:00:00.000001,allocate,0x1000,512,0\n";
    assert_rejected(
        &format!("{ok}0,00:00:00.000002,allocate,0x2000\n"),
        3,
        "malformed",
    );
    assert_rejected(
        &format!("{ok}0,00:00:00.000002,reallocate,0x1000,512,0\n"),
        3,
        "unknown action \"reallocate\"",
    );
    assert_rejected(
        &format!("{ok}0,00:00:00.000002,allocate,0x2000,-512,0\n"),
        3,
        "is negative",
    );
    assert_rejected(
        &format!("{ok}0,00:00:00.000002,allocate,0x2000,5l2,0\n"),
        3,
        "is not a number",
    );
    assert_rejected(
        &format!("{ok}0,00:00:00.000002,allocate,0x2000,123456789012345678901234,0\n"),
        3,
        "overflows",
    );
    assert_rejected(
        &format!("{ok}0,00:00:00.000002,free,0x3000,512,0\n"),
        3,
        "free of unknown pointer 0x3000",
    );
    assert_rejected(
        &format!("{ok}{ok}"),
        3,
        "second allocation at live pointer 0x1000",
    );
    assert_rejected(
        &format!("{ok}0,0,free,0x1000,512,0\n0,0,free,0x1000,512,0\n"),
        4,
        "unknown pointer",
    );
    assert_rejected(
        &format!("{ok}0,0,allocate,zz,512,0\n"),
        3,
        "not a hexadecimal address",
    );
}

#[test]
fn a_truncated_gzip_file_is_an_error() {
    let mut body = String::from(HEADER);
    for i in 0..5000 {
        body += &format!(
            "0,00:00:00.{i:06},allocate,{:#x},{},0\n",
            0x10000 + i * 0x1000,
            512 + i
        );
    }
    let whole = gzip(body.as_bytes());
    let path = write_file("cut.csv.gz", &whole[..whole.len() / 2]);
    let output = replay(&path, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("cut.csv.gz"), "{stderr}");
    assert!(stderr.contains("truncated gzip"), "{stderr}");
    assert!(stderr.contains("line "), "{stderr}");
}

#[test]
fn a_missing_file_is_an_error() {
    let output = cudamem(&["replay", "/nonexistent/trace.csv"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/trace.csv"));
}

/// Three blocks with a peak of 1000 + 3000 = 4000 live bytes, gzipped.
fn small_trace() -> PathBuf {
    let body = format!(
        "{HEADER}\
         0,00:00:00.000001,segment_alloc,0x7f0000000000,2097152,0\n\
         0,00:00:00.000002,allocate,0x7f0000000000,1000,0\n\
         0,00:00:00.000003,allocate,0x7f0000000400,2000,0\n\
         0,00:00:00.000004,free,0x7f0000000400,2000,0\n\
         0,00:00:00.000005,allocate,0x7f0000000400,3000,0\n\
         0,00:00:00.000006,free,0x7f0000000000,1000,0\n\
         0,00:00:00.000007,free,0x7f0000000400,3000,0\n"
    );
    write_file("small.csv.gz", &gzip(body.as_bytes()))
}

#[test]
fn json_output_has_every_field_and_the_exact_peak() {
    let path = small_trace();
    let output = replay(&path, &["--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let json: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert!(json["trace"].as_str().unwrap().ends_with("small.csv.gz"));
    assert_eq!(json["events"], 6);
    assert_eq!(json["peak_live_bytes"], 4000);
    let policies = json["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "first-fit",
            "best-fit",
            "tlsf",
            "tlsf-compact",
            "pool-vmm",
            "offset-allocator",
            "range-alloc",
            "stitch",
            "pytorch-expandable"
        ]
    );
    assert!(json["duration_ns"].as_u64().unwrap() > 0, "{json}");
    for policy in policies {
        // One 2 MiB granule holds everything; stitch grows its frontier by
        // whole 32 MiB handles.
        let granule: u64 = if policy["name"] == "stitch" {
            32 << 20
        } else {
            2 << 20
        };
        assert_eq!(policy["peak_footprint_bytes"], granule, "{policy}");
        let ratio = policy["footprint_ratio"].as_f64().unwrap();
        assert!((ratio - granule as f64 / 4000.0).abs() < 1e-6, "{policy}");
        assert_eq!(policy["compaction_bytes_moved"], 0);
        assert_eq!(policy["failed_allocations"], 0);
        assert!(policy["ns_per_op"].as_f64().unwrap() >= 0.0);
        // One handle: created, mapped, given access.
        let calls = &policy["driver_calls"];
        assert_eq!(
            (&calls["creates"], &calls["maps"]),
            (&1.into(), &1.into()),
            "{policy}"
        );
        assert!(
            policy["driver_time_share"].as_f64().unwrap() > 0.0,
            "{policy}"
        );
    }
}

#[test]
fn policy_selection_and_the_table() {
    let path = small_trace();
    let output = replay(&path, &["--policy", "best-fit", "--policy", "range-alloc"]);
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("peak live 3.91 KiB (4000 bytes)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("best-fit") && stdout.contains("range-alloc"),
        "{stdout}"
    );
    assert!(!stdout.contains("tlsf"), "{stdout}");
}

#[test]
fn a_fixed_capacity_reports_the_first_failure() {
    // 1 MiB, a hole of 1 MiB, 1 MiB; then 2 MiB: fits in 4 MiB only by moving.
    let body = format!(
        "{HEADER}\
         0,0,allocate,0x1000,1048576,0\n\
         0,0,allocate,0x2000,1048576,0\n\
         0,0,allocate,0x3000,1048576,0\n\
         0,0,free,0x2000,1048576,0\n\
         0,0,allocate,0x4000,2097152,0\n"
    );
    let path = write_file("holes.csv", body.as_bytes());
    let output = replay(
        &path,
        &[
            "--capacity",
            "4MiB",
            "--policy",
            "first-fit",
            "--policy",
            "tlsf-compact",
            "--json",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["capacity_bytes"], 4 << 20);
    let first_fit = &json["policies"][0];
    assert_eq!(first_fit["failed_allocations"], 1);
    let failure = &first_fit["first_failure"];
    assert_eq!(failure["event"], 4);
    assert_eq!(failure["location"], "line 6");
    assert_eq!(failure["request_bytes"], 2 << 20);
    assert_eq!(failure["state"]["free_bytes"], 2 << 20);
    assert_eq!(failure["state"]["largest_free_bytes"], 1 << 20);
    let compacting = &json["policies"][1];
    assert_eq!(compacting["failed_allocations"], 0);
    assert_eq!(compacting["compaction_bytes_moved"], 1 << 20);

    let table = replay(&path, &["--capacity", "4MiB", "--policy", "first-fit"]);
    let stdout = String::from_utf8(table.stdout).unwrap();
    assert!(
        stdout.contains("first-fit first fails at event 4 (line 6)"),
        "{stdout}"
    );
}

#[test]
fn the_report_is_html_with_svg() {
    let path = small_trace();
    let report = temp_path("report.html");
    let output = replay(
        &path,
        &[
            "--report",
            report.to_str().unwrap(),
            "--policy",
            "tlsf-compact",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(
        html.matches("<svg").count(),
        3,
        "footprint chart, overhead chart and one memory map"
    );
    assert!(html.contains("Memory map: tlsf-compact"));
}

/// Without the `cuda` feature, `--gpu` is a clear error, after the trace
/// was read (so a bad trace is still reported as such).
#[test]
#[cfg(not(feature = "cuda"))]
fn gpu_replay_without_cuda_says_how_to_get_it() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/rmm/resnet50_train.csv.gz");
    let output = replay(&trace, &["--gpu", "0"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("--gpu 0") && stderr.contains("`cuda` feature"),
        "{stderr}"
    );
    assert!(
        output.stdout.is_empty(),
        "printed a replay: {}",
        String::from_utf8_lossy(&output.stdout)
    );
}
