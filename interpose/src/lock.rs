//! The one lock of the interposer: a mutex (waiters sleep rather than spin,
//! which matters when more threads allocate than there are cores), plus
//! what `fork` and signal handlers need of it: holding it across `fork`
//! (taken in `pthread_atfork`'s prepare handler, released in the parent's
//! and the child's, all on the forking thread), and taking it without
//! waiting.

use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// A value behind the interposer's lock.
pub struct Lock<T: 'static> {
    inner: Mutex<T>,
}

impl<T: 'static> Lock<T> {
    /// An unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self {
            inner: Mutex::new(value),
        }
    }

    /// Take the lock, waiting as long as it takes. A holder that panicked
    /// (none should) left the value as it was; it is used as it is.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take the lock if it is free now (a signal handler may have
    /// interrupted its holder, on this very thread: then it never is).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.inner.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

thread_local! {
    /// The guard held across a `fork` by the forking thread.
    static ACROSS_FORK: RefCell<Option<Box<dyn std::any::Any>>> = const { RefCell::new(None) };
}

impl<T: Send + 'static> Lock<T> {
    /// Take the lock and keep it on this thread until [`Lock::release_held`]
    /// (`pthread_atfork` prepare).
    pub fn hold(&'static self) {
        let guard = self.lock();
        ACROSS_FORK.with(|held| *held.borrow_mut() = Some(Box::new(guard)));
    }

    /// Release what [`Lock::hold`] took (`pthread_atfork` parent and child:
    /// in the child this thread is the only one, so nothing waits).
    pub fn release_held(&'static self) {
        let held = ACROSS_FORK.with(|held| held.borrow_mut().take());
        drop(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static COUNTER: Lock<u64> = Lock::new(0);

    #[test]
    fn threads_take_turns_and_a_held_lock_is_not_taken_without_waiting() {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        *COUNTER.lock() += 1;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(*COUNTER.lock(), 80_000);
        COUNTER.hold();
        let other = std::thread::spawn(|| COUNTER.try_lock().is_none());
        assert!(other.join().unwrap());
        COUNTER.release_held();
        assert_eq!(*COUNTER.try_lock().unwrap(), 80_000);
    }
}
