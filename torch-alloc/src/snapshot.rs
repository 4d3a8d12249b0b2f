//! [`Snapshot`]: what a device holds, in the shape of PyTorch's memory snapshots
//! (`torch.cuda.memory._snapshot()`): segments of device memory, each tiled by its
//! blocks (live, freed but waiting for streams, or free), and the trace.
//!
//! The device's own pool shows as the backing's mapped runs, less the segments of
//! private pools, which show as segments of their own (with their pool's id), as
//! PyTorch shows a CUDA graph's memory.

use crate::history::TraceEntry;
use crate::pool_id::PoolId;

/// What a block of a segment is, PyTorch's `state` of a snapshot's block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Free (`inactive`).
    Inactive,
    /// Handed out (`active_allocated`).
    ActiveAllocated,
    /// Freed, still waiting for its streams (`active_pending_free`).
    ActivePendingFree,
}

/// A block of a segment. Bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotBlock {
    /// Device address.
    pub address: u64,
    /// Its bytes.
    pub size: u64,
    /// What the caller asked for (0 for free pieces).
    pub requested_size: u64,
    /// Live, pending or free.
    pub state: BlockState,
    /// The stack it was allocated at, or `NO_CONTEXT`.
    pub context: u64,
}

/// A segment: a range of mapped device memory. Bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// First byte's device address.
    pub address: u64,
    /// Its bytes: the sum of its blocks'.
    pub total_size: u64,
    /// The stream that places blocks in it (a private pool's), 0 for the device's pool.
    pub stream: u64,
    /// The private pool it belongs to, or [`PoolId::DEFAULT`].
    pub pool: PoolId,
    /// By address, tiling the segment.
    pub blocks: Vec<SnapshotBlock>,
}

impl Segment {
    /// Bytes of blocks handed out.
    pub fn allocated_size(&self) -> u64 {
        self.sum(|b| b.state == BlockState::ActiveAllocated, |b| b.size)
    }

    /// Bytes of blocks handed out or waiting for streams.
    pub fn active_size(&self) -> u64 {
        self.sum(|b| b.state != BlockState::Inactive, |b| b.size)
    }

    /// Bytes asked for, of active blocks.
    pub fn requested_size(&self) -> u64 {
        self.sum(|b| b.state != BlockState::Inactive, |b| b.requested_size)
    }

    fn sum(&self, keep: impl Fn(&SnapshotBlock) -> bool, f: impl Fn(&SnapshotBlock) -> u64) -> u64 {
        self.blocks.iter().filter(|b| keep(b)).map(f).sum()
    }
}

/// A device's memory and trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// By address.
    pub segments: Vec<Segment>,
    /// The trace, oldest first (empty unless history is recorded).
    pub trace: Vec<TraceEntry>,
}

/// A private pool's segment, for [`segments`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateSegment {
    /// First byte.
    pub address: u64,
    /// Bytes.
    pub bytes: u64,
    /// Its pool.
    pub pool: PoolId,
    /// The stream whose blocks it holds.
    pub stream: u64,
}

/// The segments of memory mapped as `runs` (`(address, bytes)`, sorted, disjoint),
/// of which `private` are private pools' segments, tiled by `blocks` (any order; free
/// pieces are filled in). Only segments of `only` if that is a private pool.
pub fn segments(
    runs: &[(u64, u64)],
    private: &[PrivateSegment],
    blocks: &[SnapshotBlock],
    only: PoolId,
) -> Vec<Segment> {
    let mut private: Vec<PrivateSegment> = private.to_vec();
    private.sort_unstable_by_key(|s| s.address);
    let mut out: Vec<Segment> = Vec::new();
    for &(start, bytes) in runs {
        let end = start.saturating_add(bytes);
        let mut cursor = start;
        for segment in private
            .iter()
            .filter(|s| s.address >= start && s.address < end)
        {
            if segment.address > cursor {
                out.push(empty(cursor, segment.address - cursor, 0, PoolId::DEFAULT));
            }
            cursor = cursor.max(segment.address.saturating_add(segment.bytes));
        }
        if cursor < end {
            out.push(empty(cursor, end - cursor, 0, PoolId::DEFAULT));
        }
    }
    out.extend(
        private
            .iter()
            .map(|s| empty(s.address, s.bytes, s.stream, s.pool)),
    );
    out.sort_unstable_by_key(|s| s.address);
    let mut blocks: Vec<SnapshotBlock> = blocks.to_vec();
    blocks.sort_unstable_by_key(|b| b.address);
    let mut next = 0;
    for segment in &mut out {
        let end = segment.address.saturating_add(segment.total_size);
        while next < blocks.len() && blocks[next].address < segment.address {
            next += 1; // outside every segment: not shown
        }
        let mut cursor = segment.address;
        let mut tiled = Vec::new();
        while next < blocks.len() && blocks[next].address < end {
            let block = blocks[next];
            next += 1;
            if block.address > cursor {
                tiled.push(free(cursor, block.address - cursor));
            }
            cursor = cursor.max(block.address.saturating_add(block.size));
            tiled.push(block);
        }
        if cursor < end {
            tiled.push(free(cursor, end - cursor));
        }
        segment.total_size = cursor.max(end) - segment.address;
        segment.blocks = tiled;
    }
    if only.is_private() {
        out.retain(|s| s.pool == only);
    }
    out
}

fn empty(address: u64, bytes: u64, stream: u64, pool: PoolId) -> Segment {
    Segment {
        address,
        total_size: bytes,
        stream,
        pool,
        blocks: Vec::new(),
    }
}

fn free(address: u64, size: u64) -> SnapshotBlock {
    SnapshotBlock {
        address,
        size,
        requested_size: 0,
        state: BlockState::Inactive,
        context: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(address: u64, size: u64) -> SnapshotBlock {
        SnapshotBlock {
            address,
            size,
            requested_size: size - 1,
            state: BlockState::ActiveAllocated,
            context: 0,
        }
    }

    #[test]
    fn a_run_is_cut_around_private_segments_and_tiled() {
        let runs = [(0x1000_0000, 8 << 20)];
        let graph = PoolId(1, 0);
        let private = [PrivateSegment {
            address: 0x1000_0000 + (2 << 20),
            bytes: 2 << 20,
            pool: graph,
            stream: 7,
        }];
        let blocks = [
            live(0x1000_0000 + 512, 1024),
            live(0x1000_0000 + (2 << 20), 4096),
        ];
        let all = segments(&runs, &private, &blocks, PoolId::DEFAULT);
        let shape: Vec<(u64, u64, PoolId)> = all
            .iter()
            .map(|s| (s.address, s.total_size, s.pool))
            .collect();
        assert_eq!(
            shape,
            [
                (0x1000_0000, 2 << 20, PoolId::DEFAULT),
                (0x1000_0000 + (2 << 20), 2 << 20, graph),
                (0x1000_0000 + (4 << 20), 4 << 20, PoolId::DEFAULT),
            ]
        );
        for segment in &all {
            let tiled: u64 = segment.blocks.iter().map(|b| b.size).sum();
            assert_eq!(tiled, segment.total_size);
        }
        assert_eq!(all[0].blocks.len(), 3, "free, live, free");
        assert_eq!(all[0].allocated_size(), 1024);
        assert_eq!(all[1].requested_size(), 4095);
        assert_eq!(segments(&runs, &private, &blocks, graph).len(), 1);
    }
}
