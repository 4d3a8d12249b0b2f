//! `cudamem replay` as a user runs it, in process, on trace files written
//! to a temporary folder.

mod support;
use support::{attempt, default_policies, gzip, json, message, output, temp_path, write_file};

use std::path::{Path, PathBuf};

use trace::{Location, TraceError};

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

/// The arguments `replay PATH EXTRA...`.
fn replay<'a>(path: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["replay", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    args
}

/// Replay `body` (CSV rows after the header) and expect a trace error at
/// `line` whose message names the file and holds `needle`.
fn assert_rejected(body: &str, line: u64, needle: &str) {
    let path = write_file("bad.csv", format!("{HEADER}{body}").as_bytes());
    let (_, result) = attempt(&replay(&path, &["--policy", "tlsf"]));
    let err = result.expect_err(body);
    let error = err
        .downcast_ref::<TraceError>()
        .unwrap_or_else(|| panic!("not a trace error: {err:#}"));
    assert_eq!(error.path, path);
    assert_eq!(error.location, Location::Line(line), "{error}");
    let said = format!("{err:#}");
    assert!(
        said.contains(path.file_name().unwrap().to_str().unwrap()),
        "{said}"
    );
    assert!(said.contains(&format!("line {line}:")), "{said}");
    assert!(said.contains(needle), "wanted {needle:?} in {said}");
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
    let said = message(&replay(&path, &[]));
    assert!(said.contains("cut.csv.gz"), "{said}");
    assert!(said.contains("truncated gzip"), "{said}");
    assert!(said.contains("line "), "{said}");
}

#[test]
fn a_missing_file_is_an_error() {
    let said = message(&["replay", "/nonexistent/trace.csv"]);
    assert!(said.contains("/nonexistent/trace.csv"), "{said}");
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
    let printed = output(&replay(&path, &["--json"]));
    assert_eq!(printed.lines().count(), 1, "{printed}");
    let json: serde_json::Value = serde_json::from_str(&printed).unwrap();
    assert!(json["trace"].as_str().unwrap().ends_with("small.csv.gz"));
    assert_eq!(json["events"], 6);
    assert_eq!(json["peak_live_bytes"], 4000);
    let policies = json["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, default_policies());
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
    let stdout = output(&replay(
        &path,
        &["--policy", "best-fit", "--policy", "range-alloc"],
    ));
    assert!(stdout.contains("peak live 3.91 KiB (4000 B)"), "{stdout}");
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
    let json = json(&replay(
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
    ));
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

    let stdout = output(&replay(
        &path,
        &["--capacity", "4MiB", "--policy", "first-fit"],
    ));
    assert!(
        stdout.contains("first-fit first fails at event 4 (line 6)"),
        "{stdout}"
    );
}

#[test]
fn the_report_is_html_with_svg() {
    let path = small_trace();
    let report = temp_path("report.html");
    output(&replay(
        &path,
        &[
            "--report",
            report.to_str().unwrap(),
            "--policy",
            "tlsf-compact",
        ],
    ));
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(
        html.matches("<svg").count(),
        4,
        "peak bars, footprint chart, overhead chart and one memory map"
    );
    assert!(html.contains("Memory map: tlsf-compact"));
}

/// A bare `cudamem` replays the built-in traces with `cudamem replay`'s
/// defaults: the same rows as `cudamem replay` of each trace's file (but for
/// time), so what the README shows first is what the benchmarks say.
#[test]
fn the_bare_command_and_replay_of_the_built_in_trace_give_the_same_rows() {
    use cudamem::cli::replay_command::{self, ReplayArgs};
    use trace::file::EMBEDDED;

    let mut bare = ReplayArgs::defaults().unwrap();
    // As the bare command runs, but JSON, and the report out of the way.
    bare.json = true;
    bare.report = Some(temp_path("bare.html"));
    let mut printed = Vec::new();
    replay_command::run(bare, &mut printed).unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(printed)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), EMBEDDED.len());
    // The PyTorch snapshot first, then the RMM log written from PyTorch's
    // allocator (its segment rows say what PyTorch reserved).
    assert_eq!(lines[0]["framework"], "pytorch");
    assert_eq!(lines[1]["framework"], "pytorch");
    assert!(lines[1]["pytorch_recorded"]["peak_reserved_bytes"].as_u64() > Some(0));
    let rows = |json: &serde_json::Value| {
        let mut rows = json["policies"].as_array().unwrap().clone();
        for row in &mut rows {
            let row = row.as_object_mut().unwrap();
            row.remove("ns_per_op").unwrap();
            row.remove("ops_per_second").unwrap();
        }
        rows
    };
    for (bare, embedded) in lines.iter().zip(EMBEDDED) {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../traces")
            .join(embedded.path);
        let replayed = json(&["replay", file.to_str().unwrap(), "--json"]);
        assert_eq!(rows(bare).len(), 9);
        assert_eq!(rows(bare), rows(&replayed));
        assert_eq!(bare["peak_live_bytes"], replayed["peak_live_bytes"]);
        assert_eq!(bare["conclusion"], replayed["conclusion"]);
    }
    let rows = rows(&lines[1]);
    let stitch = rows.iter().find(|row| row["name"] == "stitch").unwrap();
    assert_eq!(stitch["full_bandwidth_share"], 1.0, "{stitch}");
}

/// Without the `cuda` feature, `--gpu` is a clear error, after the trace
/// was read (so a bad trace is still reported as such).
#[test]
#[cfg(not(feature = "cuda"))]
fn gpu_replay_without_cuda_says_how_to_get_it() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/rmm/resnet50_train.csv.gz");
    let (printed, result) = attempt(&replay(&trace, &["--gpu", "0"]));
    let said = format!("{:#}", result.unwrap_err());
    assert!(
        said.contains("--gpu 0") && said.contains("`cuda` feature"),
        "{said}"
    );
    assert!(printed.is_empty(), "printed a replay: {printed}");
    let bad = write_file(
        "bad.csv",
        format!("{HEADER}0,0,resize,0x10,1,0\n").as_bytes(),
    );
    assert!(message(&replay(&bad, &["--gpu", "0"])).contains("unknown action"));
}

/// `--gpu` picks the policy that runs on a device; on the simulated one
/// (no `--gpu`) it is a row like the others, with the device's figures
/// under the table and in the JSON.
#[test]
fn the_stitched_pool_is_a_row_with_the_devices_figures() {
    let path = small_trace();
    let json = json(&replay(
        &path,
        &["--policy", "stitch", "--policy", "stitched-pool", "--json"],
    ));
    let [model, pool] = [&json["policies"][0], &json["policies"][1]];
    assert_eq!(pool["name"], "stitched-pool");
    for figure in [
        "peak_footprint_bytes",
        "driver_calls",
        "full_bandwidth_share",
    ] {
        assert_eq!(model[figure], pool[figure], "{figure}");
    }
    let device = &pool["device"];
    assert_eq!(device["measured_peak_bytes"], pool["peak_footprint_bytes"]);
    assert_eq!(device["allocate"]["calls"], 3);
    assert_eq!(device["free"]["calls"], 3);
    assert!(model.get("device").is_none(), "{model}");
    let table = output(&replay(&path, &["--policy", "stitched-pool"]));
    assert!(
        table.contains("stitched-pool on ") && table.contains("measured/model 1.000"),
        "{table}"
    );
    assert!(
        table.contains("copy kernel at the peak: not measured"),
        "{table}"
    );
}
