//! CUDA graphs' private pools on [`DeviceAllocator`]: diverting allocations to a pool
//! while a graph is captured (or torch.compile warms one up), the use count, the
//! live-block check, checkpoints.

use super::{Block, DeviceAllocator, Origin};
use crate::backing::Backing;
use crate::error::{Error, Result};
use crate::events::StreamEvents;
use crate::history::NO_CONTEXT;
use crate::pool_id::PoolId;

/// What restoring a private pool's checkpoint changed: the blocks freed (every block
/// of the pool that was live) and the blocks handed out again (the checkpoint's live
/// ones, at their old addresses), as device addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Freed, by address.
    pub freed: Vec<u64>,
    /// Handed out again, by address.
    pub allocated: Vec<u64>,
}

/// A checkpoint of a private pool: its live blocks.
#[derive(Debug, Clone)]
pub(super) struct Checkpoint<S> {
    pool: PoolId,
    /// `(address, bytes, requested, stream)`.
    blocks: Vec<(u64, u64, u64, S)>,
}

impl<B: Backing, E: StreamEvents> DeviceAllocator<B, E> {
    /// Allocations the caller's filter picks go to `pool` from now on
    /// (`beginAllocateToPool`); the pool is made if new, and counts one more user.
    /// Waits once for the device's first stream if only one was used so far (before
    /// the capture begins, when that is still allowed).
    pub fn begin_allocate_to_pool(&self, pool: PoolId) -> Result<()> {
        self.current(|state| {
            if state.underway == 0 {
                state.go_many()?;
            }
            state.pools.begin(pool)?;
            state.underway += 1;
            Ok(())
        })
    }

    /// Allocations stop going to `pool` (`endAllocateToPool`). Once no pool is
    /// allocated to, blocks freed meanwhile are fenced on their streams.
    pub fn end_allocate_to_pool(&self, pool: PoolId) -> Result<()> {
        self.current(|state| {
            state.pools.end(pool)?;
            state.underway = state.underway.saturating_sub(1);
            if state.underway == 0 {
                state.order.fence_unfenced(&mut state.events)?;
            }
            Ok(())
        })
    }

    /// One user of `pool` fewer (`releasePool`: a graph was destroyed); at none, its
    /// memory goes back once no block in it lives (at the next `empty_cache` or out
    /// of memory).
    pub fn release_pool(&self, pool: PoolId) -> Result<()> {
        self.state().pools.release(pool)
    }

    /// One more user of `pool`, made if new (`createOrIncrefPool`).
    pub fn incref_pool(&self, pool: PoolId) -> Result<()> {
        self.state().pools.incref(pool)
    }

    /// Whether `pool` serves requests of the device's own pool that found no memory
    /// (`MemPool(use_on_oom=True)`, `setUseOnOOM`): such a request is placed in the
    /// pool's free space before it is refused.
    pub fn set_use_on_oom(&self, pool: PoolId, on: bool) -> Result<()> {
        self.state().pools.set_use_on_oom(pool, on)
    }

    /// `pool` never splits a segment between blocks (`setNoSplit`, e.g. memory NCCL
    /// registers whole): each block takes whole segments of its own.
    pub fn set_no_split(&self, pool: PoolId) -> Result<()> {
        self.state().pools.set_no_split(pool)
    }

    /// The users of `pool` (`getPoolUseCount`).
    pub fn pool_use_count(&self, pool: PoolId) -> u32 {
        self.state().pools.use_count(pool)
    }

    /// Whether the live blocks of `pool` are exactly `expected`
    /// (`checkPoolLiveAllocations`, torch.compile's check of its graph trees).
    pub fn check_pool_live(&self, pool: PoolId, expected: &[u64]) -> Result<bool> {
        let state = self.state();
        let live = state.pools.live(pool)?;
        let mut expected = expected.to_vec();
        expected.sort_unstable();
        expected.dedup();
        Ok(live.len() == expected.len() && expected.iter().all(|p| live.contains(p)))
    }

    /// A checkpoint of `pool`'s live blocks (`getCheckpointState`); its number.
    pub fn checkpoint_pool(&self, pool: PoolId) -> Result<u64> {
        let mut state = self.state();
        let state = &mut *state;
        let mut blocks = Vec::new();
        for ptr in state.pools.live(pool)? {
            if let Some(b) = state.live.get(ptr) {
                blocks.push((b.ptr, b.bytes, b.requested, b.stream));
            }
        }
        let number = state.next_checkpoint;
        state.next_checkpoint += 1;
        state
            .checkpoints
            .insert(number, Checkpoint { pool, blocks });
        Ok(number)
    }

    /// Forgets checkpoint `number` (its C++ holder is gone).
    pub fn drop_checkpoint(&self, number: u64) -> Result<()> {
        match self.state().checkpoints.remove(&number) {
            Some(_) => Ok(()),
            None => Err(Error::UnknownCheckpoint {
                device: self.device,
                checkpoint: number,
            }),
        }
    }

    /// Returns the checkpoint's pool to it (`setCheckpointPoolState`): every live block
    /// of the pool is freed, every freed one waiting for streams forgotten, and the
    /// checkpoint's blocks are live again at their addresses.
    pub fn restore_checkpoint(&self, number: u64) -> Result<Restored> {
        self.current(|state| {
            let unknown = Error::UnknownCheckpoint {
                device: self.device,
                checkpoint: number,
            };
            let checkpoint = state.checkpoints.get(&number).cloned().ok_or(unknown)?;
            let pool = checkpoint.pool;
            let mut restored = Restored::default();
            let live: Vec<u64> = state.pools.live(pool)?.iter().copied().collect();
            for ptr in live {
                if let Some(block) = state.live.remove(&ptr) {
                    state.stats.block_freed(block.bytes);
                    state.counts.live_bytes -= block.bytes;
                    state.retire(&block, NO_CONTEXT);
                    restored.freed.push(ptr);
                }
            }
            let waiting = state
                .order
                .take_where(|b| b.origin.pool() == pool, &mut state.events);
            for block in waiting {
                state.retire(&block, NO_CONTEXT);
            }
            let layout: Vec<(u64, u64, E::Stream)> = checkpoint
                .blocks
                .iter()
                .map(|(ptr, bytes, _, stream)| (*ptr, *bytes, *stream))
                .collect();
            let allocations = state.pools.rebuild(pool, &layout)?;
            for ((ptr, bytes, requested, stream), allocation) in
                checkpoint.blocks.iter().zip(allocations)
            {
                state.stats.block_allocated(*bytes, *requested);
                state.counts.live_bytes += bytes;
                state.live.insert(
                    *ptr,
                    Block {
                        origin: Origin::Private { pool, allocation },
                        ptr: *ptr,
                        bytes: *bytes,
                        requested: *requested,
                        stream: *stream,
                        uses: Vec::new(),
                        context: NO_CONTEXT,
                    },
                );
                restored.allocated.push(*ptr);
            }
            Ok(restored)
        })
    }
}
