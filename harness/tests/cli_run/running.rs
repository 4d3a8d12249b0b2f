//! `cudamem run` around the program: the signals meant for the program
//! reach it and its status is `cudamem run`'s; the trace path is checked
//! before the program starts; the event logs' temporary folder is private;
//! a script without `#!` runs as from a shell; what the trace says is
//! true (a refused free, programs cudamem could not enter, children left
//! running).

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::*;

/// Start `cudamem run -- hostile sigint` in a process group of its own,
/// wait for the program's "ready", send SIGINT with `kill ARGS` (`{pid}`
/// is `cudamem run`'s), and return what it ended with.
fn interrupted(kill_args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cudamem"))
        .args(["run", "--", &program("hostile"), "sigint"])
        .env("CUDAMEM_HOOK_LIB", hook_library())
        .env("LD_LIBRARY_PATH", &fixtures().dir)
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let stdout = child.stdout.take().unwrap();
    let (ready_tx, ready) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut seen = String::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if line == "ready" {
                let _ = ready_tx.send(());
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        seen
    });
    let stop = |child: &mut std::process::Child| {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .status();
    };
    if ready.recv_timeout(Duration::from_secs(30)).is_err() {
        stop(&mut child);
        panic!("the program never said it was ready");
    }
    let args: Vec<String> = kill_args.iter().map(|a| a.replace("{pid}", &pid)).collect();
    assert!(Command::new("kill").args(&args).status().unwrap().success());
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(30) {
            stop(&mut child);
            panic!("cudamem run still running 30 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), reader.join().unwrap(), stderr)
}

#[test]
fn sigint_to_cudamem_run_reaches_the_program_whose_status_and_report_stand() {
    // Sent to `cudamem run` alone (as a supervisor would), and to the
    // whole group (as a terminal's Ctrl-C is).
    for kill_args in [&["-INT", "{pid}"][..], &["-INT", "--", "-{pid}"][..]] {
        let (code, stdout, stderr) = interrupted(kill_args);
        assert_eq!(code, Some(5), "{kill_args:?}: {stderr}");
        assert!(stdout.ends_with("ready\ninterrupted\n"), "{stdout}");
        assert!(
            stderr.contains("exit status 5; 1 process recorded"),
            "{kill_args:?}: {stderr}"
        );
    }
}

#[test]
fn a_trace_that_is_no_regular_file_exists_or_is_the_programs_is_refused() {
    let marker = temp_path("ran");
    let script = format!("touch {}", marker.display());
    let fifo = temp_path("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let existing = support::write_file("existing.csv", b"keep me");
    let dir = temp_path("dir");
    std::fs::create_dir(&dir).unwrap();
    let cases = [
        (
            fifo.to_str().unwrap().to_string(),
            "is a FIFO, not a regular file",
        ),
        ("/dev/null".to_string(), "is a device, not a regular file"),
        (dir.to_str().unwrap().to_string(), "is a directory"),
        (
            existing.to_str().unwrap().to_string(),
            "exists; pass --force",
        ),
    ];
    for (trace, message) in &cases {
        let output = run(&["--trace", trace, "--", "sh", "-c", &script], &[]);
        assert_eq!(output.status.code(), Some(1), "{trace}");
        assert!(
            text(&output.stderr).contains(message),
            "{trace}: {}",
            text(&output.stderr)
        );
        assert!(!marker.exists(), "{trace}: the program ran");
    }
    assert!(!Path::new("/dev/null.events").exists());
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");
    // A file the program's arguments name, even with --force.
    let output = run(
        &[
            "--force",
            "--trace",
            existing.to_str().unwrap(),
            "--",
            "cat",
            existing.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("is named by the program's argument"));
    let output = run(
        &[
            "--trace",
            "new.csv",
            "--",
            "sh",
            "-c",
            "true",
            "--out=./new.csv",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    // --force overwrites a trace that is nobody's input.
    let linked = program("cuda_linked");
    let output = run(
        &[
            "--force",
            "--trace",
            existing.to_str().unwrap(),
            "--",
            &linked,
            "linked",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(std::fs::read(&existing).unwrap().starts_with(b"Thread,"));
}

#[test]
fn the_temporary_log_folder_is_private_and_fresh() {
    let output = run(
        &[
            "--",
            "sh",
            "-c",
            "stat -c '%a %U' \"$CUDAMEM_HOOK_DIR\"; echo \"$CUDAMEM_HOOK_DIR\"",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let mut lines = stdout.lines();
    let mode = lines.next().unwrap();
    assert!(mode.starts_with("700 "), "{mode}");
    let dir = lines.next().unwrap();
    assert!(!Path::new(dir).exists(), "{dir} was not removed");
}

#[test]
fn a_script_without_a_shebang_runs_as_from_a_shell() {
    let script = support::write_file("no-shebang", b"echo \"from a script: $1\"\nexit 4\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let alone = Command::new("sh")
        .args(["-c", "\"$0\" arg", script.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(alone.status.code(), Some(4));
    let output = run(&["--", script.to_str().unwrap(), "arg"], &[]);
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert_eq!(output.stdout, alone.stdout);
}

#[test]
fn a_refused_free_is_a_failure_in_the_trace_not_a_free_and_an_allocation() {
    let run = traced(
        "freeasync",
        &[&program("hostile"), "freeasync"],
        &[("FAKE_CUDA_FAIL_FREE_ASYNC", "1")],
    );
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    assert_eq!(run.stdout(), "first free: 400\n");
    let log = run.log();
    assert_eq!(records(&log, "free-failed").len(), 1, "{log}");
    let csv = run.csv();
    let actions: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap())
        .collect();
    // The 1 MiB block stays live; the 2 MiB one comes and goes.
    assert_eq!(actions, ["allocate", "allocate", "free"], "{csv}");
}

#[test]
fn programs_cudamem_cannot_enter_and_children_left_running_are_named() {
    let output = run(&["--", &program("static_probe")], &[]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(text(&output.stdout), "static: done\n");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("could not enter"), "{stderr}");
    assert!(stderr.contains("statically linked"), "{stderr}");
    assert!(!stderr.contains("made no CUDA driver call"), "{stderr}");

    let run = traced("background", &[&program("hostile"), "background"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    assert!(
        run.stderr()
            .contains("still running when the program ended"),
        "{}",
        run.stderr()
    );
}

#[test]
fn time_goes_on_across_an_exec() {
    let run = traced("exec-time", &[&program("cuda_linked"), "exec"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let log = run.log();
    let lines: Vec<&str> = log.lines().collect();
    let time = |line: &str| -> u64 { line.split('\t').nth(1).unwrap().parse().unwrap() };
    // The second image's first record (its process record) comes after
    // everything the first image wrote.
    let second = lines
        .iter()
        .rposition(|line| line.starts_with("process\t"))
        .unwrap();
    assert!(second > 0, "{log}");
    let before = lines[..second].iter().map(|l| time(l)).max().unwrap();
    assert!(time(lines[second]) > before, "{log}");
}
