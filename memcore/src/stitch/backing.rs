//! The physical side of a stitched pool: which handle backs each 2 MiB
//! page of the virtual arena, how many live blocks touch each page, the
//! cache of mapped handles no live block uses, and the handles of huge
//! blocks, which own theirs whole.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use super::pages::{NONE, PageTable};
use super::{HandleInfo, PAGE_BYTES, StitchConfig};
use crate::stitch::driver::DriverOp;
use crate::{DriverCall, DriverCalls, Error, Extent, Result};

mod check;

/// The two handle sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// One page.
    Small = 0,
    /// `large_pages` pages.
    Large = 1,
}

/// A created handle. Between calls it is always mapped: one taken from
/// where it idles is mapped at its new place at once, or released.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Handle bytes; 0 for a slot whose handle was released.
    bytes: u64,
    /// Whether it is mapped, at `first_page`.
    mapped: bool,
    /// First page it is mapped at.
    first_page: u64,
    /// Its pages that live blocks touch.
    used: u32,
    /// Whether it is in the idle cache (mapped, `used == 0`).
    cached: bool,
    /// Whether `(first_page, slot)` is in its class's idle set. A cached
    /// handle is always listed; one taken back into use stays listed
    /// (stale) until a pop meets it, so a warm allocate + free pair on an
    /// otherwise idle handle touches no tree.
    listed: bool,
    /// Whether it backs one huge block whole: no page of the table names
    /// it, and it is released when its block is freed.
    huge: bool,
}

/// Pages, handles and the idle cache.
#[derive(Debug, Clone)]
pub(super) struct Backing {
    config: StitchConfig,
    pages: PageTable,
    /// The handles of live huge blocks by the first page they are mapped
    /// at.
    huge: BTreeMap<u64, u32>,
    slots: Vec<Slot>,
    spare_slots: Vec<u32>,
    /// Idle (cached) handles per class as `(first page, slot)`, so the one
    /// mapped highest is at hand, plus stale entries of listed handles
    /// back in use, skipped (and dropped) when met.
    idle: [BTreeSet<(u64, u32)>; 2],
    /// Cached handles per class.
    idle_count: [usize; 2],
    /// Physical bytes to stay within while idle handles are cached.
    budget: u64,
    idle_bytes: u64,
    physical_bytes: u64,
    peak_physical_bytes: u64,
    handles: [u64; 2],
    calls: DriverCalls,
    /// Operations not yet taken, when the configuration logs them.
    ops: Vec<DriverOp>,
}

impl Backing {
    pub(super) fn new(config: StitchConfig) -> Self {
        Self {
            config,
            pages: PageTable::default(),
            huge: BTreeMap::new(),
            slots: Vec::new(),
            spare_slots: Vec::new(),
            idle: [BTreeSet::new(), BTreeSet::new()],
            idle_count: [0; 2],
            budget: u64::MAX,
            idle_bytes: 0,
            physical_bytes: 0,
            peak_physical_bytes: 0,
            handles: [0; 2],
            calls: DriverCalls::default(),
            ops: Vec::new(),
        }
    }

    fn large_pages(&self) -> u64 {
        u64::from(self.config.large_pages)
    }

    fn class_bytes(&self, class: Class) -> u64 {
        match class {
            Class::Small => PAGE_BYTES,
            Class::Large => self.large_pages() * PAGE_BYTES,
        }
    }

    fn class_of(bytes: u64) -> Class {
        if bytes > PAGE_BYTES {
            Class::Large
        } else {
            Class::Small
        }
    }

    /// Bytes in created, not yet released handles.
    pub(super) fn physical_bytes(&self) -> u64 {
        self.physical_bytes
    }

    pub(super) fn peak_physical_bytes(&self) -> u64 {
        self.peak_physical_bytes
    }

    pub(super) fn idle_bytes(&self) -> u64 {
        self.idle_bytes
    }

    pub(super) fn handles(&self) -> (u64, u64) {
        (self.handles[0], self.handles[1])
    }

    pub(super) fn calls(&self) -> DriverCalls {
        self.calls
    }

    /// Count one call and, when the configuration logs them, keep the
    /// operation (`Map` stands for its cuMemSetAccess too).
    fn record(&mut self, kind: DriverCall, bytes: u64, op: Option<DriverOp>) {
        let costs = self.config.costs;
        self.calls.record(kind, bytes, &costs);
        if self.config.log_ops
            && let Some(op) = op
        {
            self.ops.push(op);
        }
    }

    /// The logged operations, oldest first; the log is empty afterwards.
    pub(super) fn take_ops(&mut self) -> Vec<DriverOp> {
        core::mem::take(&mut self.ops)
    }

    /// Pages `[first, last]` that `[offset, offset + len)` touches.
    fn page_span(offset: u64, len: u64) -> (u64, u64) {
        (offset / PAGE_BYTES, (offset + len - 1) / PAGE_BYTES)
    }

    /// Pages `[offset, offset + len)` covers (`len > 0`).
    pub(super) fn pages_covered(offset: u64, len: u64) -> u64 {
        let (first, last) = Self::page_span(offset, len);
        last - first + 1
    }

    /// Physical bytes the pool means to stay within, set before each
    /// [`Backing::touch`]: while creating a handle keeps the footprint
    /// within it, idle handles stay cached where they are mapped.
    pub(super) fn set_budget(&mut self, bytes: u64) {
        self.budget = bytes;
    }

    /// A block now covers `[offset, offset + len)` (`len > 0`): count it on
    /// every page it touches and back those no handle backs.
    pub(super) fn touch(&mut self, offset: u64, len: u64) -> Result<()> {
        let (first, last) = Self::page_span(offset, len);
        let mut unbacked = false;
        for page in first..=last {
            let entry = self.pages.entry(page);
            entry.refs += 1;
            if entry.refs > 1 {
                continue;
            }
            match entry.handle {
                NONE => unbacked = true,
                slot => self.use_page_of(slot),
            }
        }
        if !unbacked {
            return Ok(());
        }
        for page in first..=last {
            if self.pages.get(page).handle == NONE {
                self.back_page(page)?;
            }
        }
        Ok(())
    }

    /// Back `page`, which a live block touches and no handle backs: with a
    /// large handle over its whole chunk when no page of the chunk is
    /// backed and one fits the budget (or an idle one can move there),
    /// else with a page-sized handle.
    fn back_page(&mut self, page: u64) -> Result<()> {
        let large = self.large_pages();
        if large > 1 {
            let chunk_first = page / large * large;
            let chunk_empty =
                (chunk_first..chunk_first + large).all(|p| self.pages.get(p).handle == NONE);
            if chunk_empty && let Some(slot) = self.obtain(Class::Large)? {
                return self.map_at(slot, chunk_first);
            }
        }
        let slot = self
            .obtain(Class::Small)?
            .ok_or(Error::Corrupt("no page-sized handle could be had"))?;
        self.map_at(slot, page)
    }

    /// Undo a [`Backing::touch`] that failed part way: the pages it counted
    /// are uncounted; those it backed stay mapped, idle.
    pub(super) fn untouch_failed(&mut self, offset: u64, len: u64) -> Result<()> {
        self.untouch_pages(offset, len, true)
    }

    /// A block no longer covers `[offset, offset + len)`: pages no live
    /// block touches any more leave their handle idle (still mapped).
    pub(super) fn untouch(&mut self, offset: u64, len: u64) -> Result<()> {
        self.untouch_pages(offset, len, false)
    }

    fn untouch_pages(&mut self, offset: u64, len: u64, failed_touch: bool) -> Result<()> {
        let (first, last) = Self::page_span(offset, len);
        for page in first..=last {
            let entry = self
                .pages
                .get_mut(page)
                .ok_or(Error::Corrupt("freed block lies where no page was touched"))?;
            entry.refs = entry
                .refs
                .checked_sub(1)
                .ok_or(Error::Corrupt("page of a live block counts no block"))?;
            if entry.refs > 0 {
                continue;
            }
            let slot = entry.handle;
            if slot == NONE && failed_touch {
                continue;
            }
            let handle = self
                .slots
                .get_mut(slot as usize)
                .ok_or(Error::Corrupt("page of a live block has no handle"))?;
            handle.used = handle.used.checked_sub(1).ok_or(Error::Corrupt(
                "handle counts fewer used pages than touch it",
            ))?;
            if handle.used == 0 {
                self.make_idle(slot);
            }
        }
        while self.idle_bytes > self.config.max_idle_bytes {
            let Some(slot) = self.pop_highest_idle() else {
                break;
            };
            self.unmap(slot);
            self.release(slot);
        }
        Ok(())
    }

    /// Back a huge block over `[offset, offset + bytes)` (whole pages, no
    /// page shared with another block) with one handle of its own. Idle
    /// handles mapped inside it are released first; past the budget, idle
    /// handles are released highest first while the cache holds more than
    /// `keep_idle_bytes`; past the device's capacity, all of them. Its
    /// cost is a few calls and tree steps whatever its size, beyond the
    /// handles it releases (each made by an earlier request).
    pub(super) fn back_huge(&mut self, offset: u64, bytes: u64) -> Result<()> {
        let first = offset / PAGE_BYTES;
        let end = first + bytes / PAGE_BYTES;
        for class in [Class::Small, Class::Large] {
            loop {
                let inside = self.idle[class as usize].range((first, 0)..(end, 0)).next();
                let Some(&(page, slot)) = inside else {
                    break;
                };
                self.idle[class as usize].remove(&(page, slot));
                let handle = &mut self.slots[slot as usize];
                if !handle.cached {
                    return Err(Error::Corrupt(
                        "a handle in use lies where a huge block goes",
                    ));
                }
                handle.listed = false;
                self.take_idle(slot);
                self.unmap(slot);
                self.release(slot);
            }
        }
        while self.physical_bytes.saturating_add(bytes) > self.budget
            && self.idle_bytes > self.config.keep_idle_bytes
        {
            let Some(slot) = self.pop_highest_idle() else {
                break;
            };
            self.unmap(slot);
            self.release(slot);
        }
        self.make_room_for(bytes)?;
        let slot = self.create_handle(bytes, true)?;
        let handle = &mut self.slots[slot as usize];
        handle.mapped = true;
        handle.first_page = first;
        handle.used = 1;
        self.huge.insert(first, slot);
        self.record(
            DriverCall::Map,
            bytes,
            Some(DriverOp::Map {
                handle: slot,
                at: offset,
                bytes,
            }),
        );
        self.record(DriverCall::SetAccess, bytes, None);
        Ok(())
    }

    /// The huge block at `offset` is freed: its handle is unmapped and
    /// released.
    pub(super) fn free_huge(&mut self, offset: u64) -> Result<()> {
        let slot = self
            .huge
            .remove(&(offset / PAGE_BYTES))
            .ok_or(Error::Corrupt("a huge block has no handle"))?;
        self.slots[slot as usize].used = 0;
        self.unmap(slot);
        self.release(slot);
        Ok(())
    }

    /// Unmap and release every idle handle: what `empty_cache` does.
    pub(super) fn trim(&mut self) {
        while let Some(slot) = self.pop_highest_idle() {
            self.unmap(slot);
            self.release(slot);
        }
    }

    /// Bytes of `[offset, offset + len)` that lie in handles of at least
    /// `min_bytes`.
    pub(super) fn bytes_in_handles_of(&self, offset: u64, len: u64, min_bytes: u64) -> u64 {
        let (first, last) = Self::page_span(offset, len);
        let large_enough = |page: u64| {
            self.slots
                .get(self.pages.get(page).handle as usize)
                .is_some_and(|slot| slot.bytes >= min_bytes)
        };
        if first == last {
            // Most blocks lie within one page.
            return if large_enough(first) { len } else { 0 };
        }
        let end = offset + len;
        (first..=last)
            .filter(|&page| large_enough(page))
            .map(|page| {
                let start = (page * PAGE_BYTES).max(offset);
                ((page + 1) * PAGE_BYTES).min(end) - start
            })
            .sum()
    }

    /// A page that no live block touched is touched again; its handle
    /// leaves the idle cache if it was there.
    fn use_page_of(&mut self, slot: u32) {
        self.slots[slot as usize].used += 1;
        self.take_idle(slot);
    }

    /// Take a specific idle handle out of the cache; its entry in the
    /// idle set stays, stale, until a pop meets it.
    fn take_idle(&mut self, slot: u32) {
        let handle = &mut self.slots[slot as usize];
        if handle.cached {
            handle.cached = false;
            self.idle_count[Self::class_of(handle.bytes) as usize] -= 1;
            self.idle_bytes -= handle.bytes;
        }
    }

    fn make_idle(&mut self, slot: u32) {
        let handle = &mut self.slots[slot as usize];
        handle.cached = true;
        let class = Self::class_of(handle.bytes) as usize;
        self.idle_count[class] += 1;
        self.idle_bytes += handle.bytes;
        if !handle.listed {
            handle.listed = true;
            self.idle[class].insert((handle.first_page, slot));
        }
    }

    /// Drop the stale entries at the top of `class`'s idle set, so its
    /// last entry, if any, is a cached handle.
    fn drop_stale_tops(&mut self, class: Class) {
        while let Some(&(_, slot)) = self.idle[class as usize].last() {
            let handle = &mut self.slots[slot as usize];
            if handle.cached {
                return;
            }
            handle.listed = false;
            self.idle[class as usize].pop_last();
        }
    }

    /// The idle handle of `class` mapped at the highest address, out of the
    /// cache (still mapped). Best fit fills the arena from its dense low
    /// end, so the highest idle chunk is the one least likely to be wanted
    /// where it is: moving it costs the fewest later moves back.
    fn pop_idle(&mut self, class: Class) -> Option<u32> {
        self.drop_stale_tops(class);
        let (_, slot) = self.idle[class as usize].pop_last()?;
        let handle = &mut self.slots[slot as usize];
        handle.listed = false;
        handle.cached = false;
        self.idle_count[class as usize] -= 1;
        self.idle_bytes -= handle.bytes;
        Some(slot)
    }

    /// The idle handle of either class mapped at the highest address.
    fn pop_highest_idle(&mut self) -> Option<u32> {
        self.drop_stale_tops(Class::Small);
        self.drop_stale_tops(Class::Large);
        let last =
            |this: &Self, class: Class| this.idle[class as usize].last().map(|&(page, _)| page);
        let class = match (last(self, Class::Small), last(self, Class::Large)) {
            (Some(small), Some(large)) if large > small => Class::Large,
            (Some(_), _) => Class::Small,
            (None, Some(_)) => Class::Large,
            (None, None) => return None,
        };
        self.pop_idle(class)
    }

    /// Map the unmapped handle `slot` from `page` on and count the pages
    /// of it live blocks touch.
    fn map_at(&mut self, slot: u32, page: u64) -> Result<()> {
        let bytes = self.slots[slot as usize].bytes;
        let pages = bytes / PAGE_BYTES;
        let mut used = 0;
        for p in page..page + pages {
            let entry = self.pages.entry(p);
            if entry.handle != NONE {
                return Err(Error::Corrupt("mapping over a page another handle backs"));
            }
            entry.handle = slot;
            used += u32::from(entry.refs > 0);
        }
        let handle = &mut self.slots[slot as usize];
        handle.mapped = true;
        handle.first_page = page;
        handle.used = used;
        if used == 0 {
            self.make_idle(slot);
        }
        let at = page * PAGE_BYTES;
        self.record(
            DriverCall::Map,
            bytes,
            Some(DriverOp::Map {
                handle: slot,
                at,
                bytes,
            }),
        );
        self.record(DriverCall::SetAccess, bytes, None);
        Ok(())
    }

    /// An unmapped handle of `class`, or `None` for a large one that would
    /// take the footprint past the budget while idle handles could serve
    /// the chunk's pages instead.
    ///
    /// Within the budget a new handle is created and the idle ones stay
    /// cached where they are (a later request there costs no call). Past
    /// it, once the cache holds more than `keep_idle_bytes`, the
    /// idle handle of the class mapped highest is unmapped to serve here; with
    /// nothing idle at all a large handle is created anyway
    /// (`grow_in_large`); a large one
    /// may also replace a large handle's worth of idle pages, released;
    /// a page with no idle page-sized handle to take releases an idle
    /// large one first, so the footprint does not grow.
    fn obtain(&mut self, class: Class) -> Result<Option<u32>> {
        let bytes = self.class_bytes(class);
        // A large handle may overshoot the budget by part of itself: the
        // frontier chunk, partly used, is what growth in large handles
        // costs.
        let allowance = match class {
            Class::Large => {
                let share = u128::from(bytes) * u128::from(self.config.overshoot_permille) / 1000;
                u64::try_from(share).unwrap_or(u64::MAX)
            }
            Class::Small => 0,
        };
        let capacity = self.config.capacity_bytes;
        let after = self.physical_bytes.saturating_add(bytes);
        let within = after <= self.budget.saturating_add(allowance) && after <= capacity;
        if within {
            return self.create(bytes).map(Some);
        }
        let may_recycle = self.idle_bytes > self.config.keep_idle_bytes;
        if may_recycle && let Some(slot) = self.pop_idle(class) {
            self.unmap(slot);
            return Ok(Some(slot));
        }
        if class == Class::Large {
            // Nothing idle: the footprint grows whatever backs the chunk, and
            // a large handle keeps its bytes at full bandwidth with one call
            // where pages would take up to sixteen.
            if self.config.grow_in_large
                && self.idle_bytes == 0
                && self.physical_bytes.saturating_add(bytes) <= capacity
            {
                return self.create(bytes).map(Some);
            }
            // Idle pages worth a large handle give way to one: no more
            // memory, and fewer calls than backing the chunk page by page.
            let pages = self.large_pages() as usize;
            if !may_recycle || self.idle_count[Class::Small as usize] < pages {
                return Ok(None);
            }
            for _ in 0..pages {
                let Some(slot) = self.pop_idle(Class::Small) else {
                    break;
                };
                self.unmap(slot);
                self.release(slot);
            }
            return self.create(bytes).map(Some);
        }
        if may_recycle && let Some(slot) = self.pop_idle(Class::Large) {
            self.unmap(slot);
            self.release(slot);
        }
        self.make_room_for(bytes)?;
        self.create(bytes).map(Some)
    }

    /// Room on the device for a new handle of `bytes`: past the capacity,
    /// every idle handle is released, and if that is not enough the request
    /// is [`Error::OutOfMemory`].
    fn make_room_for(&mut self, bytes: u64) -> Result<()> {
        let capacity = self.config.capacity_bytes;
        if self.physical_bytes.saturating_add(bytes) <= capacity {
            return Ok(());
        }
        self.trim();
        if self.physical_bytes.saturating_add(bytes) <= capacity {
            return Ok(());
        }
        Err(Error::OutOfMemory {
            requested: bytes,
            align: PAGE_BYTES,
            free_bytes: capacity.saturating_sub(self.physical_bytes),
            largest_free: capacity.saturating_sub(self.physical_bytes),
        })
    }

    fn create(&mut self, bytes: u64) -> Result<u32> {
        self.create_handle(bytes, false)
    }

    fn create_handle(&mut self, bytes: u64, huge: bool) -> Result<u32> {
        let slot = Slot {
            bytes,
            mapped: false,
            first_page: 0,
            used: 0,
            cached: false,
            listed: false,
            huge,
        };
        let index = match self.spare_slots.pop() {
            Some(index) => {
                self.slots[index as usize] = slot;
                index
            }
            None => {
                let index = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&index| index != NONE)
                    .ok_or(Error::Overflow {
                        offset: self.physical_bytes,
                        size: bytes,
                    })?;
                self.slots.push(slot);
                index
            }
        };
        self.physical_bytes += bytes;
        self.peak_physical_bytes = self.peak_physical_bytes.max(self.physical_bytes);
        self.handles[Self::class_of(bytes) as usize] += 1;
        self.record(
            DriverCall::Create,
            bytes,
            Some(DriverOp::Create {
                handle: index,
                bytes,
            }),
        );
        Ok(index)
    }

    /// Take an idle handle off its pages.
    fn unmap(&mut self, slot: u32) {
        let Slot {
            bytes,
            first_page,
            huge,
            ..
        } = self.slots[slot as usize];
        if !huge {
            for page in first_page..first_page + bytes / PAGE_BYTES {
                if let Some(entry) = self.pages.get_mut(page) {
                    entry.handle = NONE;
                }
            }
        }
        self.slots[slot as usize].mapped = false;
        self.record(
            DriverCall::Unmap,
            bytes,
            Some(DriverOp::Unmap {
                handle: slot,
                at: first_page * PAGE_BYTES,
                bytes,
            }),
        );
    }

    /// Give an unmapped handle back to the device.
    fn release(&mut self, slot: u32) {
        let bytes = self.slots[slot as usize].bytes;
        self.slots[slot as usize].bytes = 0;
        self.physical_bytes -= bytes;
        self.handles[Self::class_of(bytes) as usize] -= 1;
        self.spare_slots.push(slot);
        self.record(
            DriverCall::Release,
            bytes,
            Some(DriverOp::Release {
                handle: slot,
                bytes,
            }),
        );
    }

    /// Every created handle and where it is mapped, by slot.
    pub(super) fn handles_held(&self) -> impl Iterator<Item = HandleInfo> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.bytes > 0)
            .map(|(index, slot)| HandleInfo {
                handle: index as u32,
                bytes: slot.bytes,
                mapped_at: slot
                    .mapped
                    .then(|| Extent::new(slot.first_page * PAGE_BYTES, slot.bytes)),
                in_use: slot.used > 0,
            })
    }

    /// The handle backing the byte at `offset`, and the byte's offset in it.
    pub(super) fn physical(&self, offset: u64) -> Option<(u32, u64)> {
        let page = offset / PAGE_BYTES;
        let handle = match self.pages.get(page).handle {
            NONE => {
                let (_, &slot) = self.huge.range(..=page).next_back()?;
                let huge = self.slots[slot as usize];
                (page < huge.first_page + huge.bytes / PAGE_BYTES).then_some(slot)?
            }
            slot => slot,
        };
        let slot = self.slots.get(handle as usize)?;
        Some((handle, offset - slot.first_page * PAGE_BYTES))
    }
}
