//! What allocations and frees change, kept where threads do not meet: the
//! live blocks in a table split by address into shards, each behind its
//! own lock (a free finds the block whichever thread allocated it, and two
//! threads rarely want the same shard), and the live device bytes counted
//! per thread, added to a shared figure only in steps of [`STEP`] bytes or
//! when they may make a new peak. A thread that allocates and frees the
//! same few blocks writes nothing another thread reads.
//!
//! The recorder's [`Accounting`] holds everything else; [`with_blocks`]
//! puts the blocks in a copy of it when an explanation or a pause needs
//! the whole.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::hash::{BuildHasher as _, BuildHasherDefault};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use trace::event::{Call, Event, Record};
use trace::process::Accounting;
use trace::process::accounting::AddressHasher;

/// A live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotBlock {
    /// Bytes asked for.
    pub size: u64,
    /// The calling library's id.
    pub caller: u32,
    /// The call that made it.
    pub call: Call,
}

type Map = HashMap<u64, HotBlock, BuildHasherDefault<AddressHasher>>;

const SHARDS: usize = 256;

/// One shard, on cache lines of its own. In a cell so that a process copy
/// whose other threads are gone (one of them may have held the lock) can
/// start with an empty one.
#[repr(align(128))]
struct Shard(UnsafeCell<Mutex<Map>>);

// SAFETY: shared as a `Mutex<Map>` is; the cell is written only by
// `forget_all`, whose caller is the process's one thread.
unsafe impl Sync for Shard {}

static TABLE: [Shard; SHARDS] = [const {
    Shard(UnsafeCell::new(Mutex::new(HashMap::with_hasher(
        BuildHasherDefault::new(),
    ))))
}; SHARDS];

/// Pinned host blocks are keyed apart from device ones.
const HOST_KEY: u64 = 1 << 63;

/// Live device bytes are shared in steps of this many bytes.
pub const STEP: i64 = 64 << 10;

/// Live device bytes of the blocks, as shared so far.
static SHARED: AtomicI64 = AtomicI64::new(0);
/// The highest live device bytes the recorder has seen (the hot paths go
/// to the recorder when they may pass it).
static PEAK: AtomicU64 = AtomicU64::new(0);
/// A peak waits to be read before live bytes shrink.
static PEAK_PENDING: AtomicBool = AtomicBool::new(false);

/// This thread's change to live device bytes not shared yet; shared when
/// the thread ends.
struct Unshared(Cell<i64>);

impl Drop for Unshared {
    fn drop(&mut self) {
        SHARED.fetch_add(self.0.replace(0), Ordering::Relaxed);
    }
}

thread_local! {
    static UNSHARED: Unshared = const { Unshared(Cell::new(0)) };
    /// This thread is inside a shard (a signal handler that interrupted it
    /// leaves the table alone rather than waiting for ever).
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

fn key(call: Call, ptr: u64) -> u64 {
    if call.is_host() {
        ptr | HOST_KEY
    } else {
        ptr & !HOST_KEY
    }
}

fn shard(key: u64) -> &'static Mutex<Map> {
    let hash = BuildHasherDefault::<AddressHasher>::new().hash_one(key);
    // SAFETY: the cell is written only by `forget_all` (its contract).
    unsafe { &*TABLE[(hash >> 56) as usize % SHARDS].0.get() }
}

/// Run `f` on the shard of `key`; `None` where this thread is inside one
/// already.
fn in_shard<R>(key: u64, f: impl FnOnce(&mut Map) -> R) -> Option<R> {
    inside(shard(key), f)
}

/// Run `f` on `shard`, locked; `None` where this thread is inside a shard
/// already.
fn inside<R>(shard: &Mutex<Map>, f: impl FnOnce(&mut Map) -> R) -> Option<R> {
    if INSIDE.with(|inside| inside.replace(true)) {
        return None;
    }
    let result = {
        let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut map)
    };
    INSIDE.with(|inside| inside.set(false));
    Some(result)
}

/// What an allocation or free changed in live device bytes: `true` when
/// the recorder should look for a new peak.
fn changed(delta: i64) -> bool {
    let peak = PEAK.load(Ordering::Relaxed) as i64;
    let shared = UNSHARED.try_with(|unshared| {
        let mine = unshared.0.get() + delta;
        let may_peak = delta > 0 && SHARED.load(Ordering::Relaxed) + mine > peak;
        if may_peak || mine.abs() >= STEP {
            SHARED.fetch_add(mine, Ordering::Relaxed);
            unshared.0.set(0);
        } else {
            unshared.0.set(mine);
        }
        may_peak
    });
    // This thread's own count is gone (its destructors run): shared at once.
    shared.unwrap_or_else(|_| {
        let now = SHARED.fetch_add(delta, Ordering::Relaxed) + delta;
        delta > 0 && now > peak
    })
}

/// A block was allocated: `true` when the recorder should look for a new
/// peak.
pub fn allocated(call: Call, ptr: u64, size: u64, caller: u32) -> bool {
    let block = HotBlock { size, caller, call };
    let old = in_shard(key(call, ptr), |map| map.insert(key(call, ptr), block)).flatten();
    // The driver handed out a live pointer again: its free went by unseen.
    let gone = old
        .filter(|old| !old.call.is_host())
        .map_or(0, |old| old.size);
    !call.is_host() && changed(size as i64 - gone as i64)
}

/// A block is being freed: the block, if it was live.
pub fn freed(call: Call, ptr: u64) -> Option<HotBlock> {
    let block = in_shard(key(call, ptr), |map| map.remove(&key(call, ptr))).flatten()?;
    if !block.call.is_host() {
        changed(-(block.size as i64));
    }
    Some(block)
}

/// A free failed: `block` is live again.
pub fn restored(ptr: u64, block: HotBlock) {
    if in_shard(key(block.call, ptr), |map| {
        map.insert(key(block.call, ptr), block);
    })
    .is_some()
        && !block.call.is_host()
    {
        changed(block.size as i64);
    }
}

/// Whether a peak waits to be read before live bytes shrink.
pub fn peak_pending() -> bool {
    PEAK_PENDING.load(Ordering::Relaxed)
}

/// The recorder read (`false`) or left for later (`true`) a peak of `live`
/// bytes.
pub fn set_peak(live: u64, pending: bool) {
    PEAK.store(live, Ordering::Relaxed);
    PEAK_PENDING.store(pending, Ordering::Relaxed);
}

/// The pending peak was read.
pub fn peak_read() {
    PEAK_PENDING.store(false, Ordering::Relaxed);
}

/// Live device bytes of the blocks, as shared: within [`STEP`] bytes per
/// thread of the exact figure.
pub fn live_bytes() -> u64 {
    let mine = UNSHARED.try_with(|unshared| unshared.0.get()).unwrap_or(0);
    (SHARED.load(Ordering::Relaxed) + mine).max(0) as u64
}

/// `accounting` with every live block added, as the records that made them
/// would (a shard this thread is inside already is left out).
pub fn with_blocks(accounting: &Accounting) -> Accounting {
    let mut whole = accounting.clone();
    for shard in &TABLE {
        // SAFETY: as in `shard`.
        let shard = unsafe { &*shard.0.get() };
        let blocks: Vec<(u64, HotBlock)> = inside(shard, |map| {
            map.iter().map(|(&key, &block)| (key, block)).collect()
        })
        .unwrap_or_default();
        for (key, block) in blocks {
            whole.apply(&Record {
                time_ns: 0,
                thread: 0,
                event: Event::Alloc {
                    call: block.call,
                    ptr: key & !HOST_KEY,
                    size: block.size,
                    stream: 0,
                    caller: block.caller,
                    result: 0,
                },
            });
        }
    }
    whole
}

/// Start over with no blocks, nothing shared and no peak: a process copy
/// (its parent's blocks are not its own). The old shards are forgotten,
/// never dropped (a thread the copy does not have may have held one).
///
/// # Safety
///
/// Only in a process copy, by its one thread, outside every shard.
pub unsafe fn forget_all() {
    for shard in &TABLE {
        // SAFETY: the caller's contract: nothing else reads or writes the
        // cells meanwhile; the old value is forgotten, not dropped.
        unsafe {
            std::ptr::write(
                shard.0.get(),
                Mutex::new(HashMap::with_hasher(BuildHasherDefault::new())),
            )
        };
    }
    SHARED.store(0, Ordering::Relaxed);
    set_peak(0, false);
    let _ = UNSHARED.try_with(|unshared| unshared.0.set(0));
    INSIDE.with(|inside| inside.set(false));
}
