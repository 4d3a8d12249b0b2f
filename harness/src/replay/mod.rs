//! Replaying a parsed trace through one policy: the timed loop, and a
//! second, recording pass that keeps where every block lay for the report.

pub mod baseline;
#[cfg(any(feature = "cuda", test))]
pub mod on_device;
pub mod policy;
pub mod pool_policy;
pub mod stitch_policy;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use serde::Serialize;

use crate::replay::baseline::{OffsetAllocatorPolicy, RangeAllocPolicy};
use crate::replay::policy::{Arena, ArenaState, Policy, PolicyName};
use crate::replay::pool_policy::PoolPolicy;
use crate::replay::stitch_policy::{ExpandablePolicy, StitchPolicy};
use crate::trace::{Event, Location, Trace};
use ctx::CompactionPolicy;
use memcore::StitchConfig;

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
    pub policy: PolicyName,
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

/// Replay `trace` through `name` over `arena` (the stitch policy set up by
/// `stitch`); with `record`, also keep the placement of every block (a
/// second pass, so timing stays clean).
pub fn run(
    name: PolicyName,
    trace: &Trace,
    arena: Arena,
    stitch: StitchConfig,
    progress: &ProgressBar,
    record: bool,
) -> Result<(Outcome, Option<Placement>)> {
    let context = || format!("replaying {} through {}", trace.name, name.as_str());
    let outcome = with_policy(
        name,
        arena,
        stitch,
        MeasuredPass {
            name,
            trace,
            progress,
        },
    )
    .with_context(context)?;
    let placement = if record {
        Some(with_policy(name, arena, stitch, RecordingPass { trace }).with_context(context)?)
    } else {
        None
    };
    Ok((outcome, placement))
}

/// Work to do with a freshly built policy, whatever its concrete type.
trait ReplayPass<T> {
    fn run<P: Policy>(self, policy: &mut P) -> Result<T>;
}

/// Build the policy `name` names, so the loops below are monomorphized for it.
fn with_policy<T>(
    name: PolicyName,
    arena: Arena,
    stitch: StitchConfig,
    body: impl ReplayPass<T>,
) -> Result<T> {
    match name {
        PolicyName::FirstFit => body.run(&mut policy::free_list(memcore::Fit::First, arena)?),
        PolicyName::BestFit => body.run(&mut policy::free_list(memcore::Fit::Best, arena)?),
        PolicyName::Tlsf => body.run(&mut policy::tlsf(arena)?),
        PolicyName::TlsfCompact => {
            let pool = pool_policy::pool(arena, CompactionPolicy::SlideBeforeGrow)?;
            body.run(&mut PoolPolicy::new(&pool, arena))
        }
        PolicyName::PoolVmm => {
            let pool = pool_policy::pool(arena, CompactionPolicy::BeforeGrow)?;
            body.run(&mut PoolPolicy::new(&pool, arena))
        }
        PolicyName::OffsetAllocator => body.run(&mut OffsetAllocatorPolicy::new(arena)?),
        PolicyName::RangeAlloc => body.run(&mut RangeAllocPolicy::new(arena)),
        PolicyName::Stitch => body.run(&mut StitchPolicy::new(stitch, arena)),
        PolicyName::PytorchExpandable => body.run(&mut ExpandablePolicy::new(arena)),
    }
}

/// The measured replay: nothing in the loop allocates (block slots are
/// preallocated by dense id) and nothing but the policy's calls is timed.
struct MeasuredPass<'a> {
    name: PolicyName,
    trace: &'a Trace,
    progress: &'a ProgressBar,
}

impl ReplayPass<Outcome> for MeasuredPass<'_> {
    fn run<P: Policy>(self, policy: &mut P) -> Result<Outcome> {
        let trace = self.trace;
        let mut slots: Vec<Option<P::Block>> = vec![None; trace.allocations as usize];
        let mut failed = 0u64;
        let mut first_failure = None;
        let started = Instant::now();
        for (index, event) in trace.events.iter().enumerate() {
            match *event {
                // Matched whole rather than through `?`, which would put
                // a large block through memory on every call.
                Event::Alloc { id, size } => match policy.allocate(size) {
                    Ok(Some(block)) => slots[id as usize] = Some(block),
                    Err(err) => return Err(err),
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
                    if let Some(block) = slots[id as usize].take() {
                        policy.free(block)?;
                    }
                }
            }
            if index % PROGRESS_STRIDE == PROGRESS_STRIDE - 1 {
                self.progress.inc(PROGRESS_STRIDE as u64);
            }
        }
        let elapsed = started.elapsed();
        self.progress
            .inc((trace.events.len() % PROGRESS_STRIDE) as u64);
        Ok(Outcome {
            policy: self.name,
            peak_footprint_bytes: policy.peak_mapped_bytes()?,
            bytes_moved: policy.bytes_moved()?,
            failed_allocations: failed,
            first_failure,
            elapsed,
            events: trace.events.len(),
            driver_calls: policy.driver_calls()?,
            peak_live_in_full_bandwidth_handles: policy.peak_live_in_full_bandwidth_handles()?,
        })
    }
}

/// The recording replay: the same calls, then where the block landed, what
/// compaction moved and how much is mapped.
struct RecordingPass<'a> {
    trace: &'a Trace,
}

impl ReplayPass<Placement> for RecordingPass<'_> {
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
    use crate::trace::TraceBuilder;

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
    fn assert_sound(name: PolicyName, trace: &Trace, placement: &Placement) {
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
            if let Some((&offset, &id)) = live.last_key_value().filter(|_| name.contiguous()) {
                assert!(
                    offset + sizes[id as usize] <= mapped_now,
                    "{name:?}: event {index} beyond mapped"
                );
            }
        }
    }

    #[test]
    fn every_policy_places_the_embedded_trace_soundly() {
        let trace = &crate::trace::file::load_embedded().unwrap()[0];
        for name in PolicyName::ALL {
            let (outcome, placement) = run(
                name,
                trace,
                Arena::Growable,
                StitchConfig::default(),
                &ProgressBar::hidden(),
                true,
            )
            .unwrap();
            assert_sound(name, trace, placement.as_ref().unwrap());
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
        for name in PolicyName::ALL {
            let (outcome, placement) = run(
                name,
                &trace,
                Arena::Growable,
                StitchConfig::default(),
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
        for name in PolicyName::ALL {
            let (outcome, _) = run(
                name,
                &trace,
                Arena::Fixed(4 << 20),
                StitchConfig::default(),
                &ProgressBar::hidden(),
                false,
            )
            .unwrap();
            let compacts = matches!(name, PolicyName::TlsfCompact | PolicyName::PoolVmm);
            if compacts {
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
