//! `cudamem run` end to end, without a GPU: a fake driver (`libcuda.so.1`,
//! interpose/fixtures/fake_cuda.c) and test programs that reach it each way a
//! CUDA program does (linked, dlopen + dlsym, cuGetProcAddress_v2 of base
//! names, a runtime that does so, eight threads, fork, exec, out of memory,
//! a crash, a kill), built here with the C compiler
//! (interpose/fixtures/build.sh), run under the real `cudamem run` binary with
//! the real interposer. Each test checks the program's own result (it checks
//! the driver's answers itself and exits non-zero on a change), the exit
//! status, the event log, the RMM log and that `cudamem replay` reads it.

#[path = "../support/mod.rs"]
mod support;

mod explaining;
mod pausing;
mod resolving;
mod running;
mod safety;
mod unseen;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use support::temp_path;

/// The C fixtures, built once per test process.
struct Fixtures {
    dir: PathBuf,
}

fn fixtures() -> &'static Fixtures {
    static BUILT: OnceLock<Fixtures> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../interpose/fixtures/build.sh");
        let dir = temp_path("fixtures");
        let output = Command::new("sh")
            .arg(&script)
            .arg(&dir)
            .output()
            .unwrap_or_else(|err| panic!("running {}: {err}", script.display()));
        assert!(
            output.status.success(),
            "{} (set CC to another C compiler): {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        Fixtures { dir }
    })
}

/// The interposer this test build made (a dev-dependency of this package).
fn hook_library() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_cudamem"));
    let dir = bin.parent().unwrap();
    for candidate in [
        dir.join("deps/libcudamem_interpose.so"),
        dir.join("libcudamem_interpose.so"),
    ] {
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "libcudamem_interpose.so was not built next to {}",
        bin.display()
    );
}

/// `cudamem run ARGS...`, the fake driver on the library path.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let fixtures = fixtures();
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudamem"));
    command
        .arg("run")
        .args(args)
        .env("CUDAMEM_HOOK_LIB", hook_library())
        .env("LD_LIBRARY_PATH", &fixtures.dir)
        .env_remove("LD_PRELOAD");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

fn program(name: &str) -> String {
    fixtures().dir.join(name).to_str().unwrap().to_string()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An event log's records as text: the zeros a log keeps past its records
/// (and in a place a killed writer never filled, with the part of a record
/// before them) left out.
fn log_text(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    text(&bytes)
        .split('\0')
        .filter(|piece| !piece.is_empty())
        .map(|piece| &piece[..piece.rfind('\n').map_or(0, |end| end + 1)])
        .collect()
}

/// A traced run: where its files are, and what it printed.
struct Traced {
    trace: PathBuf,
    output: Output,
}

impl Traced {
    fn stderr(&self) -> String {
        text(&self.output.stderr)
    }

    fn stdout(&self) -> String {
        text(&self.output.stdout)
    }

    fn status(&self) -> Option<i32> {
        self.output.status.code()
    }

    /// Every process's event log, by pid.
    fn logs(&self) -> HashMap<u32, String> {
        let dir = PathBuf::from(format!("{}.events", self.trace.display()));
        std::fs::read_dir(&dir)
            .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .map(|path| {
                let pid = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
                (pid, log_text(&path))
            })
            .collect()
    }

    /// The log of the one process.
    fn log(&self) -> String {
        let logs = self.logs();
        assert_eq!(logs.len(), 1, "expected one process: {:?}", logs.keys());
        logs.into_values().next().unwrap()
    }

    fn csv(&self) -> String {
        text(&std::fs::read(&self.trace).unwrap())
    }
}

fn traced(name: &str, argv: &[&str], env: &[(&str, &str)]) -> Traced {
    let trace = temp_path(&format!("{name}.csv"));
    let mut args = vec!["--trace", trace.to_str().unwrap(), "--"];
    args.extend_from_slice(argv);
    let output = run(&args, env);
    Traced { trace, output }
}

/// Records of `kind` in a log, split into fields.
fn records<'a>(log: &'a str, kind: &str) -> Vec<Vec<&'a str>> {
    log.lines()
        .map(|line| line.split('\t').collect::<Vec<_>>())
        .filter(|fields| fields[0] == kind)
        .collect()
}

/// `cudamem replay TRACE --json --policy tlsf`, which must succeed.
fn replay(trace: &Path) -> serde_json::Value {
    support::replay_json(trace, &[])
}

fn events_replayed(json: &serde_json::Value) -> u64 {
    json["events"]
        .as_u64()
        .unwrap_or_else(|| panic!("no events in {json}"))
}

#[test]
fn a_program_polling_free_memory_records_each_new_figure_once() {
    // `calls 500` reads free memory 500 times with nothing allocated
    // between the reads: one reading of that figure is recorded, and the
    // program runs to its end (its four timings printed).
    let run = traced("polling", &[&program("cuda_linked"), "calls", "500"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    assert_eq!(
        run.stdout().split_whitespace().count(),
        4,
        "{}",
        run.stdout()
    );
    let log = run.log();
    let readings = records(&log, "meminfo")
        .into_iter()
        .filter(|r| r[3] == "program")
        .count();
    assert_eq!(readings, 1, "{log}");
}

#[test]
fn a_linked_program_has_every_kind_of_call_recorded_and_its_trace_replays() {
    let run = traced("linked", &[&program("cuda_linked"), "linked"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    assert!(run.stdout().contains("linked: done"), "{}", run.stdout());
    let log = run.log();
    for kind in [
        "process",
        "library",
        "context",
        "alloc",
        "free",
        "reserve",
        "create",
        "map",
        "unmap",
        "release",
        "address-free",
        "module",
        "launch",
        "limit",
        "meminfo",
        "exit",
    ] {
        assert!(
            !records(&log, kind).is_empty(),
            "no {kind} record in\n{log}"
        );
    }
    let calls: Vec<&str> = records(&log, "alloc").iter().map(|r| r[3]).collect();
    for call in [
        "cuMemAlloc",
        "cuMemAllocPitch",
        "cuMemAllocManaged",
        "cuMemAllocAsync",
        "cuMemHostAlloc",
    ] {
        assert!(calls.contains(&call), "{call} missing from {calls:?}");
    }
    // The pitched allocation is pitch x height: 1024 x 10.
    let pitched = records(&log, "alloc")
        .into_iter()
        .find(|r| r[3] == "cuMemAllocPitch")
        .unwrap();
    assert_eq!(pitched[5], "10240");
    // Every allocation is named by the program itself (it calls the driver).
    let library = records(&log, "library");
    assert!(library[0][4].ends_with("cuda_linked"), "{library:?}");
    // The program's own cuMemGetInfo, and the launch's local memory.
    assert!(records(&log, "meminfo").iter().any(|r| r[3] == "program"));
    let launch = &records(&log, "launch")[0];
    assert_eq!((launch[5], launch[12]), ("0", "small_frame"));
    // The RMM log: device allocations only (no host row), one left live.
    let csv = run.csv();
    assert!(csv.starts_with("Thread,Time,Action,Pointer,Size,Stream,Caller\n"));
    assert!(!csv.contains("65536,0x0,cuda_linked\n") || csv.contains("allocate,"));
    let allocates = csv.lines().filter(|l| l.contains(",allocate,")).count();
    let frees = csv.lines().filter(|l| l.contains(",free,")).count();
    // cuMemAlloc x2, pitch, managed, async, and the VMM mapping.
    assert_eq!((allocates, frees), (6, 5), "{csv}");
    assert_eq!(events_replayed(&replay(&run.trace)), 11);
    // The report: the peak ledger, the live block by its caller.
    let stderr = run.stderr();
    assert!(
        stderr.contains("exit status 0; 1 process recorded"),
        "{stderr}"
    );
    assert!(stderr.contains("by cuda_linked"), "{stderr}");
    assert!(stderr.contains("unexplained"), "{stderr}");
}

#[test]
fn eight_threads_allocating_at_once_leave_a_consistent_trace() {
    let run = traced("threads", &[&program("cuda_linked"), "threads"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let log = run.log();
    let allocs = records(&log, "alloc").len();
    let frees = records(&log, "free").len();
    assert_eq!(allocs, frees);
    assert!(allocs >= 8 * 2000, "{allocs}");
    let threads: std::collections::HashSet<&str> =
        records(&log, "alloc").iter().map(|r| r[2]).collect();
    assert_eq!(threads.len(), 8);
    // The fake driver hands freed addresses out again at once: the trace
    // replays only if every free is ordered before the reuse of its pointer.
    let json = replay(&run.trace);
    assert_eq!(events_replayed(&json), (allocs + frees) as u64);
}

#[test]
fn threads_placing_records_at_once_across_the_logs_windows_lose_none() {
    // Records take their places in the log without a lock: 16 threads
    // writing about 40 MB at once, across the windows the file grows by.
    let run = traced(
        "placing",
        &[&program("cuda_runtime"), "bench", "320000", "16"],
        &[("FAKE_CUDA_PER_THREAD", "1")],
    );
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let log = run.log();
    // Each thread: 1,000 pairs to warm up, then 320,000 / 16.
    let pairs = 16 * (1000 + 320_000 / 16);
    assert_eq!(records(&log, "alloc").len(), pairs);
    assert_eq!(records(&log, "free").len(), pairs);
    let threads: std::collections::HashSet<&str> =
        records(&log, "alloc").iter().map(|r| r[2]).collect();
    assert_eq!(threads.len(), 16);
    let json = replay(&run.trace);
    assert_eq!(events_replayed(&json), 2 * pairs as u64);
}

#[test]
fn a_forked_child_writes_its_own_log_and_trace() {
    let run = traced("fork", &[&program("cuda_linked"), "fork"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let logs = run.logs();
    assert_eq!(logs.len(), 2, "{:?}", logs.keys());
    let stdout = run.stdout();
    let child: u32 = stdout
        .split("child ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    let child_log = &logs[&child];
    let sizes: Vec<&str> = records(child_log, "alloc").iter().map(|r| r[5]).collect();
    assert_eq!(sizes, ["3145728", "5242880"]);
    // The child left through _exit: its log has no exit record, all else.
    assert!(records(child_log, "exit").is_empty());
    let child_trace = cudamem::process::run::child_trace_path(&run.trace, child);
    assert_eq!(events_replayed(&replay(&child_trace)), 3);
    assert_eq!(events_replayed(&replay(&run.trace)), 2);
    assert!(
        run.stderr().contains("2 processes recorded"),
        "{}",
        run.stderr()
    );
}

#[test]
fn an_exec_continues_the_same_processs_log() {
    let run = traced("exec", &[&program("cuda_linked"), "exec"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let log = run.log();
    assert_eq!(records(&log, "process").len(), 2, "{log}");
    let first = records(&log, "alloc")[0][5];
    assert_eq!(first, "3145728");
    assert!(records(&log, "alloc").len() > 5);
    replay(&run.trace);
}

#[test]
fn a_crash_leaves_its_records_and_its_signal_as_the_exit_status() {
    let run = traced("crash", &[&program("cuda_linked"), "crash"], &[]);
    assert_eq!(run.status(), Some(128 + 11), "{}", run.stderr());
    let log = run.log();
    assert_eq!(records(&log, "alloc")[0][5], "7340032");
    assert_eq!(records(&log, "signal")[0][3], "11");
    assert!(
        run.stderr().contains("ended by signal 11"),
        "{}",
        run.stderr()
    );
    assert_eq!(events_replayed(&replay(&run.trace)), 1);
}

#[test]
fn a_killed_program_leaves_a_readable_log() {
    let run = traced("killed", &[&program("cuda_linked"), "killed"], &[]);
    assert_eq!(run.status(), Some(128 + 9), "{}", run.stderr());
    let log = run.log();
    assert_eq!(records(&log, "alloc")[0][5], "9437184");
    assert!(
        run.stderr().contains("ended by signal 9"),
        "{}",
        run.stderr()
    );
    assert_eq!(events_replayed(&replay(&run.trace)), 1);
}

#[test]
fn exit_statuses_pass_through_and_programs_without_cuda_record_nothing() {
    let output = run(&["--", "sh", "-c", "exit 7"], &[]);
    assert_eq!(output.status.code(), Some(7));
    assert!(text(&output.stderr).contains("exit status 7; 0 processes recorded"));
    let output = run(&["--", "sh", "-c", "kill -TERM $$"], &[]);
    assert_eq!(output.status.code(), Some(128 + 15));
}

#[test]
fn an_empty_trace_replays_to_one_line() {
    let trace = support::write_file(
        "empty.csv",
        b"Thread,Time,Action,Pointer,Size,Stream,Caller\n",
    );
    let said = support::replay_message(&trace, &[]);
    assert!(said.contains("holds no allocation or free"), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
}

#[test]
fn the_interposer_is_appended_to_the_users_preload() {
    let probe = fixtures().dir.join("libprobe_a.so");
    let output = run(
        &["--", "sh", "-c", "echo \"$LD_PRELOAD\""],
        &[("LD_PRELOAD", probe.to_str().unwrap())],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let seen = text(&output.stdout);
    let expected = format!(
        "{}:{}",
        probe.display(),
        std::fs::canonicalize(hook_library()).unwrap().display()
    );
    assert_eq!(seen.trim(), expected);
}

#[test]
fn bad_input_gets_clear_errors() {
    let output = run(&["--", "no-such-program-anywhere"], &[]);
    assert_eq!(output.status.code(), Some(127));
    assert!(
        text(&output.stderr).contains("program \"no-such-program-anywhere\" not found in PATH"),
        "{}",
        text(&output.stderr)
    );
    let plain = support::write_file("plain.txt", b"not a program");
    let output = run(&["--", plain.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(126));
    assert!(text(&output.stderr).contains("is not an executable file"));
    // An unwritable trace is refused before the program starts.
    let marker = temp_path("started");
    let script = format!("touch {}", marker.display());
    let output = run(
        &[
            "--trace",
            "/nonexistent/dir/t.csv",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("cannot write --trace /nonexistent/dir/t.csv"),
        "{}",
        text(&output.stderr)
    );
    assert!(!marker.exists(), "the program ran");
    // The interposer missing.
    let output = run(
        &["--", "true"],
        &[("CUDAMEM_HOOK_LIB", "/nonexistent/libx.so")],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("the interposer library /nonexistent/libx.so is missing"),
        "{}",
        text(&output.stderr)
    );
    // No program at all.
    let output = run(&[], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
}

#[test]
fn the_log_is_bounded_and_says_what_it_dropped() {
    let trace = temp_path("bounded.csv");
    let output = run(
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--max-log-bytes",
            "64KiB",
            "--",
            &program("cuda_linked"),
            "threads",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let logs = PathBuf::from(format!("{}.events", trace.display()));
    let log = std::fs::read_dir(&logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::metadata(&log).unwrap().len();
    assert!(bytes <= 64 << 10, "{bytes}");
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("records were dropped at the log's size bound"),
        "{stderr}"
    );
    // What was kept is still a trace that replays.
    replay(&trace);
}
