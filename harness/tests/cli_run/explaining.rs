//! What `cudamem run` says: the out-of-memory explanation (with advice for
//! the framework of the library that asked), the seed's case, the report.

use super::*;

#[test]
fn out_of_memory_is_explained_before_the_program_gets_the_drivers_answer() {
    let run = traced("oom", &[&program("cuda_linked"), "oom"], &[]);
    // The program exits 3 when it saw CUDA_ERROR_OUT_OF_MEMORY, unchanged.
    assert_eq!(run.status(), Some(3), "{}", run.stderr());
    assert!(run.stdout().contains("the program saw 2"));
    let stderr = run.stderr();
    assert!(
        stderr.contains("cudamem: cuMemAlloc of 2.00 GiB (called by cuda_linked) returned CUDA_ERROR_OUT_OF_MEMORY"),
        "{stderr}"
    );
    assert!(stderr.contains("free of 1.00 GiB"), "{stderr}");
    assert!(stderr.contains("the biggest holders"), "{stderr}");
    assert!(
        stderr.contains("advice: the request of 2.00 GiB is larger than the whole device"),
        "{stderr}"
    );
    let csv = run.csv();
    assert!(csv.contains(",allocate failure,0x0,2147483648,"), "{csv}");
    let json = replay(&run.trace);
    assert_eq!(json["skipped_records"][0]["count"], 1, "{json}");
}

#[test]
fn a_stack_limit_out_of_memory_is_weighed_by_what_it_reserves_not_its_value() {
    let run = traced("stack-oom", &[&program("cuda_linked"), "stack-oom"], &[]);
    assert_eq!(run.status(), Some(5), "{}", run.stderr());
    let stderr = run.stderr();
    assert!(
        stderr.contains("cudamem: cuCtxSetLimit of 448 KiB (called by (unknown)) returned CUDA_ERROR_OUT_OF_MEMORY"),
        "{stderr}"
    );
    // 448 KiB for each of 4 x 2048 resident threads: 3.5 GiB, on a 1 GiB device.
    assert!(
        stderr.contains(
            "that limit takes 3.50 GiB (448 KiB (458752 B) per thread x 2048 threads/SM x 4 SMs"
        ),
        "{stderr}"
    );
    // Room: what is free plus the 8 MiB the default 1 KiB stack holds.
    let free = 1024 - 32 - 8;
    let fit = (free + 8) * 1024 * 1024 / (4 * 2048) / 16 * 16;
    assert!(
        stderr.contains(&format!(
            "advice: 984 MiB are free and the current limit holds 8.00 MiB: at most {}",
            memcore::bytes::exact(fit)
        )),
        "{fit}: {stderr}"
    );
    assert!(
        !stderr.contains("more than the 448 KiB asked for"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("default stack limit of"),
        "the limit is said once: {stderr}"
    );
}

#[test]
fn the_seeds_case_names_the_kernel_and_its_local_memory() {
    let run = traced("seed", &[&program("cuda_linked"), "seed"], &[]);
    assert_eq!(run.status(), Some(4), "{}", run.stderr());
    let stderr = run.stderr();
    let explanation = stderr
        .split("cudamem: cuMemAlloc of 64.0 MiB")
        .nth(1)
        .unwrap_or_else(|| panic!("no explanation in {stderr}"));
    let holders = explanation.split("advice").next().unwrap();
    let first = holders
        .lines()
        .find(|line| line.contains("960 MiB  "))
        .unwrap_or_else(|| panic!("no holder of 960 MiB in {holders}"));
    assert!(
        first.contains("960 MiB")
            && first.contains("kernel big_frame")
            && first.contains("122880 B"),
        "{first}"
    );
    assert!(
        explanation.contains("advice: local memory takes 960 MiB"),
        "{explanation}"
    );
    // The end-of-run ledger says the same, measured.
    assert!(
        stderr
            .contains("local memory cause: kernel big_frame has a 120 KiB (122880 B) local frame"),
        "{stderr}"
    );
}

#[test]
fn the_html_report_holds_the_ledger() {
    let report = temp_path("report.html");
    let output = run(
        &[
            "--report",
            report.to_str().unwrap(),
            "--",
            &program("cuda_linked"),
            "seed",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(4));
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.contains("<td>local memory</td>"), "{html}");
    assert!(html.contains("big_frame"));
}

#[test]
fn the_html_report_carries_the_out_of_memory_explanation_the_terminal_got() {
    let report = temp_path("stack-oom.html");
    let output = run(
        &[
            "--report",
            report.to_str().unwrap(),
            "--",
            &program("cuda_linked"),
            "stack-oom",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("out of memory at "), "{html}");
    // Every line the interposer printed at the out-of-memory return is on
    // the page, in the same words (HTML-escaped).
    let said: Vec<&str> = stderr
        .lines()
        .skip_while(|line| !line.starts_with("cudamem: cuCtxSetLimit of 448 KiB"))
        .take_while(|line| line.starts_with("cudamem: "))
        .collect();
    assert!(said.len() > 10, "{stderr}");
    for line in said {
        let escaped = line
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        assert!(
            html.contains(&escaped),
            "{line:?} is not on the page:\n{html}"
        );
    }
}

#[test]
fn the_advice_is_for_the_framework_of_the_library_that_asked() {
    // Each fixture library asks for twice the device under a framework's
    // file name; the others' advice must not appear.
    let cases = [
        (
            "libxla_probe.so",
            "XLA_PYTHON_CLIENT_PREALLOCATE=false",
            ["PyTorch", "CuPy"],
        ),
        (
            "libtorch_probe.so",
            "expandable_segments:True",
            ["XLA", "CuPy"],
        ),
        ("cupy_probe.so", "free_all_blocks()", ["XLA", "PyTorch"]),
    ];
    for (library, expected, others) in cases {
        let path = fixtures().dir.join(library);
        let run = traced(
            "asks",
            &[&program("cuda_dynamic"), "asks", path.to_str().unwrap()],
            &[],
        );
        assert_eq!(run.status(), Some(3), "{library}: {}", run.stderr());
        let stderr = run.stderr();
        let explanation = stderr
            .split("the program gets the driver's answer unchanged")
            .nth(1)
            .and_then(|rest| rest.split("the ledger at this moment").next())
            .unwrap_or_else(|| panic!("{library}: no explanation in {stderr}"));
        assert!(
            stderr.contains(&format!(
                "(called by {library}) returned CUDA_ERROR_OUT_OF_MEMORY"
            )),
            "{stderr}"
        );
        assert!(
            explanation.contains(&format!("advice: the request came from {library}: ")),
            "{library}: {explanation}"
        );
        assert!(explanation.contains(expected), "{library}: {explanation}");
        for other in others {
            assert!(
                !explanation.contains(other),
                "{library}: {other} in {explanation}"
            );
        }
    }
}

#[test]
fn code_loaded_lazily_by_an_attribute_query_is_module_code_not_unexplained() {
    let run = traced(
        "lazy",
        &[&program("cuda_linked"), "lazy"],
        &[("FAKE_CUDA_LAZY", "1")],
    );
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    assert!(run.stdout().contains("lazy: local 64"), "{}", run.stdout());
    let log = run.log();
    // The load took nothing; the first query loaded the code; the second
    // query is not recorded.
    assert_eq!(
        measured_calls(&log),
        [
            ("cuModuleLoadData", 0),
            ("cuModuleGetFunction", 0),
            ("cuFuncGetAttribute", 2 << 20)
        ],
        "{log}"
    );
    let stderr = run.stderr();
    let module_row = stderr
        .lines()
        .find(|line| line.starts_with("module code"))
        .unwrap_or_else(|| panic!("no module code row in {stderr}"));
    assert!(module_row.contains(" 2.00 MiB "), "{module_row}");
    let unexplained = stderr
        .lines()
        .find(|line| line.starts_with("unexplained"))
        .unwrap();
    assert!(unexplained.contains(" 0.0% of the"), "{unexplained}");
}

#[test]
fn memory_the_driver_takes_for_streams_and_graphs_is_named_not_unexplained() {
    let run = traced("objects", &[&program("cuda_linked"), "objects"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    assert!(run.stdout().contains("objects: done"), "{}", run.stdout());
    let log = run.log();
    // Every creation is measured, and the graph's first launch; its second
    // launch is not recorded.
    assert_eq!(
        measured_calls(&log),
        [
            ("cuStreamCreate", 2 << 20),
            ("cuStreamCreateWithPriority", 2 << 20),
            ("cuEventCreate", 0),
            ("cuEventCreate", 0),
            ("cuEventCreate", 0),
            ("cuMemPoolCreate", 0),
            ("cuGraphInstantiateWithFlags", 0),
            ("cuGraphLaunch", 1 << 20),
        ],
        "{log}"
    );
    // Wrapped lines joined again: a continuation starts with spaces.
    let stderr = run.stderr().replace("\n ", " ");
    let objects = stderr
        .lines()
        .find(|line| line.starts_with("driver objects"))
        .unwrap_or_else(|| panic!("no line for the driver's objects in {stderr}"));
    assert!(objects.contains("5.00 MiB"), "{objects}");
    assert!(objects.contains("around 8 of their"), "{objects}");
    // The 5 MiB are not module code, and nothing is left unexplained.
    let module_row = stderr
        .lines()
        .find(|line| line.starts_with("module code"))
        .unwrap_or_else(|| panic!("no module code row in {stderr}"));
    assert!(!module_row.contains("5.0 MiB"), "{module_row}");
    let unexplained = stderr
        .lines()
        .find(|line| line.starts_with("unexplained"))
        .unwrap();
    assert!(unexplained.contains(" 0.0% of the"), "{unexplained}");
    assert!(unexplained.contains(" 0 B "), "{unexplained}");
}

/// The calls measured by free memory around them (`module` records), each
/// with the free bytes it took.
fn measured_calls(log: &str) -> Vec<(&str, u64)> {
    records(log, "module")
        .iter()
        .map(|r| {
            let before: u64 = r[5].parse().unwrap();
            let after: u64 = r[6].parse().unwrap();
            (r[3], before - after)
        })
        .collect()
}

/// A row of the ledger, its wrapped lines joined, runs of spaces made one.
fn ledger_row(stderr: &str, name: &str) -> String {
    let joined = stderr.replace("\n  ", " ");
    let row = joined
        .lines()
        .find(|line| line.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} row in {stderr}"));
    row.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn the_malloc_heap_taken_at_a_first_launch_is_the_heap_not_module_code() {
    // The image's PTX declares malloc: the driver takes the 256 MiB heap at
    // the first launch.
    let run = traced("heap", &[&program("cuda_linked"), "heap"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let log = run.log();
    let images = records(&log, "image");
    assert_eq!(images.len(), 1, "{log}");
    assert_eq!(
        &images[0][3..7],
        ["cuModuleLoadData", "ptx", images[0][5], "yes"],
        "{log}"
    );
    let stderr = run.stderr();
    let heap = ledger_row(&stderr, "malloc heap");
    assert!(heap.contains("256 MiB 256 MiB"), "{heap}");
    let module = ledger_row(&stderr, "module code");
    assert!(module.contains(" 2.00 MiB "), "{module}");
    assert!(
        ledger_row(&stderr, "unexplained").contains(" 0.0% of the"),
        "{stderr}"
    );
    assert!(
        stderr.contains("256 MiB the malloc heap (limit 256 MiB"),
        "{stderr}"
    );
    assert!(!stderr.contains("no cause explains"), "{stderr}");
}

#[test]
fn a_heap_taken_for_an_image_that_cannot_be_read_is_named_by_its_size() {
    // A fatbin whose only entry is compressed: whether it calls malloc is
    // unknown, and said; the driver takes the heap at the first launch.
    let run = traced(
        "heap_packed",
        &[&program("cuda_linked"), "heap-packed"],
        &[("FAKE_CUDA_HEAP_AT_LAUNCH", "1")],
    );
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let log = run.log();
    let images = records(&log, "image");
    assert_eq!(
        (images[0][4], images[0][5], images[0][6]),
        ("fatbin", "-", "unknown"),
        "{log}"
    );
    let stderr = run.stderr();
    assert!(
        ledger_row(&stderr, "malloc heap").contains("256 MiB 256 MiB"),
        "{stderr}"
    );
    assert!(
        stderr.contains("module images not read whole (fatbin: 1 compressed entries not read)"),
        "{stderr}"
    );
    assert!(
        ledger_row(&stderr, "unexplained").contains(" 0.0% of the"),
        "{stderr}"
    );
}

#[test]
fn a_drop_no_cause_fits_is_said_at_once_with_its_call() {
    // The image calls no malloc, yet the driver takes 256 MiB at the first
    // launch: neither code (the image is a few hundred bytes) nor the heap.
    let run = traced(
        "heap_plain",
        &[&program("cuda_linked"), "heap-plain"],
        &[("FAKE_CUDA_HEAP_AT_LAUNCH", "1")],
    );
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let stderr = run.stderr();
    // Said while the program ran, before its own output's end.
    let said = stderr
        .lines()
        .position(|line| {
            line.starts_with("cudamem: cuLaunchKernel (first launch of other) took 254 MiB")
                && line.contains("no loaded image calls malloc")
        })
        .unwrap_or_else(|| panic!("not said: {stderr}"));
    let summary = stderr
        .lines()
        .position(|line| line.starts_with("cudamem run:"))
        .unwrap();
    assert!(said < summary, "{stderr}");
    let heap = ledger_row(&stderr, "malloc heap");
    assert!(
        heap.contains("taken only once a kernel calling malloc runs"),
        "{heap}"
    );
    let unexplained = ledger_row(&stderr, "unexplained");
    assert!(unexplained.contains("254 MiB"), "{unexplained}");
    assert!(
        unexplained.contains("cuLaunchKernel (first launch of other)"),
        "{unexplained}"
    );
}

#[test]
fn a_fatbin_behind_the_runtimes_wrapper_is_read_through_it() {
    // cuModuleLoadFatBinary of the runtime's wrapper, whose fatbin holds
    // PTX calling malloc: the interposer follows the wrapper, reads the
    // entry, and names the heap the driver takes at the first launch.
    let run = traced(
        "heap_fatbin",
        &[&program("cuda_linked"), "heap-fatbin"],
        &[("FAKE_CUDA_HEAP_AT_LAUNCH", "1")],
    );
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let log = run.log();
    let images = records(&log, "image");
    assert_eq!(
        (images[0][3], images[0][4], images[0][6], images[0][8]),
        ("cuModuleLoadFatBinary", "fatbin", "yes", ""),
        "{log}"
    );
    let size: u64 = images[0][5].parse().unwrap();
    assert!(size > 80 && size < 400, "{log}");
    let stderr = run.stderr();
    assert!(
        ledger_row(&stderr, "malloc heap").contains("256 MiB 256 MiB"),
        "{stderr}"
    );
    assert!(
        ledger_row(&stderr, "unexplained").contains(" 0.0% of the"),
        "{stderr}"
    );
}
