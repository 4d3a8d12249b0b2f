//! The control channel of a program run with `cudamem run --pool`: pause,
//! resume and the residency ledger, asked for by `cudamem pause PID` over a
//! Unix socket, or in the process through the C ABI ([`cudamem_pause`],
//! [`cudamem_resume`], [`cudamem_ledger`]).
//!
//! The socket is `<dir>/<pid>.sock`, where `dir` is the folder `cudamem run`
//! made for the run (`CUDAMEM_CONTROL_DIR`): made by `mkdtemp`, mode 0700,
//! owned by the user; a folder that is a symbolic link, belongs to someone
//! else or is open to others is refused and no socket is made. Each
//! connection is checked with `SO_PEERCRED`: only the program's own user or
//! root is answered. One request per connection, one line
//! (`pause [discard=all]`, `resume`, `ledger`, `status`); the answer is
//! `ok` or `error KIND` on its first line, then text.

use std::ffi::{CStr, c_char, c_int};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use crate::driver::read;
use crate::gate;
use crate::pool::pause::{self, Discard, Paused};
use crate::pool::{self, ledger};

/// The environment variable naming the run's control folder.
pub const CONTROL_DIR_VAR: &str = "CUDAMEM_CONTROL_DIR";

/// How long a pause waits for threads inside driver calls to leave them.
const SHUT_WAIT: Duration = Duration::from_secs(60);

/// Why a request was refused (the kind is the answer's first line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The pool does not serve this process (yet).
    NoPool,
    /// Paused already.
    AlreadyPaused,
    /// Not paused.
    NotPaused,
    /// Resume found no room on the device: still paused.
    NoRoom(String),
    /// A thread stayed inside a driver call.
    Busy(String),
    /// The driver refused a step; nothing changed.
    Failed(String),
    /// A request this channel does not know.
    BadRequest(String),
    /// Another user asked.
    Refused(String),
}

impl Refusal {
    /// The kind word and the text.
    pub fn parts(&self) -> (&'static str, String) {
        match self {
            Refusal::NoPool => (
                "no-pool",
                "the program has made no allocation through cudamem's pool yet: nothing to pause"
                    .into(),
            ),
            Refusal::AlreadyPaused => ("already-paused", "the program is paused already".into()),
            Refusal::NotPaused => ("not-paused", "the program is not paused".into()),
            Refusal::NoRoom(why) => ("no-room", why.clone()),
            Refusal::Busy(why) => ("busy", why.clone()),
            Refusal::Failed(why) => ("failed", why.clone()),
            Refusal::BadRequest(why) => ("bad-request", why.clone()),
            Refusal::Refused(why) => ("refused", why.clone()),
        }
    }

    /// The C ABI's status for it.
    fn status(&self) -> c_int {
        match self {
            Refusal::NoPool => 1,
            Refusal::AlreadyPaused => 2,
            Refusal::NotPaused => 3,
            Refusal::NoRoom(_) => 4,
            Refusal::Busy(_) => 5,
            Refusal::Failed(_) => 6,
            Refusal::BadRequest(_) | Refusal::Refused(_) => 7,
        }
    }
}

/// The pause in force, if any.
static PAUSED: Mutex<Option<Paused>> = Mutex::new(None);

fn paused() -> MutexGuard<'static, Option<Paused>> {
    PAUSED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Pause the program's pool; the answer's text.
pub fn pause_now(discard: Discard) -> Result<String, Refusal> {
    let served = pool::get().ok_or(Refusal::NoPool)?;
    let mut state = paused();
    if state.is_some() {
        return Err(Refusal::AlreadyPaused);
    }
    gate::shut(SHUT_WAIT).map_err(|still| {
        Refusal::Busy(format!(
            "{} thread(s) stayed inside a driver call for {} s; nothing was paused",
            still.threads,
            SHUT_WAIT.as_secs()
        ))
    })?;
    let done = read::with_context(served.context as *mut _, || pause::pause(served, discard));
    match done {
        Some(Ok(made)) => {
            let text = format!(
                "{}{}",
                ledger::pause_text(&made.report),
                ledger::render(Some(&made.report))
            );
            *state = Some(made);
            Ok(text)
        }
        Some(Err(error)) => {
            gate::open();
            Err(Refusal::Failed(format!(
                "the pause failed, nothing is paused: {error}"
            )))
        }
        None => {
            gate::open();
            Err(Refusal::Failed(
                "the program's context cannot be made current; nothing is paused".into(),
            ))
        }
    }
}

/// Resume the paused pool; the answer's text.
pub fn resume_now() -> Result<String, Refusal> {
    let served = pool::get().ok_or(Refusal::NoPool)?;
    let mut state = paused();
    let made = state.take().ok_or(Refusal::NotPaused)?;
    let done = read::with_context(served.context as *mut _, || pause::resume(served, made));
    match done {
        Some(Ok(report)) => {
            gate::open();
            Ok(ledger::resume_text(&report))
        }
        Some(Err(refused)) => {
            let why = format!(
                "the device has no room to map the {} paused back ({} free; {}); the program stays paused, resume again once memory is free",
                memcore::bytes::human(refused.needed),
                memcore::bytes::human(refused.free),
                refused.error
            );
            *state = Some(refused.paused);
            Err(Refusal::NoRoom(why))
        }
        None => Err(Refusal::Failed(
            "the program's context cannot be made current; it stays paused".into(),
        )),
    }
}

/// The residency ledger now.
pub fn ledger_now() -> Result<String, Refusal> {
    pool::get().ok_or(Refusal::NoPool)?;
    let state = paused();
    Ok(ledger::render(state.as_ref().map(|p| &p.report)))
}

/// Answer one request line.
pub fn answer(line: &str) -> Result<String, Refusal> {
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or("");
    let rest: Vec<&str> = words.collect();
    match verb {
        "pause" => {
            let mut discard = Discard::default();
            for word in rest {
                match word {
                    "discard=all" => discard.all = true,
                    "discard=free-cache" => {}
                    other => {
                        return Err(Refusal::BadRequest(format!(
                            "unknown pause option {other:?} (known: discard=all, discard=free-cache)"
                        )));
                    }
                }
            }
            pause_now(discard)
        }
        "resume" if rest.is_empty() => resume_now(),
        "ledger" if rest.is_empty() => ledger_now(),
        "status" if rest.is_empty() => Ok(if paused().is_some() {
            "paused\n".into()
        } else {
            "running\n".into()
        }),
        _ => Err(Refusal::BadRequest(format!(
            "unknown request {:?} (known: pause, resume, ledger, status)",
            line.chars().take(80).collect::<String>()
        ))),
    }
}

/// Whether a peer of user `peer` may control a program of user `own`.
pub fn allowed(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}

/// The user id of the peer of a connected socket.
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, ours.
    let done = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (done == 0).then_some(cred.uid)
}

fn serve(stream: UnixStream) {
    // SAFETY: geteuid cannot fail.
    let own = unsafe { libc::geteuid() };
    // The request is read whoever sent it, so that a refused peer reads
    // the refusal rather than a closed connection.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let read = BufReader::new((&stream).take(4096)).read_line(&mut line);
    let reply = match peer_uid(&stream) {
        Some(peer) if allowed(peer, own) => match read {
            Ok(_) => answer(line.trim()),
            Err(error) => Err(Refusal::BadRequest(format!("reading the request: {error}"))),
        },
        Some(peer) => Err(Refusal::Refused(format!(
            "user {peer} may not control a program of user {own}"
        ))),
        None => Err(Refusal::Refused(
            "the peer's credentials cannot be read".into(),
        )),
    };
    let text = match reply {
        Ok(text) => format!("ok\n{text}"),
        Err(refusal) => {
            let (kind, why) = refusal.parts();
            format!("error {kind}\n{why}\n")
        }
    };
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let _ = (&stream).write_all(text.as_bytes());
}

/// Whether `dir` is a folder only its owner, this user, can enter, and no
/// symbolic link.
fn safe_dir(dir: &std::path::Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: geteuid cannot fail.
    let own = unsafe { libc::geteuid() };
    if !meta.file_type().is_dir() {
        return Err(format!(
            "{} is not a folder (or is a symbolic link)",
            dir.display()
        ));
    }
    if meta.uid() != own {
        return Err(format!(
            "{} belongs to user {}, not {own}",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!("{} is open to other users", dir.display()));
    }
    Ok(())
}

static STARTED: OnceLock<()> = OnceLock::new();

/// Start the control channel once (when the pool is made): arm the gate,
/// and listen on the run's control folder if there is one.
pub fn start() {
    STARTED.get_or_init(|| {
        gate::arm();
        let Some(dir) = std::env::var_os(CONTROL_DIR_VAR).filter(|d| !d.is_empty()) else {
            return;
        };
        let dir = PathBuf::from(dir);
        if let Err(why) = safe_dir(&dir) {
            eprintln!("cudamem: no pause control for this process: {why}");
            return;
        }
        let path = dir.join(format!("{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = match UnixListener::bind(&path) {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!(
                    "cudamem: no pause control for this process: {}: {error}",
                    path.display()
                );
                return;
            }
        };
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
        let spawned = std::thread::Builder::new()
            .name("cudamem-control".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    serve(stream);
                }
            });
        if let Err(error) = spawned {
            eprintln!("cudamem: no pause control for this process: {error}");
        }
    });
}

/// Run `f` without letting a panic cross the C boundary.
fn guarded(f: impl FnOnce() -> Result<String, Refusal>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(text)) => {
            *last_text() = text;
            0
        }
        Ok(Err(refusal)) => {
            let (kind, why) = refusal.parts();
            *last_text() = format!("{kind}: {why}\n");
            refusal.status()
        }
        Err(_) => 6,
    }
}

fn last_text() -> MutexGuard<'static, String> {
    static LAST: Mutex<String> = Mutex::new(String::new());
    LAST.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Pause this process's pooled device memory. `options`: NULL or a C
/// string of words as `cudamem pause` sends them (`discard=all`). Returns
/// 0, or 1 no pool, 2 paused already, 5 a thread stayed in a driver call, 6
/// failed (nothing paused), 7 bad options. The thread that pauses must make
/// no driver call until it resumes (it would wait at the gate).
///
/// # Safety
/// `options` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_pause(options: *const c_char) -> c_int {
    let words = if options.is_null() {
        String::new()
    } else {
        // SAFETY: the caller passes a C string.
        unsafe { CStr::from_ptr(options) }
            .to_string_lossy()
            .into_owned()
    };
    guarded(|| answer(&format!("pause {words}")))
}

/// Resume this process's paused memory. Returns 0, or 1 no pool, 3 not
/// paused, 4 no room on the device (still paused), 6 failed.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_resume() -> c_int {
    guarded(resume_now)
}

/// Write the text of the last pause or resume (or, when `ledger` is
/// non-zero, the residency ledger now) into `buf` of `len` bytes,
/// NUL-terminated; returns the full length (without the NUL).
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_ledger(buf: *mut c_char, len: usize, ledger: c_int) -> usize {
    let text = std::panic::catch_unwind(|| {
        if ledger != 0 {
            ledger_now().unwrap_or_else(|refusal| refusal.parts().1)
        } else {
            last_text().clone()
        }
    })
    .unwrap_or_default();
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: the caller gives `len` writable bytes; n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_user_or_root_may_control() {
        assert!(allowed(1000, 1000));
        assert!(allowed(0, 1000));
        assert!(!allowed(65534, 1000));
        assert!(!allowed(1001, 0));
    }

    #[test]
    fn bad_requests_are_named() {
        for line in ["", "frobnicate", "resume now", "pause discard=some"] {
            let (kind, why) = answer(line).unwrap_err().parts();
            assert_eq!(kind, "bad-request", "{line}: {why}");
        }
        // No pool in this test process.
        assert_eq!(answer("ledger").unwrap_err(), Refusal::NoPool);
        assert_eq!(answer("pause").unwrap_err(), Refusal::NoPool);
    }

    #[test]
    fn a_folder_open_to_others_or_a_link_is_refused() {
        let base = std::env::temp_dir().join(format!("cudamem-ctl-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(safe_dir(&base).is_ok());
        let link = base.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&base, &link).unwrap();
        assert!(safe_dir(&link).unwrap_err().contains("symbolic link"));
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(safe_dir(&base).unwrap_err().contains("open to other users"));
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }
}
