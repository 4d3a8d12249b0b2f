//! `cudamem explain` and `cudamem heap` as a user runs them, in process.

mod support;
use support::{json, message, output, run};

#[test]
fn h200_ledger_has_the_local_memory_reservation() {
    let json = json(&["explain", "--profile", "h200", "--json"]);
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
    let json = json(&[
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
    ]);
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
    let said = message(&["explain", "--profile", "voodoo2"]);
    assert!(
        said.contains("unknown profile \"voodoo2\"") && said.contains("h200"),
        "{said}"
    );

    let measured = run(&["explain", "--device", "0"]);
    if cfg!(feature = "cuda") {
        // A cuda build ends in the driver's answer: a ledger on a GPU
        // machine, an error without one.
        if let Err(err) = measured {
            assert!(!format!("{err:#}").is_empty());
        }
    } else {
        let said = format!("{:#}", measured.unwrap_err());
        assert!(said.contains("built without the cuda feature"), "{said}");
    }

    assert!(message(&["explain", "--stack-size", "12 parsecs"]).contains("unknown unit"));
}

#[test]
fn explain_draws_the_ledger() {
    let path = support::temp_path("explain.html");
    let stdout = output(&[
        "explain",
        "--profile",
        "a100-80gb",
        "--report",
        path.to_str().unwrap(),
    ]);
    assert!(stdout.contains("local memory"), "{stdout}");
    let html = std::fs::read_to_string(&path).unwrap();
    assert_eq!(html.matches("<svg").count(), 1);
    assert!(html.contains("local memory"));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn heap_predicts_without_a_gpu() {
    let json = json(&[
        "heap",
        "--size",
        "256",
        "--size",
        "1KiB",
        "--threads",
        "1024",
        "--predict",
        "--json",
    ]);
    assert_eq!(json["prediction"]["requested_bytes_per_thread"], 1280);
    // (256 + 16) + (1024 + 16) bytes a thread, 1024 threads, whole MiB.
    assert_eq!(json["prediction"]["minimum_heap_bytes"], 2 << 20);
    assert!(json["measured"].is_null());
    let stdout = output(&[
        "heap",
        "--size",
        "4096",
        "--threads",
        "1048576",
        "--predict",
    ]);
    assert!(stdout.contains("prediction"), "{stdout}");
    assert!(message(&["heap", "--size", "0"]).contains("--size 0"));
}

#[test]
fn explain_device_all_parses_and_fails_cleanly_without_a_gpu() {
    let all = run(&["explain", "--device", "all"]);
    if cfg!(feature = "cuda") {
        // On a GPU machine it succeeds; without one it fails in the driver.
        if let Err(err) = all {
            assert!(!format!("{err:#}").is_empty());
        }
    } else {
        let said = format!("{:#}", all.unwrap_err());
        assert!(
            said.contains("--device all: cudamem was built without the cuda feature"),
            "{said}"
        );
    }

    let said = message(&["explain", "--device", "gpu0"]);
    assert!(
        said.contains("\"gpu0\" is neither a device ordinal (0, 1, ...) nor `all`"),
        "{said}"
    );

    let said = message(&["explain", "--device", "all", "--report", "x.html"]);
    assert!(said.contains("--report draws one ledger"), "{said}");

    let conflict = run(&["explain", "--device", "ALL", "--profile", "h100"]).unwrap_err();
    assert_eq!(
        conflict
            .downcast_ref::<clap::Error>()
            .map(clap::Error::kind),
        Some(clap::error::ErrorKind::ArgumentConflict),
        "--device conflicts with --profile: {conflict:#}"
    );
}

#[test]
fn a_cm_heap_is_a_ledger_line_beside_cudas_malloc_heap() {
    let plain = json(&["explain", "--json"]);
    let json = json(&[
        "explain",
        "--cm-heap",
        "256MiB",
        "--heap-size",
        "64MiB",
        "--json",
    ]);
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

    let text = output(&["explain", "--cm-heap", "1GiB"]);
    // The why column wraps under itself: the words, one line.
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("cm_malloc heap 1.00 GiB - cm_malloc's heap: descriptor and regions")
            && words.contains("taken from the pool"),
        "{text}"
    );
    // The command ends with what it concluded and what to do, with numbers.
    let at = text.find("\nconclusion: ").expect("a conclusion");
    let conclusion = text[at..].split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        conclusion.starts_with("conclusion: the cm_malloc heap takes 1.00 GiB from the pool")
            && conclusion.contains("give --cm-heap what one launch holds at once"),
        "{conclusion}"
    );
    // ... last: what follows its first line is its own wrapped lines.
    assert!(
        text[at + 1..].lines().skip(1).all(|l| l.starts_with("  ")),
        "{text}"
    );
    assert_eq!(
        json["cm_heap_conclusion"]
            .as_str()
            .map(|s| s.starts_with("conclusion: the cm_malloc heap takes ")),
        Some(true)
    );
    assert!(plain.get("cm_heap_conclusion").is_none());

    assert!(message(&["explain", "--cm-heap", "3 parsecs"]).contains("--cm-heap"));
    let said = message(&["explain", "--cm-heap", "100GiB"]);
    assert!(said.contains("at most 65536 chunks"), "{said}");
}

#[test]
fn a_model_says_so_and_what_it_does_not_know_is_unknown_not_zero() {
    let text = output(&["explain", "--profile", "rtx4090"]);
    // The first sentence, wrapped to the line width.
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.starts_with(
            "model for NVIDIA GeForce RTX 4090 (not measured: run `cudamem explain --device N` \
             on the GPU, or `cudamem run -- PROGRAM`)"
        ),
        "{text}"
    );
    let driver = text
        .lines()
        .find(|l| l.starts_with("driver + context"))
        .expect("a driver line");
    assert!(
        driver.contains("unknown") && !driver.contains(" 0 B "),
        "{driver}"
    );
    let free = text.lines().find(|l| l.starts_with("free")).unwrap();
    assert!(free.contains("at most"), "{free}");
    assert!(text.contains("so free is at most"), "{text}");

    let model = json(&["explain", "--profile", "rtx4090", "--json"]);
    assert_eq!(model["model"], true);
    let item = |kind: &str| {
        model["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|item| item["kind"] == kind)
            .unwrap()
            .clone()
    };
    assert_eq!(item("context_baseline")["state"], "unknown");
    assert!(item("context_baseline")["predicted"].is_null());
    assert_eq!(item("local_memory")["state"], "predicted");
    assert_eq!(item("free")["state"], "at_most");
    assert!(item("free")["at_most"].as_u64().unwrap() > 20 << 30);
    assert_eq!(model["unknown"], serde_json::json!(["context_baseline"]));

    // The measured model knows every line: free is a figure, not a bound.
    let h200 = json(&["explain", "--json"]);
    assert_eq!(h200["unknown"], serde_json::json!([]));
    assert!(output(&["explain"]).starts_with("model for NVIDIA H200 (not measured"));
}

#[test]
fn the_common_gpus_have_profiles_with_a_source() {
    for (name, sms, threads) in [
        ("a100-40gb", 108, 2048),
        ("a100-80gb", 108, 2048),
        ("h100", 132, 2048),
        ("h100-pcie", 114, 2048),
        ("h200", 132, 2048),
        ("l40s", 142, 1536),
        ("l4", 58, 1536),
        ("t4", 40, 1024),
        ("a10", 72, 1536),
        ("v100", 80, 2048),
        ("rtx4090", 128, 1536),
        ("rtx3090", 82, 1536),
    ] {
        let json = json(&["explain", "--profile", name, "--json"]);
        assert_eq!(json["sm_count"], sms, "{name}");
        assert_eq!(json["max_threads_per_sm"], threads, "{name}");
        let total = &json["items"][0];
        assert_eq!(total["kind"], "total");
        let why = total["explanation"].as_str().unwrap();
        let source = if name == "h200" {
            "measured on an H200"
        } else {
            "NVIDIA spec sheet"
        };
        assert!(why.contains(source), "{name}: {why}");
    }
    // Every profile is named in the help.
    let said = message(&["explain", "--profile", "voodoo2"]);
    for name in ["a100-40gb", "l40s", "l4", "t4"] {
        assert!(said.contains(name), "{said}");
    }
}

#[test]
fn big_local_memory_says_how_to_find_it_and_what_to_do() {
    let text = output(&["explain", "--lmem", "16KiB"]);
    for needed in [
        "ptxas -v",
        "nvcc -Xptxas -v",
        "cuobjdump --dump-resource-usage",
        "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES",
        "cudaDeviceSetLimit(cudaLimitStackSize",
        "fewer resident threads",
    ] {
        assert!(text.contains(needed), "{needed}: {text}");
    }
    // The conclusion is the last paragraph, wrapped: its words, one line.
    let at = text.find("\nconclusion:").expect("a conclusion");
    let conclusion = text[at..].split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        conclusion.contains("local memory is the big item, 4.12 GiB")
            && conclusion.contains("largest kernel frame, 16.0 KiB (16384 B) per thread")
            && conclusion.contains("270336 resident threads")
            && conclusion.contains("shrink that kernel's frame")
            && conclusion.contains("264 MiB, 3.87 GiB back"),
        "{conclusion}"
    );
    let json = json(&["explain", "--lmem", "16KiB", "--json"]);
    assert_eq!(
        json["local_memory_advice"]["saving_bytes"],
        270_336u64 * (16384 - 1024)
    );
    // A raised stack limit is the cause when no kernel frame is larger.
    let stack = output(&["explain", "--stack-size", "8KiB"]);
    let words = stack.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("set by the stack limit, 8.00 KiB (8192 B)"),
        "{stack}"
    );
    assert!(words.contains("lower the stack limit"), "{stack}");
    // The default stack is no big item: no advice.
    assert!(!output(&["explain"]).contains("how to find a kernel's local memory"));
}
