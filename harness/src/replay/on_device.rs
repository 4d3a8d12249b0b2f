//! A trace replayed through a [`StitchedPool`] on a device (the real driver
//! for `cudamem replay --gpu N`, a simulated device in tests): what every
//! allocate and free took on the host, what the driver calls took, and the
//! footprint the device itself reports against the model's and the trace's.
//!
//! Generic over the device, so everything but the GPU is tested here.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use ctx::{DeviceMemory, StitchedPool, StitchedStats};
use serde::Serialize;

use crate::trace::{Event, Trace};

/// Host times of one kind of call, nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    /// Calls timed.
    pub calls: u64,
    /// Mean, ns.
    pub mean_ns: f64,
    /// Median, ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// Longest, ns.
    pub max_ns: u64,
}

impl Latency {
    /// The figures of `samples` (ns); all zero without samples.
    pub fn of(mut samples: Vec<u64>) -> Self {
        if samples.is_empty() {
            return Self {
                calls: 0,
                mean_ns: 0.0,
                p50_ns: 0,
                p99_ns: 0,
                max_ns: 0,
            };
        }
        samples.sort_unstable();
        let n = samples.len();
        let at = |q: f64| samples[((n - 1) as f64 * q).round() as usize];
        Self {
            calls: n as u64,
            mean_ns: samples.iter().map(|&s| s as f64).sum::<f64>() / n as f64,
            p50_ns: at(0.5),
            p99_ns: at(0.99),
            max_ns: samples[n - 1],
        }
    }
}

/// What a replay on a device measured.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReplay {
    /// The trace's name.
    pub trace: String,
    /// Events replayed.
    pub events: usize,
    /// The trace's peak of requested live bytes.
    pub peak_live_bytes: u64,
    /// The model's peak physical bytes (bytes in handles).
    pub model_peak_bytes: u64,
    /// The most device memory in use above what was in use before the
    /// first event, as the device's memory info reports it (cuMemGetInfo),
    /// read whenever the model's physical bytes reached a new high.
    pub measured_peak_bytes: u64,
    /// Host time of each allocate.
    pub allocate: Latency,
    /// Host time of each free.
    pub free: Latency,
    /// The pool's figures at the end: driver calls made, with their
    /// measured host time, and the model's counts and modeled time.
    #[serde(skip)]
    pub stats: StitchedStats,
    /// Host time of all driver calls together, ns.
    pub driver_ns: u64,
    /// The model's driver time from the measured cost table, ns.
    pub modeled_driver_ns: u64,
    /// Of the live bytes at the peak, those in handles of 32 MiB or more.
    pub peak_live_in_full_bandwidth_handles: u64,
}

/// Replays `trace` through `pool`, calling `at_peak` once with the live
/// allocations (pointer, bytes) right after the event at which the trace's
/// live bytes first peak. Frees nothing the trace leaves live.
pub fn replay<D: DeviceMemory>(
    trace: &Trace,
    pool: &StitchedPool<D>,
    mut at_peak: impl FnMut(&[(u64, u64)]) -> Result<()>,
) -> Result<DeviceReplay> {
    let used = |pool: &StitchedPool<D>| -> Result<u64> {
        let info = pool.with_device(|device| device.mem_info())?;
        Ok(info.total - info.free)
    };
    let start_used = used(pool)?;
    let mut measured_peak = 0u64;
    let mut model_high = 0u64;
    let mut slots: Vec<Option<(u64, u64)>> = vec![None; trace.allocations as usize];
    let mut allocate_ns = Vec::new();
    let mut free_ns = Vec::new();
    for (index, event) in trace.events.iter().enumerate() {
        let at = || {
            format!(
                "{}: event {index} ({:?})",
                trace.name, trace.locations[index]
            )
        };
        match *event {
            Event::Alloc { id, size } => {
                let started = Instant::now();
                let ptr = pool.allocate(size).with_context(at)?;
                allocate_ns.push(started.elapsed().as_nanos() as u64);
                slots[id as usize] = Some((ptr, size));
            }
            Event::Free { id } => {
                let Some((ptr, _)) = slots[id as usize].take() else {
                    bail!("{}: frees allocation {id}, which is not live", at());
                };
                let started = Instant::now();
                pool.free(ptr).with_context(at)?;
                free_ns.push(started.elapsed().as_nanos() as u64);
            }
        }
        let physical = pool.stats().model.physical_bytes;
        if physical > model_high {
            model_high = physical;
            measured_peak = measured_peak.max(used(pool)?.saturating_sub(start_used));
        }
        if index == trace.peak_live_event {
            let live: Vec<(u64, u64)> = slots.iter().flatten().copied().collect();
            at_peak(&live)?;
        }
    }
    let stats = pool.stats();
    let calls = stats.calls;
    let driver = calls.create.time
        + calls.map.time
        + calls.set_access.time
        + calls.unmap.time
        + calls.release.time;
    Ok(DeviceReplay {
        trace: trace.name.clone(),
        events: trace.events.len(),
        peak_live_bytes: trace.peak_live_bytes,
        model_peak_bytes: stats.model.peak_physical_bytes,
        measured_peak_bytes: measured_peak,
        allocate: Latency::of(allocate_ns),
        free: Latency::of(free_ns),
        stats,
        driver_ns: driver.as_nanos() as u64,
        modeled_driver_ns: stats.model.calls.modeled_ns,
        peak_live_in_full_bandwidth_handles: stats.model.peak_live_in_full_bandwidth_handles,
    })
}

/// Host nanoseconds of one allocate + free of `size` bytes on a warm pool
/// (the pair is made once before timing, so its pages are mapped), the
/// mean of `pairs` pairs; fails if a timed pair called the driver.
pub fn warm_pair_ns<D: DeviceMemory>(pool: &StitchedPool<D>, size: u64, pairs: u32) -> Result<f64> {
    pool.free(pool.allocate(size)?)?;
    let before = pool.stats().calls;
    let started = Instant::now();
    for _ in 0..pairs {
        let ptr = pool.allocate(std::hint::black_box(size))?;
        pool.free(std::hint::black_box(ptr))?;
    }
    let elapsed = started.elapsed();
    let calls = pool.stats().calls.since(&before);
    let made = calls.create.calls + calls.map.calls + calls.unmap.calls + calls.release.calls;
    if made != 0 {
        bail!("a warm allocate+free of {size} bytes made {made} driver calls");
    }
    Ok(elapsed.as_nanos() as f64 / f64::from(pairs.max(1)))
}

impl DeviceReplay {
    /// The human-readable lines of the report.
    pub fn lines(&self) -> Vec<String> {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        vec![
            format!("{}: {} events on the device", self.trace, self.events),
            format!(
                "  footprint: measured {:.1} MiB (cuMemGetInfo, above the start) = {:.3} x peak live {:.1} MiB; model {:.1} MiB = {:.3} x peak live; measured/model {:.3}",
                mib(self.measured_peak_bytes),
                ratio(self.measured_peak_bytes, self.peak_live_bytes),
                mib(self.peak_live_bytes),
                mib(self.model_peak_bytes),
                ratio(self.model_peak_bytes, self.peak_live_bytes),
                ratio(self.measured_peak_bytes, self.model_peak_bytes),
            ),
            format!(
                "  allocate: {} calls, mean {:.0} ns, p50 {} ns, p99 {} ns, max {} ns",
                self.allocate.calls,
                self.allocate.mean_ns,
                self.allocate.p50_ns,
                self.allocate.p99_ns,
                self.allocate.max_ns
            ),
            format!(
                "  free:     {} calls, mean {:.0} ns, p50 {} ns, p99 {} ns, max {} ns",
                self.free.calls,
                self.free.mean_ns,
                self.free.p50_ns,
                self.free.p99_ns,
                self.free.max_ns
            ),
            format!(
                "  driver: {:.3} ms measured (host), {:.3} ms modeled; live bytes at the peak in handles >= 32 MiB: {:.3}",
                self.driver_ns as f64 / 1e6,
                self.modeled_driver_ns as f64 / 1e6,
                ratio(
                    self.peak_live_in_full_bandwidth_handles,
                    self.peak_live_bytes
                )
            ),
            format!(
                "  driver calls: {} cuMemCreate, {} cuMemMap, {} cuMemSetAccess, {} cuMemUnmap, {} cuMemRelease; {} rollbacks",
                self.stats.calls.create.calls,
                self.stats.calls.map.calls,
                self.stats.calls.set_access.calls,
                self.stats.calls.unmap.calls,
                self.stats.calls.release.calls,
                self.stats.rollbacks
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use ctx::{SimConfig, SimDevice, StitchedConfig};

    use super::*;

    fn real_trace() -> Trace {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/rmm/resnet50_train.csv.gz");
        crate::trace::file::load(&path).unwrap().remove(0)
    }

    #[test]
    fn a_real_trace_on_a_simulated_device_matches_the_model() {
        let trace = real_trace();
        let pool = StitchedPool::new(
            SimDevice::new(SimConfig::h200_like()),
            StitchedConfig::default(),
        )
        .unwrap();
        let mut seen_peak = None;
        let replayed = replay(&trace, &pool, |live| {
            seen_peak = Some(live.iter().map(|&(_, bytes)| bytes).sum::<u64>());
            Ok(())
        })
        .unwrap();
        pool.check().unwrap();
        assert_eq!(
            seen_peak,
            Some(trace.peak_live_bytes),
            "called at the peak, with it"
        );
        // The simulated device counts handles as used memory, so what it
        // reports is the model's footprint exactly.
        assert_eq!(replayed.measured_peak_bytes, replayed.model_peak_bytes);
        assert!(replayed.model_peak_bytes >= trace.peak_live_bytes);
        let allocs = trace
            .events
            .iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count();
        assert_eq!(replayed.allocate.calls, allocs as u64);
        let stats = replayed.stats;
        assert_eq!(stats.calls.create.calls, stats.model.calls.create.calls);
        assert_eq!(stats.calls.map.calls, stats.model.calls.map.calls);
        assert!(replayed.allocate.p50_ns <= replayed.allocate.p99_ns);
        assert_eq!(replayed.lines().len(), 6);
        let pair = warm_pair_ns(&pool, 1 << 20, 1000).unwrap();
        assert!(pair > 0.0);
    }

    #[test]
    fn latency_figures_come_from_the_samples() {
        let l = Latency::of((1..=100).collect());
        assert_eq!((l.calls, l.p50_ns, l.p99_ns, l.max_ns), (100, 51, 99, 100));
        assert_eq!(l.mean_ns, 50.5);
        assert_eq!(Latency::of(Vec::new()).calls, 0);
    }
}
