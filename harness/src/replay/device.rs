//! ctx's [`StitchedPool`] as a replay policy (`stitched-pool`): memcore's
//! `Stitch` carried out on a device, a simulated H200 by default and CUDA
//! device N with `replay --gpu N`. Beside the row every policy has, it
//! measures on the device: the host time of every allocate and free and of
//! the driver calls, the footprint the device itself reports, at the
//! trace's peak the copy bandwidth over the live blocks (where the device
//! can time copies), and a warm allocate+free next to the moving [`Pool`]'s.
//!
//! Generic over the device ([`ReplayDevice`]), so everything but the GPU is
//! tested on the simulated one.

use std::time::Instant;

use anyhow::{Result, bail};
use ctx::{
    DeviceMemory, Pool, PoolConfig, SimConfig, SimDevice, StitchedConfig, StitchedPool,
    StitchedStats,
};
use memcore::DriverCalls;
use memcore::bytes::mib;
use serde::Serialize;

use crate::replay::policy::{Arena, ArenaState, Policy};
use crate::replay::stitch_policy::stitched_state;
use crate::replay::{Done, Pass, Settings};

/// Warm allocate+free pairs timed per pool.
const PAIRS: u32 = 100_000;
/// The warm pair's request, bytes.
const PAIR_BYTES: u64 = 1 << 20;

/// A device the stitched pool can be replayed on, and what only it can
/// measure.
pub trait ReplayDevice: DeviceMemory + Sized {
    /// The copy bandwidth over the live blocks (pointer, bytes) at the
    /// peak against plain chunks of the same sizes; `None` where the device
    /// cannot time copies.
    fn peak_bandwidth(&mut self, live: &[(u64, u64)]) -> Result<Option<PeakBandwidth>>;
    /// A fresh device of the same kind, for the moving pool's warm pair.
    fn sibling(&self) -> Result<Self>;
}

impl ReplayDevice for SimDevice {
    fn peak_bandwidth(&mut self, _live: &[(u64, u64)]) -> Result<Option<PeakBandwidth>> {
        Ok(None)
    }

    fn sibling(&self) -> Result<Self> {
        Ok(SimDevice::new(SimConfig::h200_like()))
    }
}

/// Build the `stitched-pool` policy for `settings` and run `pass` through
/// it: on a simulated H200, or on CUDA device `settings.gpu`.
pub fn replay(settings: &Settings, pass: Pass<'_>) -> Result<Done> {
    match settings.gpu {
        None => pass.run(&mut StitchedPoolPolicy::new(
            SimDevice::new(SimConfig::h200_like()),
            settings,
        )?),
        Some(ordinal) => on_gpu(ordinal, settings, pass),
    }
}

#[cfg(feature = "cuda")]
fn on_gpu(ordinal: u32, settings: &Settings, pass: Pass<'_>) -> Result<Done> {
    let device = crate::replay::cuda_device::open(ordinal)?;
    pass.run(&mut StitchedPoolPolicy::new(device, settings)?)
}

#[cfg(not(feature = "cuda"))]
fn on_gpu(ordinal: u32, _: &Settings, _: Pass<'_>) -> Result<Done> {
    bail!(
        "--gpu {ordinal} replays on the CUDA driver, and this cudamem was built without the \
         `cuda` feature: build it with `cargo build --release -p harness --features cuda`, \
         or use the GPU bundle's bin/cudamem (cargo xtask gpu-bundle DIR)"
    )
}

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

    fn line(&self) -> String {
        format!(
            "{} calls, mean {:.0} ns, p50 {} ns, p99 {} ns, max {} ns",
            self.calls, self.mean_ns, self.p50_ns, self.p99_ns, self.max_ns
        )
    }
}

/// The copy kernel over the live allocations at the peak, both ways.
#[derive(Debug, Clone, Serialize)]
pub struct PeakBandwidth {
    /// Allocations copied (each its first half onto its second).
    pub moves: usize,
    /// Bytes one run copies.
    pub bytes: u64,
    /// Runs timed per side; the median is reported.
    pub runs: usize,
    /// Median copy bandwidth over the pool's allocations, GB/s (bytes
    /// copied per ns).
    pub pool_gbps: f64,
    /// The same over cuMemAlloc buffers of the same sizes, GB/s.
    pub mem_alloc_gbps: f64,
    /// pool / cuMemAlloc.
    pub ratio: f64,
}

/// The device calls the pool made, counted on the device side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceCalls {
    /// cuMemCreate.
    pub creates: u64,
    /// cuMemMap.
    pub maps: u64,
    /// cuMemSetAccess.
    pub set_access: u64,
    /// cuMemUnmap.
    pub unmaps: u64,
    /// cuMemRelease.
    pub releases: u64,
}

/// What a replay on a device measured there, beside its row.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceFigures {
    /// The device, as its driver names it.
    pub device: String,
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
    /// Host time of all driver calls together, ns.
    pub driver_ns: u64,
    /// The model's driver time from the cost table, ns.
    pub modeled_driver_ns: u64,
    /// The driver calls the pool made.
    pub calls: DeviceCalls,
    /// Allocations whose backing failed and were rolled back.
    pub rollbacks: u64,
    /// The copy bandwidth at the peak, or why it was not measured.
    pub bandwidth: Result<PeakBandwidth, String>,
    /// A warm allocate+free of 1 MiB on the stitched pool after the
    /// replay, host ns.
    pub stitched_pair_ns: f64,
    /// The same on the moving Pool (VMM growth) on a fresh device, host ns.
    pub moving_pair_ns: f64,
}

impl DeviceFigures {
    /// The lines the table prints under its rows for policy `name`, the
    /// trace's peak live bytes being `peak_live`.
    pub fn lines(&self, name: &str, peak_live: u64) -> Vec<String> {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let calls = &self.calls;
        vec![
            format!(
                "  {name} on {}: footprint measured {} (device memory in use above the start) = {:.3} x \
                 peak live {}; model {} = {:.3} x peak live; measured/model {:.3}",
                self.device,
                mib(self.measured_peak_bytes),
                ratio(self.measured_peak_bytes, peak_live),
                mib(peak_live),
                mib(self.model_peak_bytes),
                ratio(self.model_peak_bytes, peak_live),
                ratio(self.measured_peak_bytes, self.model_peak_bytes),
            ),
            format!("    allocate: {}", self.allocate.line()),
            format!("    free:     {}", self.free.line()),
            format!(
                "    driver: {:.3} ms measured (host), {:.3} ms modeled; {} cuMemCreate, {} \
                 cuMemMap, {} cuMemSetAccess, {} cuMemUnmap, {} cuMemRelease; {} rollbacks",
                self.driver_ns as f64 / 1e6,
                self.modeled_driver_ns as f64 / 1e6,
                calls.creates,
                calls.maps,
                calls.set_access,
                calls.unmaps,
                calls.releases,
                self.rollbacks
            ),
            match &self.bandwidth {
                Ok(b) => format!(
                    "    copy kernel at the peak over {} allocations ({}): pool {:.1} GB/s, \
                     cuMemAlloc {:.1} GB/s, ratio {:.3} (median of {})",
                    b.moves,
                    mib(b.bytes),
                    b.pool_gbps,
                    b.mem_alloc_gbps,
                    b.ratio,
                    b.runs
                ),
                Err(why) => format!("    copy kernel at the peak: not measured: {why}"),
            },
            format!(
                "    warm allocate+free of {}, no driver call: stitched {:.0} ns/pair, moving Pool \
                 {:.0} ns/pair",
                mib(PAIR_BYTES),
                self.stitched_pair_ns,
                self.moving_pair_ns
            ),
        ]
    }
}

/// ctx's stitched pool on a device, as a replay policy. A block is its
/// device pointer; offsets are from the reservation's start.
pub struct StitchedPoolPolicy<D: ReplayDevice> {
    pool: StitchedPool<D>,
    /// The reservation's first device address.
    base: u64,
    /// A fixed arena's bytes: refusals past it are failed allocations.
    capacity: Option<u64>,
    /// Device memory in use before the first event, bytes.
    start_used: u64,
    /// The model's highest physical bytes so far.
    model_high: u64,
    /// The device's highest use above `start_used` so far, bytes.
    measured_peak: u64,
    allocate_ns: Vec<u64>,
    free_ns: Vec<u64>,
    /// Measured at the peak; `None` until then.
    bandwidth: Option<Result<PeakBandwidth, String>>,
}

impl<D: ReplayDevice> StitchedPoolPolicy<D> {
    /// A pool on `device` with `settings`' stitching and arena.
    pub fn new(device: D, settings: &Settings) -> Result<Self> {
        let capacity = match settings.arena {
            Arena::Growable => None,
            Arena::Fixed(bytes) => Some(bytes),
        };
        let stitch = memcore::StitchConfig {
            capacity_bytes: capacity.unwrap_or(settings.stitch.capacity_bytes),
            ..settings.stitch
        };
        let pool = StitchedPool::new(
            device,
            StitchedConfig {
                reservation_bytes: 0,
                stitch,
                peers: ctx::PeerSet::NONE,
            },
        )?;
        let (base, _) = pool.reservation();
        let start_used = used(&pool)?;
        Ok(Self {
            pool,
            base,
            capacity,
            start_used,
            model_high: 0,
            measured_peak: 0,
            allocate_ns: Vec::new(),
            free_ns: Vec::new(),
            bandwidth: None,
        })
    }

    /// The pool the policy replays through.
    pub fn pool(&self) -> &StitchedPool<D> {
        &self.pool
    }
}

/// Device memory in use, bytes.
fn used<D: DeviceMemory>(pool: &StitchedPool<D>) -> Result<u64> {
    let info = pool.with_device(|device| device.mem_info())?;
    Ok(info.total - info.free)
}

/// Whether `error` is the pool refusing a request for want of memory.
fn is_refusal(error: &ctx::Error) -> bool {
    matches!(
        error,
        ctx::Error::StitchedOutOfMemory { .. }
            | ctx::Error::Memcore(memcore::Error::OutOfMemory { .. })
    )
}

impl<D: ReplayDevice> Policy for StitchedPoolPolicy<D> {
    type Block = u64;

    fn allocate(&mut self, size: u64) -> Result<Option<u64>> {
        let started = Instant::now();
        let result = self.pool.allocate(size);
        self.allocate_ns.push(started.elapsed().as_nanos() as u64);
        let ptr = match result {
            Ok(ptr) => ptr,
            Err(err) if self.capacity.is_some() && is_refusal(&err) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        let physical = self.pool.stats().model.physical_bytes;
        if physical > self.model_high {
            self.model_high = physical;
            let above = used(&self.pool)?.saturating_sub(self.start_used);
            self.measured_peak = self.measured_peak.max(above);
        }
        Ok(Some(ptr))
    }

    fn free(&mut self, ptr: u64) -> Result<()> {
        let started = Instant::now();
        let result = self.pool.free(ptr);
        self.free_ns.push(started.elapsed().as_nanos() as u64);
        Ok(result?)
    }

    fn offset(&self, ptr: u64) -> Result<u64> {
        Ok(ptr - self.base)
    }

    fn mapped_bytes(&self) -> Result<u64> {
        Ok(self.pool.stats().model.physical_bytes)
    }

    fn peak_mapped_bytes(&self) -> Result<u64> {
        Ok(self.pool.stats().model.peak_physical_bytes)
    }

    fn driver_calls(&self) -> Result<DriverCalls> {
        Ok(self.pool.stats().model.calls)
    }

    fn peak_live_in_full_bandwidth_handles(&self) -> Result<Option<u64>> {
        Ok(Some(
            self.pool.stats().model.peak_live_in_full_bandwidth_handles,
        ))
    }

    fn state(&self) -> Result<ArenaState> {
        // As for the model.
        Ok(stitched_state(&self.pool.stats().model, self.capacity))
    }

    fn at_peak(&mut self) -> Result<()> {
        let mut live = self.pool.live_allocations();
        live.sort_unstable();
        let measured = self
            .pool
            .with_device(|device| device.peak_bandwidth(&live))
            .map_err(|err| format!("{err:#}"))
            .and_then(|measured| {
                measured.ok_or_else(|| "this device does not time its copies".to_string())
            });
        self.bandwidth = Some(measured);
        Ok(())
    }

    fn device_figures(&mut self) -> Result<Option<DeviceFigures>> {
        let stats: StitchedStats = self.pool.stats();
        let calls = stats.calls;
        let driver = calls.create.time
            + calls.map.time
            + calls.set_access.time
            + calls.unmap.time
            + calls.release.time;
        let stitched_pair_ns = warm_stitched_pair_ns(&self.pool, PAIR_BYTES, PAIRS)?;
        // The replay's blocks go back before the moving pool is measured,
        // as if the stitched pool had gone.
        for (ptr, _) in self.pool.live_allocations() {
            self.pool.free(ptr)?;
        }
        self.pool.trim()?;
        let sibling = self.pool.with_device(|device| device.sibling())?;
        let moving_pair_ns = warm_moving_pair_ns(sibling, PAIR_BYTES, PAIRS)?;
        Ok(Some(DeviceFigures {
            device: self.pool.with_device(|device| device.name()),
            model_peak_bytes: stats.model.peak_physical_bytes,
            measured_peak_bytes: self.measured_peak,
            allocate: Latency::of(std::mem::take(&mut self.allocate_ns)),
            free: Latency::of(std::mem::take(&mut self.free_ns)),
            driver_ns: driver.as_nanos() as u64,
            modeled_driver_ns: stats.model.calls.modeled_ns,
            calls: DeviceCalls {
                creates: calls.create.calls,
                maps: calls.map.calls,
                set_access: calls.set_access.calls,
                unmaps: calls.unmap.calls,
                releases: calls.release.calls,
            },
            rollbacks: stats.rollbacks,
            bandwidth: self
                .bandwidth
                .take()
                .unwrap_or_else(|| Err("the trace's peak was never reached".to_string())),
            stitched_pair_ns,
            moving_pair_ns,
        }))
    }
}

/// Host nanoseconds of one allocate + free of `size` bytes on a warm
/// stitched pool (the pair is made once before timing, so its pages are
/// mapped), the mean of `pairs` pairs; fails if a timed pair called the
/// driver.
pub fn warm_stitched_pair_ns<D: DeviceMemory>(
    pool: &StitchedPool<D>,
    size: u64,
    pairs: u32,
) -> Result<f64> {
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

/// Host nanoseconds of one allocate + free of `size` bytes on a warm moving
/// [`Pool`] (VMM growth) over `device`, the mean of `pairs` pairs.
pub fn warm_moving_pair_ns<D: DeviceMemory>(device: D, size: u64, pairs: u32) -> Result<f64> {
    let pool = Pool::new(device, PoolConfig::vmm(64 << 30))?;
    pool.free(pool.allocate(size, 512, None)?)?;
    let started = Instant::now();
    for _ in 0..pairs {
        let handle = pool.allocate(std::hint::black_box(size), 512, None)?;
        pool.free(std::hint::black_box(handle))?;
    }
    Ok(started.elapsed().as_nanos() as f64 / f64::from(pairs.max(1)))
}

#[cfg(test)]
mod tests {
    use indicatif::ProgressBar;

    use super::*;
    use crate::replay::{self, spec};
    use trace::Event;

    #[test]
    fn a_real_trace_on_a_simulated_device_matches_the_model() {
        let trace = &trace::file::load_embedded().unwrap()[0];
        let settings = Settings::default();
        let on_device = spec::named("stitched-pool").unwrap();
        let (outcome, _) =
            replay::run(on_device, trace, &settings, &ProgressBar::hidden(), false).unwrap();
        let device = outcome.device.clone().expect("figures from the device");
        // The simulated device counts handles as used memory, so what it
        // reports is the model's footprint exactly.
        assert_eq!(device.measured_peak_bytes, device.model_peak_bytes);
        assert_eq!(outcome.peak_footprint_bytes, device.model_peak_bytes);
        assert!(device.model_peak_bytes >= trace.peak_live_bytes);
        let allocs = trace
            .events
            .iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count();
        assert_eq!(device.allocate.calls, allocs as u64);
        assert_eq!(device.calls.creates, outcome.driver_calls.create.calls);
        assert_eq!(device.calls.maps, outcome.driver_calls.map.calls);
        assert!(device.allocate.p50_ns <= device.allocate.p99_ns);
        assert!(device.stitched_pair_ns > 0.0 && device.moving_pair_ns > 0.0);
        assert_eq!(
            device.bandwidth.as_ref().unwrap_err(),
            "this device does not time its copies"
        );
        assert_eq!(
            device.lines("stitched-pool", trace.peak_live_bytes).len(),
            6
        );

        // The pool on a device is the model carried out: the same row as
        // the model's but for time.
        let (model, _) = replay::run(
            spec::named("stitch").unwrap(),
            trace,
            &settings,
            &ProgressBar::hidden(),
            false,
        )
        .unwrap();
        assert_eq!(model.peak_footprint_bytes, outcome.peak_footprint_bytes);
        assert_eq!(model.driver_calls, outcome.driver_calls);
        assert_eq!(
            model.peak_live_in_full_bandwidth_handles,
            outcome.peak_live_in_full_bandwidth_handles
        );
    }

    #[test]
    fn the_pool_left_is_sound_and_empty_after_the_figures() {
        let trace = &trace::file::load_embedded().unwrap()[0];
        let mut policy =
            StitchedPoolPolicy::new(SimDevice::new(SimConfig::h200_like()), &Settings::default())
                .unwrap();
        let mut live = Vec::new();
        for event in &trace.events[..2000] {
            match *event {
                Event::Alloc { id, size } => {
                    live.push((id, policy.allocate(size).unwrap().unwrap()));
                }
                Event::Free { id } => {
                    if let Some(at) = live.iter().position(|&(live_id, _)| live_id == id) {
                        policy.free(live.swap_remove(at).1).unwrap();
                    }
                }
            }
        }
        policy.pool().check().unwrap();
        let figures = policy.device_figures().unwrap().unwrap();
        assert!(figures.bandwidth.is_err(), "no peak was passed");
        policy.pool().check().unwrap();
        assert_eq!(policy.pool().stats().model.physical_bytes, 0);
    }

    #[test]
    fn latency_figures_come_from_the_samples() {
        let l = Latency::of((1..=100).collect());
        assert_eq!((l.calls, l.p50_ns, l.p99_ns, l.max_ns), (100, 51, 99, 100));
        assert_eq!(l.mean_ns, 50.5);
        assert_eq!(Latency::of(Vec::new()).calls, 0);
    }
}
