//! The allocator's state at other moments than the dump: the snapshot's
//! `segments` walked back through `device_traces` (the history undone from
//! the newest entry), so a block allocated before recording began is still
//! there. Moments: the dump, after entry N, the peak of allocated bytes, and
//! each `oom` entry (which PyTorch records after it freed its unused cached
//! segments and retried).

use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use memcore::pytorch::TraceAction;

use super::pickle::{Pickle, Value};
use super::state::{self, BlockState, LiveBlock, Segment, Stack, Stacks, State};
use super::{action, integer, root};
use crate::budget::ReadBudget;
use crate::{Location, Problem, TraceError};

/// Which moment of a snapshot to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// When it was dumped (`segments` as they are).
    Dump,
    /// When the most bytes were allocated (PyTorch's
    /// `max_memory_allocated`; the first such entry, among equals the one
    /// with most reserved).
    Peak,
    /// At each `oom` entry.
    Oom,
    /// Right after history entry N (0-based).
    After(usize),
}

/// An `oom` entry: a request PyTorch refused after freeing its unused cached
/// segments and retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct OomEntry {
    /// Its index in the device's history.
    pub index: usize,
    /// Bytes requested.
    pub requested_bytes: u64,
    /// Free device memory the driver reported then, bytes.
    pub device_free_bytes: u64,
    /// Microseconds since recording began, where stamped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<u64>,
}

/// The state at one moment and what happened there.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AtMoment {
    /// The history entry the state follows; `None` for the dump.
    pub after_entry: Option<usize>,
    /// The snapshot's device the state is of; `None`: every device.
    pub device: Option<u64>,
    /// The `oom` entry at this moment, if it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomEntry>,
    /// Where the history walked back does not fit the dump's segments (a
    /// block past its segment's end, blocks that overlap, a block in no
    /// segment): the state's figures are not to be trusted there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The state.
    pub state: State,
}

/// One history entry as the walk needs it.
#[derive(Debug, Clone)]
struct Entry {
    /// What the entry did; `None` for one the walk passes over (a
    /// snapshot, an out-of-memory, an action it does not know).
    action: Option<TraceAction>,
    addr: u64,
    size: u64,
    /// For an alloc: its stack. For a free: the stack of the alloc it
    /// frees, where the history has it. (`size` is the request: a block
    /// walked back to is its rounded request, [`memcore::pytorch::round_size`];
    /// where PyTorch handed out a larger block unsplit, the rest shows as
    /// free.)
    frames: Option<Rc<Stack>>,
}

/// What the walk keeps: segments by start (device, bytes, pool, stream,
/// expandable) and live blocks by address.
#[derive(Debug, Clone, Default)]
struct Layout {
    segments: BTreeMap<u64, SegmentInfo>,
    blocks: BTreeMap<u64, LiveBlock>,
}

#[derive(Debug, Clone)]
struct SegmentInfo {
    device: u64,
    bytes: u64,
    pool: String,
    stream: u64,
    expandable: bool,
}

/// One device's history, and its `oom` entries.
struct History {
    device: u64,
    entries: Vec<Entry>,
    ooms: Vec<OomEntry>,
}

/// The devices a snapshot holds anything of: those of its segments and
/// those whose history holds events.
pub fn devices(path: &Path, pickle: &Pickle, dump: &State) -> Result<Vec<u64>, TraceError> {
    let root = root(path, pickle)?;
    let mut devices: Vec<u64> = dump.segments.iter().map(|segment| segment.device).collect();
    if let Some(lists) = pickle
        .get(root, "device_traces")
        .and_then(|value| pickle.items(value))
    {
        devices.extend(
            (0u64..)
                .zip(lists.iter())
                .filter(|(_, list)| pickle.items(*list).is_some_and(|items| !items.is_empty()))
                .map(|(device, _)| device),
        );
    }
    devices.sort_unstable();
    devices.dedup();
    Ok(devices)
}

/// Visit the states of `moment`: one, or one per `oom` entry (none when
/// the history has none), each built when visited and dropped after, so
/// memory follows one state however many moments there are. The history
/// is walked back once from the dump, so the moments come from the latest
/// to the earliest; only the `build` earliest are built and visited.
/// Returns how many moments there are in all. `device` picks the
/// snapshot's device (its segments and history; a device the snapshot
/// holds nothing of is an error); `None`: every device at the dump, else
/// the first device with a history.
pub fn each<E: From<TraceError>>(
    path: &Path,
    pickle: &Pickle,
    budget: &ReadBudget,
    moment: Moment,
    device: Option<usize>,
    build: usize,
    mut visit: impl FnMut(AtMoment) -> Result<(), E>,
) -> Result<usize, E> {
    let mut dump = state::read(path, pickle, budget)?;
    if let Some(wanted) = device {
        let present = devices(path, pickle, &dump)?;
        if !present.contains(&(wanted as u64)) {
            return Err(TraceError {
                path: path.to_path_buf(),
                location: Location::File,
                problem: Problem::NoSuchDevice {
                    device: wanted as u64,
                    present,
                },
            }
            .into());
        }
    }
    if moment == Moment::Dump {
        if let Some(device) = device {
            let segments = std::mem::take(&mut dump.segments)
                .into_iter()
                .filter(|segment| segment.device == device as u64)
                .collect();
            dump = State::from_segments(segments);
        }
        if build > 0 {
            visit(AtMoment {
                after_entry: None,
                device: device.map(|device| device as u64),
                oom: None,
                warnings: Vec::new(),
                state: dump,
            })?;
        }
        return Ok(1);
    }
    let history = history(path, pickle, budget, device)?;
    let mut layout = Layout::of(&dump, history.device);
    drop(dump);
    let last = history.entries.len();
    let wanted: Vec<(usize, Option<OomEntry>)> = match moment {
        Moment::Dump => Vec::new(),
        Moment::After(index) if index < last => vec![(index, None)],
        Moment::After(index) => {
            return Err(TraceError {
                path: path.to_path_buf(),
                location: Location::File,
                problem: Problem::Malformed(format!(
                    "--at {index}: device {}'s history has {last} entries (0 to {})",
                    history.device,
                    last.saturating_sub(1)
                )),
            }
            .into());
        }
        Moment::Peak => vec![(peak(&layout, &history.entries), None)],
        Moment::Oom => history
            .ooms
            .iter()
            .map(|oom| (oom.index, Some(*oom)))
            .collect(),
    };
    // Entries `undone..` are undone: the layout is the state after
    // entry `undone - 1`.
    let mut undone = last;
    for &(index, oom) in wanted[..build.min(wanted.len())].iter().rev() {
        while undone > index + 1 {
            undone -= 1;
            layout.undo(&history.entries[undone]);
        }
        let (state, warnings) = layout.state();
        visit(AtMoment {
            after_entry: Some(index),
            device: Some(history.device),
            oom,
            warnings,
            state,
        })?;
    }
    Ok(wanted.len())
}

/// Every state of `moment`, earliest first ([`each`], all of them built
/// and kept: for a few moments).
pub fn at(
    path: &Path,
    pickle: &Pickle,
    budget: &ReadBudget,
    moment: Moment,
    device: Option<usize>,
) -> Result<Vec<AtMoment>, TraceError> {
    let mut moments = Vec::new();
    each(path, pickle, budget, moment, device, usize::MAX, |at| {
        moments.push(at);
        Ok::<(), TraceError>(())
    })?;
    moments.reverse();
    Ok(moments)
}

/// The `oom` entries of `device`'s history (`None`: the first device with
/// a history).
pub fn oom_entries(
    path: &Path,
    pickle: &Pickle,
    budget: &ReadBudget,
    device: Option<usize>,
) -> Result<Vec<OomEntry>, TraceError> {
    match history(path, pickle, budget, device) {
        Ok(history) => Ok(history.ooms),
        Err(err) if matches!(err.problem, Problem::NotSnapshot(_)) => Ok(Vec::new()),
        Err(err) => Err(err),
    }
}

/// The entry after which the most bytes were allocated (the first, and
/// among equals the one with most reserved).
fn peak(layout: &Layout, entries: &[Entry]) -> usize {
    let mut reserved: i128 = layout.segments.values().map(|s| i128::from(s.bytes)).sum();
    let mut allocated: i128 = layout
        .blocks
        .values()
        .filter(|b| b.state == BlockState::Allocated)
        .map(|b| i128::from(b.size_bytes))
        .sum();
    let mut best = (allocated, reserved, entries.len().saturating_sub(1));
    // Walking back: the figures after entry i are those before undoing it.
    for (index, entry) in entries.iter().enumerate().rev() {
        if (allocated, reserved) >= (best.0, best.1) {
            best = (allocated, reserved, index);
        }
        // The history holds requests; PyTorch counts the rounded block.
        let size = i128::from(memcore::pytorch::round_size(entry.size));
        match entry.action {
            Some(TraceAction::Alloc) => allocated -= size,
            Some(TraceAction::FreeRequested) => allocated += size,
            Some(TraceAction::SegmentAlloc | TraceAction::SegmentMap) => reserved -= size,
            Some(TraceAction::SegmentFree | TraceAction::SegmentUnmap) => reserved += size,
            _ => {}
        }
    }
    best.2
}

fn history(
    path: &Path,
    pickle: &Pickle,
    budget: &ReadBudget,
    device: Option<usize>,
) -> Result<History, TraceError> {
    let budget = budget
        .for_decoded(pickle.decoded_bytes())
        .after_holding(pickle.held_bytes());
    let mut stacks = Stacks::new(pickle, budget.frames);
    let whole = |problem| TraceError {
        path: path.to_path_buf(),
        location: Location::File,
        problem,
    };
    let root = root(path, pickle)?;
    let devices = pickle
        .get(root, "device_traces")
        .and_then(|value| pickle.items(value))
        .ok_or_else(|| {
            whole(Problem::NotSnapshot(
                "the dict has no \"device_traces\" list: --at needs the history \
                 (torch.cuda.memory._record_memory_history before the dump)"
                    .into(),
            ))
        })?;
    let with_events = |(device, list): (usize, Value)| {
        pickle
            .items(list)
            .filter(|l| !l.is_empty())
            .map(|l| (device, l))
    };
    let found = match device {
        Some(device) => devices
            .get(device)
            .and_then(|list| with_events((device, list))),
        None => devices.iter().enumerate().find_map(with_events),
    };
    let Some((device, items)) = found else {
        return Err(whole(Problem::NotSnapshot(match device {
            Some(device) => format!(
                "device_traces holds no events for device {device} ({} devices listed): \
                 --at needs its history",
                devices.len()
            ),
            None => "device_traces holds no events: --at needs the history".into(),
        })));
    };
    if items.len() as u64 > budget.events {
        return Err(whole(Problem::OverBudget {
            what: "history entries",
            limit: budget.events,
        }));
    }
    let mut entries = Vec::with_capacity(items.len());
    let mut ooms = Vec::new();
    let mut last_alloc: BTreeMap<u64, usize> = BTreeMap::new();
    for (index, value) in items.iter().enumerate() {
        let fail = |problem| TraceError {
            path: path.to_path_buf(),
            location: Location::Entry {
                device: u32::try_from(device).unwrap_or(u32::MAX),
                index: index as u64,
            },
            problem,
        };
        let name = action(pickle, value).map_err(fail)?;
        let named = TraceAction::from_name(name);
        let action = named.filter(|a| !matches!(a, TraceAction::Snapshot | TraceAction::Oom));
        if named == Some(TraceAction::Oom) {
            ooms.push(OomEntry {
                index,
                requested_bytes: integer(pickle, value, "size").unwrap_or(0),
                device_free_bytes: integer(pickle, value, "device_free").unwrap_or(0),
                time_us: integer(pickle, value, "time_us").ok(),
            });
        }
        let (addr, size) = if action.is_none() {
            (0, 0)
        } else {
            (
                integer(pickle, value, "addr").map_err(fail)?,
                integer(pickle, value, "size").map_err(fail)?,
            )
        };
        let frames = match action {
            Some(TraceAction::Alloc) => {
                last_alloc.insert(addr, index);
                let frames = pickle.get(value, "frames").unwrap_or(Value::None);
                Some(stacks.stack(frames).map_err(fail)?)
            }
            Some(TraceAction::FreeRequested | TraceAction::FreeCompleted) => last_alloc
                .get(&addr)
                .and_then(|&alloc: &usize| entries.get(alloc))
                .and_then(|alloc: &Entry| alloc.frames.clone()),
            _ => None,
        };
        entries.push(Entry {
            action,
            addr,
            size,
            frames,
        });
    }
    Ok(History {
        device: device as u64,
        entries,
        ooms,
    })
}

impl Layout {
    /// A segment of `size` bytes the walk back brings back, on the layout's
    /// device (the history names none).
    fn segment_of(&self, size: u64, expandable: bool) -> SegmentInfo {
        SegmentInfo {
            device: self.segments.values().next().map_or(0, |s| s.device),
            bytes: size,
            pool: pool_of(size).into(),
            stream: 0,
            expandable,
        }
    }

    /// The dump's segments and live blocks of `device`.
    fn of(dump: &State, device: u64) -> Layout {
        let mut layout = Layout::default();
        for segment in dump.segments.iter().filter(|s| s.device == device) {
            layout.segments.insert(
                segment.address,
                SegmentInfo {
                    device: segment.device,
                    bytes: segment.total_bytes,
                    pool: segment.pool.clone(),
                    stream: segment.stream,
                    expandable: segment.expandable,
                },
            );
            for block in &segment.live_blocks {
                layout.blocks.insert(block.address, block.clone());
            }
        }
        layout
    }

    /// Undo one history entry: the layout as it was before it.
    fn undo(&mut self, entry: &Entry) {
        let (addr, size) = (entry.addr, entry.size);
        match entry.action {
            Some(TraceAction::Alloc) => {
                self.blocks.remove(&addr);
            }
            Some(TraceAction::FreeRequested | TraceAction::FreeCompleted) => {
                let state = if entry.action == Some(TraceAction::FreeRequested) {
                    BlockState::Allocated
                } else {
                    BlockState::PendingFree
                };
                let (frame, stack) = entry
                    .frames
                    .as_deref()
                    .cloned()
                    .unwrap_or((None, Vec::new()));
                let block = self.blocks.entry(addr).or_insert(LiveBlock {
                    address: addr,
                    size_bytes: memcore::pytorch::round_size(size),
                    requested_bytes: size,
                    state,
                    frame,
                    stack,
                });
                block.state = state;
            }
            Some(TraceAction::SegmentAlloc) => {
                self.segments.remove(&addr);
            }
            Some(TraceAction::SegmentFree) => {
                let segment = self.segment_of(size, false);
                self.segments.insert(addr, segment);
            }
            Some(TraceAction::SegmentMap) => self.carve(addr, size),
            Some(TraceAction::SegmentUnmap) => self.map_back(addr, size),
            _ => {}
        }
    }

    /// Take `[addr, addr + size)` out of the segments (an expandable
    /// segment's mapping undone).
    fn carve(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        let touching: Vec<u64> = self
            .segments
            .range(..end)
            .filter(|(start, info)| start.saturating_add(info.bytes) > addr)
            .map(|(start, _)| *start)
            .collect();
        for start in touching {
            let Some(info) = self.segments.remove(&start) else {
                continue;
            };
            let stop = start.saturating_add(info.bytes);
            if start < addr {
                let mut left = info.clone();
                left.bytes = addr - start;
                self.segments.insert(start, left);
            }
            if stop > end {
                let mut right = info;
                right.bytes = stop - end;
                self.segments.insert(end, right);
            }
        }
    }

    /// Put `[addr, addr + size)` back as an expandable segment's mapping,
    /// joined to a mapping that ends where it starts.
    fn map_back(&mut self, addr: u64, size: u64) {
        let before = self
            .segments
            .range(..addr)
            .next_back()
            .filter(|(start, info)| start.saturating_add(info.bytes) == addr)
            .map(|(start, _)| *start);
        match before.and_then(|start| self.segments.get_mut(&start)) {
            Some(info) => info.bytes = info.bytes.saturating_add(size),
            None => {
                let segment = self.segment_of(size, true);
                self.segments.insert(addr, segment);
            }
        }
    }

    /// The layout as a [`State`]: each segment's live blocks, and its free
    /// bytes as the gaps between them; and where the layout does not fit
    /// (blocks past their segment, overlapping, or in no segment).
    fn state(&self) -> (State, Vec<String>) {
        let mut segments = Vec::with_capacity(self.segments.len());
        let mut misfits = Misfits::default();
        let mut placed = 0usize;
        let mut reached = 0u64;
        for (&start, info) in &self.segments {
            if start < reached {
                misfits.note(format!(
                    "segment {start:#x} ({} bytes) overlaps the segment before it",
                    info.bytes
                ));
            }
            let stop = start.saturating_add(info.bytes);
            reached = reached.max(stop);
            let mut segment = Segment {
                device: info.device,
                address: start,
                total_bytes: info.bytes,
                allocated_bytes: 0,
                active_bytes: 0,
                free_bytes: 0,
                largest_free_bytes: 0,
                pool: info.pool.clone(),
                stream: info.stream,
                expandable: info.expandable,
                live_blocks: Vec::new(),
            };
            let mut at = start;
            for block in self.blocks.range(start..stop).map(|(_, b)| b) {
                placed += 1;
                let end = block.address.saturating_add(block.size_bytes);
                if block.address < at {
                    misfits.note(format!(
                        "live block {:#x} ({} bytes) overlaps the block before it in segment \
                         {start:#x}",
                        block.address, block.size_bytes
                    ));
                }
                if end > stop {
                    misfits.note(format!(
                        "live block {:#x} ({} bytes) runs past the end of segment {start:#x} \
                         ({} bytes)",
                        block.address, block.size_bytes, info.bytes
                    ));
                }
                let gap = block.address.saturating_sub(at);
                segment.free_bytes = segment.free_bytes.saturating_add(gap);
                segment.largest_free_bytes = segment.largest_free_bytes.max(gap);
                segment.active_bytes = segment.active_bytes.saturating_add(block.size_bytes);
                if block.state == BlockState::Allocated {
                    segment.allocated_bytes =
                        segment.allocated_bytes.saturating_add(block.size_bytes);
                }
                at = at.max(end);
                segment.live_blocks.push(block.clone());
            }
            let gap = stop.saturating_sub(at);
            segment.free_bytes = segment.free_bytes.saturating_add(gap);
            segment.largest_free_bytes = segment.largest_free_bytes.max(gap);
            segment.live_blocks.sort_by(|a, b| {
                b.size_bytes
                    .cmp(&a.size_bytes)
                    .then(a.address.cmp(&b.address))
            });
            segments.push(segment);
        }
        let outside = self.blocks.len().saturating_sub(placed);
        if outside > 0 {
            misfits.note(format!(
                "{outside} live block(s) lie in no segment (not counted)"
            ));
        }
        (State::from_segments(segments), misfits.finish())
    }
}

/// Where a walked-back layout does not fit, a few said and the rest
/// counted.
#[derive(Default)]
struct Misfits {
    said: Vec<String>,
    more: usize,
}

impl Misfits {
    const SAID: usize = 5;

    fn note(&mut self, text: String) {
        if self.said.len() < Self::SAID {
            self.said.push(text);
        } else {
            self.more += 1;
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.more > 0 {
            self.said.push(format!("and {} more such", self.more));
        }
        if !self.said.is_empty() {
            self.said.push(
                "the history walked back does not fit the dump's segments (a history cut \
                 short, or a damaged file): this moment's figures are not to be trusted"
                    .into(),
            );
        }
        self.said
    }
}

/// The pool a segment of `bytes` serves: PyTorch's small pool holds only
/// segments of its small buffer.
fn pool_of(bytes: u64) -> &'static str {
    if bytes <= memcore::pytorch::SMALL_BUFFER_BYTES {
        "small"
    } else {
        "large"
    }
}

/// `--at`'s value: `dump`, `peak`, `oom` or an entry number.
pub fn parse_moment(text: &str) -> Result<Moment, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "dump" => Ok(Moment::Dump),
        "peak" => Ok(Moment::Peak),
        "oom" => Ok(Moment::Oom),
        other => other.parse().map(Moment::After).map_err(|_| {
            let shown: String = text.chars().take(80).collect();
            format!("{shown:?} is none of dump, peak, oom or a history entry number (0, 1, ...)")
        }),
    }
}
