//! A global allocator that counts, per thread, the bytes allocated and not
//! yet freed and their peak, so a test bounds what a call allocates (what a
//! hostile input can make a reader take) by counting, in process. A test
//! binary installs it with
//! `#[global_allocator] static COUNTING: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counted.
pub struct Counting;

thread_local! {
    /// Bytes this thread allocated and has not freed (frees of another
    /// thread's blocks can take it below zero).
    static LIVE: Cell<i64> = const { Cell::new(0) };
    /// The most `LIVE` has been since the last [`peak_during`] began.
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

/// Count `bytes` more (or fewer) live on this thread. Const-initialised
/// thread-locals never allocate, so counting cannot recurse; during thread
/// teardown they may be gone, and the change is not counted.
fn count(bytes: i64) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + bytes;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

// SAFETY: every call goes to the system allocator with the caller's
// arguments unchanged, so `System`'s guarantees are the caller's; counting
// only reads the sizes.
unsafe impl GlobalAlloc for Counting {
    /// # Safety
    ///
    /// [`GlobalAlloc::alloc`]'s: `layout` has a non-zero size.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract, which is System's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(signed(layout.size()));
        }
        ptr
    }

    /// # Safety
    ///
    /// [`GlobalAlloc::dealloc`]'s: `ptr` is a block this allocator handed
    /// out with `layout`, not freed since.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from System, with
        // `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) };
        count(-signed(layout.size()));
    }

    /// # Safety
    ///
    /// [`GlobalAlloc::realloc`]'s: `ptr` as for `dealloc`, `new_size`
    /// non-zero and, rounded up to `layout`'s alignment, at most
    /// `isize::MAX`.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and the caller upholds `realloc`'s
        // contract on `new_size`.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            count(signed(new_size) - signed(layout.size()));
        }
        moved
    }
}

/// `f`'s result, and the most bytes the calling thread held allocated at
/// once while it ran, above what it held before.
pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(start));
    let result = f();
    let peak = PEAK.with(Cell::get);
    (result, u64::try_from(peak - start).unwrap_or(0))
}
