//! `cudamem explain` and `cudamem heap` as a user runs them.

mod support;
use support::{cudamem, json_of};

#[test]
fn h200_ledger_has_the_local_memory_reservation() {
    let json = json_of(&cudamem(&["explain", "--profile", "h200", "--json"]));
    assert_eq!(json["device"], "h200");
    assert_eq!(json["sm_count"], 132);
    assert_eq!(json["max_threads_per_sm"], 2048);
    assert_eq!(json["total_bytes"], 150_109_880_320u64);
    assert_eq!(json["stack_size_bytes"], 1024);
    assert_eq!(json["local_memory_per_sm_bytes"], 2048 * 1024);
    assert_eq!(json["local_memory_reservation_bytes"], 132 * 2048 * 1024);
    assert_eq!(json["malloc_heap_bytes"], 8 << 20);
    assert_eq!(json["printf_fifo_bytes"], 8_650_752);
    assert_eq!(json["measured"], false);
    assert!(
        json.as_object()
            .unwrap()
            .keys()
            .all(|key| !key.starts_with("measured_"))
    );
}

#[test]
fn limits_and_kernel_frames_change_the_ledger() {
    let json = json_of(&cudamem(&[
        "explain",
        "--stack-size",
        "2KiB",
        "--lmem",
        "16KiB",
        "--lmem",
        "512",
        "--heap-size",
        "64MiB",
        "--json",
    ]));
    // The largest frame (16 KiB) exceeds the stack limit and sets the reservation.
    assert_eq!(json["stack_size_bytes"], 2048);
    assert_eq!(
        json["local_memory_reservation_bytes"],
        132u64 * 2048 * 16384
    );
    assert_eq!(json["malloc_heap_bytes"], 64 << 20);
}

#[test]
fn explain_tells_unknown_profiles_and_missing_cuda_apart() {
    let output = cudamem(&["explain", "--profile", "voodoo2"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unknown profile \"voodoo2\"") && stderr.contains("h200"),
        "{stderr}"
    );

    let output = cudamem(&["explain", "--device", "0"]);
    if cfg!(feature = "cuda") {
        // A cuda build without a GPU fails in the driver, still cleanly.
        assert!(!String::from_utf8_lossy(&output.stderr).contains("panicked"));
    } else {
        assert!(!output.status.success());
        assert!(String::from_utf8_lossy(&output.stderr).contains("built without the cuda feature"));
    }

    let output = cudamem(&["explain", "--stack-size", "12 parsecs"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown unit"));
}

#[test]
fn explain_draws_the_ledger() {
    let path = std::env::temp_dir().join(format!("cudamem-explain-{}.html", std::process::id()));
    let output = cudamem(&[
        "explain",
        "--profile",
        "a100-80gb",
        "--report",
        path.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("local memory"), "{stdout}");
    let html = std::fs::read_to_string(&path).unwrap();
    assert_eq!(html.matches("<svg").count(), 1);
    assert!(html.contains("local memory"));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn heap_predicts_without_a_gpu() {
    let json = json_of(&cudamem(&[
        "heap",
        "--size",
        "256",
        "--size",
        "1KiB",
        "--threads",
        "1024",
        "--predict",
        "--json",
    ]));
    assert_eq!(json["prediction"]["requested_bytes_per_thread"], 1280);
    // (256 + 16) + (1024 + 16) bytes a thread, 1024 threads, whole MiB.
    assert_eq!(json["prediction"]["minimum_heap_bytes"], 2 << 20);
    assert!(json["measured"].is_null());
    let output = cudamem(&[
        "heap",
        "--size",
        "4096",
        "--threads",
        "1048576",
        "--predict",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("prediction"), "{stdout}");
    let output = cudamem(&["heap", "--size", "0"]);
    assert!(!output.status.success());
}

#[test]
fn explain_device_all_parses_and_fails_cleanly_without_a_gpu() {
    let output = cudamem(&["explain", "--device", "all"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if cfg!(feature = "cuda") {
        // A cuda build on a machine without a GPU fails in the driver; on a GPU
        // machine it succeeds. Either way it ends cleanly.
        assert!(output.status.success() || !stderr.is_empty());
    } else {
        assert!(!output.status.success());
        assert!(
            stderr.contains("--device all: cudamem was built without the cuda feature"),
            "{stderr}"
        );
    }

    let output = cudamem(&["explain", "--device", "gpu0"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("\"gpu0\" is neither a device ordinal (0, 1, ...) nor `all`"),
        "{stderr}"
    );

    let output = cudamem(&["explain", "--device", "all", "--report", "x.html"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--report draws one ledger"), "{stderr}");

    let output = cudamem(&["explain", "--device", "ALL", "--profile", "h100"]);
    assert!(
        !output.status.success(),
        "--device conflicts with --profile"
    );
}

#[test]
fn a_cm_heap_is_a_ledger_line_beside_cudas_malloc_heap() {
    let plain = json_of(&cudamem(&["explain", "--json"]));
    let json = json_of(&cudamem(&[
        "explain",
        "--cm-heap",
        "256MiB",
        "--heap-size",
        "64MiB",
        "--json",
    ]));
    // 256 MiB of regions hold 252 chunks of 1 MiB + 16 KiB of maps; the
    // descriptor comes on top.
    let expected = kernels::cm_heap::DESCRIPTOR_BYTES + kernels::cm_heap::region_bytes(252);
    assert_eq!(json["cm_heap_bytes"], expected);
    assert_eq!(plain["cm_heap_bytes"], 0);
    assert_eq!(json["malloc_heap_bytes"], 64 << 20);
    let item = |json: &serde_json::Value, kind: &str| {
        json["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|item| item["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} line"))
            .clone()
    };
    assert_eq!(item(&json, "cm_heap")["predicted"], expected);
    assert_eq!(item(&json, "cm_heap")["name"], "cm_malloc heap");
    let free = |json: &serde_json::Value| item(json, "free")["predicted"].as_u64().unwrap();
    assert_eq!(free(&plain) - free(&json), expected);

    let table = cudamem(&["explain", "--cm-heap", "1GiB"]);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("cm_malloc heap"))
        .expect("a cm_malloc heap line");
    assert!(line.contains("taken from the pool"), "{line}");

    let bad = cudamem(&["explain", "--cm-heap", "3 parsecs"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--cm-heap"));
    let huge = cudamem(&["explain", "--cm-heap", "100GiB"]);
    assert!(!huge.status.success());
    assert!(
        String::from_utf8_lossy(&huge.stderr).contains("at most 65536 chunks"),
        "{}",
        String::from_utf8_lossy(&huge.stderr)
    );
}
