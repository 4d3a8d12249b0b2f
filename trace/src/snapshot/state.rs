//! The allocator's state when the snapshot was dumped (`segments`): per
//! segment its size, what is allocated, active and free, and the live blocks
//! with the frame that allocated each.

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use super::pickle::{Pickle, Value};
use super::{cut, integer, root};
use crate::budget::{Counter, ReadBudget};
use crate::{Location, Problem, TraceError};

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

/// As people read a frame: `file:line in function`.
impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} in {}", self.file, self.line, self.function)
    }
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
    /// The top of the stack that allocated it, innermost first (at most
    /// [`STACK_FRAMES`]; Python frames only where there are any), when
    /// frames were recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<Frame>,
}

/// Frames of a block's stack kept for people.
pub const STACK_FRAMES: usize = 8;

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

/// What the rules below need to know of a frame's file, found once per
/// string however many frames share it (a long file name shared by a
/// million frames is searched once).
#[derive(Debug, Clone, Copy)]
struct FileKind {
    /// A Python source file (`.py`).
    python: bool,
    /// Inside an installed package (`site-packages`, `dist-packages`).
    installed: bool,
    /// A pseudo-file such as `<string>`.
    pseudo: bool,
    /// Inside torch.
    torch: bool,
    /// A file at all (not empty, not `??`).
    known: bool,
}

impl FileKind {
    fn of(file: &str) -> FileKind {
        FileKind {
            python: file.ends_with(".py"),
            installed: file.contains("site-packages") || file.contains("dist-packages"),
            pseudo: file.starts_with('<'),
            torch: file.contains("/torch/"),
            known: !file.is_empty() && file != "??",
        }
    }
}

/// One frame, built for people.
fn read_frame(pickle: &Pickle, frame: Value) -> Option<Frame> {
    let file = pickle.text(pickle.get(frame, "filename")?)?;
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

/// The stacks of a snapshot's frames lists, each list read once however
/// many blocks or entries share it (lists of equal frames are one), its
/// frames counted against a budget.
pub struct Stacks<'a> {
    pickle: &'a Pickle,
    frames: Counter,
    /// The top user frame and the top of the stack of each frames list
    /// already read, by its items.
    read: HashMap<u32, Rc<Stack>>,
    /// Each file name string's kind, by its index.
    files: HashMap<u32, FileKind>,
}

/// A recorded stack as people see it: the user's own innermost frame and
/// the top of the stack.
pub type Stack = (Option<Frame>, Vec<Frame>);

impl<'a> Stacks<'a> {
    /// No list read yet; at most `frames` frames read in all.
    pub fn new(pickle: &'a Pickle, frames: u64) -> Self {
        Stacks {
            pickle,
            frames: Counter::new(frames),
            read: HashMap::new(),
            files: HashMap::new(),
        }
    }

    /// The stack of `frames` (empty where it is not a list), and which
    /// items it was read from (`None`: no list).
    pub fn stack_of(&mut self, frames: Value) -> Result<(Rc<Stack>, Option<u32>), Problem> {
        let (Value::List(_) | Value::Tuple(_)) = frames else {
            return Ok((Rc::new((None, Vec::new())), None));
        };
        let Some(id) = self.pickle.items_id(frames) else {
            return Ok((Rc::new((None, Vec::new())), None));
        };
        if let Some(stack) = self.read.get(&id) {
            return Ok((Rc::clone(stack), Some(id)));
        }
        let count = self.pickle.items(frames).map_or(0, |items| items.len());
        if !self.frames.take(count as u64) {
            return Err(Problem::OverBudget {
                what: "frames",
                limit: self.frames.limit(),
            });
        }
        let files = self.frame_files(frames);
        let stack = Rc::new((self.top_user_frame(&files), self.top_frames(&files)));
        self.read.insert(id, Rc::clone(&stack));
        Ok((stack, Some(id)))
    }

    /// The stack of `frames` (empty where it is not a list).
    pub fn stack(&mut self, frames: Value) -> Result<Rc<Stack>, Problem> {
        self.stack_of(frames).map(|(stack, _)| stack)
    }

    /// Each frame of a recorded stack with its file's kind, innermost
    /// first, read without copying.
    fn frame_files(&mut self, frames: Value) -> Vec<(Value, FileKind)> {
        let pickle = self.pickle;
        let Some(items) = pickle.items(frames) else {
            return Vec::new();
        };
        let mut files = Vec::with_capacity(items.len());
        for frame in items.iter() {
            let Some(Value::Str(file)) = pickle.get(frame, "filename") else {
                continue;
            };
            let kind = *self
                .files
                .entry(file)
                .or_insert_with(|| FileKind::of(pickle.text(Value::Str(file)).unwrap_or_default()));
            files.push((frame, kind));
        }
        files
    }

    /// The innermost frame of the user's own code: the first Python frame
    /// outside installed packages, else the first Python frame outside
    /// torch, else the first frame with a file.
    fn top_user_frame(&self, files: &[(Value, FileKind)]) -> Option<Frame> {
        let (frame, _) = files
            .iter()
            .find(|(_, kind)| kind.python && !kind.installed && !kind.pseudo)
            .or_else(|| files.iter().find(|(_, kind)| kind.python && !kind.torch))
            .or_else(|| files.iter().find(|(_, kind)| kind.known))?;
        read_frame(self.pickle, *frame)
    }

    /// The top of a recorded stack, innermost first: its Python frames
    /// where it has any, else every frame with a file; at most
    /// [`STACK_FRAMES`].
    fn top_frames(&self, files: &[(Value, FileKind)]) -> Vec<Frame> {
        let python = files.iter().any(|(_, kind)| kind.python);
        files
            .iter()
            .filter(|(_, kind)| if python { kind.python } else { kind.known })
            .take(STACK_FRAMES)
            .filter_map(|&(frame, _)| read_frame(self.pickle, frame))
            .collect()
    }
}

/// What reading the state costs, counted against the file's budget: each
/// block visited (a segment shared by reference counted each time), and
/// each frames list read once however many blocks share it.
struct Walk<'a> {
    pickle: &'a Pickle,
    blocks: Counter,
    stacks: Stacks<'a>,
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
        stacks: Stacks::new(pickle, budget.frames),
    };
    let mut segments = Vec::with_capacity(items.len());
    for (index, value) in items.iter().enumerate() {
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
    // Segments of one device hold distinct bytes: one listed twice, or two
    // that overlap, would count their bytes twice.
    let mut order: Vec<usize> = (0..segments.len()).collect();
    order.sort_by_key(|&index| (segments[index].device, segments[index].address));
    for pair in order.windows(2) {
        let (before, after) = (&segments[pair[0]], &segments[pair[1]]);
        if before.device == after.device
            && after.address < before.address.saturating_add(before.total_bytes)
        {
            return Err(at(
                pair[1].max(pair[0]),
                Problem::Malformed(format!(
                    "segment {:#x} ({} bytes) overlaps segment {:#x} ({} bytes) on device {}: \
                     a segment listed twice would count its bytes twice",
                    after.address,
                    after.total_bytes,
                    before.address,
                    before.total_bytes,
                    after.device
                )),
            ));
        }
    }
    // Refuse sums past 64 bits before deriving the state from them.
    let whole = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    for field in [
        (|segment: &Segment| segment.total_bytes) as fn(&Segment) -> u64,
        |segment| segment.free_bytes,
        |segment| segment.allocated_bytes,
        |segment| segment.active_bytes,
    ] {
        segments
            .iter()
            .map(field)
            .try_fold(0u64, add)
            .map_err(whole)?;
    }
    Ok(State::from_segments(segments))
}

impl State {
    /// The state of `segments`, the sums and shares derived from them
    /// (saturating: [`read`] refuses a file whose sums pass 64 bits before
    /// it gets here, and a moment's state holds no more than its dump's).
    pub fn from_segments(mut segments: Vec<Segment>) -> State {
        segments.sort_by_key(|segment| (segment.device, segment.address));
        let sum =
            |field: fn(&Segment) -> u64| segments.iter().map(field).fold(0u64, u64::saturating_add);
        let reserved_bytes = sum(|segment| segment.total_bytes);
        let free_bytes = sum(|segment| segment.free_bytes);
        let largest_free_bytes = segments
            .iter()
            .map(|segment| segment.largest_free_bytes)
            .max()
            .unwrap_or(0);
        let fragmented_bytes = free_bytes.saturating_sub(largest_free_bytes);
        let pinned_free_bytes = sum(|segment| {
            if segment.live_blocks.is_empty() {
                0
            } else {
                segment.free_bytes
            }
        });
        State {
            reserved_bytes,
            allocated_bytes: sum(|segment| segment.allocated_bytes),
            active_bytes: sum(|segment| segment.active_bytes),
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
        }
    }
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
    // No "device": device 0, as PyTorch's older snapshots had it.
    let device = match pickle.get(value, "device") {
        None => 0,
        Some(_) => integer(pickle, value, "device")?,
    };
    if device >= super::MAX_DEVICES as u64 {
        return Err(Problem::TooManyDevices {
            what: format!("\"device\" is {device}"),
        });
    }
    let mut segment = Segment {
        device,
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
    for (index, block) in blocks.iter().enumerate() {
        // Said once: "malformed record: block 3: unknown ...", not twice.
        let in_block = |problem: Problem| match problem {
            Problem::Malformed(text) => Problem::Malformed(format!("block {index}: {text}")),
            other => Problem::Malformed(format!("block {index}: {other}")),
        };
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
                    crate::quote(other)
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
                let (frame, stack) = match pickle.get(block, "frames") {
                    Some(frames) => walk
                        .stacks
                        .stack(frames)
                        .map_err(in_block)?
                        .as_ref()
                        .clone(),
                    None => (None, Vec::new()),
                };
                segment.live_blocks.push(LiveBlock {
                    address: integer(pickle, block, "address").map_err(in_block)?,
                    size_bytes: size,
                    requested_bytes: integer(pickle, block, "requested_size").unwrap_or(size),
                    state,
                    frame,
                    stack,
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
