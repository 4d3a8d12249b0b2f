//! The figures of a replay, as a table for people and as JSON lines.

use std::fmt::Write as _;

use serde::Serialize;

use crate::replay::device::DeviceFigures;
use crate::replay::policy::FOOTPRINT_RULE;
use crate::replay::{Failure, Outcome};
use crate::trace::{Skipped, Trace};
use memcore::bytes::human;

/// One policy's figures for one trace.
#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    /// Policy name as on the command line.
    pub name: &'static str,
    /// Most bytes mapped at once.
    pub peak_footprint_bytes: u64,
    /// Peak footprint over peak live bytes (1.0 is perfect).
    pub footprint_ratio: f64,
    /// Bytes copied by compaction.
    pub compaction_bytes_moved: u64,
    /// Requests that could not be served.
    pub failed_allocations: u64,
    /// Mean nanoseconds per allocate or free call.
    pub ns_per_op: f64,
    /// Allocator calls per second.
    pub ops_per_second: f64,
    /// The first refused request, with the arena's state then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<Failure>,
    /// Driver calls by kind and their modeled time.
    pub driver_calls: DriverSummary,
    /// Modeled driver time over the trace's recorded duration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_time_share: Option<f64>,
    /// Share of the live bytes at their peak that lie in handles of at
    /// least 32 MiB, where the policy models handles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_bandwidth_share: Option<f64>,
    /// What a policy that runs on a device measured there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceFigures>,
}

/// A policy's driver calls, by kind, each on one handle.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DriverSummary {
    /// cuMemCreate.
    pub creates: u64,
    /// cuMemRelease.
    pub releases: u64,
    /// cuMemMap.
    pub maps: u64,
    /// cuMemUnmap.
    pub unmaps: u64,
    /// cuMemSetAccess, one per handle.
    pub set_access: u64,
    /// Their time by memcore's H200 cost table, nanoseconds.
    pub modeled_ns: u64,
}

impl From<memcore::DriverCalls> for DriverSummary {
    fn from(calls: memcore::DriverCalls) -> Self {
        Self {
            creates: calls.create.calls,
            releases: calls.release.calls,
            maps: calls.map.calls,
            unmaps: calls.unmap.calls,
            set_access: calls.set_access.calls,
            modeled_ns: calls.modeled_ns,
        }
    }
}

/// What the recording allocator itself did (PyTorch's caching allocator,
/// from a snapshot's segment events): the row `pytorch (recorded)`.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedSummary {
    /// Row name in the table.
    pub name: &'static str,
    /// Most bytes PyTorch reserved at once.
    pub peak_reserved_bytes: u64,
    /// Peak reserved over peak live bytes.
    pub footprint_ratio: f64,
    /// Peak live bytes with each request rounded as PyTorch rounds it (to
    /// 512 bytes): comparable with `torch.cuda.max_memory_allocated()`.
    pub peak_allocated_bytes: u64,
}

/// The row name of PyTorch's own figures.
pub const RECORDED_ROW: &str = "pytorch (recorded)";

/// A policy left out of a replay, and why (it cannot take the arena).
#[derive(Debug, Clone, Serialize)]
pub struct SkippedPolicy {
    /// Policy name as on the command line.
    pub name: &'static str,
    /// Why it was left out.
    pub reason: String,
}

/// One trace's figures, one JSON line of `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct TraceSummary {
    /// Trace name.
    pub trace: String,
    /// Allocate and free events replayed.
    pub events: usize,
    /// Largest sum of requested bytes alive at once.
    pub peak_live_bytes: u64,
    /// Index of the event at which the live bytes first peaked.
    pub peak_live_event: usize,
    /// Frees of blocks allocated before the trace began, taken as live from
    /// the first event.
    pub unknown_frees: u64,
    /// PyTorch's own figures, for a snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pytorch_recorded: Option<RecordedSummary>,
    /// Time from the first to the last record, nanoseconds, where the
    /// trace records time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ns: Option<u64>,
    /// The fixed arena size, when `--capacity` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// How footprint is measured.
    pub footprint_rule: &'static str,
    /// Per policy.
    pub policies: Vec<PolicySummary>,
    /// Policies left out because they cannot take the fixed arena.
    pub skipped_policies: Vec<SkippedPolicy>,
    /// Records of the trace file passed over rather than replayed.
    pub skipped_records: Vec<Skipped>,
}

impl TraceSummary {
    /// Summarize `outcomes` of `trace`.
    pub fn new(
        trace: &Trace,
        capacity_bytes: Option<u64>,
        outcomes: &[Outcome],
        skipped_policies: Vec<SkippedPolicy>,
    ) -> Self {
        let policies = outcomes
            .iter()
            .map(|outcome| {
                let ns_per_op = outcome.ns_per_op();
                PolicySummary {
                    name: outcome.policy.name,
                    peak_footprint_bytes: outcome.peak_footprint_bytes,
                    footprint_ratio: ratio(outcome.peak_footprint_bytes, trace.peak_live_bytes),
                    compaction_bytes_moved: outcome.bytes_moved,
                    failed_allocations: outcome.failed_allocations,
                    ns_per_op,
                    ops_per_second: if ns_per_op > 0.0 {
                        1e9 / ns_per_op
                    } else {
                        0.0
                    },
                    first_failure: outcome.first_failure.clone(),
                    driver_calls: outcome.driver_calls.into(),
                    driver_time_share: trace
                        .duration_ns
                        .filter(|&ns| ns > 0)
                        .map(|ns| outcome.driver_calls.modeled_ns as f64 / ns as f64),
                    full_bandwidth_share: outcome
                        .peak_live_in_full_bandwidth_handles
                        .filter(|_| trace.peak_live_bytes > 0)
                        .map(|bytes| bytes as f64 / trace.peak_live_bytes as f64),
                    device: outcome.device.clone(),
                }
            })
            .collect();
        Self {
            trace: trace.name.clone(),
            events: trace.events.len(),
            peak_live_bytes: trace.peak_live_bytes,
            peak_live_event: trace.peak_live_event,
            unknown_frees: trace.unknown_frees,
            pytorch_recorded: trace.recorded.as_ref().map(|recorded| RecordedSummary {
                name: RECORDED_ROW,
                peak_reserved_bytes: recorded.peak_reserved_bytes,
                footprint_ratio: ratio(recorded.peak_reserved_bytes, trace.peak_live_bytes),
                peak_allocated_bytes: recorded.peak_allocated_bytes,
            }),
            duration_ns: trace.duration_ns,
            capacity_bytes,
            footprint_rule: FOOTPRINT_RULE,
            policies,
            skipped_policies,
            skipped_records: trace.skipped.clone(),
        }
    }

    /// The table for people.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{}: {} events{}, peak live {} ({} bytes){}\n",
            self.trace,
            self.events,
            self.duration_ns
                .map(|ns| format!(" over {:.3} s", ns as f64 / 1e9))
                .unwrap_or_default(),
            human(self.peak_live_bytes),
            self.peak_live_bytes,
            self.capacity_bytes
                .map(|bytes| format!(", fixed arena {} ({bytes} bytes)", human(bytes)))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "  {:<18} {:>16} {:>7} {:>11} {:>6} {:>8} {:>9} {:>10} {:>8} {:>7}",
            "policy",
            "peak footprint",
            "ratio",
            "moved",
            "failed",
            "ns/op",
            "drv calls",
            "drv ms",
            "drv/time",
            ">=32MiB"
        );
        let percent = |share: Option<f64>| {
            share.map_or_else(|| "-".to_string(), |share| format!("{:.2}%", share * 100.0))
        };
        for policy in &self.policies {
            let calls = &policy.driver_calls;
            let _ = writeln!(
                out,
                "  {:<18} {:>16} {:>7.3} {:>11} {:>6} {:>8.1} {:>9} {:>10.2} {:>8} {:>7}",
                policy.name,
                human(policy.peak_footprint_bytes),
                policy.footprint_ratio,
                human(policy.compaction_bytes_moved),
                policy.failed_allocations,
                policy.ns_per_op,
                calls.creates + calls.releases + calls.maps + calls.unmaps + calls.set_access,
                calls.modeled_ns as f64 / 1e6,
                percent(policy.driver_time_share),
                percent(policy.full_bandwidth_share)
            );
        }
        if let Some(recorded) = &self.pytorch_recorded {
            let _ = writeln!(
                out,
                "  {:<18} {:>15} {:>10.3} {:>13} {:>8} {:>9}",
                recorded.name,
                human(recorded.peak_reserved_bytes),
                recorded.footprint_ratio,
                "-",
                "-",
                "-"
            );
        }
        if self.unknown_frees > 0 {
            let _ = writeln!(
                out,
                "  {} frees of blocks allocated before the trace began (recording started late, \
                 or its ring buffer wrapped): taken as live from the first event",
                self.unknown_frees
            );
        }
        for policy in &self.policies {
            if let Some(failure) = &policy.first_failure {
                let state = &failure.state;
                let _ = writeln!(
                    out,
                    "  {} first fails at event {} ({}): {} requested; {} live, {} free, largest free block {}",
                    policy.name,
                    failure.event,
                    failure.location,
                    human(failure.request_bytes),
                    human(state.live_bytes),
                    human(state.free_bytes),
                    human(state.largest_free_bytes)
                );
            }
        }
        for policy in &self.policies {
            if let Some(device) = &policy.device {
                for line in device.lines(policy.name, self.peak_live_bytes) {
                    let _ = writeln!(out, "{line}");
                }
            }
        }
        for policy in &self.skipped_policies {
            let _ = writeln!(out, "  note: {} skipped: {}", policy.name, policy.reason);
        }
        for skipped in &self.skipped_records {
            let _ = writeln!(
                out,
                "  warning: skipped {} {} (first at {})",
                skipped.count,
                skipped.reason.describe(),
                skipped.first
            );
        }
        out
    }
}

/// `bytes` over `live` (0 when nothing was live).
fn ratio(bytes: u64, live: u64) -> f64 {
    if live == 0 {
        0.0
    } else {
        bytes as f64 / live as f64
    }
}
