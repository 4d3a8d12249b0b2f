//! Allocation policies a trace can be replayed through, and the one growth
//! rule they all share.
//!
//! # Footprint
//! [`FOOTPRINT_RULE`] states how a policy's footprint is measured; it is
//! written once, here, and the table, the JSON (`footprint_rule`), the HTML
//! report and the READMEs repeat or point to it. [`GRANULE`] is the mapping
//! step and [`ARENA_BYTES`] the address space of a policy that cannot grow
//! at its end (offset-allocator) or must reserve it up front (pool-vmm).
//!
//! With `--capacity` the arena is fixed at that size from the start, nothing
//! grows, and a request that does not fit is a failed allocation.

use anyhow::Result;
use memcore::{
    Allocation, Allocator, DEFAULT_ALIGN, DriverCalls, Error, FreeList, H200_DRIVER_COSTS,
    NewRegion, Tlsf,
};
use serde::Serialize;

use crate::replay::device::DeviceFigures;

/// The step in which address space is mapped, in bytes: the VMM page
/// (2 MiB).
pub const GRANULE: u64 = memcore::PAGE_BYTES;

/// The address space, in bytes (512 GiB), of a policy that must take it all
/// at once: offset-allocator's one arena (its u32 units of 256 B reach just
/// short of 1 TiB) and the reservation of ctx's VMM pool. Nothing is mapped
/// until used, and no trace comes near it.
pub const ARENA_BYTES: u64 = 512 << 30;

/// How footprint is defined, said the same way in the table, the JSON and
/// the report. The sizes in it are [`GRANULE`], [`ARENA_BYTES`] and
/// [`DEFAULT_ALIGN`]; a test holds the text to them.
pub const FOOTPRINT_RULE: &str = "Footprint: every policy owns one address space that it maps in 2 MiB \
granules at its end, like a VMM pool; it maps more only when a request does not fit in what it has, \
and then the fewest granules that let the request fit at the end (its free tail counts). Peak \
footprint is the most it ever had mapped. offset-allocator cannot grow, so it gets one 512 GiB arena \
and counts as mapped everything up to the granule above the highest byte it ever placed; pool-vmm \
reserves 512 GiB and counts the pages it mapped; stitch and pytorch-expandable count physical pages. \
Every request is aligned to 256 bytes.";

/// The address space a policy starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arena {
    /// Nothing mapped at first; grows at the end on demand.
    Growable,
    /// Exactly this many bytes from the start, never more.
    Fixed(u64),
}

impl Arena {
    /// A fixed arena of `bytes`: a whole, non-zero number of [`GRANULE`]s,
    /// since every policy maps in granules (a VMM pool could map no less, and
    /// others would be measured against a capacity it cannot have).
    pub fn fixed(bytes: u64) -> Result<Arena> {
        if bytes == 0 || bytes % GRANULE != 0 {
            // The next whole granule, or the last one below where that
            // passes 64 bits: a multiple of 2 MiB either way.
            let whole = bytes
                .div_ceil(GRANULE)
                .max(1)
                .checked_mul(GRANULE)
                .unwrap_or(bytes / GRANULE * GRANULE);
            anyhow::bail!(
                "--capacity {bytes} bytes is not a whole number of the {} B (2 MiB) granules \
                 every policy maps in; use a multiple of 2 MiB, e.g. {whole} B ({})",
                GRANULE,
                memcore::bytes::human(whole)
            );
        }
        Ok(Arena::Fixed(bytes))
    }
}

/// A policy that cannot manage an arena as large as the one asked for: the
/// replay skips it and says why. Its message follows the policy's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("manages at most {max_bytes} bytes, less than the {arena_bytes}-byte arena")]
pub struct ArenaRefused {
    /// The arena asked for, bytes.
    pub arena_bytes: u64,
    /// The most it can manage, bytes.
    pub max_bytes: u64,
}

/// Whether `err`, a replay's, says the policy cannot take this trace or
/// arena (an arena larger than it manages, a request or live bytes past
/// what it models, a request past its step budget) rather than that it is
/// broken: such a policy is skipped with the error as its reason, and the
/// others still report. Decided on error types and variants only.
pub fn cannot_take(err: &anyhow::Error) -> bool {
    let modelled = |err: &memcore::Error| {
        matches!(
            err,
            memcore::Error::OutOfMemory { .. }
                | memcore::Error::Overflow { .. }
                | memcore::Error::StepBudget { .. }
        )
    };
    err.chain().any(|cause| {
        cause.downcast_ref::<ArenaRefused>().is_some()
            || cause.downcast_ref::<memcore::Error>().is_some_and(modelled)
            || match cause.downcast_ref::<ctx::Error>() {
                Some(ctx::Error::Memcore(inner)) => modelled(inner),
                // The simulated device refusing what no device could hold.
                Some(ctx::Error::OutOfMemory { .. }) => true,
                _ => false,
            }
    })
}

/// A policy's address space at one moment, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ArenaState {
    /// Bytes mapped (the arena's size).
    pub mapped_bytes: u64,
    /// Requested bytes of live blocks.
    pub live_bytes: u64,
    /// Mapped bytes in free blocks.
    pub free_bytes: u64,
    /// The largest free block inside the mapped bytes.
    pub largest_free_bytes: u64,
}

/// One allocation policy under replay.
///
/// `allocate` answers `Ok(None)` when the request cannot be served (the
/// arena is fixed and full); an `Err` is a broken allocator and stops the
/// replay.
pub trait Policy {
    /// What the policy hands out for a live block.
    type Block: Copy;
    /// Serve `size` bytes at [`DEFAULT_ALIGN`], growing the arena if allowed.
    fn allocate(&mut self, size: u64) -> Result<Option<Self::Block>>;
    /// Give a block back.
    fn free(&mut self, block: Self::Block) -> Result<()>;
    /// Where the block lies now, in bytes from the arena start.
    fn offset(&self, block: Self::Block) -> Result<u64>;
    /// Bytes mapped now.
    fn mapped_bytes(&self) -> Result<u64>;
    /// The most bytes ever mapped: the footprint. Policies that never give
    /// memory back keep the default, what they have mapped now.
    fn peak_mapped_bytes(&self) -> Result<u64> {
        self.mapped_bytes()
    }
    /// Bytes copied by compaction so far; none for policies that never move.
    fn bytes_moved(&self) -> Result<u64> {
        Ok(0)
    }
    /// How many compactions have moved blocks so far; a change tells a
    /// recorder to read offsets again.
    fn relocations(&self) -> Result<u64> {
        Ok(0)
    }
    /// Driver calls so far, by kind, with their modeled time. A policy
    /// that maps one range at its end makes one create, map and
    /// access grant per growth, for a handle of the growth's bytes.
    fn driver_calls(&self) -> Result<DriverCalls>;
    /// Of the live bytes when they first peaked, those in handles of at
    /// least [`memcore::FULL_BANDWIDTH_HANDLE_BYTES`]; `None` where the
    /// policy does not model handles.
    fn peak_live_in_full_bandwidth_handles(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    /// The arena now, for reports of a failed request.
    fn state(&self) -> Result<ArenaState>;
    /// Called once, right after the event at which the trace's live bytes
    /// first peak, outside the timed replay: a policy on a device measures
    /// what only the peak shows.
    fn at_peak(&mut self) -> Result<()> {
        Ok(())
    }
    /// What a policy on a device measured there, after the replay (and
    /// after the other figures were read); `None` for a model.
    fn device_figures(&mut self) -> Result<Option<DeviceFigures>> {
        Ok(None)
    }
}

/// Round `bytes` up to whole granules, at least one.
pub fn granules(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(GRANULE) * GRANULE
}

/// How much to grow an arena of `mapped` bytes whose highest live byte ends
/// at `top` so that a `size`-byte request fits, on the `attempt`-th try:
/// for allocators outside memcore, which cannot say. memcore's allocators
/// answer exactly ([`memcore::Allocator::growth_needed`], [`grow_to_fit`]).
pub fn growth(mapped: u64, top: u64, size: u64, attempt: u32) -> u64 {
    if attempt == 0 {
        let start = top.div_ceil(DEFAULT_ALIGN) * DEFAULT_ALIGN;
        granules((start + size).saturating_sub(mapped))
    } else {
        granules(size / 8)
    }
}

/// A memcore allocator over a growable (or fixed) arena.
#[derive(Debug)]
pub struct GrowingArena<A: Allocator> {
    allocator: A,
    mapped: u64,
    growable: bool,
    calls: DriverCalls,
}

impl<A: Allocator> GrowingArena<A> {
    /// `allocator`, given `arena`'s initial space.
    pub fn new(mut allocator: A, arena: Arena) -> Result<Self> {
        let (mapped, growable) = match arena {
            Arena::Growable => (0, true),
            Arena::Fixed(bytes) => {
                allocator.add_region(0, bytes)?;
                (bytes, false)
            }
        };
        Ok(Self {
            allocator,
            mapped,
            growable,
            calls: DriverCalls::default(),
        })
    }
}

/// The whole granules to map at the end of an arena of `mapped` bytes so
/// that a `size`-byte request refused by `allocator` fits, as memcore
/// answers exactly ([`Allocator::growth_needed`]); `None` when that passes
/// the address space.
fn granules_to_fit<A: Allocator>(allocator: &A, mapped: u64, size: u64) -> Result<Option<u64>> {
    match allocator.growth_needed(size, DEFAULT_ALIGN, NewRegion::At(mapped)) {
        Ok(need) => {
            let grow = need.max(1).checked_next_multiple_of(GRANULE);
            Ok(grow.filter(|&grow| mapped.checked_add(grow).is_some()))
        }
        Err(err) if is_refusal(&err) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// The error for a request refused after growing by what the allocator
/// asked for: a broken allocator, not a full arena.
fn refused_after_growth(size: u64) -> anyhow::Error {
    anyhow::anyhow!("{size} bytes refused after growing by what the allocator asked for")
}

impl<A: Allocator> GrowingArena<A> {
    /// Map more and retry, after `size` bytes did not fit.
    #[cold]
    fn grow_and_allocate(&mut self, size: u64) -> Result<Option<Allocation>> {
        if !self.growable {
            return Ok(None);
        }
        let Some(grow) = granules_to_fit(&self.allocator, self.mapped, size)? else {
            return Ok(None);
        };
        self.allocator.add_region(self.mapped, grow)?;
        self.mapped += grow;
        self.calls.grow(grow, &H200_DRIVER_COSTS);
        match self.allocator.allocate(size, DEFAULT_ALIGN) {
            Ok(block) => Ok(Some(block)),
            Err(err) if is_refusal(&err) => Err(refused_after_growth(size)),
            Err(err) => Err(err.into()),
        }
    }
}

/// Whether an allocator error means "does not fit" rather than a bug.
fn is_refusal(err: &Error) -> bool {
    matches!(err, Error::OutOfMemory { .. } | Error::Overflow { .. })
}

impl<A: Allocator> Policy for GrowingArena<A> {
    type Block = Allocation;

    // The replay loop times these calls: inline them, and keep growth out
    // of line, so the loop holds the allocator's own code and nothing else.
    #[inline(always)]
    fn allocate(&mut self, size: u64) -> Result<Option<Allocation>> {
        match self.allocator.allocate(size, DEFAULT_ALIGN) {
            Ok(block) => Ok(Some(block)),
            Err(err) if is_refusal(&err) => self.grow_and_allocate(size),
            Err(err) => Err(err.into()),
        }
    }

    #[inline(always)]
    fn free(&mut self, block: Allocation) -> Result<()> {
        Ok(self.allocator.free(block)?)
    }

    fn offset(&self, block: Allocation) -> Result<u64> {
        Ok(block.offset)
    }

    fn mapped_bytes(&self) -> Result<u64> {
        Ok(self.mapped)
    }

    fn driver_calls(&self) -> Result<DriverCalls> {
        Ok(self.calls)
    }

    fn state(&self) -> Result<ArenaState> {
        Ok(arena_state(self.mapped, &self.allocator.stats()))
    }
}

fn arena_state(mapped: u64, stats: &memcore::Stats) -> ArenaState {
    ArenaState {
        mapped_bytes: mapped,
        live_bytes: stats.live_bytes,
        free_bytes: stats.free_bytes,
        largest_free_bytes: stats.largest_free,
    }
}

/// `memcore::FreeList` with first or best fit.
pub fn free_list(fit: memcore::Fit, arena: Arena) -> Result<GrowingArena<FreeList>> {
    GrowingArena::new(FreeList::new(fit), arena)
}

/// `memcore::Tlsf`.
pub fn tlsf(arena: Arena) -> Result<GrowingArena<Tlsf>> {
    GrowingArena::new(Tlsf::new(), arena)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_footprint_rule_states_the_sizes_the_code_uses() {
        let granule = format!("{} MiB granules", GRANULE >> 20);
        let arena = format!("{} GiB", ARENA_BYTES >> 30);
        assert!(FOOTPRINT_RULE.contains(&granule), "{granule}");
        assert!(
            FOOTPRINT_RULE.contains(&format!("one {arena} arena")),
            "{arena}"
        );
        assert!(
            FOOTPRINT_RULE.contains(&format!("reserves {arena}")),
            "{arena}"
        );
        assert!(FOOTPRINT_RULE.contains(&format!("aligned to {DEFAULT_ALIGN} bytes")));
    }

    #[test]
    fn a_fixed_arena_is_whole_granules() {
        assert_eq!(Arena::fixed(4 << 20).unwrap(), Arena::Fixed(4 << 20));
        for bytes in [0, 1, 3 << 20, (2 << 20) + 256, u64::MAX] {
            let message = Arena::fixed(bytes).unwrap_err().to_string();
            assert!(message.contains("2 MiB"), "{message}");
        }
    }

    #[test]
    fn growth_maps_only_what_the_tail_lacks() {
        // 1 MiB free at the tail of 4 MiB: a 3 MiB request needs 2 MiB more.
        assert_eq!(growth(4 << 20, 3 << 20, 3 << 20, 0), 2 << 20);
        // An empty arena grows by at least one granule.
        assert_eq!(growth(0, 0, 1, 0), GRANULE);
        // The start is aligned: a top of 1 byte puts the block at 256.
        assert_eq!(growth(GRANULE, 1, GRANULE, 0), GRANULE);
        assert_eq!(growth(GRANULE, 1, GRANULE - 256, 0), GRANULE);
        assert_eq!(growth(0, 0, 100 << 20, 3), 14 << 20);
    }
}
