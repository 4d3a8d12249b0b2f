//! Replaying a parsed trace through one policy: the timed loop, and a
//! second, recording pass that keeps where every block lay for the report.
//! [`spec`] is the table of policies; each builds its policy and runs a
//! [`Pass`] through it, so the loops are compiled for each policy's type.

pub mod baseline;
#[cfg(feature = "cuda")]
pub mod cuda_device;
pub mod device;
pub mod policy;
pub mod pool_policy;
pub mod spec;
pub mod stitch_policy;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use indicatif::ProgressBar;
use serde::Serialize;

use crate::replay::device::DeviceFigures;
use crate::replay::policy::{ArenaState, Policy};
use trace::{Event, Location, Trace};

pub use spec::{POLICIES, PolicySpec, Settings};

/// Events between two progress-bar updates: rare enough to cost nothing in
/// the timed loop.
const PROGRESS_STRIDE: usize = 1 << 16;

/// The first request a fixed arena could not serve.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Index of the event in the trace.
    pub event: usize,
    /// Where the event came from in the trace file.
    #[serde(serialize_with = "location_text")]
    pub location: Location,
    /// The request, in bytes.
    pub request_bytes: u64,
    /// The arena at that moment.
    pub state: ArenaState,
}

fn location_text<S: serde::Serializer>(
    location: &Location,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(location)
}

/// What one replay of one trace through one policy measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The policy.
    pub policy: &'static PolicySpec,
    /// Most bytes mapped at once (see [`crate::replay::policy`] for the rule).
    pub peak_footprint_bytes: u64,
    /// Bytes copied by compaction.
    pub bytes_moved: u64,
    /// Requests that could not be served.
    pub failed_allocations: u64,
    /// The first of them, with the arena's state then.
    pub first_failure: Option<Failure>,
    /// Time spent in the replay loop (allocator calls only; parsing excluded).
    pub elapsed: Duration,
    /// Events replayed.
    pub events: usize,
    /// Driver calls by kind, with their modeled time.
    pub driver_calls: memcore::DriverCalls,
    /// Of the live bytes at their first peak, those in handles of at least
    /// 32 MiB, where the policy models handles.
    pub peak_live_in_full_bandwidth_handles: Option<u64>,
    /// What a policy that runs on a device measured there.
    pub device: Option<DeviceFigures>,
}

impl Outcome {
    /// Mean time per allocator call, nanoseconds.
    pub fn ns_per_op(&self) -> f64 {
        if self.events == 0 {
            0.0
        } else {
            self.elapsed.as_nanos() as f64 / self.events as f64
        }
    }
}

/// Where each block lay over time, for drawing.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Offset (bytes) each allocation got, by dense id; `u64::MAX` if refused.
    pub offsets: Vec<u64>,
    /// Compaction moves: (event index, id, new offset). A compaction runs
    /// inside an allocation, before that event's own block is placed, so the
    /// block sits at its new offset from that event on.
    pub moves: Vec<(usize, u32, u64)>,
    /// Bytes mapped, as (event index from which it holds, bytes); starts at event 0.
    pub mapped: Vec<(usize, u64)>,
}

/// Replay `trace` through `spec`'s policy built for `settings`; with
/// `record`, also keep the placement of every block (a second pass, so
/// timing stays clean).
pub fn run(
    spec: &'static PolicySpec,
    trace: &Trace,
    settings: &Settings,
    progress: &ProgressBar,
    record: bool,
) -> Result<(Outcome, Option<Placement>)> {
    let context = || format!("replaying {} through {}", trace.name, spec.name);
    // A model's work stays linear in the trace however large its requests
    // or however many blocks are live.
    let steps = memcore::model_steps(trace.allocations.into());
    let settings = &Settings {
        stitch: memcore::StitchConfig {
            page_steps: steps.min(settings.stitch.page_steps),
            ..settings.stitch
        },
        plan_steps: steps.min(settings.plan_steps),
        ..*settings
    };
    let measured = Pass::Measured(MeasuredPass {
        spec,
        trace,
        progress,
    });
    let outcome = match spec.run(settings, measured).with_context(context)? {
        Done::Measured(outcome) => *outcome,
        Done::Recorded(_) => return Err(wrong_pass(spec)),
    };
    let placement = if record {
        match spec
            .run(settings, Pass::Recording(RecordingPass { trace }))
            .with_context(context)?
        {
            Done::Recorded(placement) => Some(placement),
            Done::Measured(_) => return Err(wrong_pass(spec)),
        }
    } else {
        None
    };
    Ok((outcome, placement))
}

/// A spec whose builder answered a pass with another pass's result.
fn wrong_pass(spec: &PolicySpec) -> anyhow::Error {
    anyhow!(
        "the {} policy's builder did not run the pass it was given",
        spec.name
    )
}

/// Work to do with a freshly built policy, whatever its concrete type: a
/// spec's builder makes the policy and hands it to [`Pass::run`].
pub enum Pass<'a> {
    /// The timed replay.
    Measured(MeasuredPass<'a>),
    /// The replay that records where every block lay.
    Recording(RecordingPass<'a>),
}

/// What a [`Pass`] produced.
pub enum Done {
    /// The timed replay's figures (boxed: they are most of a `Done`).
    Measured(Box<Outcome>),
    /// Where every block lay.
    Recorded(Placement),
}

impl Pass<'_> {
    /// Run the pass through `policy`; compiled for each policy's type.
    pub fn run<P: Policy>(self, policy: &mut P) -> Result<Done> {
        match self {
            Pass::Measured(pass) => pass
                .run(policy)
                .map(|outcome| Done::Measured(Box::new(outcome))),
            Pass::Recording(pass) => pass.run(policy).map(Done::Recorded),
        }
    }
}

/// The measured replay: nothing in the loop allocates (block slots are
/// preallocated by dense id) and nothing but the policy's calls is timed.
pub struct MeasuredPass<'a> {
    spec: &'static PolicySpec,
    trace: &'a Trace,
    progress: &'a ProgressBar,
}

impl MeasuredPass<'_> {
    fn run<P: Policy>(self, policy: &mut P) -> Result<Outcome> {
        let trace = self.trace;
        let mut slots: Vec<Option<P::Block>> = vec![None; trace.allocations as usize];
        let mut failed = 0u64;
        let mut first_failure = None;
        // What the policy does at the peak is not the replay's time.
        let mut untimed = Duration::ZERO;
        let at_event = |index: usize| format!("event {index} ({})", trace.locations[index]);
        let started = Instant::now();
        for (index, event) in trace.events.iter().enumerate() {
            match *event {
                // Matched whole rather than through `?`, which would put
                // a large block through memory on every call.
                Event::Alloc { id, size } => match policy.allocate(size) {
                    Ok(Some(block)) => slots[id as usize] = Some(block),
                    Err(err) => return Err(err.context(at_event(index))),
                    Ok(None) => {
                        failed += 1;
                        if first_failure.is_none() {
                            first_failure = Some(Failure {
                                event: index,
                                location: trace.locations[index],
                                request_bytes: size,
                                state: policy.state()?,
                            });
                        }
                    }
                },
                // A block the arena refused has nothing to free.
                Event::Free { id } => {
                    if let Some(block) = slots[id as usize].take()
                        && let Err(err) = policy.free(block)
                    {
                        return Err(err.context(at_event(index)));
                    }
                }
            }
            if index == trace.peak_live_event {
                let paused = Instant::now();
                policy.at_peak()?;
                untimed += paused.elapsed();
            }
            if index % PROGRESS_STRIDE == PROGRESS_STRIDE - 1 {
                self.progress.inc(PROGRESS_STRIDE as u64);
            }
        }
        let elapsed = started.elapsed().saturating_sub(untimed);
        self.progress
            .inc((trace.events.len() % PROGRESS_STRIDE) as u64);
        let mut outcome = Outcome {
            policy: self.spec,
            peak_footprint_bytes: policy.peak_mapped_bytes()?,
            bytes_moved: policy.bytes_moved()?,
            failed_allocations: failed,
            first_failure,
            elapsed,
            events: trace.events.len(),
            driver_calls: policy.driver_calls()?,
            peak_live_in_full_bandwidth_handles: policy.peak_live_in_full_bandwidth_handles()?,
            device: None,
        };
        // Last: measuring on the device may change what the policy holds.
        outcome.device = policy.device_figures()?;
        Ok(outcome)
    }
}

/// The recording replay: the same calls, then where the block landed, what
/// compaction moved and how much is mapped.
pub struct RecordingPass<'a> {
    trace: &'a Trace,
}

impl RecordingPass<'_> {
    fn run<P: Policy>(self, policy: &mut P) -> Result<Placement> {
        let trace = self.trace;
        let count = trace.allocations as usize;
        let mut slots: Vec<Option<P::Block>> = vec![None; count];
        let mut placement = Placement {
            offsets: vec![u64::MAX; count],
            moves: Vec::new(),
            mapped: vec![(0, policy.mapped_bytes()?)],
        };
        // Live ids, with each id's position in the list, so a compaction
        // re-reads only live blocks.
        let mut live: Vec<u32> = Vec::new();
        let mut position = vec![0u32; count];
        let mut current = vec![u64::MAX; count];
        let mut relocations = policy.relocations()?;
        for (index, event) in trace.events.iter().enumerate() {
            match *event {
                Event::Alloc { id, size } => {
                    if let Some(block) = policy.allocate(size)? {
                        slots[id as usize] = Some(block);
                        let offset = policy.offset(block)?;
                        placement.offsets[id as usize] = offset;
                        current[id as usize] = offset;
                        position[id as usize] = live.len() as u32;
                        live.push(id);
                    }
                }
                Event::Free { id } => {
                    if let Some(block) = slots[id as usize].take() {
                        policy.free(block)?;
                        let at = position[id as usize] as usize;
                        live.swap_remove(at);
                        if let Some(&moved) = live.get(at) {
                            position[moved as usize] = at as u32;
                        }
                    }
                }
            }
            let mapped = policy.mapped_bytes()?;
            if placement
                .mapped
                .last()
                .is_some_and(|&(_, last)| last != mapped)
            {
                placement.mapped.push((index, mapped));
            }
            let now = policy.relocations()?;
            if now != relocations {
                relocations = now;
                for &id in &live {
                    if let Some(block) = slots[id as usize] {
                        let offset = policy.offset(block)?;
                        if offset != current[id as usize] {
                            current[id as usize] = offset;
                            placement.moves.push((index, id, offset));
                        }
                    }
                }
            }
        }
        Ok(placement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::policy::Arena;
    use trace::TraceBuilder;

    fn sawtooth() -> Trace {
        // Three 1 MiB blocks, free the middle one, then a 2 MiB request:
        // the hole does not fit it, so a non-compacting policy must grow.
        let mut trace = TraceBuilder::new("sawtooth".into());
        let mib = 1 << 20;
        for (line, pointer) in [0x1000u64, 0x2000, 0x3000].into_iter().enumerate() {
            trace
                .allocate(pointer, mib, Location::Line(line as u64 + 2))
                .unwrap();
        }
        trace.free(0x2000, Location::Line(5)).unwrap();
        trace.allocate(0x4000, 2 * mib, Location::Line(6)).unwrap();
        trace.finish()
    }

    /// Check a placement is sound: blocks aligned, never overlapping, and
    /// inside what the policy had mapped, at every event.
    fn assert_sound(spec: &PolicySpec, trace: &Trace, placement: &Placement) {
        let name = spec.name;
        use std::collections::BTreeMap;
        let sizes: Vec<u64> = {
            let mut sizes = vec![0; trace.allocations as usize];
            for event in &trace.events {
                if let Event::Alloc { id, size } = *event {
                    sizes[id as usize] = size;
                }
            }
            sizes
        };
        let mut current = placement.offsets.clone();
        let mut live: BTreeMap<u64, u32> = BTreeMap::new();
        let overlaps = |live: &BTreeMap<u64, u32>, offset: u64, size: u64| {
            let below = live.range(..offset + size).next_back();
            below.is_some_and(|(&start, &other)| start + sizes[other as usize] > offset)
        };
        let mut moves = placement.moves.iter().peekable();
        let mut mapped = placement.mapped.iter().peekable();
        let mut mapped_now = 0;
        for (index, event) in trace.events.iter().enumerate() {
            while let Some(&&(from, bytes)) = mapped.peek() {
                if from > index {
                    break;
                }
                mapped_now = bytes;
                mapped.next();
            }
            let mut batch = Vec::new();
            while let Some(&&(event, id, to)) = moves.peek() {
                if event != index {
                    break;
                }
                batch.push((id, to));
                moves.next();
            }
            for &(id, _) in &batch {
                live.remove(&current[id as usize]);
            }
            for &(id, to) in &batch {
                current[id as usize] = to;
                assert!(
                    !overlaps(&live, to, sizes[id as usize]),
                    "{name:?}: move at {index} overlaps"
                );
                live.insert(to, id);
            }
            match *event {
                Event::Alloc { id, size } => {
                    let offset = current[id as usize];
                    assert_eq!(
                        offset % memcore::DEFAULT_ALIGN,
                        0,
                        "{name:?}: event {index}"
                    );
                    assert!(
                        !overlaps(&live, offset, size),
                        "{name:?}: event {index} overlaps"
                    );
                    live.insert(offset, id);
                }
                Event::Free { id } => {
                    assert_eq!(
                        live.remove(&current[id as usize]),
                        Some(id),
                        "{name:?}: event {index}"
                    );
                }
            }
            if let Some((&offset, &id)) = live.last_key_value().filter(|_| spec.contiguous) {
                assert!(
                    offset + sizes[id as usize] <= mapped_now,
                    "{name:?}: event {index} beyond mapped"
                );
            }
        }
    }

    #[test]
    fn every_policy_places_the_embedded_trace_soundly() {
        let trace = &trace::file::load_embedded().unwrap()[0];
        for spec in POLICIES {
            let name = spec.name;
            let (outcome, placement) = run(
                spec,
                trace,
                &Settings::default(),
                &ProgressBar::hidden(),
                true,
            )
            .unwrap();
            assert_sound(spec, trace, placement.as_ref().unwrap());
            assert_eq!(outcome.failed_allocations, 0);
            assert!(outcome.peak_footprint_bytes >= trace.peak_live_bytes);
            assert_eq!(
                placement
                    .unwrap()
                    .mapped
                    .iter()
                    .map(|&(_, bytes)| bytes)
                    .max(),
                Some(outcome.peak_footprint_bytes),
                "{name:?}"
            );
        }
    }

    #[test]
    fn every_policy_replays_and_maps_at_least_the_peak() {
        let trace = sawtooth();
        for spec in POLICIES {
            let name = spec.name;
            let (outcome, placement) = run(
                spec,
                &trace,
                &Settings::default(),
                &ProgressBar::hidden(),
                true,
            )
            .unwrap();
            assert_eq!(outcome.failed_allocations, 0, "{name:?}");
            assert!(
                outcome.peak_footprint_bytes >= 4 << 20,
                "{name:?}: {outcome:?}"
            );
            assert_eq!(
                outcome.peak_footprint_bytes % policy::GRANULE,
                0,
                "{name:?}"
            );
            let placement = placement.unwrap();
            assert!(
                placement.offsets.iter().all(|&offset| offset != u64::MAX),
                "{name:?}"
            );
        }
    }

    #[test]
    fn a_fixed_arena_reports_the_first_refusal() {
        let trace = sawtooth();
        let settings = Settings {
            arena: Arena::Fixed(4 << 20),
            ..Settings::default()
        };
        for spec in POLICIES {
            let name = spec.name;
            let (outcome, _) = run(spec, &trace, &settings, &ProgressBar::hidden(), false).unwrap();
            if spec.moves_blocks {
                assert_eq!(outcome.failed_allocations, 0, "{name:?}");
                assert!(outcome.bytes_moved > 0, "{name:?}");
            } else {
                assert_eq!(outcome.failed_allocations, 1, "{name:?}");
                let failure = outcome.first_failure.unwrap();
                assert_eq!(failure.event, 4);
                assert_eq!(failure.location, Location::Line(6));
                assert_eq!(failure.request_bytes, 2 << 20);
                assert_eq!(failure.state.live_bytes, 2 << 20, "{name:?}");
            }
        }
    }
}
