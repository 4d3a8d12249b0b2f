//! The allocator's state when the snapshot was dumped (`segments`): per
//! segment its size, what is allocated, active and free, and the live blocks
//! with the frame that allocated each.

use std::collections::HashMap;
use std::path::Path;

use super::pickle::{Pickle, Value};
use super::{cut, integer, root};
use crate::trace::budget::{Counter, ReadBudget};
use crate::trace::{Location, Problem, TraceError};

/// Where a block was allocated: the innermost frame of the user's own code.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Frame {
    /// Source file.
    pub file: String,
    /// Line in it (0 when unknown, as for C++ frames without symbols).
    pub line: u64,
    /// Function name.
    pub function: String,
}

/// A block's state, as PyTorch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// `active_allocated`: handed to a tensor.
    Allocated,
    /// `active_pending_free`: freed, waiting for its stream's work.
    PendingFree,
    /// `inactive`: free inside the segment.
    Free,
}

/// A live block (allocated or pending free) of a segment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveBlock {
    /// Device address.
    pub address: u64,
    /// Block bytes (rounded as the allocator rounds).
    pub size_bytes: u64,
    /// Bytes the program asked for.
    pub requested_bytes: u64,
    /// Allocated or pending free.
    pub state: BlockState,
    /// The innermost user frame that allocated it, when frames were recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<Frame>,
}

/// One segment (a `cudaMalloc` or an expandable segment's mapped range).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Segment {
    /// CUDA device.
    pub device: u64,
    /// Device address of the first byte.
    pub address: u64,
    /// Segment bytes.
    pub total_bytes: u64,
    /// Bytes in allocated blocks.
    pub allocated_bytes: u64,
    /// Bytes in allocated or pending-free blocks.
    pub active_bytes: u64,
    /// Bytes in free blocks.
    pub free_bytes: u64,
    /// The largest free block, bytes.
    pub largest_free_bytes: u64,
    /// `small` (requests up to 1 MiB) or `large`.
    pub pool: String,
    /// CUDA stream the segment serves.
    pub stream: u64,
    /// An expandable segment (`expandable_segments:True`).
    pub expandable: bool,
    /// Its live blocks, largest first.
    pub live_blocks: Vec<LiveBlock>,
}

/// The whole state at the dump.
#[derive(Debug, Clone, serde::Serialize)]
pub struct State {
    /// Segments in address order.
    pub segments: Vec<Segment>,
    /// Bytes PyTorch held from the device.
    pub reserved_bytes: u64,
    /// Bytes in allocated blocks.
    pub allocated_bytes: u64,
    /// Bytes in allocated or pending-free blocks.
    pub active_bytes: u64,
    /// Bytes in free blocks.
    pub free_bytes: u64,
    /// The largest free block of any segment, bytes.
    pub largest_free_bytes: u64,
    /// Free bytes outside the largest free block: a request larger than that
    /// block can use none of them, though PyTorch holds them.
    pub fragmented_bytes: u64,
    /// `fragmented_bytes` as a share of `reserved_bytes` (0 to 1).
    pub fragmented_share: f64,
    /// Free bytes of segments that hold at least one live block: what
    /// `torch.cuda.empty_cache()` cannot return because of those blocks.
    pub pinned_free_bytes: u64,
}

impl State {
    /// Segments with live blocks and free bytes, most free bytes first:
    /// those whose live blocks keep `empty_cache` from returning them.
    pub fn pinned_segments(&self) -> Vec<&Segment> {
        let mut pinned: Vec<&Segment> = self
            .segments
            .iter()
            .filter(|segment| !segment.live_blocks.is_empty() && segment.free_bytes > 0)
            .collect();
        pinned.sort_by(|a, b| {
            b.free_bytes
                .cmp(&a.free_bytes)
                .then(a.address.cmp(&b.address))
        });
        pinned
    }
}

/// The innermost frame of the user's own code: the first Python frame
/// outside installed packages, else the first Python frame outside torch,
/// else the first frame with a file.
pub fn top_user_frame(pickle: &Pickle, frames: Value) -> Option<Frame> {
    let items = pickle.items(frames)?;
    // Each frame's file, read without copying; only the chosen frame is built.
    let files = || {
        items.iter().filter_map(|&frame| {
            let file = pickle.text(pickle.get(frame, "filename")?)?;
            Some((frame, file))
        })
    };
    let python = |file: &str| file.ends_with(".py");
    let installed = |file: &str| file.contains("site-packages") || file.contains("dist-packages");
    let (frame, file) = files()
        .find(|&(_, file)| python(file) && !installed(file) && !file.starts_with('<'))
        .or_else(|| files().find(|&(_, file)| python(file) && !file.contains("/torch/")))
        .or_else(|| files().find(|&(_, file)| !file.is_empty() && file != "??"))?;
    let function = pickle
        .get(frame, "name")
        .and_then(|name| pickle.text(name))
        .unwrap_or("?");
    let line = match pickle.get(frame, "line") {
        Some(Value::Int(line)) if line >= 0 => line as u64,
        _ => 0,
    };
    Some(Frame {
        file: cut(file),
        line,
        function: cut(function),
    })
}

/// What reading the state costs, counted against the file's budget: each
/// block visited (a segment shared by reference counted each time), and
/// each frames list read once however many blocks share it.
struct Walk<'a> {
    pickle: &'a Pickle,
    blocks: Counter,
    frames: Counter,
    /// The top user frame of each frames list already read, by its index.
    top_frames: HashMap<u32, Option<Frame>>,
}

impl Walk<'_> {
    fn top_frame(&mut self, frames: Value) -> Result<Option<Frame>, Problem> {
        let (Value::List(index) | Value::Tuple(index)) = frames else {
            return Ok(None);
        };
        if let Some(frame) = self.top_frames.get(&index) {
            return Ok(frame.clone());
        }
        let count = self.pickle.items(frames).map_or(0, <[Value]>::len);
        if !self.frames.take(count as u64) {
            return Err(Problem::OverBudget {
                what: "frames",
                limit: self.frames.limit(),
            });
        }
        let frame = top_user_frame(self.pickle, frames);
        self.top_frames.insert(index, frame.clone());
        Ok(frame)
    }
}

/// A sum of bytes that must fit in 64 bits, refused as the CSV reader
/// refuses live bytes that pass them.
fn add(sum: u64, size: u64) -> Result<u64, Problem> {
    sum.checked_add(size).ok_or(Problem::LiveBytesOverflow {
        live_bytes: sum,
        size,
    })
}

/// Read the state at the dump from a snapshot's `segments`, within
/// `budget`.
pub fn read(path: &Path, pickle: &Pickle, budget: &ReadBudget) -> Result<State, TraceError> {
    let budget = budget.for_decoded(pickle.decoded_bytes());
    let root = root(path, pickle)?;
    let at = |index: usize, problem| TraceError {
        path: path.to_path_buf(),
        location: Location::Segment {
            index: index as u64,
        },
        problem,
    };
    let list = pickle.get(root, "segments").unwrap_or(Value::None);
    let Some(items) = pickle.items(list) else {
        return Err(TraceError {
            path: path.to_path_buf(),
            location: Location::File,
            problem: Problem::NotSnapshot(format!(
                "\"segments\" is a {}, not a list",
                Pickle::kind(list)
            )),
        });
    };
    let mut walk = Walk {
        pickle,
        blocks: Counter::new(budget.events),
        frames: Counter::new(budget.frames),
        top_frames: HashMap::new(),
    };
    let mut segments = Vec::with_capacity(items.len());
    for (index, &value) in items.iter().enumerate() {
        if !walk.blocks.take(1) {
            return Err(at(
                index,
                Problem::OverBudget {
                    what: "segments and blocks",
                    limit: budget.events,
                },
            ));
        }
        segments.push(segment(&mut walk, value).map_err(|problem| at(index, problem))?);
    }
    segments.sort_by_key(|segment| (segment.device, segment.address));
    let whole = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    let sum = |field: fn(&Segment) -> u64| {
        segments
            .iter()
            .map(field)
            .try_fold(0u64, add)
            .map_err(whole)
    };
    let reserved_bytes = sum(|segment| segment.total_bytes)?;
    let free_bytes = sum(|segment| segment.free_bytes)?;
    let largest_free_bytes = segments
        .iter()
        .map(|segment| segment.largest_free_bytes)
        .max()
        .unwrap_or(0);
    let fragmented_bytes = free_bytes - largest_free_bytes;
    let pinned_free_bytes = sum(|segment| {
        if segment.live_blocks.is_empty() {
            0
        } else {
            segment.free_bytes
        }
    })?;
    Ok(State {
        reserved_bytes,
        allocated_bytes: sum(|segment| segment.allocated_bytes)?,
        active_bytes: sum(|segment| segment.active_bytes)?,
        free_bytes,
        largest_free_bytes,
        fragmented_bytes,
        fragmented_share: if reserved_bytes == 0 {
            0.0
        } else {
            fragmented_bytes as f64 / reserved_bytes as f64
        },
        pinned_free_bytes,
        segments,
    })
}

fn segment(walk: &mut Walk<'_>, value: Value) -> Result<Segment, Problem> {
    let pickle = walk.pickle;
    if pickle.pairs(value).is_none() {
        return Err(Problem::Malformed(format!(
            "segment is a {}, not a dict",
            Pickle::kind(value)
        )));
    }
    let text = |key: &str| {
        pickle
            .get(value, key)
            .and_then(|value| pickle.text(value))
            .map(cut)
    };
    let total_bytes = integer(pickle, value, "total_size")?;
    let blocks = pickle.get(value, "blocks").unwrap_or(Value::None);
    let Some(blocks) = pickle.items(blocks) else {
        return Err(Problem::Malformed(format!(
            "\"blocks\" is a {}, not a list",
            Pickle::kind(blocks)
        )));
    };
    let mut segment = Segment {
        device: integer(pickle, value, "device").unwrap_or(0),
        address: integer(pickle, value, "address")?,
        total_bytes,
        allocated_bytes: 0,
        active_bytes: 0,
        free_bytes: 0,
        largest_free_bytes: 0,
        pool: text("segment_type").unwrap_or_else(|| "?".into()),
        stream: integer(pickle, value, "stream").unwrap_or(0),
        expandable: matches!(pickle.get(value, "is_expandable"), Some(Value::Bool(true))),
        live_blocks: Vec::new(),
    };
    let mut block_bytes = 0u64;
    if !walk.blocks.take(blocks.len() as u64) {
        return Err(Problem::OverBudget {
            what: "segments and blocks",
            limit: walk.blocks.limit(),
        });
    }
    for (index, &block) in blocks.iter().enumerate() {
        let in_block = |problem: Problem| Problem::Malformed(format!("block {index}: {problem}"));
        if pickle.pairs(block).is_none() {
            return Err(in_block(Problem::Malformed(format!(
                "is a {}, not a dict",
                Pickle::kind(block)
            ))));
        }
        let size = integer(pickle, block, "size").map_err(in_block)?;
        let state_value = pickle.get(block, "state").unwrap_or(Value::None);
        let state = match pickle.text(state_value) {
            Some("active_allocated") => BlockState::Allocated,
            Some("active_pending_free") => BlockState::PendingFree,
            Some("inactive") => BlockState::Free,
            Some(other) => {
                return Err(in_block(Problem::Malformed(format!(
                    "unknown \"state\" {}",
                    crate::trace::quote(other)
                ))));
            }
            None => {
                return Err(in_block(Problem::Malformed(format!(
                    "\"state\" is a {}, not a str",
                    Pickle::kind(state_value)
                ))));
            }
        };
        block_bytes = add(block_bytes, size).map_err(in_block)?;
        match state {
            BlockState::Free => {
                segment.free_bytes = add(segment.free_bytes, size).map_err(in_block)?;
                segment.largest_free_bytes = segment.largest_free_bytes.max(size);
            }
            BlockState::Allocated | BlockState::PendingFree => {
                segment.active_bytes = add(segment.active_bytes, size).map_err(in_block)?;
                if state == BlockState::Allocated {
                    segment.allocated_bytes =
                        add(segment.allocated_bytes, size).map_err(in_block)?;
                }
                let frame = match pickle.get(block, "frames") {
                    Some(frames) => walk.top_frame(frames).map_err(in_block)?,
                    None => None,
                };
                segment.live_blocks.push(LiveBlock {
                    address: integer(pickle, block, "address").map_err(in_block)?,
                    size_bytes: size,
                    requested_bytes: integer(pickle, block, "requested_size").unwrap_or(size),
                    state,
                    frame,
                });
            }
        }
    }
    let end = segment
        .address
        .checked_add(total_bytes)
        .ok_or_else(|| Problem::Malformed("the segment ends past 2^64".into()))?;
    // Live blocks lie inside their segment, each at its own bytes.
    segment.live_blocks.sort_by_key(|block| block.address);
    let mut reached = segment.address;
    for block in &segment.live_blocks {
        let block_end = block.address.checked_add(block.size_bytes);
        if block.address < reached || block_end.is_none_or(|block_end| block_end > end) {
            return Err(Problem::Malformed(format!(
                "live block at {:#x} ({} bytes) overlaps another or lies outside its segment \
                 [{:#x}, {end:#x})",
                block.address, block.size_bytes, segment.address
            )));
        }
        reached = block_end.unwrap_or(end);
    }
    if block_bytes != total_bytes {
        return Err(Problem::Malformed(format!(
            "its blocks hold {block_bytes} bytes but \"total_size\" is {total_bytes}"
        )));
    }
    segment.live_blocks.sort_by(|a, b| {
        b.size_bytes
            .cmp(&a.size_bytes)
            .then(a.address.cmp(&b.address))
    });
    Ok(segment)
}
