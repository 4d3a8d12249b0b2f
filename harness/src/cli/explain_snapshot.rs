//! `cudamem explain --snapshot FILE`: the state a PyTorch memory snapshot
//! captured. Per segment its bytes (allocated, active, free, largest free
//! block); the free bytes no request larger than the largest free block
//! could use; and the live blocks that keep otherwise-empty segments from
//! being returned by `torch.cuda.empty_cache()`, with the frame of the
//! user's code that allocated each.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::output;
use crate::report::{escape, page};
use crate::trace;
use crate::trace::display_name;
use crate::trace::snapshot::state::{self, Segment, State};
use memcore::bytes::human;

/// Pinned segments the text lists before it says how many more there are.
const LISTED_SEGMENTS: usize = 10;
/// Live blocks listed per pinned segment in the text.
const LISTED_BLOCKS: usize = 5;

/// How fragmentation is measured, said the same way in text, JSON and HTML.
pub const FRAGMENTATION_RULE: &str = "Fragmented bytes: free bytes PyTorch holds outside the \
largest free block; a request larger than that block can use none of them. Pinned free bytes: free \
bytes of segments that hold a live block; empty_cache() returns only segments with no live block.";

/// Run `cudamem explain --snapshot FILE`, writing what it found to `out`.
pub fn run(path: &Path, json: bool, report: Option<&Path>, out: &mut dyn Write) -> Result<()> {
    if let Some(report) = report {
        output::refuse_input("--report", report, &[path])?;
    }
    let (pickle, budget) = trace::file::load_pickle(path)?;
    let state = state::read(path, &pickle, &budget)?;
    let budget = budget.for_decoded(pickle.decoded_bytes());
    drop(pickle);
    let name = display_name(path);
    let shown = if json {
        let mut value = serde_json::to_value(&state)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("snapshot".into(), name.clone().into());
            object.insert("fragmentation_rule".into(), FRAGMENTATION_RULE.into());
        }
        serde_json::to_string(&value)? + "\n"
    } else {
        text(&name, &state)
    };
    if shown.len() as u64 > budget.output_bytes {
        anyhow::bail!(
            "{}: the explanation would take {} bytes, more than the {} cudamem prints \
             for a file of this size",
            path.display(),
            shown.len(),
            budget.output_bytes
        );
    }
    out.write_all(shown.as_bytes())?;
    if let Some(report) = report {
        std::fs::write(report, html(&name, &state))
            .with_context(|| format!("writing the report to {}", report.display()))?;
        if !json {
            writeln!(out, "report: {}", report.display())?;
        }
    }
    Ok(())
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

fn block_origin(block: &state::LiveBlock) -> String {
    match &block.frame {
        Some(frame) => format!("{}:{} in {}", frame.file, frame.line, frame.function),
        None => "(no frames recorded)".into(),
    }
}

fn segment_line(segment: &Segment) -> String {
    format!(
        "{:#014x} {:<5} {:>11} {:>11} {:>11} {:>11} {:>13}{}",
        segment.address,
        segment.pool,
        human(segment.total_bytes),
        human(segment.allocated_bytes),
        human(segment.active_bytes),
        human(segment.free_bytes),
        human(segment.largest_free_bytes),
        if segment.expandable {
            "  expandable"
        } else {
            ""
        }
    )
}

/// The state for people.
pub fn text(name: &str, state: &State) -> String {
    let mut out = format!(
        "{name}: {} segments, {} reserved, {} allocated, {} active, {} free\n",
        state.segments.len(),
        human(state.reserved_bytes),
        human(state.allocated_bytes),
        human(state.active_bytes),
        human(state.free_bytes),
    );
    let _ = writeln!(
        out,
        "fragmentation: largest free block {}; {} of free bytes lie outside it ({:.1}% of reserved): \
         a request over {} can use none of them",
        human(state.largest_free_bytes),
        human(state.fragmented_bytes),
        100.0 * state.fragmented_share,
        human(state.largest_free_bytes),
    );
    let _ = writeln!(
        out,
        "  {:<14} {:<5} {:>11} {:>11} {:>11} {:>11} {:>13}",
        "segment", "pool", "size", "allocated", "active", "free", "largest free"
    );
    for segment in &state.segments {
        let _ = writeln!(out, "  {}", segment_line(segment));
    }
    let pinned = state.pinned_segments();
    let _ = writeln!(
        out,
        "live blocks keep {} segments from being returned: {} free ({:.1}% of reserved) \
         that empty_cache() cannot release",
        pinned.len(),
        human(state.pinned_free_bytes),
        share(state.pinned_free_bytes, state.reserved_bytes),
    );
    for segment in pinned.iter().take(LISTED_SEGMENTS) {
        let _ = writeln!(
            out,
            "  segment {:#x} ({}, {} free) held by {} live block(s):",
            segment.address,
            human(segment.total_bytes),
            human(segment.free_bytes),
            segment.live_blocks.len()
        );
        for block in segment.live_blocks.iter().take(LISTED_BLOCKS) {
            let _ = writeln!(
                out,
                "    {:>11} at {:#x}  {}",
                human(block.size_bytes),
                block.address,
                block_origin(block)
            );
        }
        if segment.live_blocks.len() > LISTED_BLOCKS {
            let _ = writeln!(
                out,
                "    and {} more",
                segment.live_blocks.len() - LISTED_BLOCKS
            );
        }
    }
    if pinned.len() > LISTED_SEGMENTS {
        let _ = writeln!(
            out,
            "  and {} more segments (all in --json)",
            pinned.len() - LISTED_SEGMENTS
        );
    }
    out
}

/// The state as an HTML page.
pub fn html(name: &str, state: &State) -> String {
    let mut body = format!(
        "<p>{} segments, {} reserved, {} allocated, {} active, {} free. Largest free block {}; \
         fragmented {} ({:.1}% of reserved); pinned free {} ({:.1}% of reserved).</p>\n<p>{}</p>\n",
        state.segments.len(),
        human(state.reserved_bytes),
        human(state.allocated_bytes),
        human(state.active_bytes),
        human(state.free_bytes),
        human(state.largest_free_bytes),
        human(state.fragmented_bytes),
        100.0 * state.fragmented_share,
        human(state.pinned_free_bytes),
        share(state.pinned_free_bytes, state.reserved_bytes),
        escape(FRAGMENTATION_RULE)
    );
    body += "<h2>Segments</h2>\n<table><tr><th>segment</th><th>pool</th><th>size</th>\
             <th>allocated</th><th>active</th><th>free</th><th>largest free</th></tr>\n";
    for segment in &state.segments {
        let _ = writeln!(
            body,
            "<tr><td>{:#x}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            segment.address,
            if segment.expandable {
                " (expandable)"
            } else {
                ""
            },
            escape(&segment.pool),
            human(segment.total_bytes),
            human(segment.allocated_bytes),
            human(segment.active_bytes),
            human(segment.free_bytes),
            human(segment.largest_free_bytes)
        );
    }
    body += "</table>\n<h2>Live blocks that keep segments from being returned</h2>\n\
             <table><tr><th>segment</th><th>segment free</th><th>block</th><th>address</th>\
             <th>allocated at</th></tr>\n";
    for segment in state.pinned_segments() {
        for block in &segment.live_blocks {
            let _ = writeln!(
                body,
                "<tr><td>{:#x}</td><td>{}</td><td>{}</td><td>{:#x}</td><td style=\"text-align:left\">{}</td></tr>",
                segment.address,
                human(segment.free_bytes),
                human(block.size_bytes),
                block.address,
                escape(&block_origin(block))
            );
        }
    }
    body += "</table>\n";
    page(&format!("cudamem explain: {name}"), &body)
}
