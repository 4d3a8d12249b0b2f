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
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            panic!(
                "{what}: still running after {LIMIT:?} (hung); stderr so far:\n{}",
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

/// The program alone, the fake driver on its library path.
fn alone(argv: &[&str]) -> Output {
    let mut command = Command::new(argv[0]);
    command
        .args(&argv[1..])
        .env("LD_LIBRARY_PATH", &fixtures().dir)
        .env_remove("LD_PRELOAD");
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
    let log = text(&std::fs::read(&logs[0]).unwrap());
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

#[test]
fn a_fork_while_the_interposer_sets_itself_up_never_hangs() {
    let hostile = program("hostile");
    for run in 0..30 {
        let output = under_cudamem(&["--", &hostile, "forksetup"], &[]);
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
    let log = text(&std::fs::read(&logs[0]).unwrap());
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
