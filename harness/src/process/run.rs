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
//! Without `--trace`, the event logs go to a temporary folder removed
//! after the run.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{SystemTime, UNIX_EPOCH};

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
}

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
    temporary: bool,
}

/// Check everything that can be checked before the program starts: the
/// program, the outputs (created empty), the log folder (made, old logs
/// removed).
pub fn prepare(plan: RunPlan, path_var: Option<&OsStr>) -> Result<Prepared, RunError> {
    let program = find_program(&plan.program, path_var)?;
    for (what, path) in [("--trace", &plan.trace), ("--report", &plan.report)] {
        if let Some(path) = path {
            let unwritable = |source| RunError::Unwritable {
                what,
                path: path.clone(),
                source,
            };
            let mut file = File::create(path).map_err(unwritable)?;
            // A program that never reaches the driver still leaves a log
            // `cudamem replay` reads: the header and no rows.
            if what == "--trace" {
                writeln!(file, "{}", trace::rmm_csv::write::HEADER).map_err(unwritable)?;
            }
        }
    }
    let (log_dir, temporary) = match &plan.trace {
        Some(trace) => {
            let mut dir = trace.as_os_str().to_os_string();
            dir.push(format!(".{LOG_EXTENSION}"));
            (PathBuf::from(dir), false)
        }
        None => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let name = format!("cudamem-run-{}-{nanos}", std::process::id());
            (std::env::temp_dir().join(name), true)
        }
    };
    let dir_error = |source| RunError::LogDir {
        path: log_dir.clone(),
        source,
    };
    fs::create_dir_all(&log_dir).map_err(dir_error)?;
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

/// What a finished run left.
#[derive(Debug)]
pub struct Finished {
    /// The program's exit status.
    pub status: ExitStatus,
    /// Each process that recorded anything, the started one first; or why
    /// their logs could not be read (the program's status stands either way).
    pub reports: Result<Vec<ProcessReport>, RunError>,
}

impl Prepared {
    /// The folder the processes write their logs to.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// The command that will run, with the interposer's settings.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command
            .arg0(&self.plan.program)
            .args(&self.plan.args)
            .env(
                "LD_PRELOAD",
                preload_value(std::env::var_os("LD_PRELOAD").as_deref(), &self.plan.hook),
            )
            .env(LOG_DIR_VAR, &self.log_dir)
            .env(MAX_LOG_BYTES_VAR, self.plan.max_log_bytes.to_string())
            .envs(self.plan.env.iter().map(|(key, value)| (key, value)));
        command
    }

    /// Run the program to its end, then read every process's log (writing
    /// the RMM logs when `--trace` asked for them). Fails only when the
    /// program could not be run.
    pub fn run(self) -> Result<Finished, RunError> {
        let mut child = self.command().spawn().map_err(|source| RunError::Spawn {
            path: self.program.clone(),
            source,
        })?;
        let root = child.id();
        let status = child.wait().map_err(RunError::Wait)?;
        let reports = self.collect(root);
        if self.temporary {
            let _ = fs::remove_dir_all(&self.log_dir);
        }
        Ok(Finished { status, reports })
    }

    fn collect(&self, root: u32) -> Result<Vec<ProcessReport>, RunError> {
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
            reports.push(summarize(&log, self.plan.max_log_bytes, rmm.as_deref())?);
        }
        Ok(reports)
    }
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
