//! `cudamem explain --snapshot FILE [--at dump|peak|oom|N]`: the state a
//! PyTorch memory snapshot captured, at the dump or (walked back through its
//! history) at the peak, at each `oom` entry or after entry N. Per segment
//! its bytes (allocated, active, free, largest free block); what is truly
//! stranded and what PyTorch's retry before an out-of-memory would free
//! (snapshot_oom.rs); and the live blocks that keep segments from being
//! returned, with the stack that allocated each.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::output;
use crate::cli::snapshot_oom::{self, OOM_RULE, OomStory};
use crate::report::{escape, page};
use ctx::text::push_wrapped;
use memcore::bytes::human;
use trace;
use trace::display_name;
use trace::snapshot::moments::{self, AtMoment, Moment, OomEntry};
use trace::snapshot::state::{self, Segment, State};

/// Pinned segments the text lists before it says how many more there are.
const LISTED_SEGMENTS: usize = 10;
/// Live blocks listed per pinned segment in the text.
const LISTED_BLOCKS: usize = 5;
/// Frames of a holder's stack shown in the text (all kept ones in JSON and
/// in the report's hover titles).
const LISTED_FRAMES: usize = 4;
/// `oom` entries told one by one.
const LISTED_OOMS: usize = 10;

/// How fragmentation is measured, said the same way in text, JSON and HTML.
pub const FRAGMENTATION_RULE: &str = "Fragmented bytes: free bytes PyTorch holds outside the \
largest free block. Pinned (stranded) free bytes: free bytes of segments that hold a live block; \
empty_cache(), and the retry PyTorch makes before it raises out of memory, return only segments \
with no live block.";

/// Run `cudamem explain --snapshot FILE --at MOMENT`, writing what it found
/// to `out`.
pub fn run(
    path: &Path,
    at: Moment,
    device: Option<usize>,
    json: bool,
    report: Option<&Path>,
    out: &mut dyn Write,
) -> Result<()> {
    if let Some(report) = report {
        output::refuse_input("--report", report, &[path])?;
    }
    let (pickle, budget) = trace::file::load_pickle(path)?;
    let ooms = moments::oom_entries(path, &pickle, &budget, device)?;
    let limit = budget.for_decoded(pickle.decoded_bytes()).output_bytes;
    let name = display_name(path);
    let too_much = |bytes: usize| {
        anyhow::anyhow!(
            "{}: the explanation would take more than {limit} bytes ({bytes} so far), the most \
             cudamem prints for a file of this size",
            path.display(),
        )
    };
    // Each moment's state is built, told and dropped in turn (latest
    // first); what is kept is its text, within the output bound, and the
    // earliest state for the page.
    let mut told: Vec<String> = Vec::new();
    let mut bytes = 0usize;
    let mut first: Option<(AtMoment, OomStory)> = None;
    let build = if json { usize::MAX } else { LISTED_OOMS };
    let count = moments::each(path, &pickle, &budget, at, device, build, |moment| {
        let story = snapshot_oom::story(&moment.state, moment.oom.as_ref());
        let text = if json {
            serde_json::to_string(&serde_json::json!({
                "after_entry": moment.after_entry,
                "device": moment.device,
                "oom": moment.oom,
                "warnings": moment.warnings,
                "story": story,
                "state": moment.state,
            }))?
        } else {
            moment_text(&name, &moment, &story)
        };
        bytes += text.len();
        if bytes as u64 > limit {
            return Err(too_much(bytes));
        }
        let mut text = text;
        text.shrink_to_fit();
        told.push(text);
        first = Some((moment, story));
        Ok::<(), anyhow::Error>(())
    })?;
    drop(pickle);
    told.reverse();
    if json {
        let mut value = match &first {
            Some((moment, _)) => serde_json::to_value(&moment.state)?,
            None => serde_json::json!({}),
        };
        if let Some(object) = value.as_object_mut() {
            object.insert("snapshot".into(), name.clone().into());
            object.insert("at".into(), moment_name(at).into());
            object.insert("fragmentation_rule".into(), FRAGMENTATION_RULE.into());
            object.insert("oom_rule".into(), OOM_RULE.into());
            object.insert("oom_entries".into(), serde_json::to_value(&ooms)?);
            object.insert("moments".into(), serde_json::json!([]));
        }
        // The moments, already told (within the bound), go into the list
        // left empty, written as they are rather than copied again.
        let head = serde_json::to_string(&value)?;
        let (before, after) = head
            .split_once("\"moments\":[]")
            .context("the JSON object lost its moments")?;
        if (head.len() + bytes) as u64 > limit {
            return Err(too_much(head.len() + bytes));
        }
        write!(out, "{before}\"moments\":[")?;
        for (index, moment) in told.iter().enumerate() {
            if index > 0 {
                out.write_all(b",")?;
            }
            out.write_all(moment.as_bytes())?;
        }
        writeln!(out, "]{after}")?;
    } else {
        let shown = text_at(&name, at, &told, count, &ooms);
        if shown.len() as u64 > limit {
            return Err(too_much(shown.len()));
        }
        out.write_all(shown.as_bytes())?;
    }
    if let Some(report) = report {
        let first = first
            .as_ref()
            .map(|(moment, story)| (&moment.state, story, moment.warnings.as_slice()));
        std::fs::write(report, html(&name, at, first, &ooms))
            .with_context(|| format!("writing the report to {}", report.display()))?;
        if !json {
            writeln!(out, "report: {}", report.display())?;
        }
    }
    Ok(())
}

/// `--at`'s value as the output names it.
fn moment_name(at: Moment) -> String {
    match at {
        Moment::Dump => "dump".into(),
        Moment::Peak => "peak".into(),
        Moment::Oom => "oom".into(),
        Moment::After(index) => index.to_string(),
    }
}

/// Where a moment is, for a heading.
fn moment_heading(moment: &AtMoment) -> String {
    let when = moment_when(moment);
    match moment.device {
        Some(device) => format!("{when} (device {device})"),
        None => when,
    }
}

/// When a moment is.
fn moment_when(moment: &AtMoment) -> String {
    match (moment.after_entry, &moment.oom) {
        (None, _) => "at the dump".into(),
        (Some(index), Some(oom)) => format!(
            "at oom entry {index}: {} requested, {} free on the device",
            human(oom.requested_bytes),
            human(oom.device_free_bytes)
        ),
        (Some(index), None) => format!("after history entry {index}"),
    }
}

/// One moment for people: where it is, any warning, the state.
fn moment_text(name: &str, moment: &AtMoment, story: &OomStory) -> String {
    let mut out = format!("{}\n", moment_heading(moment));
    for warning in &moment.warnings {
        push_wrapped(&mut out, &format!("warning: {warning}"), "", "  ");
    }
    out + &text(name, &moment.state, story)
}

/// Every moment asked for, for people: the `told` ones of `count`.
fn text_at(name: &str, at: Moment, told: &[String], count: usize, ooms: &[OomEntry]) -> String {
    let mut out = String::new();
    if count == 0 {
        let _ = writeln!(
            out,
            "{name}: the history holds no oom entry (--at {} found nothing)",
            moment_name(at)
        );
    }
    for moment in told {
        out += moment;
    }
    if count > told.len() {
        let _ = writeln!(
            out,
            "and {} more oom entries (all in --json)",
            count - told.len()
        );
    }
    if at != Moment::Oom && !ooms.is_empty() {
        let _ = writeln!(
            out,
            "the history has {} oom entries (the first at entry {}): --at oom explains each",
            ooms.len(),
            ooms[0].index
        );
    }
    out
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
        Some(frame) => frame_text(frame),
        None => "(no frames recorded)".into(),
    }
}

/// A frame as `file:line in function`, control characters escaped.
fn frame_text(frame: &state::Frame) -> String {
    trace::printable(&frame.to_string())
}

/// A block's stack, innermost first, one frame a line.
pub(crate) fn stack_text(block: &state::LiveBlock, frames: usize) -> Vec<String> {
    block.stack.iter().take(frames).map(frame_text).collect()
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

/// The state for people, with its out-of-memory story.
pub fn text(name: &str, state: &State, story: &OomStory) -> String {
    let mut out = String::new();
    let say = push_wrapped;
    say(
        &mut out,
        &format!(
            "{name}: {} segments, {} reserved, {} allocated, {} active, {} free",
            state.segments.len(),
            human(state.reserved_bytes),
            human(state.allocated_bytes),
            human(state.active_bytes),
            human(state.free_bytes),
        ),
        "",
        "  ",
    );
    say(
        &mut out,
        &format!(
            "free: {} truly stranded in segments holding live blocks (largest free block there \
             {}); {} in segments with no live block, which PyTorch frees and retries with before \
             it raises out of memory",
            human(story.stranded_bytes),
            human(story.largest_stranded_block_bytes),
            human(story.retry_frees_bytes),
        ),
        "",
        "  ",
    );
    say(&mut out, &story.conclusion, "=> ", "   ");
    let _ = writeln!(
        out,
        "  {:<14} {:<5} {:>11} {:>11} {:>11} {:>11} {:>13}",
        "segment", "pool", "size", "allocated", "active", "free", "largest free"
    );
    for segment in &state.segments {
        let _ = writeln!(out, "  {}", segment_line(segment));
    }
    let pinned = state.pinned_segments();
    say(
        &mut out,
        &format!(
            "live blocks keep {} segments from being returned: {} free ({:.1}% of reserved) \
             that empty_cache() cannot release",
            pinned.len(),
            human(state.pinned_free_bytes),
            share(state.pinned_free_bytes, state.reserved_bytes),
        ),
        "",
        "  ",
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
            let lead = format!(
                "    {:>11} at {:#x}  ",
                human(block.size_bytes),
                block.address
            );
            say(&mut out, &block_origin(block), &lead, "          ");
            for frame in stack_text(block, LISTED_FRAMES) {
                say(&mut out, &frame, "        at ", "          ");
            }
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

/// The moment asked for as an HTML page: the conclusion, the picture of its
/// segments and blocks, the `oom` entries, and the tables.
pub fn html(
    name: &str,
    at: Moment,
    first: Option<(&State, &OomStory, &[String])>,
    ooms: &[OomEntry],
) -> String {
    let mut body = format!(
        "<p>the moment shown: {} (another with <code>--at dump|peak|oom|N</code>)</p>\n",
        escape(&moment_name(at))
    );
    let Some((state, story, warnings)) = first else {
        body += "<p>The history holds no oom entry.</p>\n";
        return page(&format!("cudamem explain: {name}"), &body);
    };
    for warning in warnings {
        let _ = writeln!(body, "<p><b>warning:</b> {}</p>", escape(warning));
    }
    let _ = writeln!(body, "<p><b>{}</b></p>", escape(&story.conclusion));
    body += &crate::report::snapshot_map::picture(state);
    if !ooms.is_empty() {
        body += "<h2>Out-of-memory entries</h2>\n<table><tr><th>entry</th><th>requested</th>\
                 <th>free on the device</th></tr>\n";
        for oom in ooms {
            let _ = writeln!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                oom.index,
                human(oom.requested_bytes),
                human(oom.device_free_bytes)
            );
        }
        body += "</table>\n";
    }
    let _ = writeln!(body, "<p>{}</p>", escape(OOM_RULE));
    body += &state_html(state);
    page(&format!("cudamem explain: {name}"), &body)
}

/// The state's figures and tables, for the page.
fn state_html(state: &State) -> String {
    let mut body = format!(
        "<p>{} segments, {} reserved, {} allocated, {} active, {} free. Largest free block {}; \
         free outside it {} ({:.1}% of reserved; the retry before an out of memory returns what \
         of it lies in segments with no live block); stranded (free in segments holding a live \
         block) {} ({:.1}% of reserved).</p>\n<p>{}</p>\n",
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
                "<tr><td>{:#x}</td><td>{}</td><td>{}</td><td>{:#x}</td><td style=\"text-align:left\" title=\"{}\">{}</td></tr>",
                segment.address,
                human(segment.free_bytes),
                human(block.size_bytes),
                block.address,
                escape(&stack_text(block, state::STACK_FRAMES).join("\n")),
                escape(&block_origin(block))
            );
        }
    }
    body += "</table>\n";
    body
}
