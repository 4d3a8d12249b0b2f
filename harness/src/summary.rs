//! The figures of a replay, as a table for people and as JSON lines.

use std::fmt::Write as _;

use serde::Serialize;

use crate::byte_size::human;
use crate::replay::{Failure, Outcome};
use crate::trace::{Skipped, Trace};

/// How footprint is defined, said the same way in the table, the JSON and
/// the report.
pub const FOOTPRINT_RULE: &str = "Footprint: every policy owns one address space that it maps in 2 MiB \
granules at its end, like a VMM pool; it maps more only when a request does not fit in what it has, \
and then the fewest granules that let the request fit at the end. Peak footprint is the most it ever \
had mapped. offset-allocator cannot grow, so it gets one 512 GiB arena and counts as mapped everything \
up to the granule above the highest byte it ever placed. Every request is aligned to 256 bytes.";

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
}

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
                    name: outcome.policy.as_str(),
                    peak_footprint_bytes: outcome.peak_footprint_bytes,
                    footprint_ratio: if trace.peak_live_bytes == 0 {
                        0.0
                    } else {
                        outcome.peak_footprint_bytes as f64 / trace.peak_live_bytes as f64
                    },
                    compaction_bytes_moved: outcome.bytes_moved,
                    failed_allocations: outcome.failed_allocations,
                    ns_per_op,
                    ops_per_second: if ns_per_op > 0.0 {
                        1e9 / ns_per_op
                    } else {
                        0.0
                    },
                    first_failure: outcome.first_failure.clone(),
                }
            })
            .collect();
        Self {
            trace: trace.name.clone(),
            events: trace.events.len(),
            peak_live_bytes: trace.peak_live_bytes,
            peak_live_event: trace.peak_live_event,
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
            "{}: {} events, peak live {} ({} bytes){}\n",
            self.trace,
            self.events,
            human(self.peak_live_bytes),
            self.peak_live_bytes,
            self.capacity_bytes
                .map(|bytes| format!(", fixed arena {} ({bytes} bytes)", human(bytes)))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "  {:<17} {:>16} {:>10} {:>13} {:>8} {:>9}",
            "policy", "peak footprint", "ratio", "moved", "failed", "ns/op"
        );
        for policy in &self.policies {
            let _ = writeln!(
                out,
                "  {:<17} {:>16} {:>10.3} {:>13} {:>8} {:>9.1}",
                policy.name,
                human(policy.peak_footprint_bytes),
                policy.footprint_ratio,
                human(policy.compaction_bytes_moved),
                policy.failed_allocations,
                policy.ns_per_op
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
