//! Pause and resume of the pool's physical memory.
//!
//! Pause (the program's threads held at the gate, its device work done):
//! the pool's free pages are released without a copy (`trim`); every
//! other handle's live bytes are copied to one pinned host buffer in
//! chunks queued on one stream; then each handle is unmapped and released,
//! its address range staying reserved. Resume creates a handle for each,
//! maps it at the same address, copies the bytes back and frees the host
//! buffer. A resume that cannot get the memory gives back what it made and
//! leaves the program paused; a pause that fails part way maps back what it
//! released, so a handle is never unmapped while the pool believes it
//! mapped.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ctx::{DeviceMemory, Error, Result};

use super::Served;
use super::device::{DriverDevice, check, driver, sym};
use crate::driver::call_driver;

/// Largest single copy queued.
const CHUNK: u64 = 64 << 20;

/// What to drop without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Discard {
    /// Every block's contents (they read as undefined after resume).
    pub all: bool,
}

/// A handle given back by a pause.
#[derive(Debug, Clone)]
struct Released {
    number: usize,
    addr: u64,
    size: u64,
    /// (device address, offset in the host copy, bytes) to restore.
    pieces: Vec<(u64, u64, u64)>,
}

/// What a pause holds until its resume.
#[derive(Debug)]
pub struct Paused {
    released: Vec<Released>,
    host: HostCopy,
    /// What the pause did, for the resume's and the ledger's report.
    pub report: PauseReport,
}

/// Figures of one pause, bytes and seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct PauseReport {
    /// Free device memory before the pause.
    pub free_before: u64,
    /// After it.
    pub free_after: u64,
    /// Total device memory.
    pub total: u64,
    /// Pool handles released.
    pub handles: u64,
    /// Their bytes.
    pub released_bytes: u64,
    /// Free pool pages released without a copy.
    pub cache_bytes: u64,
    /// Bytes copied to host.
    pub copied_bytes: u64,
    /// Live bytes dropped without a copy (`--discard`).
    pub discarded_bytes: u64,
    /// Seconds the copies took.
    pub copy_seconds: f64,
    /// Seconds the whole pause took.
    pub seconds: f64,
}

/// Pinned host memory made with `cuMemHostAlloc`.
#[derive(Debug)]
struct HostCopy {
    ptr: usize,
}

impl HostCopy {
    fn new(len: u64) -> Result<HostCopy> {
        if len == 0 {
            return Ok(HostCopy { ptr: 0 });
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        driver!(
            "cuMemHostAlloc",
            sym::HOST_ALLOC,
            fn(*mut *mut c_void, usize, u32),
            &mut ptr,
            len as usize,
            0
        )?;
        Ok(HostCopy { ptr: ptr as usize })
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = driver!(
                "cuMemFreeHost",
                sym::FREE_HOST,
                fn(*mut c_void),
                self.ptr as *mut c_void
            );
        }
    }
}

/// Device bytes the copy stream took when it was made (measured).
pub static STREAM_BYTES: AtomicU64 = AtomicU64::new(0);

/// One stream of the pool's own for its copies.
fn stream() -> Result<usize> {
    static STREAM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if let Some(&stream) = STREAM.get() {
        return Ok(stream);
    }
    let before = crate::driver::read::free_bytes();
    let mut made: *mut c_void = std::ptr::null_mut();
    // CU_STREAM_NON_BLOCKING (1): not ordered after the legacy stream.
    driver!(
        "cuStreamCreate",
        sym::STREAM_CREATE,
        fn(*mut *mut c_void, u32),
        &mut made,
        1
    )?;
    if let (Some(before), Some(after)) = (before, crate::driver::read::free_bytes()) {
        STREAM_BYTES.store(before.saturating_sub(after), Ordering::Relaxed);
    }
    Ok(*STREAM.get_or_init(|| made as usize))
}

/// Queue copies device to host (`to_host`) or back, in chunks, and wait.
fn copy_all(pieces: &[(u64, u64, u64)], host: &HostCopy, to_host: bool) -> Result<()> {
    let stream = stream()? as *mut c_void;
    for &(dev, offset, len) in pieces {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK);
            let h = (host.ptr as u64 + offset + done) as *mut c_void;
            if to_host {
                driver!(
                    "cuMemcpyDtoHAsync_v2",
                    sym::COPY_DTOH_ASYNC,
                    fn(*mut c_void, u64, usize, *mut c_void),
                    h,
                    dev + done,
                    n as usize,
                    stream
                )?;
            } else {
                driver!(
                    "cuMemcpyHtoDAsync_v2",
                    sym::COPY_HTOD_ASYNC,
                    fn(u64, *const c_void, usize, *mut c_void),
                    dev + done,
                    h,
                    n as usize,
                    stream
                )?;
            }
            done += n;
        }
    }
    driver!(
        "cuStreamSynchronize",
        sym::STREAM_SYNCHRONIZE,
        fn(*mut c_void),
        stream
    )
}

/// The parts of `live` (sorted, non-overlapping) inside `[addr, addr + size)`.
fn pieces_in(live: &[(u64, u64)], addr: u64, size: u64) -> Vec<(u64, u64)> {
    let end = addr + size;
    let first = live.partition_point(|&(ptr, len)| ptr + len <= addr);
    live[first..]
        .iter()
        .take_while(|&&(ptr, _)| ptr < end)
        .map(|&(ptr, len)| {
            let start = ptr.max(addr);
            (start, (ptr + len).min(end) - start)
        })
        .filter(|&(_, len)| len > 0)
        .collect()
}

/// Pause the pool: the caller has shut the gate and made the pool's
/// context current.
pub fn pause(served: &Served, discard: Discard) -> Result<Paused> {
    let start = Instant::now();
    let mut report = PauseReport::default();
    let before = served.pool.with_device(|device| device.mem_info())?;
    report.free_before = before.free;
    report.total = before.total;
    check("cuCtxSynchronize", call_driver!(sym::SYNCHRONIZE, fn()))?;
    let physical_before = served.pool.stats().model.physical_bytes;
    served.pool.trim()?;
    report.cache_bytes = physical_before.saturating_sub(served.pool.stats().model.physical_bytes);
    let live = served.live_blocks();
    let paused = served
        .pool
        .with_device(|device| release_all(device, &live, discard, &mut report))?;
    let after = served.pool.with_device(|device| device.mem_info())?;
    report.free_after = after.free;
    report.seconds = start.elapsed().as_secs_f64();
    Ok(Paused { report, ..paused })
}

fn release_all(
    device: &mut DriverDevice,
    live: &[(u64, u64)],
    discard: Discard,
    report: &mut PauseReport,
) -> Result<Paused> {
    let mut released = Vec::new();
    let mut offset = 0u64;
    for (number, slot) in device.slots.iter().enumerate() {
        let Some(slot) = slot else { continue };
        let Some(addr) = slot.mapped_at else { continue };
        if slot.driver == 0 {
            continue;
        }
        let mut pieces = Vec::new();
        for (ptr, len) in pieces_in(live, addr, slot.size) {
            if discard.all {
                report.discarded_bytes += len;
            } else {
                pieces.push((ptr, offset, len));
                offset += len;
            }
        }
        released.push(Released {
            number,
            addr,
            size: slot.size,
            pieces,
        });
    }
    let host = HostCopy::new(offset).map_err(|error| Error::Driver {
        op: "cuMemHostAlloc",
        code: error
            .driver_code()
            .unwrap_or(ctx::DriverCode::OUT_OF_MEMORY),
        detail: format!("no pinned host memory for the {offset} bytes to keep"),
    })?;
    let pieces: Vec<_> = released
        .iter()
        .flat_map(|r| r.pieces.iter().copied())
        .collect();
    let copy_start = Instant::now();
    copy_all(&pieces, &host, true)?;
    report.copy_seconds = copy_start.elapsed().as_secs_f64();
    report.copied_bytes = offset;
    for (done, r) in released.iter().enumerate() {
        let driver = device.slots[r.number].map_or(0, |slot| slot.driver);
        if let Err(error) = device.unmap_and_release(driver, r.addr, r.size) {
            // Map back what this pause released, contents restored.
            let back = restore(device, &released[..done], &host);
            return Err(match back {
                Ok(_) => error,
                Err(again) => Error::Inconsistent(format!(
                    "a pause failed ({error}) and mapping back failed too ({again})"
                )),
            });
        }
        if let Some(slot) = device.slots[r.number].as_mut() {
            slot.driver = 0;
        }
        report.handles += 1;
        report.released_bytes += r.size;
    }
    Ok(Paused {
        released,
        host,
        report: *report,
    })
}

/// Create, map and fill every handle in `released` again; on a failure
/// give back what this call made, leaving them all released. Returns the
/// seconds the mapping took and the seconds the copies took.
fn restore(
    device: &mut DriverDevice,
    released: &[Released],
    host: &HostCopy,
) -> Result<(f64, f64)> {
    let start = Instant::now();
    let mut made: Vec<(usize, u64)> = Vec::new();
    let undo = |device: &mut DriverDevice, made: &[(usize, u64)]| {
        for &(i, driver) in made {
            let r = &released[i];
            let _ = device.unmap_and_release(driver, r.addr, r.size);
            if let Some(slot) = device.slots[r.number].as_mut() {
                slot.driver = 0;
            }
        }
    };
    for (i, r) in released.iter().enumerate() {
        let created = device.create_driver_handle(r.size).and_then(|driver| {
            match device.map_and_grant(driver, r.addr, r.size) {
                Ok(()) => Ok(driver),
                Err(error) => {
                    let _ = driver!("cuMemRelease", sym::RELEASE, fn(u64), driver);
                    Err(error)
                }
            }
        });
        match created {
            Ok(driver) => {
                made.push((i, driver));
                if let Some(slot) = device.slots[r.number].as_mut() {
                    slot.driver = driver;
                }
            }
            Err(error) => {
                undo(device, &made);
                return Err(error);
            }
        }
    }
    let mapped = start.elapsed().as_secs_f64();
    let pieces: Vec<_> = released
        .iter()
        .flat_map(|r| r.pieces.iter().copied())
        .collect();
    if let Err(error) = copy_all(&pieces, host, false) {
        undo(device, &made);
        return Err(error);
    }
    Ok((mapped, start.elapsed().as_secs_f64() - mapped))
}

/// Figures of one resume.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResumeReport {
    /// Free device memory before and after.
    pub free_before: u64,
    /// After.
    pub free_after: u64,
    /// Bytes mapped again.
    pub mapped_bytes: u64,
    /// Bytes copied back.
    pub copied_bytes: u64,
    /// Seconds making and mapping the handles again.
    pub map_seconds: f64,
    /// Seconds copying the bytes back.
    pub copy_seconds: f64,
    /// Seconds in all.
    pub seconds: f64,
}

/// Why a resume did not happen: the program stays paused.
#[derive(Debug)]
pub struct ResumeRefused {
    /// The pause, kept.
    pub paused: Paused,
    /// Why.
    pub error: Error,
    /// Bytes it needed and the free memory seen.
    pub needed: u64,
    /// Free memory when it tried.
    pub free: u64,
}

/// Resume a pause: the caller made the pool's context current; the gate is
/// still shut.
pub fn resume(
    served: &Served,
    paused: Paused,
) -> std::result::Result<ResumeReport, Box<ResumeRefused>> {
    let start = Instant::now();
    let needed: u64 = paused.released.iter().map(|r| r.size).sum();
    let free = served
        .pool
        .with_device(|device| device.mem_info())
        .map_or(0, |info| info.free);
    let done = served
        .pool
        .with_device(|device| restore(device, &paused.released, &paused.host));
    let (map_seconds, copy_seconds) = match done {
        Ok(seconds) => seconds,
        Err(error) => {
            return Err(Box::new(ResumeRefused {
                paused,
                error,
                needed,
                free,
            }));
        }
    };
    let copied = paused.report.copied_bytes;
    // The host copy goes now.
    drop(paused);
    let after = served
        .pool
        .with_device(|device| device.mem_info())
        .map_or(0, |info| info.free);
    Ok(ResumeReport {
        free_before: free,
        free_after: after,
        mapped_bytes: needed,
        copied_bytes: copied,
        map_seconds,
        copy_seconds,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::pieces_in;

    #[test]
    fn pieces_are_the_live_bytes_inside_a_handle() {
        let live = [(0u64, 100u64), (1000, 3000), (5000, 10)];
        assert_eq!(pieces_in(&live, 2048, 2048), vec![(2048, 1952)]);
        assert_eq!(pieces_in(&live, 0, 2048), vec![(0, 100), (1000, 1048)]);
        assert_eq!(pieces_in(&live, 4096, 4096), vec![(5000, 10)]);
        assert!(pieces_in(&live, 8192, 4096).is_empty());
    }
}
