//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`): a pickled
//! dict whose `device_traces` holds, per device, the allocator's history as
//! dicts `{action, addr, size, stream, ...}`.
//!
//! A replay uses `alloc` and the free that really returned the block:
//! `free_completed` (the block's stream work finished), or `free_requested`
//! when the history has no completions (older PyTorch, or no stream use).

use std::collections::BTreeMap;
use std::path::Path;

use serde_pickle::{DeOptions, HashableValue, Value};

use crate::trace::{Location, Problem, Trace, TraceBuilder, TraceError};

/// Actions the caching allocator records that are not allocator calls.
const BOOKKEEPING: [&str; 6] = [
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
];

/// Parse a pickled snapshot: one trace per device with events.
pub fn parse(path: &Path, name: &str, bytes: &[u8]) -> Result<Vec<Trace>, TraceError> {
    let whole = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    let value =
        serde_pickle::value_from_slice(bytes, DeOptions::new().replace_unresolved_globals())
            .map_err(|err| whole(Problem::NotSnapshot(format!("unreadable pickle: {err}"))))?;
    let Value::Dict(root) = value else {
        return Err(whole(Problem::NotSnapshot(format!(
            "the pickle holds a {}, not a dict",
            kind(&value)
        ))));
    };
    if get(&root, "segments").is_none() {
        return Err(whole(Problem::NotSnapshot(
            "the dict has no \"segments\" key".into(),
        )));
    }
    let Some(Value::List(devices)) = get(&root, "device_traces") else {
        return Err(whole(Problem::NotSnapshot(
            "the dict has no \"device_traces\" list (record with \
             torch.cuda.memory._record_memory_history before dumping)"
                .into(),
        )));
    };

    let non_empty = devices
        .iter()
        .filter(|entries| matches!(entries, Value::List(list) if !list.is_empty()))
        .count();
    let mut traces = Vec::new();
    for (device, entries) in devices.iter().enumerate() {
        let Value::List(entries) = entries else {
            return Err(whole(Problem::NotSnapshot(format!(
                "device_traces[{device}] is a {}, not a list",
                kind(entries)
            ))));
        };
        if entries.is_empty() {
            continue;
        }
        let trace_name = if non_empty > 1 {
            format!("{name} [device {device}]")
        } else {
            name.to_string()
        };
        let trace =
            parse_device(device, entries, trace_name).map_err(|(index, problem)| TraceError {
                path: path.to_path_buf(),
                location: Location::Entry { device, index },
                problem,
            })?;
        traces.push(trace);
    }
    if traces.is_empty() {
        return Err(whole(Problem::NotSnapshot(
            "device_traces holds no events (was _record_memory_history enabled?)".into(),
        )));
    }
    Ok(traces)
}

fn parse_device(device: usize, entries: &[Value], name: String) -> Result<Trace, (u64, Problem)> {
    let mut has_completed = false;
    for (index, entry) in entries.iter().enumerate() {
        if entry_fields(entry)
            .map_err(|problem| (index as u64, problem))?
            .1
            == "free_completed"
        {
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
    for (index, entry) in entries.iter().enumerate() {
        let at = Location::Entry {
            device,
            index: index as u64,
        };
        let (fields, action) = entry_fields(entry).map_err(|problem| (index as u64, problem))?;
        let applied = match action {
            "alloc" => integer(fields, "addr")
                .and_then(|addr| Ok((addr, integer(fields, "size")?)))
                .and_then(|(addr, size)| trace.allocate(addr, size, at)),
            "free_requested" | "free_completed" if action == free_action => {
                integer(fields, "addr").and_then(|addr| trace.free(addr, at))
            }
            "free_requested" | "free_completed" | "user_defined" => Ok(()),
            other if BOOKKEEPING.contains(&other) => Ok(()),
            other => Err(Problem::UnknownAction(other.to_string())),
        };
        applied.map_err(|problem| (index as u64, problem))?;
    }
    Ok(trace.finish())
}

/// A trace entry's fields and its action.
fn entry_fields(entry: &Value) -> Result<(&BTreeMap<HashableValue, Value>, &str), Problem> {
    let Value::Dict(fields) = entry else {
        return Err(Problem::Malformed(format!(
            "entry is a {}, not a dict",
            kind(entry)
        )));
    };
    match get(fields, "action") {
        Some(Value::String(action)) => Ok((fields, action)),
        Some(other) => Err(Problem::Malformed(format!(
            "\"action\" is a {}",
            kind(other)
        ))),
        None => Err(Problem::Malformed("entry has no \"action\"".into())),
    }
}

fn get<'a>(dict: &'a BTreeMap<HashableValue, Value>, key: &str) -> Option<&'a Value> {
    dict.get(&HashableValue::String(key.to_string()))
}

/// A non-negative integer field (Python ints pickle as I64 or, past 2^63, as
/// a big integer).
fn integer(fields: &BTreeMap<HashableValue, Value>, key: &'static str) -> Result<u64, Problem> {
    let bad = |why: &'static str, text: String| {
        if key == "size" {
            Problem::BadSize { text, why }
        } else {
            Problem::Malformed(format!("{key:?} {text} {why}"))
        }
    };
    match get(fields, key) {
        Some(Value::I64(value)) if *value < 0 => Err(bad("is negative", value.to_string())),
        Some(Value::I64(value)) => Ok(*value as u64),
        Some(Value::Int(big)) => {
            let text = big.to_string();
            if text.starts_with('-') {
                Err(bad("is negative", text))
            } else {
                text.parse().map_err(|_| bad("overflows 64 bits", text))
            }
        }
        Some(other) => Err(bad("is not a number", format!("({})", kind(other)))),
        None => Err(Problem::Malformed(format!("entry has no {key:?}"))),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::None => "None",
        Value::Bool(_) => "bool",
        Value::I64(_) | Value::Int(_) => "int",
        Value::F64(_) => "float",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "str",
        Value::List(_) => "list",
        Value::Tuple(_) => "tuple",
        Value::Set(_) | Value::FrozenSet(_) => "set",
        Value::Dict(_) => "dict",
    }
}
