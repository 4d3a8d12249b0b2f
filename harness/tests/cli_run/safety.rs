//! The program under `cudamem run` behaves as it does alone, whatever it
//! does to the process it shares with the interposer: closing every
//! descriptor, exiting from a signal handler, forking while the interposer
//! sets itself up, relying on its signal actions, or meeting a panic
//! inside the interposer. Each hazard runs several times where it is a
//! race, every run bounded by a time limit that fails the test loudly.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The most one run may take; a run past it hung.
const LIMIT: Duration = Duration::from_secs(30);

/// Run `command` in a process group of its own, killing the group and
/// failing the test if it outlives [`LIMIT`].
fn bounded(mut command: Command, what: &str) -> Output {
    let out = temp_path("bounded.out");
    let err = temp_path("bounded.err");
    command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0);
    let mut child = command.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > LIMIT {
            let waiting = where_waiting(child.id());
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            panic!(
                "{what}: still running after {LIMIT:?} (hung); where its threads waited:\n{waiting}stderr so far:\n{}",
                text(&std::fs::read(&err).unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: std::fs::read(&out).unwrap(),
        stderr: std::fs::read(&err).unwrap(),
    }
}

/// Every process of group `group` and what each of its threads waits in
/// (the kernel's wait channel), for the message of a run that hung.
fn where_waiting(group: u32) -> String {
    let mut said = String::new();
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return said;
    };
    for process in processes.flatten() {
        let dir = process.path();
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // Fields after the command's closing parenthesis: state, ppid, pgrp.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2) != Some(&group.to_string().as_str()) {
            continue;
        }
        let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
        let mut threads = Vec::new();
        for task in std::fs::read_dir(dir.join("task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            threads.push(format!(
                "{}:{}",
                task.file_name().to_string_lossy(),
                read(task.path().join("wchan"))
            ));
        }
        said.push_str(&format!(
            "  {} {} (parent {}): {}\n",
            process.file_name().to_string_lossy(),
            read(dir.join("comm")).trim(),
            fields.get(1).unwrap_or(&"?"),
            threads.join(" ")
        ));
    }
    said
}

/// The program alone, the fake driver on its library path.
fn alone(argv: &[&str]) -> Output {
    alone_with(argv, &[])
}

/// The program alone with `env` added.
fn alone_with(argv: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(argv[0]);
    command
        .args(&argv[1..])
        .env("LD_LIBRARY_PATH", &fixtures().dir)
        .env_remove("LD_PRELOAD");
    for (key, value) in env {
        command.env(key, value);
    }
    bounded(command, &format!("{argv:?} alone"))
}

/// `cudamem run ARGS...`, bounded.
fn under_cudamem(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudamem"));
    command
        .arg("run")
        .args(args)
        .env("CUDAMEM_HOOK_LIB", hook_library())
        .env("LD_LIBRARY_PATH", &fixtures().dir)
        .env_remove("LD_PRELOAD");
    for (key, value) in env {
        command.env(key, value);
    }
    bounded(command, &format!("cudamem run {args:?}"))
}

/// `cudamem run --trace NAME -- ARGV...` with `env` added, which must end
/// as `by_itself` did: the same exit status and standard output. Its
/// output, and its event logs.
fn traced_like(
    by_itself: &Output,
    name: &str,
    argv: &[&str],
    env: &[(&str, &str)],
) -> (Output, Vec<PathBuf>) {
    let trace = temp_path(name);
    let mut args = vec!["--trace", trace.to_str().unwrap(), "--"];
    args.extend_from_slice(argv);
    let output = under_cudamem(&args, env);
    assert_eq!(
        output.status.code(),
        by_itself.status.code(),
        "{argv:?}: {}",
        text(&output.stderr)
    );
    assert_eq!(text(&output.stdout), text(&by_itself.stdout), "{argv:?}");
    let logs = event_logs(&trace);
    (output, logs)
}

fn event_logs(trace: &Path) -> Vec<PathBuf> {
    let dir = PathBuf::from(format!("{}.events", trace.display()));
    std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect()
}

#[test]
fn a_program_that_closes_every_descriptor_keeps_its_files_and_a_whole_trace() {
    let hostile = program("hostile");
    let own = temp_path("own-alone.bin");
    let by_itself = alone(&[&hostile, "closefds", own.to_str().unwrap()]);
    assert!(by_itself.status.success(), "{}", text(&by_itself.stderr));
    let expected = std::fs::read(&own).unwrap();
    assert_eq!(expected.len(), 32_000);

    let own = temp_path("own-traced.bin");
    let trace = temp_path("closefds.csv");
    let output = under_cudamem(
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--",
            &hostile,
            "closefds",
            own.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(output.stdout, by_itself.stdout);
    let written = std::fs::read(&own).unwrap();
    assert!(
        written == expected,
        "the program's file changed: {} bytes, {} expected",
        written.len(),
        expected.len()
    );
    // The trace is whole: every pair past the 4 MiB the first mapping
    // held, and the exit record.
    let logs = event_logs(&trace);
    assert_eq!(logs.len(), 1);
    let log = log_text(&logs[0]);
    assert_eq!(records(&log, "alloc").len(), 60_001);
    assert_eq!(records(&log, "free").len(), 60_001);
    assert_eq!(records(&log, "exit").len(), 1);
}

#[test]
fn exit_from_a_signal_handler_while_recording_never_hangs() {
    let hostile = program("hostile");
    for run in 0..20 {
        let output = under_cudamem(&["--", &hostile, "exitsig"], &[]);
        assert_eq!(
            output.status.code(),
            Some(3),
            "run {run}: {}",
            text(&output.stderr)
        );
    }
}

/// `runs` runs of `hostile forksetup` under `cudamem run` with `env`
/// added: each ends as alone, with no child left waiting.
fn forks_during_setup(runs: usize, env: &[(&str, &str)]) {
    let hostile = program("hostile");
    for run in 0..runs {
        let output = under_cudamem(&["--", &hostile, "forksetup"], env);
        assert_eq!(
            output.status.code(),
            Some(0),
            "run {run}: {}",
            text(&output.stderr)
        );
        assert_eq!(text(&output.stdout), "forksetup: done\n");
    }
}

#[test]
fn a_fork_while_the_interposer_sets_itself_up_never_hangs() {
    forks_during_setup(30, &[]);
}

#[test]
fn a_fork_in_the_middle_of_a_slow_setup_step_never_hangs_the_child() {
    // Each one-time setup step is made to linger, so that the forks land
    // inside them: a step behind a once-lock, or a walk of the loaded
    // objects on a program thread, leaves a child that waits for ever.
    forks_during_setup(5, &[("CUDAMEM_TEST_SLOW_SETUP_MS", "2")]);
}

#[test]
fn signal_actions_flags_and_masks_stay_the_programs() {
    let hostile = program("hostile");
    let by_itself = alone(&[&hostile, "resethand"]);
    // Alone, the second SIGTERM ends the program (SA_RESETHAND).
    assert_eq!(by_itself.status.signal(), Some(15));
    let seen = text(&by_itself.stdout);
    assert!(seen.contains("SA_RESETHAND set"), "{seen}");
    assert!(seen.contains("SIGUSR1 blocked"), "{seen}");
    assert!(seen.contains("default fatal actions: 5 of 5"), "{seen}");
    let trace = temp_path("resethand.csv");
    let output = under_cudamem(
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--",
            &hostile,
            "resethand",
        ],
        &[],
    );
    assert_eq!(text(&output.stdout), seen);
    assert_eq!(
        output.status.code(),
        Some(128 + 15),
        "{}",
        text(&output.stderr)
    );
    // The signal that ended it is recorded.
    let logs = event_logs(&trace);
    let log = log_text(&logs[0]);
    assert_eq!(records(&log, "signal").len(), 1, "{log}");
}

#[test]
fn a_panic_inside_the_interposer_leaves_the_program_as_it_was() {
    let linked = program("cuda_linked");
    let by_itself = alone(&[&linked, "linked"]);
    assert!(by_itself.status.success());
    let output = under_cudamem(
        &["--", &linked, "linked"],
        &[("CUDAMEM_TEST_PANIC_AFTER", "5")],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(output.stdout, by_itself.stdout);
    let stderr = text(&output.stderr);
    assert_eq!(
        stderr.matches("the interposer stopped recording").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn event_logs_are_readable_by_their_owner_alone() {
    let trace = temp_path("private.csv");
    let output = under_cudamem(
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--",
            &program("cuda_linked"),
            "linked",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    for log in event_logs(&trace) {
        let mode = std::fs::metadata(&log).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", log.display());
    }
}

#[test]
fn copies_made_by_a_raw_clone_write_logs_of_their_own_and_never_their_parents() {
    let hostile = program("hostile");
    let by_itself = alone(&[&hostile, "clone"]);
    assert_eq!(text(&by_itself.stdout), "clone: 16 of 16 exited 7\n");
    let (_, logs) = traced_like(&by_itself, "clone.csv", &[&hostile, "clone"], &[]);
    let logs: Vec<String> = logs.iter().map(|path| log_text(path)).collect();
    let field = |log: &str, kind: &str, at: usize| -> Vec<String> {
        records(log, kind)
            .iter()
            .map(|record| record[at].to_string())
            .collect()
    };
    let three_mib = |log: &str| {
        records(log, "alloc")
            .iter()
            .filter(|record| record[5] == (3 << 20).to_string())
            .count()
    };
    // The program's own log: one process and one exit record, and none of
    // its copies' allocations.
    let (parents, copies): (Vec<&String>, Vec<&String>) = logs
        .iter()
        .partition(|log| records(log, "alloc").iter().any(|r| r[5] == "1048576"));
    assert_eq!(parents.len(), 1, "{} logs", logs.len());
    let parent = parents[0];
    assert_eq!(records(parent, "process").len(), 1);
    assert_eq!(records(parent, "exit").len(), 1);
    assert_eq!(three_mib(parent), 0);
    // Every copy that allocated has its log, named by its own pid, with its
    // allocation and its exit; each names the program as its parent.
    let parent_pid = field(parent, "process", 4)[0].clone();
    let allocating: Vec<&&String> = copies.iter().filter(|log| three_mib(log) == 1).collect();
    assert_eq!(allocating.len(), 8, "{} copies' logs", copies.len());
    for log in &copies {
        // Stamped from the copy's own start: time never goes back.
        let times: Vec<u64> = log
            .lines()
            .map(|line| line.split('\t').nth(1).unwrap().parse().unwrap())
            .collect();
        assert!(times.windows(2).all(|pair| pair[0] <= pair[1]), "{log}");
        assert_eq!(
            field(log, "process", 5),
            std::slice::from_ref(&parent_pid),
            "{log}"
        );
        assert_eq!(records(log, "exit").len(), 1, "{log}");
        assert!(three_mib(log) <= 1, "{log}");
    }
}

#[test]
fn a_function_the_driver_lacks_bound_by_the_loader_answers_not_found() {
    // Alone, the weak reference to a function the driver lacks is null.
    // Under `cudamem run` the loader binds it to the interposer's export
    // (a preloaded library's exports are fixed before it can know the
    // driver: ARCHITECTURE.md says what remains); called, that export
    // answers as the driver would for a missing function, and records
    // nothing.
    let hostile = program("hostile");
    let by_itself = alone(&[&hostile, "weak"]);
    assert_eq!(
        text(&by_itself.stdout),
        "cuMemAllocFromPoolAsync_ptsz: missing\n"
    );
    let trace = temp_path("weak.csv");
    let output = under_cudamem(
        &["--trace", trace.to_str().unwrap(), "--", &hostile, "weak"],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "cuMemAllocFromPoolAsync_ptsz: present, answers 500\n"
    );
    for log in event_logs(&trace) {
        let log = log_text(&log);
        assert!(records(&log, "alloc").is_empty(), "{log}");
    }
}

#[test]
fn a_programs_own_dlsym_wrapper_that_finds_the_next_through_dlvsym_reaches_the_interposers() {
    // The program's preloaded library wraps dlsym and finds the next one
    // with dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"). The C library's
    // versioned lookup skips an export without that version, so it used to
    // find the C library's dlsym, which then found the interposer's
    // exports in the default scope: a function the driver lacks looked
    // present (exit 25), and the program's lookups bypassed the wrappers.
    let wrapper = fixtures().dir.join("libwrap_dlsym.so");
    let preload = [("LD_PRELOAD", wrapper.to_str().unwrap())];
    let dynamic = program("cuda_dynamic");
    let by_itself = alone_with(&[&dynamic, "dlopen"], &preload);
    assert_eq!(
        by_itself.status.code(),
        Some(0),
        "{}",
        text(&by_itself.stderr)
    );
    assert_eq!(
        text(&by_itself.stdout),
        "dlopen: done\nwrap_dlsym: 8 cu lookups\n"
    );
    let (_, logs) = traced_like(
        &by_itself,
        "wrapped_dlsym.csv",
        &[&dynamic, "dlopen"],
        &preload,
    );
    // The wrapper's lookups were answered with the wrappers: both
    // allocations and the free are in the log.
    assert_eq!(logs.len(), 1, "{logs:?}");
    let log = log_text(&logs[0]);
    assert_eq!(records(&log, "alloc").len(), 2, "{log}");
    assert_eq!(records(&log, "free").len(), 1, "{log}");
}

#[test]
fn another_interposer_preloaded_first_reaches_the_driver_as_it_does_alone() {
    // The user's own LD_PRELOAD comes before the interposer: another
    // interposer defines cuMemAlloc_v2 and cuMemFree_v2 and looks up the
    // driver's by each way such tools use. Looked up in the driver's
    // handle, the answer used to be its own function (the interposer's
    // wrapper address bound to the first definition of the name), which
    // recursed (here: exit 86).
    let stacked = fixtures().dir.join("libstacked.so");
    let linked = program("cuda_linked");
    let argv = [linked.as_str(), "linked"];
    let (_, plain_logs) = traced_like(&alone(&argv), "unstacked.csv", &argv, &[]);
    let plain_log = log_text(&plain_logs[0]);
    for how in ["next", "handle", "default"] {
        let env = [
            ("LD_PRELOAD", stacked.to_str().unwrap()),
            ("STACKED_FIND", how),
        ];
        let by_itself = alone_with(&argv, &env);
        assert_eq!(by_itself.status.code(), Some(0), "{how}");
        let (output, logs) = traced_like(&by_itself, &format!("stacked_{how}.csv"), &argv, &env);
        for side in [&by_itself, &output] {
            let stderr = text(&side.stderr);
            assert!(
                stderr.contains("stacked: 2 allocs, 4 frees"),
                "{how}: {stderr}"
            );
        }
        // Every call still reached the interposer's wrappers too.
        let log = log_text(&logs[0]);
        for kind in ["alloc", "free"] {
            assert_eq!(
                records(&log, kind).len(),
                records(&plain_log, kind).len(),
                "{how} {kind}: {log}"
            );
        }
    }
}

#[test]
fn threads_that_exit_mid_run_lose_no_record_even_from_their_exit_destructors() {
    let hostile = program("hostile");
    let by_itself = alone(&[&hostile, "threadexit"]);
    assert_eq!(text(&by_itself.stdout), "threadexit: done\n");
    let (output, logs) = traced_like(&by_itself, "threadexit.csv", &[&hostile, "threadexit"], &[]);
    let stderr = text(&output.stderr);
    assert!(!stderr.contains("stopped recording"), "{stderr}");
    assert_eq!(logs.len(), 1);
    let log = log_text(&logs[0]);
    // Thread i makes 100 + i pairs, then one block its exit frees.
    let expected = (0..32).map(|i| 100 + i + 1).sum::<usize>();
    assert_eq!(records(&log, "alloc").len(), expected);
    assert_eq!(records(&log, "free").len(), expected);
    // Each thread's last block is freed on the thread that made it, by the
    // key's destructor as it exits.
    let threads: std::collections::HashSet<&str> =
        records(&log, "free").iter().map(|r| r[2]).collect();
    assert_eq!(threads.len(), 32, "{threads:?}");
}

#[test]
fn an_exec_with_an_environment_at_the_kernels_limit_runs_as_alone() {
    let hostile = program("hostile");
    let by_itself = alone(&[&hostile, "bigenv"]);
    assert_eq!(text(&by_itself.stdout), "bigenv: done\n");
    let (_, logs) = traced_like(&by_itself, "bigenv.csv", &[&hostile, "bigenv"], &[]);
    assert_eq!(logs.len(), 1);
    let log = log_text(&logs[0]);
    assert_eq!(records(&log, "alloc").len(), 10, "{log}");
    assert_eq!(records(&log, "exit").len(), 1, "{log}");
}

#[test]
fn an_environment_too_big_for_the_interposers_settings_is_refused_saying_why() {
    // One variable at the kernel's limit for a variable: alone the program
    // starts; with the interposer added to LD_PRELOAD it cannot.
    let limit = 128 << 10;
    let preload = ":".repeat(limit - 1 - "LD_PRELOAD=".len());
    let hostile = program("hostile");
    let mut command = Command::new(&hostile);
    command
        .arg("weak")
        .env("LD_LIBRARY_PATH", &fixtures().dir)
        .env("LD_PRELOAD", &preload);
    let by_itself = bounded(command, "hostile weak alone");
    assert_eq!(by_itself.status.code(), Some(0));
    let output = under_cudamem(&["--", &hostile, "weak"], &[("LD_PRELOAD", &preload)]);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("pass the kernel's limit")
            && stderr.contains("the longest variable is LD_PRELOAD (131071 bytes)"),
        "{stderr}"
    );
}

#[test]
fn a_thread_cancelled_while_it_calls_the_driver_is_cancelled_as_alone() {
    // The pending cancellation must act at the program's own cancellation
    // point, never inside the interposer (its log's file calls are
    // cancellation points): there it aborted the program.
    let hostile = program("hostile");
    let by_itself = alone(&[&hostile, "cancel"]);
    assert_eq!(text(&by_itself.stdout), "cancel: 20 of 20 cancelled\n");
    let (_, logs) = traced_like(&by_itself, "cancel.csv", &[&hostile, "cancel"], &[]);
    let log = log_text(&logs[0]);
    assert_eq!(records(&log, "exit").len(), 1);
    // Every allocation but those a cancelled thread left is freed.
    let (allocs, frees) = (records(&log, "alloc").len(), records(&log, "free").len());
    assert!(allocs >= frees && allocs - frees <= 20, "{allocs} {frees}");
}
