//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`): a pickled
//! dict whose `device_traces` holds, per device, the allocator's history as
//! dicts `{action, addr, size, stream, frames, ...}`, and whose `segments`
//! hold the allocator's state when it was dumped.
//!
//! A replay uses `alloc` and the free that really returned the block:
//! `free_completed` (the block's stream work finished), or `free_requested`
//! when the history has no completions (older PyTorch, or no stream use).
//! A free of a block the history never allocated (recording began late, or
//! the ring buffer of `max_entries` wrapped) is a block that was live from
//! the start. The segment events (`segment_alloc`/`segment_free` for the
//! default allocator, `segment_map`/`segment_unmap` for expandable
//! segments) give the bytes PyTorch itself reserved over time.

pub mod blocks;
pub mod moments;
pub mod pickle;
pub mod state;

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use pickle::{Pickle, Value};

use blocks::BlockModel;

use crate::budget::{Counter, ReadBudget};
use crate::{HOVER_FRAMES, Location, Problem, Recorded, Trace, TraceBuilder, TraceError};
use state::Stacks;

/// Actions that neither allocate, free nor change what is reserved.
const BOOKKEEPING: [&str; 3] = ["snapshot", "oom", "user_defined"];

/// A string of the snapshot (a frame's file or function name, a segment
/// type) as tables show it: control characters escaped, at most 80
/// characters. (Values quoted in errors go through [`crate::quote`].)
fn cut(text: &str) -> String {
    // Only the first characters are shown: escape and copy no more.
    let head = text
        .char_indices()
        .nth(81)
        .map_or(text, |(at, _)| &text[..at]);
    let shown = crate::printable(head);
    if head.len() == text.len() && shown.chars().count() <= 80 {
        shown
    } else {
        let mut short: String = shown.chars().take(77).collect();
        short.push_str("...");
        short
    }
}

/// A frame as a hover shows it: `file:line in function`, a file of an
/// installed package named from the package on.
fn short_frame(frame: &state::Frame) -> String {
    let text = frame.to_string();
    ["site-packages/", "dist-packages/"]
        .iter()
        .find_map(|packages| text.split_once(packages).map(|(_, rest)| rest.to_string()))
        .unwrap_or(text)
}

/// Read the pickle of a snapshot from `input` (already decompressed).
pub fn read_pickle(
    path: &Path,
    input: impl BufRead,
    budget: &ReadBudget,
) -> Result<Pickle, TraceError> {
    pickle::read(input, budget).map_err(|err| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem: match err {
            pickle::PickleError::TooLarge { limit_bytes } => Problem::TooLarge { limit_bytes },
            pickle::PickleError::Protocol { protocol } => Problem::PickleProtocol { protocol },
            pickle::PickleError::Limit {
                offset,
                what,
                limit,
                memory,
            } => Problem::PickleLimit {
                offset,
                what,
                limit,
                memory,
            },
            err => Problem::NotSnapshot(format!("unreadable pickle: {err}")),
        },
    })
}

/// Parse a snapshot: one trace per device with events, or only
/// `device`'s (the others' entries are neither built nor counted).
pub fn parse(
    path: &Path,
    name: &str,
    input: impl BufRead,
    budget: &ReadBudget,
    device: Option<u32>,
) -> Result<Vec<Trace>, TraceError> {
    let pickle = read_pickle(path, input, budget)?;
    traces(path, name, &pickle, budget, device)
}

/// The snapshot's root dict, checked to be one.
pub fn root(path: &Path, pickle: &Pickle) -> Result<Value, TraceError> {
    let whole = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    let root = pickle.root();
    if pickle.pairs(root).is_none() {
        return Err(whole(Problem::NotSnapshot(format!(
            "the pickle holds a {}, not a dict",
            Pickle::kind(root)
        ))));
    }
    if pickle.get(root, "segments").is_none() {
        return Err(whole(Problem::NotSnapshot(
            "the dict has no \"segments\" key".into(),
        )));
    }
    Ok(root)
}

/// The most devices a PyTorch snapshot can list: PyTorch numbers devices
/// with an 8-bit index (`c10::DeviceIndex`).
pub const MAX_DEVICES: usize = 128;

/// The traces of a read snapshot, one per device with events (only
/// `device`'s when given); the entries read together (a list shared by
/// several devices counted once per device) within `budget.events`.
pub fn traces(
    path: &Path,
    name: &str,
    pickle: &Pickle,
    budget: &ReadBudget,
    device: Option<u32>,
) -> Result<Vec<Trace>, TraceError> {
    let whole = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    let budget = budget
        .for_decoded(pickle.decoded_bytes())
        .after_holding(pickle.held_bytes());
    let root = root(path, pickle)?;
    let Some(devices) = pickle
        .get(root, "device_traces")
        .and_then(|value| pickle.items(value))
    else {
        return Err(whole(Problem::NotSnapshot(
            "the dict has no \"device_traces\" list (record with \
             torch.cuda.memory._record_memory_history before dumping); \
             `cudamem explain --snapshot FILE` reads the segments it holds"
                .into(),
        )));
    };

    if devices.len() > MAX_DEVICES {
        return Err(whole(Problem::TooManyDevices {
            what: format!("device_traces lists {} devices", devices.len()),
        }));
    }
    let mut lists = Vec::with_capacity(devices.len());
    for (device, entries) in devices.iter().enumerate() {
        let Some(entries) = pickle.items(entries) else {
            return Err(whole(Problem::NotSnapshot(format!(
                "device_traces[{device}] is a {}, not a list",
                Pickle::kind(entries)
            ))));
        };
        lists.push(entries);
    }
    let non_empty = lists.iter().filter(|entries| !entries.is_empty()).count();
    if let Some(wanted) = device {
        let present: Vec<u32> = (0u32..)
            .zip(&lists)
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(index, _)| index)
            .collect();
        if !present.contains(&wanted) {
            return Err(whole(Problem::NoEventsForDevice {
                device: wanted,
                present,
            }));
        }
        for (index, entries) in (0u32..).zip(lists.iter_mut()) {
            if index != wanted {
                *entries = pickle::Items::none(pickle);
            }
        }
    }
    let total: u64 = lists.iter().map(|entries| entries.len() as u64).sum();
    let mut entries_read = Counter::new(budget.events);
    if !entries_read.take(total) {
        return Err(whole(Problem::OverBudget {
            what: "trace entries",
            limit: budget.events,
        }));
    }
    let mut traces = Vec::new();
    let mut stacks = Stacks::new(pickle, budget.frames);
    for (device, entries) in (0u32..).zip(lists) {
        if entries.is_empty() {
            continue;
        }
        let trace_name = if non_empty > 1 {
            format!("{name} [device {device}]")
        } else {
            name.to_string()
        };
        let reserved_at_dump =
            dump_reserved(pickle, root, device).map_err(|(index, problem)| TraceError {
                path: path.to_path_buf(),
                location: Location::Segment { index },
                problem,
            })?;
        let trace = parse_device(
            pickle,
            &mut stacks,
            device,
            entries,
            trace_name,
            reserved_at_dump,
        )
        .map_err(|(index, problem)| TraceError {
            path: path.to_path_buf(),
            location: Location::Entry { device, index },
            problem,
        })?;
        traces.push(trace);
    }
    if traces.is_empty() {
        return Err(whole(Problem::NotSnapshot(
            "device_traces holds no events (was _record_memory_history enabled?); \
             `cudamem explain --snapshot FILE` reads the segments it holds at the dump: what is \
             stranded, what is cached, and the stacks that hold them"
                .into(),
        )));
    }
    Ok(traces)
}

fn parse_device(
    pickle: &Pickle,
    stacks: &mut Stacks<'_>,
    device: u32,
    entries: pickle::Items<'_>,
    name: String,
    reserved_at_dump: Option<u64>,
) -> Result<Trace, (u64, Problem)> {
    let mut has_completed = false;
    for (index, entry) in entries.iter().enumerate() {
        if action(pickle, entry).map_err(|problem| (index as u64, problem))? == "free_completed" {
            has_completed = true;
            break;
        }
    }
    let free_action = if has_completed {
        "free_completed"
    } else {
        "free_requested"
    };

    let mut trace = TraceBuilder::new(name);
    let mut pushed = 0usize;
    let mut expandable_segments = false;
    // The lowest the history's own count goes (below zero: segments freed
    // that it never saw reserved) and where it ends, to find what was
    // reserved before it began.
    let mut history_reserved = 0i128;
    let mut history_low = 0i128;
    let mut curve = vec![(0usize, 0i128)];
    let mut history_high = 0i128;
    let mut model = BlockModel::default();
    // Each distinct stack's text once, by its index in `stack_texts`.
    let mut stack_texts: Vec<String> = Vec::new();
    let mut stack_ids: HashMap<String, u32> = HashMap::new();
    let mut text_of_items: HashMap<u32, Option<u32>> = HashMap::new();
    let mut alloc_stacks: Vec<(u64, u32)> = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let fail = |problem| (index as u64, problem);
        let at = Location::Entry {
            device,
            index: index as u64,
        };
        let action = action(pickle, entry).map_err(fail)?;
        // PyTorch stamps each entry in microseconds; older snapshots do not.
        if pickle.get(entry, "time_us").is_some() {
            let us = integer(pickle, entry, "time_us").map_err(fail)?;
            // Nanoseconds past 64 bits (584 years) are no time a trace records.
            let ns = us.checked_mul(1_000).ok_or_else(|| {
                fail(Problem::Malformed(format!(
                    "\"time_us\" {us} is past 2^64 nanoseconds (584 years)"
                )))
            })?;
            trace.observe_time(ns);
        }
        match action {
            "alloc" => {
                let addr = integer(pickle, entry, "addr").map_err(fail)?;
                let size = integer(pickle, entry, "size").map_err(fail)?;
                trace.allocate(addr, size, at).map_err(fail)?;
                model.alloc(addr, size);
                pushed += 1;
                if let Some(frames) = pickle.get(entry, "frames") {
                    let (stack, items) = stacks.stack_of(frames).map_err(fail)?;
                    // Each frames list's text is built once.
                    let cached = items.and_then(|items| text_of_items.get(&items).copied());
                    let id = match cached {
                        Some(id) => id,
                        None => {
                            let (user, top) = &*stack;
                            let id = (user.is_some() || !top.is_empty()).then(|| {
                                let mut shown =
                                    vec![user.as_ref().map_or_else(String::new, short_frame)];
                                shown.extend(top.iter().take(HOVER_FRAMES).map(short_frame));
                                let text = shown.join("\n");
                                let next = stack_texts.len() as u32;
                                *stack_ids.entry(text).or_insert_with_key(|text| {
                                    stack_texts.push(text.clone());
                                    next
                                })
                            });
                            if let Some(items) = items {
                                text_of_items.insert(items, id);
                            }
                            id
                        }
                    };
                    if let Some(id) = id {
                        alloc_stacks.push((index as u64, id));
                    }
                }
            }
            "free_requested" | "free_completed" => {
                let addr = integer(pickle, entry, "addr").map_err(fail)?;
                let size = integer(pickle, entry, "size").map_err(fail)?;
                if action == "free_requested" {
                    model.free_requested(addr);
                }
                if action == free_action {
                    model.free_completed(addr);
                    trace.free_or_assume(addr, size, at).map_err(fail)?;
                    pushed += 1;
                }
            }
            "segment_alloc" | "segment_map" => {
                let addr = integer(pickle, entry, "addr").map_err(fail)?;
                let size = integer(pickle, entry, "size").map_err(fail)?;
                crate::check_segment_size(size).map_err(fail)?;
                if action == "segment_alloc" {
                    model.segment_alloc(addr, size);
                } else {
                    model.expandable();
                    expandable_segments = true;
                }
                history_reserved += i128::from(size);
                if history_reserved > i128::from(u64::MAX) {
                    return Err(fail(Problem::BadSize {
                        text: size.to_string(),
                        why: "makes the reserved bytes overflow 64 bits",
                    }));
                }
                history_high = history_high.max(history_reserved);
                curve.push((pushed, history_reserved));
            }
            "segment_free" | "segment_unmap" => {
                let addr = integer(pickle, entry, "addr").map_err(fail)?;
                let size = integer(pickle, entry, "size").map_err(fail)?;
                crate::check_segment_size(size).map_err(fail)?;
                if action == "segment_free" {
                    model.segment_free(addr, size);
                } else {
                    model.expandable();
                    expandable_segments = true;
                }
                // A segment reserved before recording began: the curve counts
                // only what the history shows.
                history_reserved -= i128::from(size);
                history_low = history_low.min(history_reserved);
                curve.push((pushed, history_reserved));
            }
            other if BOOKKEEPING.contains(&other) => {}
            other => return Err(fail(Problem::UnknownAction(other.to_string()))),
        }
    }
    let mut trace = trace.finish();
    // What was reserved before the history began: the dump's segments less
    // what the history added, and at least what it freed unseen.
    let before = reserved_at_dump
        .map_or(0, |dump| i128::from(dump) - history_reserved)
        .max(-history_low)
        .clamp(0, i128::from(u64::MAX)) as u64;
    // Assumed blocks were put before the first event: the curve moves with them.
    let shift = trace.events.len() - pushed;
    let reserved =
        |history: i128| (i128::from(before) + history).clamp(0, i128::from(u64::MAX)) as u64;
    let mut reserved_curve: Vec<(usize, u64)> = Vec::with_capacity(curve.len());
    for (event, history) in curve {
        let bytes = reserved(history);
        let event = if event == 0 { 0 } else { event + shift };
        match reserved_curve.last_mut() {
            Some(last) if last.0 == event => last.1 = bytes,
            _ => reserved_curve.push((event, bytes)),
        }
    }
    trace.device = Some(device as usize);
    trace.stacks = stack_texts;
    trace.alloc_stacks = alloc_stacks;
    trace.set_recorded(Recorded {
        reserved: reserved_curve,
        peak_reserved_bytes: reserved(history_high),
        peak_allocated_bytes: model.peak_allocated_bytes(),
        expandable_segments,
        reserved_before_history_bytes: before,
    });
    Ok(trace)
}

/// Bytes the snapshot's segments of `device` hold at the dump, where its
/// segments can be read (`None` where not: a history alone is read as it
/// counts); a segment larger than any device can reserve is refused (its
/// index in `segments`, and why).
fn dump_reserved(pickle: &Pickle, root: Value, device: u32) -> Result<Option<u64>, (u64, Problem)> {
    let Some(segments) = pickle
        .get(root, "segments")
        .and_then(|list| pickle.items(list))
    else {
        return Ok(None);
    };
    let mut total = 0u64;
    for (index, segment) in (0u64..).zip(segments.iter()) {
        let on = match pickle.get(segment, "device") {
            Some(Value::Int(on)) => on,
            _ => 0,
        };
        if on == i64::from(device) {
            let Ok(size) = integer(pickle, segment, "total_size") else {
                return Ok(None);
            };
            crate::check_segment_size(size).map_err(|problem| (index, problem))?;
            let Some(sum) = total.checked_add(size) else {
                return Ok(None);
            };
            total = sum;
        }
    }
    Ok(Some(total))
}

/// A trace entry's action.
fn action(pickle: &Pickle, entry: Value) -> Result<&str, Problem> {
    if pickle.pairs(entry).is_none() {
        return Err(Problem::Malformed(format!(
            "entry is a {}, not a dict",
            Pickle::kind(entry)
        )));
    }
    match pickle.get(entry, "action") {
        Some(value) => pickle
            .text(value)
            .ok_or_else(|| Problem::Malformed(format!("\"action\" is a {}", Pickle::kind(value)))),
        None => Err(Problem::Malformed("entry has no \"action\"".into())),
    }
}

/// A non-negative integer field of a dict: `size` problems are
/// [`Problem::BadSize`], others name their key.
pub fn integer(pickle: &Pickle, dict: Value, key: &'static str) -> Result<u64, Problem> {
    let bad = |why: &'static str, text: String| {
        if key == "size" {
            Problem::BadSize { text, why }
        } else {
            Problem::Malformed(format!("{key:?} {text} {why}"))
        }
    };
    match pickle.get(dict, key) {
        Some(Value::Int(value)) if value < 0 => Err(bad("is negative", value.to_string())),
        Some(Value::Int(value)) => Ok(value as u64),
        Some(Value::UInt(value)) => Ok(value),
        Some(Value::BigInt { bytes }) => Err(bad(
            "overflows 64 bits",
            format!("(an integer of {bytes} bytes)"),
        )),
        Some(other) => Err(bad(
            "is not a number",
            format!("(a {})", Pickle::kind(other)),
        )),
        None => Err(Problem::Malformed(format!("entry has no {key:?}"))),
    }
}
