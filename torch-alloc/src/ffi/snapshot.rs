//! History and snapshots: what `_record_memory_history` and `_snapshot` read.

use std::ffi::{c_int, c_void};
use std::panic::catch_unwind;

use super::{CUDAMEM_OK, fail, guarded, null, selector, status};
use crate::error::Error;
use crate::history::{HistorySettings, RecordContext, TraceEntry};
use crate::pool_id::PoolId;
use crate::registry;
use crate::snapshot::{BlockState, Segment, SnapshotBlock};

/// Records history on `device` (-1: every device, now and later; other negatives are
/// refused) as
/// `_record_memory_history` asks: `when` is PyTorch's `RecordContext` (0 to 3),
/// `skip` one bit per `TraceEntry::Action` not to record.
#[unsafe(no_mangle)]
pub extern "C" fn cudamem_record_history(
    device: c_int,
    enabled: c_int,
    when: u32,
    max_entries: u64,
    clear: c_int,
    skip: u32,
) -> c_int {
    guarded("cudamem_record_history", || {
        let Some(when) = RecordContext::from_raw(when) else {
            return fail(&Error::Ctx(ctx::Error::InvalidConfig(
                "the record context is not 0 to 3",
            )));
        };
        let settings = HistorySettings {
            enabled: enabled != 0,
            when,
            max_entries: usize::try_from(max_entries).unwrap_or(usize::MAX),
            skip,
        };
        match selector(device) {
            Ok(device) => status(registry::record_history(device, settings, clear != 0)),
            Err(error) => fail(&error),
        }
    })
}

/// Writes up to `max` stack numbers that no device holds any more to `out` and
/// returns how many; the C++ side drops those stacks.
///
/// # Safety
///
/// `out` is writable for `max` `uint64_t`s (null only with `max == 0`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_take_dead_contexts(out: *mut u64, max: usize) -> usize {
    if out.is_null() || max == 0 {
        return 0;
    }
    catch_unwind(|| registry::take_dead_contexts(max))
        .map(|dead| {
            for (i, number) in dead.iter().enumerate() {
                // SAFETY: `i < dead.len() <= max`, and `out` holds `max` values by the
                // caller's promise.
                unsafe { out.add(i).write_unaligned(*number) };
            }
            dead.len()
        })
        .unwrap_or(0)
}

/// A segment of a snapshot, `struct cudamem_segment`. Bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemSegment {
    /// First byte's device address.
    pub address: u64,
    /// Its bytes.
    pub total_size: u64,
    /// Bytes of blocks handed out.
    pub allocated_size: u64,
    /// Bytes of blocks handed out or waiting for streams.
    pub active_size: u64,
    /// Bytes asked for, of active blocks.
    pub requested_size: u64,
    /// The stream of a private pool's segment, else 0.
    pub stream: u64,
    /// Private pool id (0, 0 for the device's pool).
    pub pool_first: u64,
    /// Second half.
    pub pool_second: u64,
    /// The number of blocks that follow.
    pub blocks: u64,
}

/// A block of a snapshot, `struct cudamem_block_info`. Bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemBlockInfo {
    /// Device address.
    pub address: u64,
    /// Its bytes.
    pub size: u64,
    /// What the caller asked for.
    pub requested_size: u64,
    /// 0: free; 1: handed out; 2: freed, waiting for streams.
    pub state: u32,
    /// The stack number it was allocated at, 0 for none.
    pub context: u64,
}

/// A trace entry, `struct cudamem_trace_entry`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemTraceEntry {
    /// PyTorch's `TraceEntry::Action`.
    pub action: u32,
    /// Address (for an out of memory: the device's free bytes).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Stream handle.
    pub stream: u64,
    /// Private pool id.
    pub pool_first: u64,
    /// Second half.
    pub pool_second: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
    /// Stack number, 0 for none.
    pub context: u64,
}

/// Where a snapshot goes, `struct cudamem_snapshot_sink`: each segment, then its
/// blocks, in address order; then the trace, oldest first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudamemSnapshotSink {
    /// Passed to every function, untouched.
    pub user: *mut c_void,
    /// Gets each segment.
    pub segment: Option<unsafe extern "C" fn(*mut c_void, *const CudamemSegment)>,
    /// Gets each block of the last segment.
    pub block: Option<unsafe extern "C" fn(*mut c_void, *const CudamemBlockInfo)>,
    /// Gets each trace entry.
    pub trace: Option<unsafe extern "C" fn(*mut c_void, *const CudamemTraceEntry)>,
}

fn segment_of(s: &Segment) -> CudamemSegment {
    CudamemSegment {
        address: s.address,
        total_size: s.total_size,
        allocated_size: s.allocated_size(),
        active_size: s.active_size(),
        requested_size: s.requested_size(),
        stream: s.stream,
        pool_first: s.pool.0,
        pool_second: s.pool.1,
        blocks: s.blocks.len() as u64,
    }
}

fn block_of(b: &SnapshotBlock) -> CudamemBlockInfo {
    CudamemBlockInfo {
        address: b.address,
        size: b.size,
        requested_size: b.requested_size,
        state: match b.state {
            BlockState::Inactive => 0,
            BlockState::ActiveAllocated => 1,
            BlockState::ActivePendingFree => 2,
        },
        context: b.context,
    }
}

fn trace_of(t: &TraceEntry) -> CudamemTraceEntry {
    CudamemTraceEntry {
        action: t.action.raw(),
        addr: t.addr,
        size: t.size,
        stream: t.stream,
        pool_first: t.pool.0,
        pool_second: t.pool.1,
        time_us: t.time_us,
        context: t.context,
    }
}

/// Tells `*sink` what `device` holds (every segment for pool (0, 0), else that private
/// pool's) and, with `trace` nonzero, its history.
///
/// # Safety
///
/// `sink` is null (refused) or valid for one sink whose functions may be called with
/// its `user` and a pointer valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudamem_snapshot(
    device: c_int,
    first: u64,
    second: u64,
    trace: c_int,
    sink: *const CudamemSnapshotSink,
) -> c_int {
    guarded("cudamem_snapshot", || {
        if sink.is_null() {
            return null("cudamem_snapshot", "sink");
        }
        // SAFETY: not null, readable for one sink by the caller's promise.
        let sink = unsafe { sink.read_unaligned() };
        let (Some(on_segment), Some(on_block), Some(on_trace)) =
            (sink.segment, sink.block, sink.trace)
        else {
            return null("cudamem_snapshot", "a sink function");
        };
        let snapshot = match registry::snapshot(device, PoolId(first, second), trace != 0) {
            Ok(snapshot) => snapshot,
            Err(error) => return fail(&error),
        };
        for segment in &snapshot.segments {
            let s = segment_of(segment);
            // SAFETY: the caller's promise about the sink; `&s` lives for the call.
            unsafe { on_segment(sink.user, &s) };
            for block in &segment.blocks {
                let b = block_of(block);
                // SAFETY: as above.
                unsafe { on_block(sink.user, &b) };
            }
        }
        for entry in &snapshot.trace {
            let t = trace_of(entry);
            // SAFETY: as above.
            unsafe { on_trace(sink.user, &t) };
        }
        CUDAMEM_OK
    })
}
