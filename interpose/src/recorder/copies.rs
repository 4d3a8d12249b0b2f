//! Copies of the process: `fork` (its handlers hold the lock across it, and
//! the child starts a log of its own on its first record) and copies that
//! no handler saw (a raw `clone` without `CLONE_VM`, noticed through
//! [`crate::thread::take_copy`]), which start a log of their own too, and
//! never write their parent's.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::{FORKED, LAST_PROGRAM_READ, LIVE_HANDLES, LOG, START_NS, STATE, State, hot};
use crate::stop::stop_quietly;
use crate::thread::{forget_thread_id, take_copy};

/// `pthread_atfork` prepare: hold the lock across `fork`, so the child's
/// copy of the state is whole.
pub fn before_fork() {
    // A copy no handler saw, forking before any record: its lock may be
    // held by a thread it does not have.
    copy_check();
    STATE.hold();
}

/// `pthread_atfork` parent: release it.
pub fn after_fork_parent() {
    STATE.release_held();
}

/// `pthread_atfork` child: release it, and start over on the first record
/// (a child forked by a handler that interrupted a record records nothing).
pub fn after_fork_child() {
    forget_thread_id();
    forget_program_reads();
    // SAFETY: the child's one thread, in its fork handler.
    unsafe { hot::forget_all() };
    // Records are stamped from the child's own start, once it has one.
    START_NS.store(0, Ordering::Release);
    FORKED.store(true, Ordering::Release);
    if !STATE.release_held() {
        stop_quietly();
    }
}

fn forget_program_reads() {
    for last in &LAST_PROGRAM_READ {
        last.store(u64::MAX, Ordering::Relaxed);
    }
}

/// Before anything is recorded: where this process is a copy no `fork`
/// handler saw, give it a state and a log of its own. Its parent's state
/// is left as it was, never dropped (memory the parent's other threads
/// allocated may belong to an allocator arena whose lock one of them held
/// at the copy); its lock, held by one of those threads, is replaced.
#[inline(always)]
pub(super) fn copy_check() {
    if take_copy() {
        adopt_copy();
    }
}

#[cold]
#[inline(never)]
fn adopt_copy() {
    forget_program_reads();
    START_NS.store(0, Ordering::Release);
    LIVE_HANDLES.store(0, Ordering::Relaxed);
    FORKED.store(false, Ordering::Release);
    // SAFETY: the copy's one thread (a process copy starts with the copying
    // thread alone).
    unsafe { hot::forget_all() };
    if STATE.held_here() {
        // Copied by a signal handler that interrupted a record of this
        // thread: nothing can be recorded safely.
        stop_quietly();
        return;
    }
    match STATE.try_lock() {
        Some(mut guard) => {
            // Free at the copy: the parent's state is whole. Its libraries
            // keep the ids the caller table hands out.
            let parent = guard.take();
            let (libraries, names) = match &parent {
                Some(parent) => (parent.libraries.clone(), parent.names.clone()),
                None => (Vec::new(), HashMap::new()),
            };
            let had_state = parent.is_some();
            if let Some(mut parent) = parent {
                if let Some(log) = parent.log.take() {
                    LOG.store(std::ptr::null_mut(), Ordering::Release);
                    log.close();
                }
                std::mem::forget(parent);
            }
            if had_state {
                *guard = Some(State::new(libraries, names));
            }
        }
        None => {
            // Held by a thread this copy does not have.
            // SAFETY: this is the copy's one thread (a process copy starts
            // with the copying thread alone), and it holds no guard of the
            // lock (checked above).
            unsafe { STATE.replace_abandoned(None) };
            crate::caller::forget_libraries();
        }
    }
}
