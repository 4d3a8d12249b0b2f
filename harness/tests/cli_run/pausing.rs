//! `cudamem run --pool`, `cudamem pause PID`, `cudamem resume PID` and
//! `cudamem ledger PID` end to end, against the fake driver with its device
//! memory in host memory (FAKE_CUDA_MEMORY=host: a pause really unmaps the
//! pages, so a thread that touched them while paused would crash the
//! program), with a program of 16 threads allocating, launching and copying
//! while the pause arrives (interpose/fixtures/pause_workload.c).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use super::{fixtures, hook_library, program, text};

/// The environment every run here gets: host memory, and `full` as the
/// file whose presence makes the fake device full.
fn fake_env(command: &mut Command, full: &Path) {
    command
        .env("CUDAMEM_HOOK_LIB", hook_library())
        .env("LD_LIBRARY_PATH", &fixtures().dir)
        .env("FAKE_CUDA_MEMORY", "host")
        .env("FAKE_CUDA_FULL_FILE", full)
        .env_remove("LD_PRELOAD")
        .env_remove("CUDAMEM_CONTROL_DIR");
}

/// `cudamem ARGS...`.
fn cudamem(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudamem"));
    command.args(args);
    fake_env(&mut command, Path::new("/nonexistent"));
    command.output().unwrap()
}

fn cudamem_ok(args: &[&str]) -> String {
    let output = cudamem(args);
    assert!(
        output.status.success(),
        "cudamem {args:?}: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

fn cudamem_refused(args: &[&str]) -> String {
    let output = cudamem(args);
    assert_eq!(
        output.status.code(),
        Some(1),
        "cudamem {args:?}: {}",
        text(&output.stdout)
    );
    text(&output.stderr)
}

/// The workload's checksum without cudamem at all.
fn unpaused_checksum(iterations: &str) -> String {
    let mut command = Command::new(program("pause_workload"));
    command.arg(iterations);
    fake_env(&mut command, Path::new("/nonexistent"));
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    checksum(&text(&output.stdout))
}

fn checksum(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("checksum "))
        .unwrap_or_else(|| panic!("no checksum in {stdout:?}"))
        .to_string()
}

/// The workload under `cudamem run --pool`, stopped at "ready".
struct Pooled {
    child: Child,
    pid: String,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Pooled {
    fn start(iterations: &str, full: &Path) -> Pooled {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cudamem"));
        command
            .args([
                "run",
                "--pool",
                "--",
                &program("pause_workload"),
                iterations,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        fake_env(&mut command, full);
        let mut child = command.spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let pid = line
            .strip_prefix("pid ")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("the workload did not start: {line:?}"))
            .to_string();
        Pooled { child, pid, stdout }
    }

    /// Wait for the end: exit status, the rest of stdout, stderr.
    fn finish(mut self) -> (Option<i32>, String, String) {
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = self.child.wait().unwrap();
        (status.code(), rest, err)
    }
}

/// The free memory figures of a pause's report: (before, after) in MiB.
fn freed_mib(report: &str) -> (f64, f64) {
    let line = report
        .lines()
        .find(|line| line.starts_with("paused: free device memory"))
        .unwrap_or_else(|| panic!("no free memory line in {report}"));
    let figures: Vec<f64> = line
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|pair| pair[1] == "MiB")
        .filter_map(|pair| pair[0].parse().ok())
        .collect();
    (figures[0], figures[1])
}

fn full_flag(name: &str) -> std::path::PathBuf {
    let path = super::support::temp_path(name);
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn a_program_paused_mid_run_gives_its_memory_back_and_ends_as_if_never_paused() {
    let expected = unpaused_checksum("400");
    let run = Pooled::start("400", &full_flag("pause-full-1"));
    let paused = cudamem_ok(&["pause", &run.pid]);
    let (before, after) = freed_mib(&paused);
    // 16 threads hold at least 13 MiB of buffers, in pool pages of 2 MiB.
    assert!(after - before >= 12.0, "{paused}");
    assert!(paused.contains("residency ledger"), "{paused}");
    assert!(paused.contains(", paused:"), "{paused}");
    // While paused, the ledger names what stays: the context, its local
    // memory and the module, and no pool page.
    let ledger = cudamem_ok(&["ledger", &run.pid]);
    for line in ["released", "context", "local memory", "module code"] {
        assert!(ledger.contains(line), "{line}: {ledger}");
    }
    let pool_line = ledger
        .lines()
        .find(|line| line.contains("the pool's pages on the device"))
        .unwrap();
    assert!(pool_line.contains(" 0 B "), "{pool_line}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let resumed = cudamem_ok(&["resume", &run.pid]);
    assert!(
        resumed.contains("mapped again at the same addresses"),
        "{resumed}"
    );
    let (status, stdout, stderr) = run.finish();
    assert_eq!(status, Some(0), "{stderr}");
    assert_eq!(checksum(&stdout), expected, "{stderr}");
}

#[test]
fn bad_input_is_refused_clearly_and_the_program_is_unharmed() {
    let expected = unpaused_checksum("300");
    // A process not started by cudamem.
    let mut sleeper = Command::new("sleep").arg("5").spawn().unwrap();
    let message = cudamem_refused(&["pause", &sleeper.id().to_string()]);
    assert!(
        message.contains("was not started with `cudamem run --pool`"),
        "{message}"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    // One that exited.
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id().to_string();
    gone.wait().unwrap();
    let message = cudamem_refused(&["resume", &gone_pid]);
    assert!(message.contains("no such process"), "{message}");

    let full = full_flag("pause-full-2");
    let run = Pooled::start("300", &full);
    let message = cudamem_refused(&["resume", &run.pid]);
    assert!(message.contains("is not paused"), "{message}");
    // All or none: the second PID is gone, so the first is resumed again.
    let output = cudamem(&["pause", &run.pid, &gone_pid]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("no such process"));
    assert!(
        text(&output.stdout).contains("undone"),
        "{}",
        text(&output.stdout)
    );
    let ledger = cudamem_ok(&["ledger", &run.pid]);
    assert!(ledger.contains(", running:"), "{ledger}");
    cudamem_ok(&["pause", &run.pid]);
    let message = cudamem_refused(&["pause", &run.pid]);
    assert!(message.contains("paused already"), "{message}");
    // The device is full: the resume says so and the program stays paused.
    std::fs::write(&full, b"").unwrap();
    let message = cudamem_refused(&["resume", &run.pid]);
    assert!(message.contains("no room"), "{message}");
    assert!(message.contains("stays paused"), "{message}");
    let ledger = cudamem_ok(&["ledger", &run.pid]);
    assert!(ledger.contains(", paused:"), "{ledger}");
    std::fs::remove_file(&full).unwrap();
    cudamem_ok(&["resume", &run.pid]);
    let (status, stdout, stderr) = run.finish();
    assert_eq!(status, Some(0), "{stderr}");
    assert_eq!(checksum(&stdout), expected, "{stderr}");
}

#[test]
fn a_program_pauses_and_resumes_itself_through_the_c_abi() {
    let expected = unpaused_checksum("300");
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudamem"));
    command.args([
        "run",
        "--pool",
        "--",
        &program("pause_workload"),
        "300",
        "16",
        "self",
    ]);
    fake_env(&mut command, Path::new("/nonexistent"));
    let output = command.output().unwrap();
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // Not paused: 3; paused: 0; paused already: 2; resumed: 0.
    assert!(
        stdout.contains("self resume-before-pause 3 pause 0 pause-again 2 resume 0"),
        "{stdout}"
    );
    assert!(stdout.contains("residency ledger"), "{stdout}");
    assert!(stdout.contains("resumed: free device memory"), "{stdout}");
    assert_eq!(checksum(&stdout), expected);
}

/// A Python program that allocates through the driver with ctypes and
/// pauses itself with python/cudamem_pause.py.
const PYTHON_SELF_PAUSE: &str = r#"
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import cudamem_pause as cp
assert cp.available()
cuda = ctypes.CDLL("libcuda.so.1")
u64, size = ctypes.c_uint64, ctypes.c_size_t
cuda.cuMemcpyHtoD_v2.argtypes = [u64, ctypes.c_char_p, size]
cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_char_p, u64, size]
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
ptr = u64()
data = bytes(range(256)) * (3 << 12)
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), size(len(data))) == 0
assert cuda.cuMemcpyHtoD_v2(ptr.value, data, len(data)) == 0
try:
    cp.resume()
except cp.PauseError as error:
    print("resume first:", error.kind)
print(cp.pause())
try:
    cp.pause()
except cp.PauseError as error:
    print("pause again:", error.kind)
print(cp.ledger())
print(cp.resume())
back = ctypes.create_string_buffer(len(data))
assert cuda.cuMemcpyDtoH_v2(back, ptr.value, len(data)) == 0
print("contents kept:", back.raw == data)
"#;

#[test]
fn python_pauses_and_resumes_its_own_process() {
    let python_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudamem"));
    command.args(["run", "--pool", "--", "python3", "-c", PYTHON_SELF_PAUSE]);
    command.arg(&python_dir);
    fake_env(&mut command, Path::new("/nonexistent"));
    let output = command.output().expect("python3 runs (CI has it)");
    let stdout = text(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        text(&output.stderr)
    );
    for said in [
        "resume first: not-paused",
        "paused: free device memory",
        "pause again: already-paused",
        "residency ledger",
        "resumed: free device memory",
        "contents kept: True",
    ] {
        assert!(stdout.contains(said), "{said}: {stdout}");
    }
}

#[test]
fn several_programs_pause_and_resume_together() {
    let expected = unpaused_checksum("300");
    let full = full_flag("pause-full-3");
    let first = Pooled::start("300", &full);
    let second = Pooled::start("300", &full);
    let paused = cudamem_ok(&["pause", &first.pid, &second.pid]);
    assert_eq!(paused.matches("residency ledger").count(), 2, "{paused}");
    cudamem_ok(&["resume", &first.pid, &second.pid]);
    for run in [first, second] {
        let (status, stdout, stderr) = run.finish();
        assert_eq!(status, Some(0), "{stderr}");
        assert_eq!(checksum(&stdout), expected);
    }
}

/// `as_user UID ARGS...` (the fixture): ARGS run as user `uid`.
fn as_user(uid: u32, args: &[&str]) -> Output {
    let mut command = Command::new(program("as_user"));
    command.arg(uid.to_string()).args(args);
    fake_env(&mut command, Path::new("/nonexistent"));
    command.output().unwrap()
}

#[test]
fn another_user_is_refused_and_the_program_runs_on() {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    assert_eq!(
        me, 0,
        "this test acts as another user (nobody), which takes root; CI runs as root"
    );
    let expected = unpaused_checksum("300");
    let run = Pooled::start("300", &full_flag("pause-full-4"));
    // `cudamem pause` as nobody: the program's environment is not readable.
    let output = as_user(65534, &[env!("CARGO_BIN_EXE_cudamem"), "pause", &run.pid]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("another user"),
        "{}",
        text(&output.stderr)
    );
    // The socket itself, opened to everyone here on purpose: the program
    // checks the peer's credentials and refuses.
    let environ = std::fs::read(format!("/proc/{}/environ", run.pid)).unwrap();
    let dir = text(&environ)
        .split('\0')
        .find_map(|entry| {
            entry
                .strip_prefix("CUDAMEM_CONTROL_DIR=")
                .map(str::to_string)
        })
        .unwrap();
    let socket = Path::new(&dir).join(format!("{}.sock", run.pid));
    let socket = socket.to_str().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let foreign = as_user(65534, &["--ask", socket, "pause"]);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let answer = text(&foreign.stdout);
    assert!(
        answer.starts_with("error refused"),
        "{answer:?} {:?} {}",
        foreign.status,
        text(&foreign.stderr)
    );
    assert!(answer.contains("user 65534 may not control"), "{answer:?}");
    // The same socket answers its own user: still running.
    let own = as_user(0, &["--ask", socket, "status"]);
    assert_eq!(text(&own.stdout), "ok\nrunning\n");
    let (status, stdout, stderr) = run.finish();
    assert_eq!(status, Some(0), "{stderr}");
    assert_eq!(checksum(&stdout), expected);
}
