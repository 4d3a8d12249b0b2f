//! The interposer's locks (the recorder's, and the log's growth lock): a mutex (waiters sleep rather than spin,
//! which matters when more threads allocate than there are cores) that
//! knows whether this thread holds it, plus what `fork` and signal handlers need
//! of it: holding it across `fork` (taken in `pthread_atfork`'s prepare
//! handler, released in the parent's and the child's, all on the forking
//! thread), and never waiting for it on the thread that holds it (a signal
//! handler, or an `exit` called from one, that interrupted a record).

use std::cell::{Cell, RefCell, UnsafeCell};
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

/// A value behind the interposer's lock.
pub struct Lock<T: 'static> {
    /// In a cell so that a process copy whose holder is gone (a raw
    /// `clone`, which runs no `fork` handler) can put a fresh one in its
    /// place ([`Lock::replace_abandoned`]).
    inner: UnsafeCell<Mutex<T>>,
}

// SAFETY: the mutex is shared as a `Mutex<T>` is; the cell is written only
// by `replace_abandoned`, whose caller is the process's one thread with no
// reference to the mutex alive.
unsafe impl<T: Send> Sync for Lock<T> {}

/// Locks one thread may hold at once (the recorder's, then the log's
/// growth lock inside it).
const NESTED: usize = 4;

thread_local! {
    /// The locks this thread is taking or holds (their addresses; 0: a free
    /// slot), each set before the mutex is asked for and cleared after it
    /// is let go, so that a signal handler never waits for a lock its own
    /// thread is in the middle of taking or releasing.
    static MINE: Cell<[usize; NESTED]> = const { Cell::new([0; NESTED]) };
}

/// Note `key` as taken by this thread; `false` when every slot is in use.
fn note(key: usize) -> bool {
    MINE.with(|mine| {
        let mut keys = mine.get();
        match keys.iter().position(|&slot| slot == 0) {
            Some(free) => {
                keys[free] = key;
                mine.set(keys);
                true
            }
            None => false,
        }
    })
}

/// Forget `key` as taken by this thread.
fn forget(key: usize) {
    MINE.with(|mine| {
        let mut keys = mine.get();
        if let Some(at) = keys.iter().position(|&slot| slot == key) {
            keys[at] = 0;
            mine.set(keys);
        }
    });
}

/// The lock, held.
pub struct Guard<'a, T: 'static> {
    guard: ManuallyDrop<MutexGuard<'a, T>>,
    key: usize,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here; the field is not used again.
        unsafe { ManuallyDrop::drop(&mut self.guard) };
        forget(self.key);
    }
}

impl<T: 'static> Lock<T> {
    /// An unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self {
            inner: UnsafeCell::new(Mutex::new(value)),
        }
    }

    fn mutex(&self) -> &Mutex<T> {
        // SAFETY: the cell is only written by `replace_abandoned`, while no
        // reference from here is alive (its contract).
        unsafe { &*self.inner.get() }
    }

    /// Put a fresh, unlocked lock holding `value` in place of this one,
    /// never dropping what was there (its holder may have been changing
    /// it, and its memory may belong to an allocator arena whose lock that
    /// holder had).
    ///
    /// # Safety
    ///
    /// Only in a process copy made without `fork`'s handlers, by its one
    /// thread, while that thread holds no guard of this lock and no other
    /// reference to it is alive: the lock's holder, if any, is a thread
    /// the copy does not have.
    pub unsafe fn replace_abandoned(&self, value: T) {
        // SAFETY: the caller's contract: nothing else reads or writes the
        // cell meanwhile; the old value is forgotten, not dropped.
        unsafe { std::ptr::write(self.inner.get(), Mutex::new(value)) };
    }

    fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Whether this thread holds it, or is taking or releasing it (then
    /// waiting for it might never end).
    pub fn held_here(&self) -> bool {
        let key = self.key();
        MINE.with(Cell::get).contains(&key)
    }

    fn guard<'a>(&'a self, guard: MutexGuard<'a, T>) -> Guard<'a, T> {
        Guard {
            guard: ManuallyDrop::new(guard),
            key: self.key(),
        }
    }

    /// Take the lock, waiting as long as another thread holds it; `None`
    /// when this thread holds it already (a signal handler re-entered the
    /// interposer while the interrupted code held it). A holder that
    /// panicked left the value as it was; it is used as it is.
    pub fn lock(&self) -> Option<Guard<'_, T>> {
        if self.held_here() || !note(self.key()) {
            return None;
        }
        let guard = self.mutex().lock().unwrap_or_else(PoisonError::into_inner);
        Some(self.guard(guard))
    }

    /// Take the lock if it is free now.
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        if self.held_here() || !note(self.key()) {
            return None;
        }
        match self.mutex().try_lock() {
            Ok(guard) => Some(self.guard(guard)),
            Err(TryLockError::Poisoned(poisoned)) => Some(self.guard(poisoned.into_inner())),
            Err(TryLockError::WouldBlock) => {
                forget(self.key());
                None
            }
        }
    }

    /// Take the lock, waiting at most `limit` for another thread to let it
    /// go (the exit path and signal handlers: the holder may be stopped,
    /// or waiting on something this thread holds); `None` when this thread
    /// holds it or the time ran out.
    pub fn lock_within(&self, limit: Duration) -> Option<Guard<'_, T>> {
        let _no_cancel = crate::thread::NoCancel::hold();
        let start = Instant::now();
        loop {
            if let Some(guard) = self.try_lock() {
                return Some(guard);
            }
            if self.held_here() || start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

thread_local! {
    /// The guard held across a `fork` by the forking thread.
    static ACROSS_FORK: RefCell<Option<Box<dyn std::any::Any>>> = const { RefCell::new(None) };
    /// Whether this thread's prepare handler found the lock held by itself.
    static NOT_HELD: Cell<bool> = const { Cell::new(false) };
}

impl<T: Send + 'static> Lock<T> {
    /// Take the lock and keep it on this thread until [`Lock::release_held`]
    /// (`pthread_atfork` prepare). Returns false when this thread holds it
    /// already (a `fork` from a signal handler that interrupted a record):
    /// then nothing is taken, and the child's copy stays locked.
    pub fn hold(&'static self) -> bool {
        match self.lock() {
            Some(guard) => {
                ACROSS_FORK.with(|held| *held.borrow_mut() = Some(Box::new(guard)));
                NOT_HELD.with(|flag| flag.set(false));
                true
            }
            None => {
                NOT_HELD.with(|flag| flag.set(true));
                false
            }
        }
    }

    /// Release what [`Lock::hold`] took (`pthread_atfork` parent and child:
    /// in the child this thread is the only one, so nothing waits). Returns
    /// false when `hold` took nothing.
    pub fn release_held(&'static self) -> bool {
        let held = ACROSS_FORK.with(|held| held.borrow_mut().take());
        drop(held);
        !NOT_HELD.with(Cell::get)
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
                        *COUNTER.lock().unwrap() += 1;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(*COUNTER.lock().unwrap(), 80_000);
        assert!(COUNTER.hold());
        let other = std::thread::spawn(|| {
            COUNTER.try_lock().is_none() && COUNTER.lock_within(Duration::from_millis(5)).is_none()
        });
        assert!(other.join().unwrap());
        COUNTER.release_held();
        assert_eq!(*COUNTER.try_lock().unwrap(), 80_000);
    }

    #[test]
    fn the_holding_thread_is_refused_rather_than_left_waiting() {
        static OWN: Lock<u8> = Lock::new(0);
        let guard = OWN.lock().unwrap();
        assert!(OWN.held_here());
        assert!(OWN.lock().is_none());
        assert!(OWN.try_lock().is_none());
        assert!(OWN.lock_within(Duration::from_secs(5)).is_none());
        drop(guard);
        assert!(!OWN.held_here());
        assert!(OWN.lock().is_some());
    }

    #[test]
    fn a_lock_held_by_a_thread_that_is_gone_can_be_replaced() {
        static ABANDONED: Lock<u8> = Lock::new(1);
        std::thread::spawn(|| std::mem::forget(ABANDONED.lock().unwrap()))
            .join()
            .unwrap();
        assert!(ABANDONED.try_lock().is_none());
        // SAFETY: the holder is gone and this thread holds no guard (as in
        // a process copy whose other threads are gone).
        unsafe { ABANDONED.replace_abandoned(2) };
        assert_eq!(*ABANDONED.try_lock().unwrap(), 2);
    }
}
