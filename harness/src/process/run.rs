//! `cudamem run -- PROGRAM ARGS...`: run a program with the interposer
//! preloaded, wait for it, and make its processes' logs into reports and
//! RMM logs.
//!
//! The program's environment gets `LD_PRELOAD` with the interposer appended
//! to what the user had, and [`LOG_DIR_VAR`] naming the folder every
//! process writes its log to; children and `exec` inherit both, so each
//! process that touches the driver leaves `<pid>.events` there.
//!
//! Where files go, for `--trace FILE`:
//! - FILE: the RMM log of the process `cudamem run` started;
//! - `STEM.<pid>.EXT` beside it (FILE's stem and extension): the RMM log of
//!   every other process;
//! - `FILE.events/<pid>.events`: each process's event log (the rich
//!   records, [`trace::event`]'s format), kept.
//!
//! Without `--trace`, the event logs go to a private temporary folder
//! (made as `mkdtemp` does: a fresh name, mode 0700) removed after the run.
//!
//! While the program runs, `cudamem run` stays out of its way: SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT sent to `cudamem run` are passed on to the
//! program (one a terminal sent reached the whole foreground group, the
//! program included, and is not sent twice), and `cudamem run` waits for
//! the program's end, writes what it recorded, and exits with its status.
//! A file that the kernel refuses to execute because it has no `#!` line
//! runs under `/bin/sh`, as a shell would run it.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{
    DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _,
};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::low_level::siginfo::Cause;

use crate::process::report::{ProcessReport, ReportError, summarize};
use trace::event_log::{LOG_DIR_VAR, LOG_EXTENSION, MAX_LOG_BYTES_VAR, log_pid};

/// The environment variable naming the interposer library, for a
/// `cudamem` whose folder does not hold it.
pub const HOOK_LIB_VAR: &str = "CUDAMEM_HOOK_LIB";

/// The interposer's file name, looked for beside the `cudamem` executable.
pub const HOOK_FILE_NAME: &str = "libcudamem_interpose.so";

/// What to run and where its records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPlan {
    /// The program, as the user named it (a path, or a name looked up in
    /// `PATH`).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The interposer library.
    pub hook: PathBuf,
    /// Where the RMM log of the started process goes.
    pub trace: Option<PathBuf>,
    /// Where the HTML report goes.
    pub report: Option<PathBuf>,
    /// The bound of each process's event log, bytes.
    pub max_log_bytes: u64,
    /// More environment for the program (`--pool`'s settings).
    pub env: Vec<(String, OsString)>,
    /// Whether an existing trace may be overwritten.
    pub force: bool,
}

/// The signals passed on to the program.
const FORWARDED: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];

/// `ENOEXEC`: the kernel does not know the file's format (a script without
/// `#!`).
const ENOEXEC: i32 = 8;

/// `E2BIG`: the arguments and environment are more than the kernel starts
/// a program with.
const E2BIG: i32 = 7;

/// The shell a file without `#!` runs under.
const SHELL: &str = "/bin/sh";

/// Why a program could not be run under the interposer, or its records
/// not be read.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No such program.
    #[error("program {program:?} not found{}", if program.to_string_lossy().contains('/') { "" } else { " in PATH" })]
    ProgramNotFound {
        /// The name as given.
        program: OsString,
    },
    /// The program is there, but is not an executable file.
    #[error("{} is not an executable file", path.display())]
    NotExecutable {
        /// Its path.
        path: PathBuf,
    },
    /// The interposer library is not where it was looked for.
    #[error(
        "the interposer library {} is missing ({how}); build it with `cargo build --release -p cudamem-interpose`, or name it in {HOOK_LIB_VAR}",
        path.display()
    )]
    HookMissing {
        /// Where it was looked for.
        path: PathBuf,
        /// How that place was chosen.
        how: &'static str,
    },
    /// An output file cannot be written; checked before the program starts.
    #[error("cannot write {what} {}: {source}", path.display())]
    Unwritable {
        /// `--trace` or `--report`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// `--trace` names something other than a regular file.
    #[error("--trace {} is {kind}, not a regular file; name a file", path.display())]
    TraceNotAFile {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// `--trace` names a file that exists.
    #[error("--trace {} exists; pass --force to overwrite it", path.display())]
    TraceExists {
        /// The path.
        path: PathBuf,
    },
    /// `--trace` names a file the program's arguments name.
    #[error(
        "--trace {} is named by the program's argument {argument:?}; refusing to overwrite a \
         file the program may read (name another file)",
        path.display()
    )]
    TraceIsArgument {
        /// The path.
        path: PathBuf,
        /// The argument.
        argument: String,
    },
    /// The signals to pass on to the program cannot be caught.
    #[error("catching signals to pass on to the program: {0}")]
    Signals(io::Error),
    /// The folder for event logs cannot be made or cleared.
    #[error("event log folder {}: {source}", path.display())]
    LogDir {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Starting the program failed.
    #[error("starting {}: {source}", path.display())]
    Spawn {
        /// The program.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The program's arguments and environment, with the settings the
    /// interposer needs added, are more than the kernel starts a program
    /// with.
    #[error(
        "starting {}: its arguments and environment, with the {added} bytes of settings cudamem \
         run adds (LD_PRELOAD and {LOG_DIR_VAR}, {MAX_LOG_BYTES_VAR}), pass the kernel's limit on \
         what a program is started with (128 KiB a variable, a quarter of the stack limit in \
         all); the longest variable is {longest} ({longest_bytes} bytes): shorten the \
         environment to run it under cudamem",
        path.display()
    )]
    TooBig {
        /// The program.
        path: PathBuf,
        /// Bytes the settings add to the environment.
        added: usize,
        /// The longest variable of the environment the program was given.
        longest: String,
        /// Its length, `NAME=value`.
        longest_bytes: usize,
    },
    /// Waiting for the program failed.
    #[error("waiting for the program: {0}")]
    Wait(io::Error),
    /// A process's log could not be read or converted.
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// Where the interposer is: `from_env` (the [`HOOK_LIB_VAR`] value) when
/// set, else [`HOOK_FILE_NAME`] beside `exe` (the running `cudamem`).
pub fn find_hook(from_env: Option<OsString>, exe: &Path) -> Result<PathBuf, RunError> {
    let (path, how) = match from_env.filter(|value| !value.is_empty()) {
        Some(value) => (PathBuf::from(value), "named by CUDAMEM_HOOK_LIB"),
        None => (
            exe.parent()
                .unwrap_or_else(|| Path::new("."))
                .join(HOOK_FILE_NAME),
            "looked for beside the cudamem executable",
        ),
    };
    if path.is_file() {
        Ok(fs::canonicalize(&path).unwrap_or(path))
    } else {
        Err(RunError::HookMissing { path, how })
    }
}

/// The file `program` names: a path when it holds a `/`, else the first
/// executable of that name in `path_var`'s folders.
pub fn find_program(program: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, RunError> {
    let not_found = || RunError::ProgramNotFound {
        program: program.to_os_string(),
    };
    if program.is_empty() {
        return Err(not_found());
    }
    let executable = |path: &Path| {
        fs::metadata(path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.to_string_lossy().contains('/') {
        let path = PathBuf::from(program);
        return match fs::metadata(&path) {
            Err(_) => Err(not_found()),
            Ok(_) if executable(&path) => Ok(path),
            Ok(_) => Err(RunError::NotExecutable { path }),
        };
    }
    let dirs = path_var.map(std::env::split_paths).into_iter().flatten();
    for dir in dirs {
        let candidate = dir.join(program);
        if executable(&candidate) {
            return Ok(candidate);
        }
    }
    Err(not_found())
}

/// The RMM log of process `pid` when the started process's goes to
/// `trace`: `STEM.<pid>.EXT` beside it.
pub fn child_trace_path(trace: &Path, pid: u32) -> PathBuf {
    let stem = trace
        .file_stem()
        .map_or_else(|| OsString::from("trace"), OsStr::to_os_string);
    let mut name = stem;
    name.push(format!(".{pid}"));
    if let Some(ext) = trace.extension() {
        name.push(".");
        name.push(ext);
    }
    trace.with_file_name(name)
}

/// `LD_PRELOAD` with `hook` appended to `existing`.
pub fn preload_value(existing: Option<&OsStr>, hook: &Path) -> OsString {
    let mut value = OsString::new();
    if let Some(existing) = existing.filter(|value| !value.is_empty()) {
        value.push(existing);
        value.push(":");
    }
    value.push(hook);
    value
}

/// The shell's exit code for `status`: the code, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => 1,
    }
}

/// A run ready to start: outputs checked, the log folder made.
#[derive(Debug)]
pub struct Prepared {
    plan: RunPlan,
    program: PathBuf,
    log_dir: PathBuf,
    /// The private temporary folder, removed when dropped.
    temporary: Option<tempfile::TempDir>,
}

/// Check everything that can be checked before the program starts: the
/// program, the outputs (created empty), the log folder (made, old logs
/// removed).
pub fn prepare(plan: RunPlan, path_var: Option<&OsStr>) -> Result<Prepared, RunError> {
    let program = find_program(&plan.program, path_var)?;
    if let Some(trace) = &plan.trace {
        check_trace(trace, &plan.args, plan.force)?;
    }
    for (what, path) in [("--trace", &plan.trace), ("--report", &plan.report)] {
        if let Some(path) = path {
            let unwritable = |source| RunError::Unwritable {
                what,
                path: path.clone(),
                source,
            };
            let mut file = File::create(path).map_err(unwritable)?;
            // The header, so a program that records later still leaves a
            // log `cudamem replay` reads; one that makes no driver call
            // leaves none ([`Prepared::run`] removes it).
            if what == "--trace" {
                writeln!(file, "{}", trace::rmm_csv::write::HEADER).map_err(unwritable)?;
            }
        }
    }
    let (log_dir, temporary) = match &plan.trace {
        Some(trace) => {
            let mut dir = trace.as_os_str().to_os_string();
            dir.push(format!(".{LOG_EXTENSION}"));
            (events_dir(PathBuf::from(dir))?, None)
        }
        None => {
            let dir = tempfile::Builder::new()
                .prefix("cudamem-run-")
                .permissions(fs::Permissions::from_mode(0o700))
                .tempdir()
                .map_err(|source| RunError::LogDir {
                    path: std::env::temp_dir(),
                    source,
                })?;
            (dir.path().to_path_buf(), Some(dir))
        }
    };
    let dir_error = |source| RunError::LogDir {
        path: log_dir.clone(),
        source,
    };
    let log_dir = fs::canonicalize(&log_dir).map_err(dir_error)?;
    for entry in fs::read_dir(&log_dir).map_err(dir_error)? {
        let path = entry.map_err(dir_error)?.path();
        if log_pid(&path).is_some() {
            fs::remove_file(&path).map_err(dir_error)?;
        }
    }
    Ok(Prepared {
        plan,
        program,
        log_dir,
        temporary,
    })
}

/// Refuse a `--trace` that is not a regular file (a FIFO would block, a
/// device would be written to, and `FILE.events/` made beside it), that
/// exists unless `force`, or that an argument of the program names (the
/// whole argument, or what follows its first `=`).
fn check_trace(trace: &Path, args: &[OsString], force: bool) -> Result<(), RunError> {
    if let Ok(meta) = fs::metadata(trace) {
        let kind = meta.file_type();
        let what = if kind.is_file() {
            None
        } else if kind.is_dir() {
            Some("a directory")
        } else if kind.is_fifo() {
            Some("a FIFO")
        } else if kind.is_char_device() || kind.is_block_device() {
            Some("a device")
        } else if kind.is_socket() {
            Some("a socket")
        } else {
            Some("not a regular file")
        };
        if let Some(kind) = what {
            return Err(RunError::TraceNotAFile {
                path: trace.to_path_buf(),
                kind,
            });
        }
    }
    let target = place(trace);
    for argument in args {
        let text = argument.to_string_lossy();
        let candidates = std::iter::once(text.as_ref()).chain(text.split_once('=').map(|(_, v)| v));
        for candidate in candidates.filter(|c| !c.is_empty()) {
            if target.is_some() && place(Path::new(candidate)) == target {
                return Err(RunError::TraceIsArgument {
                    path: trace.to_path_buf(),
                    argument: text.into_owned(),
                });
            }
        }
    }
    if !force && fs::symlink_metadata(trace).is_ok() {
        return Err(RunError::TraceExists {
            path: trace.to_path_buf(),
        });
    }
    Ok(())
}

/// Where `path` is: its canonical folder and its name, whether or not the
/// file exists yet (`None` when its folder does not).
fn place(path: &Path) -> Option<(PathBuf, OsString)> {
    if let Ok(full) = fs::canonicalize(path) {
        return Some((
            full.parent()?.to_path_buf(),
            full.file_name()?.to_os_string(),
        ));
    }
    let name = path.file_name()?.to_os_string();
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    Some((fs::canonicalize(parent).ok()?, name))
}

/// The folder `FILE.events` of a `--trace`: made private when new; an
/// existing one must be a folder (a link in its place is not followed).
fn events_dir(dir: PathBuf) -> Result<PathBuf, RunError> {
    let dir_error = |source| RunError::LogDir {
        path: dir.clone(),
        source,
    };
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => Ok(dir),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(&dir).map_err(dir_error)?;
            if meta.is_dir() {
                Ok(dir)
            } else {
                Err(dir_error(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists and is not a folder",
                )))
            }
        }
        Err(err) => Err(dir_error(err)),
    }
}

/// What a finished run left.
#[derive(Debug)]
pub struct Finished {
    /// The program's exit status.
    pub status: ExitStatus,
    /// Each process that recorded anything, the started one first; or why
    /// their logs could not be read (the program's status stands either way).
    pub reports: Result<Vec<ProcessReport>, RunError>,
    /// The `--trace` file and `FILE.events/`, removed because no process
    /// made a driver call (they would hold no row).
    pub trace_removed: Option<PathBuf>,
}

impl Prepared {
    /// The program's file.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The folder the processes write their logs to.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// The command that will run, with the interposer's settings.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.arg0(&self.plan.program).args(&self.plan.args);
        self.settings(&mut command);
        command
    }

    /// The program run by the shell, as a shell runs a file without `#!`.
    fn shell_command(&self) -> Command {
        let mut command = Command::new(SHELL);
        command.arg(&self.program).args(&self.plan.args);
        self.settings(&mut command);
        command
    }

    fn settings(&self, command: &mut Command) {
        command
            .env(
                "LD_PRELOAD",
                preload_value(std::env::var_os("LD_PRELOAD").as_deref(), &self.plan.hook),
            )
            .env(LOG_DIR_VAR, &self.log_dir)
            .env(MAX_LOG_BYTES_VAR, self.plan.max_log_bytes.to_string())
            .envs(self.plan.env.iter().map(|(key, value)| (key, value)));
    }

    /// Run the program to its end, passing on the signals meant for it,
    /// then read every process's log (writing the RMM logs when `--trace`
    /// asked for them). Fails only when the program could not be run.
    pub fn run(self) -> Result<Finished, RunError> {
        // Caught before the program starts: one that comes meanwhile waits
        // for it.
        let mut signals = SignalsInfo::<WithOrigin>::new(FORWARDED).map_err(RunError::Signals)?;
        let handle = signals.handle();
        let spawned = match self.command().spawn() {
            Err(err) if err.raw_os_error() == Some(ENOEXEC) => self.shell_command().spawn(),
            spawned => spawned,
        };
        let mut child = spawned.map_err(|source| {
            if source.raw_os_error() == Some(E2BIG) {
                self.too_big()
            } else {
                RunError::Spawn {
                    path: self.program.clone(),
                    source,
                }
            }
        })?;
        let pid = rustix::process::Pid::from_child(&child);
        let forwarder = std::thread::spawn(move || {
            for origin in signals.forever() {
                // A terminal's signal (sent by the kernel) went to the
                // whole foreground group: the program has it already.
                if matches!(origin.cause, Cause::Kernel) {
                    continue;
                }
                if let Some(signal) = rustix_signal(origin.signal) {
                    let _ = rustix::process::kill_process(pid, signal);
                }
            }
        });
        let root = child.id();
        let waited = child.wait();
        handle.close();
        let _ = forwarder.join();
        let status = waited.map_err(RunError::Wait)?;
        let reports = self.collect(root, status);
        let trace_removed = match &reports {
            Ok(reports) if !reports.iter().any(ProcessReport::made_driver_calls) => {
                self.remove_trace(reports)
            }
            _ => None,
        };
        drop(self.temporary);
        Ok(Finished {
            status,
            reports,
            trace_removed,
        })
    }

    /// Remove what `--trace` made when no process made a driver call: the
    /// file (a header and no row), the RMM logs and event logs of processes
    /// that only asked for a driver, and `FILE.events/` when that leaves it
    /// empty. The trace, when there was one to remove.
    fn remove_trace(&self, reports: &[ProcessReport]) -> Option<PathBuf> {
        let trace = self.plan.trace.as_ref()?;
        let _ = fs::remove_file(trace);
        for report in reports {
            if let Some((rmm, _)) = &report.rmm {
                let _ = fs::remove_file(rmm);
            }
            let _ = fs::remove_file(&report.log);
        }
        let _ = fs::remove_dir(&self.log_dir);
        Some(trace.clone())
    }

    /// What [`RunError::TooBig`] says of this run.
    fn too_big(&self) -> RunError {
        let command = self.command();
        let given = std::env::var_os("LD_PRELOAD").map_or(0, |value| value.len());
        let added = command
            .get_envs()
            .filter_map(|(key, value)| Some((key, value?)))
            .map(|(key, value)| {
                let before = if key == "LD_PRELOAD" && given > 0 {
                    key.len() + given + 2
                } else {
                    0
                };
                (key.len() + value.len() + 2).saturating_sub(before)
            })
            .sum();
        let (longest, longest_bytes) = std::env::vars_os()
            .map(|(key, value)| {
                (
                    key.to_string_lossy().into_owned(),
                    key.len() + value.len() + 1,
                )
            })
            .max_by_key(|&(_, len)| len)
            .unwrap_or_default();
        RunError::TooBig {
            path: self.program.clone(),
            added,
            longest,
            longest_bytes,
        }
    }

    fn collect(&self, root: u32, status: ExitStatus) -> Result<Vec<ProcessReport>, RunError> {
        let dir_error = |source| RunError::LogDir {
            path: self.log_dir.clone(),
            source,
        };
        let mut logs: Vec<(u32, PathBuf)> = fs::read_dir(&self.log_dir)
            .map_err(dir_error)?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter_map(|path| log_pid(&path).map(|pid| (pid, path)))
            .collect();
        logs.sort_by_key(|&(pid, _)| (pid != root, pid));
        let mut reports = Vec::new();
        for (pid, log) in logs {
            let rmm = self.plan.trace.as_ref().map(|trace| {
                if pid == root {
                    trace.clone()
                } else {
                    child_trace_path(trace, pid)
                }
            });
            let mut report = summarize(&log, self.plan.max_log_bytes, rmm.as_deref())?;
            if pid == root {
                // A signal the process could not record (it came while
                // another thread held the recorder) is in its wait status.
                if !report.counts.exited && report.counts.signal.is_none() {
                    report.counts.signal = status.signal();
                }
            } else if !report.counts.exited
                && report.counts.signal.is_none()
                && Path::new(&format!("/proc/{pid}")).exists()
            {
                report.outlived = true;
            }
            reports.push(report);
        }
        Ok(reports)
    }
}

/// The signal `number` (one of [`FORWARDED`]) as rustix names it.
fn rustix_signal(number: i32) -> Option<rustix::process::Signal> {
    use rustix::process::Signal;
    [
        (SIGINT, Signal::INT),
        (SIGTERM, Signal::TERM),
        (SIGHUP, Signal::HUP),
        (SIGQUIT, Signal::QUIT),
    ]
    .into_iter()
    .find(|&(known, _)| known == number)
    .map(|(_, signal)| signal)
}

/// Why `cudamem run` could not enter `program`, read from the file: a
/// statically linked program loads no library, so `LD_PRELOAD` has no
/// effect; a set-user-id or set-group-id program run by another user
/// ignores it. `None` when nothing in the file says so.
pub fn not_entered(program: &Path) -> Option<&'static str> {
    let meta = fs::metadata(program).ok()?;
    let mode = meta.permissions().mode();
    if mode & 0o6000 != 0 && meta.uid() != rustix::process::geteuid().as_raw() {
        return Some("it is set-user-id or set-group-id, and the loader ignores LD_PRELOAD for it");
    }
    let bytes = fs::read(program).ok()?;
    elf_is_static(&bytes)
        .then_some("it is statically linked, so it loads no library and LD_PRELOAD has no effect")
}

/// Whether `bytes` are a 64-bit little-endian ELF file with no program
/// interpreter (statically linked, static-pie included).
fn elf_is_static(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return false;
    }
    let word = |at: usize, len: usize| -> Option<u64> {
        let mut value = 0u64;
        for (shift, byte) in bytes.get(at..at + len)?.iter().enumerate() {
            value |= u64::from(*byte) << (8 * shift);
        }
        Some(value)
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (word(0x20, 8), word(0x36, 2), word(0x38, 2))
    else {
        return false;
    };
    let mut types = (0..phnum).filter_map(|index| {
        let at = usize::try_from(phoff + index * phentsize).ok()?;
        word(at, 4).map(|kind| kind as u32)
    });
    !types.any(|kind| kind == PT_INTERP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_traces_sit_beside_the_first() {
        assert_eq!(
            child_trace_path(Path::new("/t/run.csv"), 42),
            Path::new("/t/run.42.csv")
        );
        assert_eq!(
            child_trace_path(Path::new("/t/run"), 42),
            Path::new("/t/run.42")
        );
    }

    #[test]
    fn the_hook_is_appended_to_the_users_preload() {
        let hook = Path::new("/b/libcudamem_interpose.so");
        assert_eq!(preload_value(None, hook), "/b/libcudamem_interpose.so");
        assert_eq!(
            preload_value(Some(OsStr::new("")), hook),
            "/b/libcudamem_interpose.so"
        );
        assert_eq!(
            preload_value(Some(OsStr::new("/x/liba.so /x/libb.so")), hook),
            "/x/liba.so /x/libb.so:/b/libcudamem_interpose.so"
        );
    }

    #[test]
    fn programs_are_found_by_path_or_in_path() {
        let sh = find_program(
            OsStr::new("sh"),
            Some(OsStr::new("/nonexistent:/bin:/usr/bin")),
        )
        .unwrap();
        assert!(sh.ends_with("sh"));
        assert!(matches!(
            find_program(OsStr::new("no-such-program-here"), Some(OsStr::new("/bin"))),
            Err(RunError::ProgramNotFound { .. })
        ));
        assert!(matches!(
            find_program(OsStr::new("./no/such/file"), None),
            Err(RunError::ProgramNotFound { .. })
        ));
        let plain = std::env::temp_dir().join(format!("cudamem-plain-{}", std::process::id()));
        fs::write(&plain, b"not a program").unwrap();
        fs::set_permissions(&plain, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            find_program(plain.as_os_str(), None),
            Err(RunError::NotExecutable { .. })
        ));
        fs::remove_file(&plain).unwrap();
        assert!(matches!(
            find_program(OsStr::new(""), None),
            Err(RunError::ProgramNotFound { .. })
        ));
    }

    #[test]
    fn a_missing_hook_says_where_it_was_looked_for() {
        let err = find_hook(None, Path::new("/nonexistent/bin/cudamem")).unwrap_err();
        assert!(
            matches!(&err, RunError::HookMissing { path, .. } if path == Path::new("/nonexistent/bin/libcudamem_interpose.so")),
            "{err}"
        );
        let err = find_hook(Some("/nope/lib.so".into()), Path::new("/x/cudamem")).unwrap_err();
        assert!(err.to_string().contains("CUDAMEM_HOOK_LIB"), "{err}");
    }
}
