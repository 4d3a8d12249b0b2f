//! Runs a sequence of steps on the system under test (a heap plus the device
//! bytes its blocks live in) and on the model side by side, checking each
//! step's outcome and the invariants after it.

use memcore::{
    Allocator, BlockFlags, CompactionPlan, DEFAULT_ALIGN, Error, Extent, Handle, Heap, MAX_ALIGN,
};
use proptest::prelude::*;

use crate::device::{DEVICE_BYTES, Device};
use crate::invariants::{contents_kept, heap_matches, plan_is_sound};
use crate::model::{Model, ModelBlock, fits};
use crate::transition::{BadRequest, Setup, Step};

/// What varies between the allocators under test.
pub struct Policy<A> {
    /// A fresh allocator with no region.
    pub make: fn() -> A,
    /// Whether a request fails only when no free range can hold it at
    /// `min_align` (an exhaustive search); a good-fit allocator may refuse
    /// more.
    pub exact_fit: bool,
    /// The finest alignment the allocator hands out, bytes.
    pub min_align: u64,
    /// The allocator's own consistency check.
    pub check: fn(&A) -> Result<(), String>,
}

/// The system under test and the model, in step.
pub struct Machine<'p, A: Allocator> {
    policy: &'p Policy<A>,
    heap: Heap<A>,
    device: Device,
    model: Model,
}

/// Run `steps` from `setup`, failing on the first divergence.
pub fn run<A: Allocator>(
    policy: &Policy<A>,
    setup: Setup,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mut machine = Machine::new(policy, setup)?;
    for step in steps {
        machine.apply(step)?;
        machine.check()?;
    }
    contents_kept(&machine.device, &machine.model)
}

impl<'p, A: Allocator> Machine<'p, A> {
    pub fn new(policy: &'p Policy<A>, setup: Setup) -> Result<Self, TestCaseError> {
        let mut heap = Heap::new((policy.make)());
        let mut model = Model::default();
        let region = Extent::new(setup.base, setup.size);
        prop_assert_eq!(heap.add_region(region.offset, region.size), Ok(()));
        model.add_region(region);
        Ok(Self {
            policy,
            heap,
            device: Device::new(),
            model,
        })
    }

    pub fn heap(&self) -> &Heap<A> {
        &self.heap
    }

    pub fn check(&self) -> Result<(), TestCaseError> {
        heap_matches(&self.heap, &self.model)?;
        let own = (self.policy.check)(self.heap.allocator());
        prop_assert_eq!(own, Ok(()), "allocator's own check");
        Ok(())
    }

    pub fn apply(&mut self, step: &Step) -> Result<(), TestCaseError> {
        match *step {
            Step::Allocate {
                size,
                align,
                pinned,
                seed,
            } => self.allocate(size, align, pinned, seed),
            Step::AllocateBad(bad) => self.allocate_bad(bad),
            Step::Free(pick) => match self.model.live(pick) {
                Some(h) => self.free(h),
                None => Ok(()),
            },
            Step::FreeStale(pick) => match self.model.dead(pick) {
                Some(h) => self.free_stale(h),
                None => Ok(()),
            },
            Step::DoubleFree(pick) => match self.model.live(pick) {
                Some(h) => {
                    self.free(h)?;
                    self.free_stale(h)
                }
                None => Ok(()),
            },
            Step::SetPinned(pick, pinned) => match self.model.live(pick) {
                Some(h) => {
                    let flags = if pinned {
                        BlockFlags::PINNED
                    } else {
                        BlockFlags::empty()
                    };
                    prop_assert_eq!(self.heap.set_flags(h, flags), Ok(()));
                    if let Some(block) = self.model.blocks.get_mut(&h) {
                        block.pinned = pinned;
                    }
                    Ok(())
                }
                None => Ok(()),
            },
            Step::CompactFull => self.compact_full(),
            Step::CompactRoom { size, align, seed } => {
                self.compact_room(size, align, seed).map(drop)
            }
            Step::CompactRoomFragmented {
                permille,
                align,
                seed,
            } => self
                .compact_room_fragmented(permille, align, seed)
                .map(drop),
            Step::Grow { size, gap, below } => self.grow(size, gap, below),
            Step::GrowOverlapping(pick, len) => self.grow_overlapping(pick, len),
            Step::Shrink { min_bytes } => self.shrink(min_bytes),
        }
    }

    /// Allocate and fill a block; `None` if the allocator was out of memory
    /// (and is then unchanged).
    pub fn allocate_block(
        &mut self,
        size: u64,
        align: u64,
        pinned: bool,
        seed: u64,
    ) -> Result<Option<Handle>, TestCaseError> {
        let before = self.heap.stats();
        let free = self.heap.allocator().free_extents();
        let flags = if pinned {
            BlockFlags::PINNED
        } else {
            BlockFlags::empty()
        };
        match self.heap.allocate(size, align, flags) {
            Ok(h) => {
                prop_assert!(
                    !self.model.blocks.contains_key(&h),
                    "handle {:?} issued twice",
                    h
                );
                prop_assert!(
                    !self.model.dead.contains(&h),
                    "dead handle {:?} reissued",
                    h
                );
                let offset = self.heap.offset(h);
                prop_assert!(offset.is_ok());
                let block = ModelBlock {
                    offset: offset.unwrap_or_default(),
                    size,
                    align,
                    pinned,
                    seed,
                };
                prop_assert!(
                    free.iter().any(|hole| hole.contains(&block.extent())),
                    "block {:?} not placed in a free range",
                    block
                );
                self.device.fill(block.extent(), seed);
                self.model.blocks.insert(h, block);
                Ok(Some(h))
            }
            Err(Error::OutOfMemory {
                requested,
                align: asked,
                free_bytes,
                largest_free,
            }) => {
                prop_assert_eq!((requested, asked), (size, align));
                prop_assert_eq!(
                    (free_bytes, largest_free),
                    (before.free_bytes, before.largest_free)
                );
                prop_assert_eq!(self.heap.stats(), before);
                if self.policy.exact_fit {
                    prop_assert!(
                        !free.iter().any(|&hole| fits(
                            hole,
                            size,
                            align.max(self.policy.min_align)
                        )),
                        "refused {} bytes aligned {} though a free range fits",
                        size,
                        align
                    );
                }
                Ok(None)
            }
            Err(other) => Err(TestCaseError::fail(format!(
                "allocate({size}, {align}): {other}"
            ))),
        }
    }

    fn allocate(
        &mut self,
        size: u64,
        align: u64,
        pinned: bool,
        seed: u64,
    ) -> Result<(), TestCaseError> {
        self.allocate_block(size, align, pinned, seed).map(drop)
    }

    fn allocate_bad(&mut self, bad: BadRequest) -> Result<(), TestCaseError> {
        let before = self.heap.stats();
        let (size, align) = match bad {
            BadRequest::ZeroSize => (0, 256),
            BadRequest::AlignNotPowerOfTwo => (64, 3 << 8),
            BadRequest::AlignTooLarge => (64, MAX_ALIGN << 1),
        };
        let result = self.heap.allocate(size, align, BlockFlags::empty());
        match bad {
            BadRequest::ZeroSize => prop_assert_eq!(result, Err(Error::ZeroSize)),
            _ => prop_assert!(
                matches!(result, Err(Error::InvalidAlignment { .. })),
                "{:?}",
                result
            ),
        }
        prop_assert!(self.heap.plan_room(size, align).is_err());
        prop_assert_eq!(self.heap.stats(), before);
        Ok(())
    }

    pub fn free(&mut self, h: Handle) -> Result<(), TestCaseError> {
        let expected = self.model.blocks.remove(&h).map(|b| b.info());
        prop_assert_eq!(self.heap.free(h).ok(), expected);
        self.model.dead.push(h);
        Ok(())
    }

    fn free_stale(&mut self, h: Handle) -> Result<(), TestCaseError> {
        let before = self.heap.stats();
        prop_assert_eq!(self.heap.free(h), Err(Error::StaleHandle(h)));
        prop_assert_eq!(self.heap.offset(h), Err(Error::StaleHandle(h)));
        prop_assert_eq!(
            self.heap.set_flags(h, BlockFlags::PINNED),
            Err(Error::StaleHandle(h))
        );
        prop_assert_eq!(self.heap.stats(), before);
        Ok(())
    }

    /// Copy the plan's moves on the device in order, commit, and hold the
    /// heap to the new offsets and the device to the old contents.
    fn execute(&mut self, plan: CompactionPlan) -> Result<(), TestCaseError> {
        plan_is_sound(&plan, &self.model)?;
        for m in plan.moves() {
            self.device.copy(m);
        }
        let replay = plan.clone();
        prop_assert_eq!(self.heap.commit(plan.clone()), Ok(()));
        prop_assert_eq!(self.heap.commit(replay), Err(Error::StalePlan));
        for m in plan.moves() {
            if let Some(block) = self.model.blocks.get_mut(&m.handle) {
                block.offset = m.dst;
            }
        }
        contents_kept(&self.device, &self.model)
    }

    pub fn compact_full(&mut self) -> Result<(), TestCaseError> {
        let plan = self.heap.plan_full();
        self.execute(plan)?;
        let again = self.heap.plan_full();
        prop_assert!(
            again.is_empty(),
            "full compaction is not a fixpoint: {:?}",
            again.moves()
        );
        Ok(())
    }

    /// Make room for a request and allocate it. The heap makes room at its
    /// planning alignment (at least 256 bytes), so "fits" is judged there.
    pub fn compact_room(
        &mut self,
        size: u64,
        align: u64,
        seed: u64,
    ) -> Result<Option<Handle>, TestCaseError> {
        let before = self.heap.stats();
        let align_at = align.max(DEFAULT_ALIGN);
        let fits_now = self
            .heap
            .allocator()
            .free_extents()
            .iter()
            .any(|&h| fits(h, size, align_at));
        match self.heap.plan_room(size, align) {
            Ok(plan) => {
                prop_assert!(
                    !fits_now || plan.is_empty(),
                    "moves planned though the request fits"
                );
                self.execute(plan)?;
                let made = self
                    .heap
                    .allocator()
                    .free_extents()
                    .iter()
                    .any(|&h| fits(h, size, align_at));
                prop_assert!(made, "plan_room({}, {}) made no room", size, align);
                let placed = self.allocate_block(size, align, false, seed)?;
                prop_assert!(
                    placed.is_some() || !self.policy.exact_fit,
                    "room made but allocation refused"
                );
                Ok(placed)
            }
            Err(Error::OutOfMemory {
                requested,
                align: asked,
                ..
            }) => {
                prop_assert_eq!((requested, asked), (size, align));
                prop_assert!(!fits_now, "plan_room refused a request that fits");
                prop_assert_eq!(self.heap.stats(), before);
                // Complete at least up to a full slide: if sliding everything
                // down made room, plan_room should have found a plan.
                let mut slid = self.model.clone();
                for m in self.heap.plan_full().moves() {
                    if let Some(block) = slid.blocks.get_mut(&m.handle) {
                        block.offset = m.dst;
                    }
                }
                let len = size.next_multiple_of(DEFAULT_ALIGN);
                let room = slid.holes().iter().any(|&h| fits(h, len, align_at));
                prop_assert!(
                    !room,
                    "plan_room({}, {}) refused; a full slide makes room",
                    size,
                    align
                );
                Ok(None)
            }
            Err(other) => Err(TestCaseError::fail(format!(
                "plan_room({size}, {align}): {other}"
            ))),
        }
    }

    /// Make room for a request that does not fit as the free space lies:
    /// larger than the largest free range by 1 byte plus `permille` of the
    /// rest of the free bytes.
    pub fn compact_room_fragmented(
        &mut self,
        permille: u64,
        align: u64,
        seed: u64,
    ) -> Result<Option<Handle>, TestCaseError> {
        let stats = self.heap.stats();
        let spread = stats.free_bytes.saturating_sub(stats.largest_free);
        let size = stats.largest_free + 1 + spread * permille / 1000;
        self.compact_room(size.min(stats.free_bytes.max(1)), align, seed)
    }

    pub fn grow(&mut self, size: u64, gap: u64, below: bool) -> Result<(), TestCaseError> {
        let offset = match (below, self.model.regions.first(), self.model.regions.last()) {
            (_, None, _) | (_, _, None) => gap,
            (true, Some(low), _) => match low.offset.checked_sub(gap + size) {
                Some(offset) => offset,
                None => return Ok(()),
            },
            (false, _, Some(high)) => high.end() + gap,
        };
        let region = Extent::new(offset, size);
        if region.end() > DEVICE_BYTES {
            return Ok(());
        }
        prop_assert_eq!(self.heap.add_region(offset, size), Ok(()));
        self.model.add_region(region);
        Ok(())
    }

    fn grow_overlapping(
        &mut self,
        pick: proptest::sample::Index,
        len: u64,
    ) -> Result<(), TestCaseError> {
        if self.model.regions.is_empty() {
            return Ok(());
        }
        let r = self.model.regions[pick.index(self.model.regions.len())];
        // Straddles the region's last byte.
        let offset = r.end() - 1 - (len / 2).min(r.size - 1);
        let before = self.heap.stats();
        prop_assert_eq!(
            self.heap.add_region(offset, len),
            Err(Error::RegionOverlap { offset, size: len })
        );
        prop_assert_eq!(self.heap.stats(), before);
        Ok(())
    }

    pub fn shrink(&mut self, min_bytes: u64) -> Result<(), TestCaseError> {
        let before = self.heap.stats();
        let top = self.model.regions.last().map(Extent::end);
        let tail = self
            .heap
            .allocator()
            .free_extents()
            .last()
            .copied()
            .filter(|e| Some(e.end()) == top);
        match self.heap.release_tail(min_bytes) {
            Some(released) => {
                prop_assert_eq!(Some(released), tail);
                prop_assert!(released.size >= min_bytes);
                self.model.release_tail(released);
            }
            None => {
                prop_assert!(
                    tail.is_none_or(|t| t.size < min_bytes),
                    "tail {:?} kept",
                    tail
                );
                prop_assert_eq!(self.heap.stats(), before);
            }
        }
        Ok(())
    }
}
