//! `cudamem pause PID...`, `cudamem resume PID...` and `cudamem ledger PID`:
//! the client of the control channel the interposer opens in a program run
//! with `cudamem run --pool`, and the run's control folder ([`ControlDir`]).
//!
//! The channel is the socket `<dir>/<pid>.sock`, where `dir` is the folder
//! named by the program's `CUDAMEM_CONTROL_DIR` (read from
//! `/proc/PID/environ`, which only the program's user or root may read).
//! The folder must be a real folder (not a symbolic link), mode 0700, of
//! the program's user; the socket's server must be the process asked for
//! (`SO_PEERCRED`). Several PIDs are paused (or resumed) all or none: on a
//! refusal, the ones done are undone.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

/// The environment variable that turns the interposer's pool on.
pub const POOL_VAR: &str = "CUDAMEM_POOL";
/// The environment variable naming the run's control folder.
pub const CONTROL_DIR_VAR: &str = "CUDAMEM_CONTROL_DIR";

/// The longest answer read, bytes.
const MAX_ANSWER: u64 = 1 << 20;

/// Arguments of `cudamem pause`.
#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    /// Drop without a copy: `all` (every block's contents; they read as
    /// undefined after resume). The pool's free pages are always released
    /// without a copy.
    #[arg(long, value_name = "WHAT", value_parser = ["all", "free-cache"])]
    discard: Vec<String>,
    /// Give up waiting for an answer after this many seconds (the program
    /// finishes what it started either way: paused, or running).
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    timeout: u64,
    /// Processes started with `cudamem run --pool`.
    #[arg(required = true, value_name = "PID")]
    pids: Vec<u32>,
}

/// Arguments of `cudamem resume`.
#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// Give up waiting for an answer after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    timeout: u64,
    /// Paused processes.
    #[arg(required = true, value_name = "PID")]
    pids: Vec<u32>,
}

/// Arguments of `cudamem ledger`.
#[derive(Debug, clap::Args)]
pub struct LedgerArgs {
    /// A process started with `cudamem run --pool`.
    #[arg(value_name = "PID")]
    pid: u32,
}

/// Why a program could not be reached or did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No such process.
    #[error("process {pid}: no such process (it may have exited)")]
    NoProcess {
        /// The PID.
        pid: u32,
    },
    /// The process's environment cannot be read: another user's.
    #[error("process {pid}: belongs to another user (its environment cannot be read)")]
    NotYours {
        /// The PID.
        pid: u32,
    },
    /// Not started with `cudamem run --pool`.
    #[error("process {pid} was not started with `cudamem run --pool`")]
    NotPooled {
        /// The PID.
        pid: u32,
    },
    /// No socket: the pool is not made yet, or the process is a child made
    /// by fork.
    #[error(
        "process {pid} has no control channel: it has made no device allocation through cudamem's pool yet"
    )]
    NoChannel {
        /// The PID.
        pid: u32,
    },
    /// The control folder is not safe to use.
    #[error("process {pid}: control folder {}: {why}", dir.display())]
    UnsafeDir {
        /// The PID.
        pid: u32,
        /// The folder.
        dir: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The socket's server is another process.
    #[error("process {pid}: the control socket is served by process {server}, not by it")]
    WrongServer {
        /// The PID.
        pid: u32,
        /// The server's PID.
        server: i32,
    },
    /// Talking to the program failed.
    #[error("process {pid}: {what}: {source}")]
    Io {
        /// The PID.
        pid: u32,
        /// The step.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The program refused (its words).
    #[error("process {pid}: {why}")]
    Refused {
        /// The PID.
        pid: u32,
        /// The kind (`already-paused`, `not-paused`, `no-room`, `busy`,
        /// `failed`, `refused`, `no-pool`, `bad-request`).
        kind: String,
        /// The program's explanation.
        why: String,
    },
}

/// The run's control folder: made like `mkdtemp` (a new name, mode 0700,
/// never through a symbolic link), removed with what is in it when dropped.
#[derive(Debug)]
pub struct ControlDir {
    path: PathBuf,
}

impl ControlDir {
    /// A new folder in `$XDG_RUNTIME_DIR` where it is set, else the
    /// temporary folder.
    pub fn make() -> std::io::Result<ControlDir> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|dir| dir.is_absolute() && dir.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let mut last = None;
        for attempt in 0..64u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = base.join(format!(
                "cudamem-{}-{:08x}",
                std::process::id(),
                nanos ^ attempt.wrapping_mul(0x9e37_79b9)
            ));
            // mkdir makes a new entry or fails: an existing name (a file, a
            // folder, a symbolic link) is never used.
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(ControlDir { path }),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    last = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Whether `dir` is a real folder of user `owner`, closed to others.
pub fn check_dir(dir: &Path, owner: u32) -> std::result::Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if meta.file_type().is_symlink() {
        return Err("is a symbolic link".into());
    }
    if !meta.is_dir() {
        return Err("is not a folder".into());
    }
    if meta.uid() != owner {
        return Err(format!("belongs to user {}, not {owner}", meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "is open to other users (mode {:o})",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// The control socket of `pid`.
fn socket_of(pid: u32) -> std::result::Result<PathBuf, ControlError> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let meta = std::fs::metadata(&proc).map_err(|_| ControlError::NoProcess { pid })?;
    let environ = match std::fs::read(proc.join("environ")) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(ControlError::NoProcess { pid });
        }
        Err(_) => return Err(ControlError::NotYours { pid }),
    };
    let key = format!("{CONTROL_DIR_VAR}=");
    let dir = environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(key.as_bytes()))
        .filter(|value| !value.is_empty())
        .ok_or(ControlError::NotPooled { pid })?;
    let dir = PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(dir)));
    check_dir(&dir, meta.uid()).map_err(|why| ControlError::UnsafeDir {
        pid,
        dir: dir.clone(),
        why,
    })?;
    let socket = dir.join(format!("{pid}.sock"));
    if std::fs::symlink_metadata(&socket).is_err() {
        return Err(ControlError::NoChannel { pid });
    }
    Ok(socket)
}

/// The PID of the process serving a connected socket.
fn server_pid(stream: &UnixStream) -> Option<i32> {
    rustix::net::sockopt::socket_peercred(stream)
        .ok()
        .map(|cred| cred.pid.as_raw_nonzero().get())
}

/// Send `request` to `pid` and return its answer's text, or its refusal.
pub fn ask(
    pid: u32,
    request: &str,
    timeout: Duration,
) -> std::result::Result<String, ControlError> {
    let socket = socket_of(pid)?;
    let io = |what| move |source| ControlError::Io { pid, what, source };
    let mut stream =
        UnixStream::connect(&socket).map_err(io("connecting to its control socket"))?;
    match server_pid(&stream) {
        Some(server) if server == pid as i32 => {}
        Some(server) => return Err(ControlError::WrongServer { pid, server }),
        None => {
            return Err(ControlError::Io {
                pid,
                what: "reading the server's credentials",
                source: std::io::Error::other("SO_PEERCRED failed"),
            });
        }
    }
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(10))))
        .map_err(io("setting timeouts"))?;
    stream
        .write_all(format!("{request}\n").as_bytes())
        .map_err(io("sending the request"))?;
    let mut answer = String::new();
    (&mut stream)
        .take(MAX_ANSWER)
        .read_to_string(&mut answer)
        .map_err(io("reading the answer"))?;
    let (head, text) = answer.split_once('\n').unwrap_or((answer.as_str(), ""));
    if head == "ok" {
        return Ok(text.to_string());
    }
    let kind = head.strip_prefix("error ").unwrap_or("failed").to_string();
    Err(ControlError::Refused {
        pid,
        kind,
        why: if text.trim().is_empty() {
            format!("the program gave no answer ({head:?})")
        } else {
            text.trim_end().to_string()
        },
    })
}

/// Ask each PID in turn; on the first refusal, send `undo` to those done
/// (all or none), then fail with the refusal.
fn all_or_none(
    pids: &[u32],
    request: &str,
    undo: &str,
    timeout: Duration,
    out: &mut dyn Write,
) -> Result<()> {
    let mut done = Vec::new();
    for &pid in pids {
        match ask(pid, request, timeout) {
            Ok(text) => {
                writeln!(out, "cudamem {request}: process {pid}")?;
                write!(out, "{text}")?;
                done.push(pid);
            }
            Err(error) => {
                let mut undone = Vec::new();
                for &earlier in done.iter().rev() {
                    match ask(earlier, undo, timeout) {
                        Ok(_) => undone.push(earlier),
                        Err(again) => writeln!(out, "cudamem {undo}: {again}")?,
                    }
                }
                if !undone.is_empty() {
                    writeln!(
                        out,
                        "cudamem {request}: undone for process(es) {undone:?} (all or none)"
                    )?;
                }
                return Err(error.into());
            }
        }
    }
    Ok(())
}

/// `cudamem pause`.
pub fn pause(args: &PauseArgs, out: &mut dyn Write) -> Result<()> {
    let mut request = String::from("pause");
    for what in &args.discard {
        request.push_str(&format!(" discard={what}"));
    }
    all_or_none(
        &args.pids,
        &request,
        "resume",
        Duration::from_secs(args.timeout.max(1)),
        out,
    )
}

/// `cudamem resume`.
pub fn resume(args: &ResumeArgs, out: &mut dyn Write) -> Result<()> {
    all_or_none(
        &args.pids,
        "resume",
        "pause",
        Duration::from_secs(args.timeout.max(1)),
        out,
    )
}

/// `cudamem ledger`.
pub fn ledger(args: &LedgerArgs, out: &mut dyn Write) -> Result<()> {
    let text = ask(args.pid, "ledger", Duration::from_secs(60))?;
    write!(out, "{text}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_folder_is_new_private_and_goes_away() {
        let dir = ControlDir::make().unwrap();
        let path = dir.path().to_path_buf();
        let me = rustix::process::geteuid().as_raw();
        assert_eq!(check_dir(&path, me), Ok(()));
        assert!(
            check_dir(&path, me + 1)
                .unwrap_err()
                .contains("belongs to user")
        );
        let link = path.with_extension("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(check_dir(&link, me), Err("is a symbolic link".into()));
        std::fs::remove_file(&link).unwrap();
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn a_process_not_under_the_pool_is_named() {
        // This test process has no control folder in its environment.
        let me = std::process::id();
        assert!(matches!(socket_of(me), Err(ControlError::NotPooled { .. })));
        assert!(matches!(
            socket_of(u32::MAX - 1),
            Err(ControlError::NoProcess { .. })
        ));
    }
}
