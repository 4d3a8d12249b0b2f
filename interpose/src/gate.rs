//! The gate every wrapped driver call passes: while a pause holds it shut,
//! a program thread that makes a driver call waits there, holding nothing
//! of ours, until the resume opens it. A pause shuts it and then waits
//! until no thread is inside a wrapped call any more.
//!
//! Costs one atomic load per call while no control channel is open (a run
//! without `--pool`), and one increment and decrement of a shared counter
//! with it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Whether the gate is in use at all (a pause is possible in this
/// process): 0 not known yet, 1 no, 2 yes.
static ARMED: AtomicU8 = AtomicU8::new(0);
/// Shut: threads wait at their next driver call.
static SHUT: AtomicBool = AtomicBool::new(false);
/// Threads inside a wrapped call now.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Where waiting threads sleep; the flag mirrors [`SHUT`] under the lock.
static WAITING: Mutex<bool> = Mutex::new(false);
static OPENED: Condvar = Condvar::new();

thread_local! {
    /// This thread is inside a wrapped call already (the driver calling an
    /// export of its own, or the thread that paused).
    static PASSING: Cell<bool> = const { Cell::new(false) };
}

/// A thread's passage through the gate; dropped when it leaves the call.
pub struct Pass(());

impl Drop for Pass {
    fn drop(&mut self) {
        PASSING.with(|passing| passing.set(false));
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Turn the gate on (a pause is possible in this process).
pub fn arm() {
    ARMED.store(2, Ordering::Release);
}

/// Whether the gate is on: from the first wrapped call on when the pool
/// serves this process, so that every call is counted.
fn armed() -> bool {
    match ARMED.load(Ordering::Relaxed) {
        2 => true,
        1 => false,
        _ => {
            let on = crate::pool::enabled();
            let _ = ARMED.compare_exchange(
                0,
                if on { 2 } else { 1 },
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            ARMED.load(Ordering::Acquire) == 2
        }
    }
}

/// Pass the gate at the start of a wrapped call: waits while it is shut.
/// `None` where there is no gate, or this thread is inside a call already.
pub fn pass() -> Option<Pass> {
    if !armed() {
        return None;
    }
    if PASSING.with(Cell::get) {
        return None;
    }
    loop {
        INSIDE.fetch_add(1, Ordering::SeqCst);
        if !SHUT.load(Ordering::SeqCst) {
            PASSING.with(|passing| passing.set(true));
            return Some(Pass(()));
        }
        INSIDE.fetch_sub(1, Ordering::SeqCst);
        let mut shut = WAITING.lock().unwrap_or_else(PoisonError::into_inner);
        while *shut {
            shut = OPENED.wait(shut).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Why the gate could not be shut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StillInside {
    /// Threads still inside a driver call when the wait ended.
    pub threads: usize,
}

/// Shut the gate and wait (up to `wait`) until no thread is inside a wrapped
/// call; on a timeout the gate is opened again.
pub fn shut(wait: Duration) -> Result<(), StillInside> {
    *WAITING.lock().unwrap_or_else(PoisonError::into_inner) = true;
    SHUT.store(true, Ordering::SeqCst);
    let start = Instant::now();
    loop {
        // This thread may itself be inside a call (an in-process pause
        // from a wrapped call is not possible: the C ABI is not wrapped).
        let inside = INSIDE.load(Ordering::SeqCst);
        if inside == 0 {
            return Ok(());
        }
        if start.elapsed() >= wait {
            open();
            return Err(StillInside { threads: inside });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Open the gate: waiting threads go on.
pub fn open() {
    let mut shut = WAITING.lock().unwrap_or_else(PoisonError::into_inner);
    SHUT.store(false, Ordering::SeqCst);
    *shut = false;
    OPENED.notify_all();
}

/// Whether the gate is shut now.
#[cfg(test)]
pub fn is_shut() -> bool {
    SHUT.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_shut_gate_holds_callers_until_opened_and_waits_for_those_inside() {
        arm();
        let done = Arc::new(AtomicU64::new(0));
        // One thread inside a call while the gate shuts: shut waits for it.
        let inside = {
            let done = done.clone();
            std::thread::spawn(move || {
                let pass = pass();
                assert!(pass.is_some());
                std::thread::sleep(Duration::from_millis(50));
                done.fetch_add(1, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(10));
        shut(Duration::from_secs(5)).unwrap();
        assert_eq!(
            done.load(Ordering::SeqCst),
            1,
            "shut returned with a thread inside"
        );
        inside.join().unwrap();
        // A caller now waits.
        let waiter = {
            let done = done.clone();
            std::thread::spawn(move || {
                let _pass = pass();
                done.fetch_add(10, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            done.load(Ordering::SeqCst),
            1,
            "a caller passed a shut gate"
        );
        open();
        waiter.join().unwrap();
        assert_eq!(done.load(Ordering::SeqCst), 11);
        // A thread that never leaves: shut gives up and opens again.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let stuck = std::thread::spawn(move || {
            let _pass = pass();
            rx.recv().unwrap();
        });
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(
            shut(Duration::from_millis(30)),
            Err(StillInside { threads: 1 })
        );
        assert!(!is_shut());
        tx.send(()).unwrap();
        stuck.join().unwrap();
    }
}
