//! The one lock of the interposer: a spin lock whose raw acquire and
//! release `fork` handlers can split across `pthread_atfork`'s prepare and
//! parent/child calls (a `std::sync::Mutex` guard cannot be held that way),
//! and whose try-acquire a signal handler can use without blocking.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A value behind a spin lock. Holders keep it for a record's worth of
/// work; waiters spin a little, then yield.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and a guard exists
// only while `locked` is held by its thread: one thread at a time.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// An unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    fn try_acquire(&self) -> bool {
        self.locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Take the lock, waiting as long as it takes.
    pub fn lock(&self) -> Guard<'_, T> {
        self.acquire_raw();
        Guard { lock: self }
    }

    /// Take the lock if it comes within `tries` attempts (a signal handler
    /// may have interrupted its own holder: then it never comes).
    pub fn try_lock_for(&self, tries: u32) -> Option<Guard<'_, T>> {
        for _ in 0..tries {
            if self.try_acquire() {
                return Some(Guard { lock: self });
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Take the lock with no guard: for `pthread_atfork`'s prepare handler,
    /// released by [`SpinLock::release_raw`] in the parent and child.
    pub fn acquire_raw(&self) {
        let mut spins = 0u32;
        while !self.try_acquire() {
            spins += 1;
            if spins < 128 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Release a lock taken by [`SpinLock::acquire_raw`] (in a forked child
    /// this is the only thread, so whoever took it is gone or is this one).
    pub fn release_raw(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// The lock held; released on drop.
pub struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock, so no other reference to the
        // value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only use
        // of the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.release_raw();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_take_turns() {
        let lock = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(*lock.lock(), 80_000);
    }

    #[test]
    fn a_held_lock_is_not_taken_by_a_bounded_try() {
        let lock = SpinLock::new(1);
        let held = lock.lock();
        assert!(lock.try_lock_for(100).is_none());
        drop(held);
        assert_eq!(*lock.try_lock_for(1).unwrap(), 1);
    }
}
