//! Private pools (CUDA graphs' and `MemPool`s) and their checkpoints.

use std::ffi::{c_int, c_void};

use super::{CUDAMEM_OK, fail, guarded, null, put, status};
use crate::pool_id::PoolId;
use crate::registry;

macro_rules! pool_call {
    ($($(#[$doc:meta])* $c:ident => $rust:ident;)*) => {
        $(
            $(#[$doc])*
            #[unsafe(no_mangle)]
            pub extern "C" fn $c(device: c_int, first: u64, second: u64) -> c_int {
                guarded(stringify!($c), || status(registry::$rust(device, PoolId(first, second))))
            }
        )*
    };
}

pool_call! {
    /// Allocations the C++ side's filter picks go to pool `(first, second)`
    /// (`beginAllocateToPool`); made if new, one more user.
    cudamem_begin_allocate_to_pool => begin_allocate_to_pool;
    /// Allocations stop going to the pool (`endAllocateToPool`).
    cudamem_end_allocate_to_pool => end_allocate_to_pool;
    /// One user of the pool fewer (`releasePool`).
    cudamem_release_pool => release_pool;
    /// One user of the pool more, made if new (`createOrIncrefPool`).
    cudamem_incref_pool => incref_pool;
}

/// Pool `(first, second)` serves the device pool's requests that find no memory
/// (`on` nonzero) or stops doing so (`setUseOnOOM`).
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_set_use_on_oom(
    device: c_int,
    first: u64,
    second: u64,
    on: c_int,
) -> c_int {
    guarded("cudamem_set_use_on_oom", || {
        status(registry::set_use_on_oom(
            device,
            PoolId(first, second),
            on != 0,
        ))
    })
}

/// Pool `(first, second)` hands each block whole segments of its own (`setNoSplit`).
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_set_no_split(device: c_int, first: u64, second: u64) -> c_int {
    guarded("cudamem_set_no_split", || {
        status(registry::set_no_split(device, PoolId(first, second)))
    })
}

/// Writes the use count of pool `(first, second)` to `*out`.
///
/// # Safety
///
/// `out` is null (refused) or writable for one `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_pool_use_count(
    device: c_int,
    first: u64,
    second: u64,
    out: *mut u32,
) -> c_int {
    guarded("cudamem_pool_use_count", || {
        match registry::pool_use_count(device, PoolId(first, second)) {
            // SAFETY: the caller's promise.
            Ok(count) => unsafe { put("cudamem_pool_use_count", out, count) },
            Err(error) => fail(&error),
        }
    })
}

/// Writes 1 to `*matches` when the live blocks of pool `(first, second)` are exactly
/// the `n` addresses at `ptrs`, else 0 (`checkPoolLiveAllocations`).
///
/// # Safety
///
/// `ptrs` is null with `n == 0`, or readable for `n` `uint64_t`s; `matches` is null
/// (refused) or writable for one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_check_pool_live(
    device: c_int,
    first: u64,
    second: u64,
    ptrs: *const u64,
    n: usize,
    matches: *mut c_int,
) -> c_int {
    guarded("cudamem_check_pool_live", || {
        let expected: &[u64] = if n == 0 {
            &[]
        } else if ptrs.is_null() {
            return null("cudamem_check_pool_live", "ptrs");
        } else {
            // SAFETY: not null, readable for `n` values by the caller's promise, and
            // not written while the slice lives.
            unsafe { std::slice::from_raw_parts(ptrs, n) }
        };
        match registry::check_pool_live(device, PoolId(first, second), expected) {
            // SAFETY: the caller's promise.
            Ok(ok) => unsafe { put("cudamem_check_pool_live", matches, c_int::from(ok)) },
            Err(error) => fail(&error),
        }
    })
}

/// Checkpoints pool `(first, second)` (`getCheckpointState`); writes its number.
///
/// # Safety
///
/// `out` is null (refused) or writable for one `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_checkpoint_pool(
    device: c_int,
    first: u64,
    second: u64,
    out: *mut u64,
) -> c_int {
    guarded("cudamem_checkpoint_pool", || {
        match registry::checkpoint_pool(device, PoolId(first, second)) {
            // SAFETY: the caller's promise.
            Ok(number) => unsafe { put("cudamem_checkpoint_pool", out, number) },
            Err(error) => fail(&error),
        }
    })
}

/// Forgets checkpoint `number` of `device`; an unknown number is an error.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_drop_checkpoint(device: c_int, number: u64) -> c_int {
    guarded("cudamem_drop_checkpoint", || {
        status(registry::drop_checkpoint(device, number))
    })
}

/// Receives the addresses a restore changed: `allocated` is 1 for a block handed out
/// again, 0 for a block freed.
pub type CudamemPtrSink = unsafe extern "C" fn(user: *mut c_void, allocated: c_int, ptr: u64);

/// Restores checkpoint `number` of `device` (`setCheckpointPoolState`), telling `sink`
/// every block freed, then every block handed out again.
///
/// # Safety
///
/// `sink` is a function that may be called with `user` (passed through untouched).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_restore_checkpoint(
    device: c_int,
    number: u64,
    sink: Option<CudamemPtrSink>,
    user: *mut c_void,
) -> c_int {
    guarded("cudamem_restore_checkpoint", || {
        let Some(sink) = sink else {
            return null("cudamem_restore_checkpoint", "sink");
        };
        match registry::restore_checkpoint(device, number) {
            Ok(restored) => {
                for ptr in restored.freed {
                    // SAFETY: the caller's promise about `sink` and `user`.
                    unsafe { sink(user, 0, ptr) };
                }
                for ptr in restored.allocated {
                    // SAFETY: as above.
                    unsafe { sink(user, 1, ptr) };
                }
                CUDAMEM_OK
            }
            Err(error) => fail(&error),
        }
    })
}
