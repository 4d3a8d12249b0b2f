//! Driver calls counted and timed on the host, so a benchmark can tell where
//! the time of a pool's growth goes: the record the CUDA backend keeps of its
//! VMM calls. Plain data and arithmetic, so it lives outside the backend.

use std::time::{Duration, Instant};

/// How often one driver entry point was called and the host time it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CallTally {
    /// Calls that returned (successful or not).
    pub calls: u64,
    /// Bytes the calls were asked to cover.
    pub bytes: u64,
    /// Host time in them, all calls together.
    pub time: Duration,
}

impl CallTally {
    /// Times one call covering `bytes`; returns what the call returned.
    pub(crate) fn record<T>(&mut self, bytes: u64, call: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let code = call();
        self.time += start.elapsed();
        self.calls += 1;
        self.bytes += bytes;
        code
    }

    /// Host time per call, microseconds (0 without calls).
    pub fn micros_per_call(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.time.as_secs_f64() * 1e6 / self.calls as f64
        }
    }
}

impl CallTally {
    /// The calls between `earlier` (a snapshot of the same tally) and `self`.
    pub fn since(&self, earlier: &CallTally) -> CallTally {
        CallTally {
            calls: self.calls.saturating_sub(earlier.calls),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            time: self.time.saturating_sub(earlier.time),
        }
    }
}

/// The VMM driver calls a device has made (`CudaDevice::vmm_calls`): a growth of a pool is one
/// `cuMemCreate`, one `cuMemMap` and one `cuMemSetAccess` of the whole growth; the
/// reservation is made once, when the pool is created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct VmmCalls {
    /// `cuMemAddressReserve`.
    pub reserve: CallTally,
    /// `cuMemCreate`: the physical memory.
    pub create: CallTally,
    /// `cuMemMap`: the physical memory into the reservation.
    pub map: CallTally,
    /// `cuMemSetAccess`: read-write access for the device.
    pub set_access: CallTally,
    /// `cuMemUnmap`.
    pub unmap: CallTally,
    /// `cuMemRelease`: the physical memory back to the driver.
    pub release: CallTally,
}

impl VmmCalls {
    /// The calls between `earlier` (a snapshot of the same device) and `self`.
    pub fn since(&self, earlier: &VmmCalls) -> VmmCalls {
        VmmCalls {
            reserve: self.reserve.since(&earlier.reserve),
            create: self.create.since(&earlier.create),
            map: self.map.since(&earlier.map),
            set_access: self.set_access.since(&earlier.set_access),
            unmap: self.unmap.since(&earlier.unmap),
            release: self.release.since(&earlier.release),
        }
    }

    /// Host time of create, map and set-access together: what backing new memory
    /// cost.
    pub fn growth_time(&self) -> Duration {
        self.create.time + self.map.time + self.set_access.time
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_count_calls_bytes_and_time_and_subtract() {
        let mut tally = CallTally::default();
        assert_eq!(tally.micros_per_call(), 0.0);
        assert_eq!(tally.record(4096, || 7), 7);
        assert_eq!(tally.record(100, || 0), 0);
        assert_eq!((tally.calls, tally.bytes), (2, 4196));
        let earlier = tally;
        tally.record(50, || ());
        let since = tally.since(&earlier);
        assert_eq!((since.calls, since.bytes), (1, 50));
        assert!(since.time <= tally.time);
        let calls = VmmCalls {
            create: tally,
            map: tally,
            ..VmmCalls::default()
        };
        assert_eq!(calls.growth_time(), tally.time * 2);
        assert_eq!(calls.since(&calls), VmmCalls::default());
    }
}
