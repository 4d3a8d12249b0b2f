//! What `cudamem run` says it could not see: a program that made no driver
//! call (no empty trace left), one that asked the loader for a driver it
//! could not load, and where the loader looked; the report page says the
//! same.

use std::path::{Path, PathBuf};

use cudamem::process::driver_search::{self, DRIVER_NAME};

use super::{Traced, fixtures, program, run, support, text, traced};

fn events_dir(trace: &Path) -> PathBuf {
    PathBuf::from(format!("{}.events", trace.display()))
}

#[test]
fn a_program_without_cuda_leaves_no_empty_trace_and_names_the_driver_it_would_load() {
    let report = support::temp_path("no-cuda.html");
    let trace = support::temp_path("no-cuda.csv");
    let output = run(
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
            "--",
            "true",
        ],
        &[],
    );
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // The fake driver is on LD_LIBRARY_PATH: it is where the loader looks
    // first.
    let driver = fixtures().dir.join(DRIVER_NAME);
    let said = format!(
        "cudamem run: the program made no CUDA driver call that cudamem saw (no CUDA context was \
         created), so there is no GPU memory to explain; the loader finds libcuda.so.1 at {}",
        driver.display()
    );
    assert!(stderr.contains(&said), "{stderr}");
    let removed = format!(
        "cudamem run: no trace written: {} would hold no allocation, so it and {}.events/ are not \
         kept",
        trace.display(),
        trace.display()
    );
    assert!(stderr.contains(&removed), "{stderr}");
    assert!(!trace.exists(), "a header-only trace was left");
    assert!(
        !events_dir(&trace).exists(),
        "an empty events folder was left"
    );
    // The page says what the terminal said.
    let page = text(&std::fs::read(&report).unwrap());
    for line in [&said, &removed] {
        let line = line.trim_start_matches("cudamem run: ");
        assert!(page.contains(&format!("<p>{line}</p>")), "{line}\n{page}");
    }
    assert!(
        page.contains("exit status 0; 0 processes recorded"),
        "{page}"
    );
    std::fs::remove_file(&report).unwrap();
}

#[test]
fn a_program_that_cannot_load_the_driver_is_told_so_with_where_the_loader_looked() {
    let empty = support::temp_path("no-driver-here");
    std::fs::create_dir(&empty).unwrap();
    let asked = "/nonexistent/libcuda.so.1";
    let Traced { trace, output } = traced(
        "no-driver",
        &[&program("cuda_dynamic"), "open", asked],
        &[("LD_LIBRARY_PATH", empty.to_str().unwrap())],
    );
    let stderr = text(&output.stderr);
    // The program's own failure stands.
    assert_eq!(output.status.code(), Some(24), "{stderr}");
    assert!(
        stderr.contains("dlopen: /nonexistent/libcuda.so.1"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "(cuda_dynamic) asked the loader for {asked} (dlopen), and no driver library was \
             loaded by its exit"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("exit status 24; 0 processes recorded"),
        "{stderr}"
    );
    // Where the loader looks, as this machine has it.
    let search = driver_search::search(Some(empty.as_os_str()));
    let expected = match &search.found {
        None => format!(
            "cudamem run: no libcuda.so.1 could be loaded: the loader looked in LD_LIBRARY_PATH \
             ({}), /etc/ld.so.cache",
            empty.display()
        ),
        Some(found) => format!("the loader finds libcuda.so.1 at {}", found.display()),
    };
    assert!(stderr.contains(&expected), "{expected}\n{stderr}");
    // Its log held only that: no trace is kept.
    assert!(!trace.exists());
    assert!(!events_dir(&trace).exists());
    std::fs::remove_dir(&empty).unwrap();
}

#[test]
fn a_driver_that_loads_is_not_called_missing() {
    let output = run(&["--", &program("cuda_dynamic"), "open", DRIVER_NAME], &[]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(text(&output.stdout).contains("opened libcuda.so.1"));
    assert!(!stderr.contains("asked the loader"), "{stderr}");
    assert!(
        stderr.contains("the program made no CUDA driver call that cudamem saw"),
        "{stderr}"
    );
}

#[test]
fn the_programs_own_search_path_still_finds_the_driver() {
    // Only the program's RUNPATH names the fake driver's folder: its dlopen
    // finds it only if the loader still sees the program as the caller
    // (the interposer's dlopen notes the name and jumps on unchanged).
    let empty = support::temp_path("no-path");
    std::fs::create_dir(&empty).unwrap();
    let output = run(
        &["--", &program("cuda_dynamic"), "open", DRIVER_NAME],
        &[("LD_LIBRARY_PATH", empty.to_str().unwrap())],
    );
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        text(&output.stdout).contains("opened libcuda.so.1"),
        "{stderr}"
    );
    assert!(!stderr.contains("asked the loader"), "{stderr}");
    std::fs::remove_dir(&empty).unwrap();
}
