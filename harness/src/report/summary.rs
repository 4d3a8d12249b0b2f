//! The figures of a replay, as a table for people and as JSON lines.

use std::fmt::Write as _;

use serde::Serialize;

use crate::replay::device::DeviceFigures;
use crate::replay::policy::FOOTPRINT_RULE;
use crate::replay::spec::{Framework, Pick};
use crate::replay::{Failure, Outcome};
use crate::report::conclusion;
use ctx::text::{LINE_WIDTH, push_wrapped, wrap};
use memcore::bytes::{exact, human};
use trace::{Skipped, Trace};

/// One policy's figures for one trace.
#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    /// Policy name as on the command line.
    pub name: &'static str,
    /// Whether it moves live blocks (only for callers that hold handles).
    pub moves_blocks: bool,
    /// How a program of the trace's framework picks it, where it can.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pick: Option<Pick>,
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

impl PolicySummary {
    /// The row's figures as the table and the page write them, one per
    /// column of [`COLUMNS`] but the last (how to use it).
    pub fn cells(&self) -> [String; FIGURE_COLUMNS] {
        let percent = |share: Option<f64>| {
            share.map_or_else(|| "-".to_string(), |share| format!("{:.2}%", share * 100.0))
        };
        let calls = &self.driver_calls;
        [
            self.name.to_string(),
            if self.moves_blocks { "yes" } else { "no" }.to_string(),
            human(self.peak_footprint_bytes),
            format!("{:.3}", self.footprint_ratio),
            human(self.compaction_bytes_moved),
            self.failed_allocations.to_string(),
            format!("{:.1}", self.ns_per_op),
            (calls.creates + calls.releases + calls.maps + calls.unmaps + calls.set_access)
                .to_string(),
            format!("{:.2}", calls.modeled_ns as f64 / 1e6),
            percent(self.driver_time_share),
            percent(self.full_bandwidth_share),
        ]
    }
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
    /// The program ran with `expandable_segments:True`.
    pub expandable_segments: bool,
    /// Bytes already reserved when the history begins (recording started
    /// after segments were reserved), read from the snapshot's segments:
    /// the figure is partial where this is not zero.
    pub reserved_before_history_bytes: u64,
}

impl RecordedSummary {
    /// What the table's "how to use it" column says of the row.
    pub fn ran(&self) -> String {
        let ran = if self.expandable_segments {
            "what the program ran: PyTorch's caching allocator with expandable_segments:True"
        } else {
            "what the program ran: PyTorch's caching allocator"
        };
        if self.reserved_before_history_bytes > 0 {
            format!(
                "{ran}; partial: the history begins with {} already reserved (recording \
                 started late), counted from the segments the recording holds or frees",
                human(self.reserved_before_history_bytes)
            )
        } else {
            ran.to_string()
        }
    }
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
    /// The allocator library the trace was recorded under.
    pub framework: Framework,
    /// What the replay concluded and what the user can do, in a sentence
    /// or two with the figures.
    pub conclusion: Vec<String>,
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
        let framework = Framework::of(trace);
        let policies = outcomes
            .iter()
            .map(|outcome| {
                let ns_per_op = outcome.ns_per_op();
                PolicySummary {
                    name: outcome.policy.name,
                    moves_blocks: outcome.policy.moves_blocks,
                    pick: outcome.policy.pick(framework),
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
        let mut summary = Self {
            trace: trace.name.clone(),
            framework,
            conclusion: Vec::new(),
            events: trace.events.len(),
            peak_live_bytes: trace.peak_live_bytes,
            peak_live_event: trace.peak_live_event,
            unknown_frees: trace.unknown_frees,
            pytorch_recorded: trace.recorded.as_ref().map(|recorded| RecordedSummary {
                name: RECORDED_ROW,
                peak_reserved_bytes: recorded.peak_reserved_bytes,
                footprint_ratio: ratio(recorded.peak_reserved_bytes, trace.peak_live_bytes),
                peak_allocated_bytes: recorded.peak_allocated_bytes,
                expandable_segments: recorded.expandable_segments,
                reserved_before_history_bytes: recorded.reserved_before_history_bytes,
            }),
            duration_ns: trace.duration_ns,
            capacity_bytes,
            footprint_rule: FOOTPRINT_RULE,
            policies,
            skipped_policies,
            skipped_records: trace.skipped.clone(),
        };
        summary.conclusion = conclusion::conclude(&summary);
        summary
    }

    /// The table for people: first the rows a program of the trace's
    /// framework can use, then the models for comparison, each row saying
    /// whether it moves blocks; the conclusion under it. Columns are as
    /// wide as their cells (a header wider than them takes two lines), and
    /// every line fits [`LINE_WIDTH`].
    pub fn table(&self) -> String {
        let mut out = String::new();
        let say = push_wrapped;
        say(
            &mut out,
            &format!(
                "{}: {} events{}, peak live {}{}",
                self.trace,
                self.events,
                self.duration_ns
                    .map(|ns| format!(" over {:.3} s", ns as f64 / 1e9))
                    .unwrap_or_default(),
                exact(self.peak_live_bytes),
                self.capacity_bytes
                    .map(|bytes| format!(", fixed arena {}", exact(bytes)))
                    .unwrap_or_default()
            ),
            "",
            "  ",
        );
        let policy_row = |policy: &PolicySummary| {
            Line::Row(
                policy.cells().to_vec(),
                policy
                    .pick
                    .map(|pick| format!("{}: {}", COLUMNS[COLUMNS.len() - 1].header, pick.how)),
            )
        };
        let (mut usable, models): (Vec<&PolicySummary>, Vec<&PolicySummary>) = self
            .policies
            .iter()
            .partition(|policy| policy.pick.is_some());
        // The framework's own settings first, then cudamem's library.
        usable.sort_by_key(|policy| policy.pick.is_some_and(|pick| pick.cudamem));
        let mut lines = Vec::new();
        if !usable.is_empty() || self.pytorch_recorded.is_some() {
            lines.push(Line::Group(format!(
                "what {} program can use (none moves a block):",
                self.framework.a_program()
            )));
        }
        if let Some(recorded) = &self.pytorch_recorded {
            let mut cells = vec![
                recorded.name.to_string(),
                "no".to_string(),
                human(recorded.peak_reserved_bytes),
                format!("{:.3}", recorded.footprint_ratio),
            ];
            cells.resize(COLUMNS.len() - 1, "-".to_string());
            lines.push(Line::Row(cells, Some(recorded.ran())));
        }
        lines.extend(usable.into_iter().map(policy_row));
        if !models.is_empty() {
            lines.push(Line::Group(format!(
                "for comparison (research models, libraries {} program cannot pick):",
                self.framework.a_program()
            )));
        }
        lines.extend(models.into_iter().map(policy_row));
        out += &layout(&lines);
        say(
            &mut out,
            &format!("{DRIVER_TIME_NOTE}; `cudamem replay --help` explains every column"),
            "  * ",
            "    ",
        );
        if self.unknown_frees > 0 {
            say(
                &mut out,
                &format!(
                    "{} frees of blocks allocated before the trace began (recording started \
                     late, or its ring buffer wrapped): taken as live from the first event",
                    self.unknown_frees
                ),
                "  ",
                "    ",
            );
        }
        for policy in &self.policies {
            if let Some(failure) = &policy.first_failure {
                let state = &failure.state;
                say(
                    &mut out,
                    &format!(
                        "{} first fails at event {} ({}): {} requested; {} live, {} free, \
                         largest free block {}",
                        policy.name,
                        failure.event,
                        failure.location,
                        human(failure.request_bytes),
                        human(state.live_bytes),
                        human(state.free_bytes),
                        human(state.largest_free_bytes)
                    ),
                    "  ",
                    "    ",
                );
            }
        }
        for policy in &self.policies {
            if let Some(device) = &policy.device {
                for line in device.lines(policy.name, self.peak_live_bytes) {
                    let text = line.trim_start();
                    let indent = &line[..line.len() - text.len()];
                    say(&mut out, text, indent, &format!("{indent}  "));
                }
            }
        }
        for sentence in &self.conclusion {
            say(&mut out, sentence, "  => ", "     ");
        }
        for policy in &self.skipped_policies {
            say(
                &mut out,
                &format!("note: {} skipped: {}", policy.name, policy.reason),
                "  ",
                "    ",
            );
        }
        for skipped in &self.skipped_records {
            say(
                &mut out,
                &format!(
                    "warning: skipped {} {} (first at {})",
                    skipped.count,
                    skipped.reason.describe(),
                    skipped.first
                ),
                "  ",
                "    ",
            );
        }
        out
    }
}

/// A line of the replay table: a group's heading, or a row's cells (one
/// per column but the last) with what is said under it (the last column's).
enum Line {
    Group(String),
    Row(Vec<String>, Option<String>),
}

/// `lines` under the headers, each column as wide as its widest cell; a
/// header wider than its column is split at a space onto two lines where
/// that makes it narrower. The last column ("how to use it") goes under
/// its row, as it is too wide to share a line.
fn layout(lines: &[Line]) -> String {
    let columns = &COLUMNS[..COLUMNS.len() - 1];
    let rows: Vec<&Vec<String>> = lines
        .iter()
        .filter_map(|line| match line {
            Line::Row(cells, _) => Some(cells),
            Line::Group(_) => None,
        })
        .collect();
    let headers: Vec<(&str, &str)> = columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            let widest = rows
                .iter()
                .filter_map(|cells| cells.get(index))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0);
            split_header(column.header, widest)
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .zip(&headers)
        .enumerate()
        .map(|(index, (_, (top, bottom)))| {
            rows.iter()
                .filter_map(|cells| cells.get(index))
                .map(|cell| cell.chars().count())
                .chain([top.len(), bottom.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[&str]| {
        let mut text = String::from(" ");
        for ((cell, width), column) in cells.iter().zip(&widths).zip(columns) {
            if column.left {
                let _ = write!(text, " {cell:<width$}");
            } else {
                let _ = write!(text, " {cell:>width$}");
            }
        }
        text.trim_end().to_string() + "\n"
    };
    let mut out = String::new();
    if headers.iter().any(|(top, _)| !top.is_empty()) {
        out += &line(&headers.iter().map(|(top, _)| *top).collect::<Vec<_>>());
    }
    out += &line(
        &headers
            .iter()
            .map(|(_, bottom)| *bottom)
            .collect::<Vec<_>>(),
    );
    for entry in lines {
        match entry {
            Line::Group(title) => {
                out += &wrap(title, LINE_WIDTH, "  ", "    ");
                out.push('\n');
            }
            Line::Row(cells, under) => {
                out += &line(&cells.iter().map(String::as_str).collect::<Vec<_>>());
                if let Some(under) = under {
                    out += &wrap(under, LINE_WIDTH, "      ", "        ");
                    out.push('\n');
                }
            }
        }
    }
    out
}

/// `header` over a column whose widest cell is `widest` characters: on
/// one line (`("", header)`) where it fits or a split would narrow the
/// column by less than two characters, else split at the space that leaves
/// the narrower two lines.
fn split_header(header: &str, widest: usize) -> (&str, &str) {
    let one_line = header.len().max(widest);
    header
        .match_indices(' ')
        .map(|(at, _)| (&header[..at], &header[at + 1..]))
        .min_by_key(|(top, bottom)| top.len().max(bottom.len()))
        .filter(|(top, bottom)| top.len().max(bottom.len()).max(widest) + 2 <= one_line)
        .unwrap_or(("", header))
}

/// One column of the replay table: its header and what it means, for
/// `--help` and the report.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// The header, as printed.
    pub header: &'static str,
    /// Whether its cells are left-aligned (names) rather than right
    /// (figures).
    left: bool,
    /// What its figures mean, in plain words.
    pub means: &'static str,
}

/// How the driver time is known.
pub const DRIVER_TIME_NOTE: &str = "driver time is modelled: the calls counted, each priced at \
what it cost on an H200 when measured, not timed here";

/// The columns a policy's figures fill: all of [`COLUMNS`] but the last
/// (how to use it), which only the policies a program can pick have.
pub const FIGURE_COLUMNS: usize = COLUMNS.len() - 1;

/// The replay table's columns, in order.
pub const COLUMNS: &[Column] = &[
    Column {
        header: "policy",
        left: true,
        means: "the allocator replayed (its name for --policy); `pytorch (recorded)` is what \
                PyTorch itself reserved while the snapshot was taken",
    },
    Column {
        header: "moves",
        left: false,
        means: "whether it moves live blocks to close gaps; one that does needs a program that \
                holds handles, so no PyTorch or RMM program can use it",
    },
    Column {
        header: "peak mapped",
        left: false,
        means: "the most device memory the policy held mapped at once (its footprint): the \
                figure that decides whether the program runs out of memory",
    },
    Column {
        header: "x live",
        left: false,
        means: "peak mapped over the most bytes the program had allocated at once; 1.000 \
                wastes nothing, 1.100 holds 10% more than it needs",
    },
    Column {
        header: "copied",
        left: false,
        means: "bytes compaction copied on the device to close gaps (0 for a policy that never \
                moves a block)",
    },
    Column {
        header: "failed",
        left: false,
        means: "requests refused; only a fixed arena (--capacity) can refuse one",
    },
    Column {
        header: "cpu ns/call",
        left: false,
        means: "host time the allocator's own bookkeeping took per allocate or free, in \
                nanoseconds, on this machine (driver time not included); it moves with the \
                machine's load, so compare rows of one run, not runs",
    },
    Column {
        header: "driver calls",
        left: false,
        means: "calls to the driver's virtual memory API (create, map, set access, unmap, \
                release) a real pool would make",
    },
    Column {
        header: "driver ms*",
        left: false,
        means: "those calls' time in milliseconds, modelled from their costs measured on an \
                H200 (not timed here)",
    },
    Column {
        header: "driver %",
        left: false,
        means: "that time as a share of the trace's recorded run time",
    },
    Column {
        header: "in 32 MiB",
        left: false,
        means: "share of the peak live bytes that lie in physical handles of 32 MiB or more, \
                which the GPU reads at full bandwidth; `-` where the policy has no handles",
    },
    Column {
        header: "how to use it",
        left: true,
        means: "for what the trace's program can use: the setting or library that gives it",
    },
];

/// Every column and what it means, for `cudamem replay --help`.
pub fn columns_help() -> String {
    let mut text = String::from("Columns of the table:\n");
    let indent = " ".repeat(16);
    for column in COLUMNS {
        let lead = format!("  {:<13} ", column.header);
        let _ = writeln!(text, "{}", wrap(column.means, LINE_WIDTH, &lead, &indent));
    }
    text + &wrap(
        "Rows come in two groups: what the trace's program can use (PyTorch's settings, \
         cudamem's PyTorch allocator, RMM's resources), then models and libraries for \
         comparison. The line after `=>` says what the user can do, with the figures.",
        LINE_WIDTH,
        "",
        "",
    )
}

/// `bytes` over `live` (0 when nothing was live).
fn ratio(bytes: u64, live: u64) -> f64 {
    if live == 0 {
        0.0
    } else {
        bytes as f64 / live as f64
    }
}
