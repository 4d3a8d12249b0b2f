//! The backing's self-check: every page, handle, idle entry and count
//! walked and compared with what the others say, the first inconsistency
//! reported as [`Error::Corrupt`].

use super::{Backing, Class, NONE, PAGE_BYTES};
use crate::{Error, Result};

impl Backing {
    /// Walk pages and handles and report the first inconsistency.
    pub(in crate::stitch) fn check(&self) -> Result<()> {
        let mut used = alloc::vec![0u32; self.slots.len()];
        let mut pages = alloc::vec![0u64; self.slots.len()];
        let in_huge = |page: u64| {
            self.huge
                .range(..=page)
                .next_back()
                .is_some_and(|(_, &slot)| {
                    let huge = self.slots[slot as usize];
                    page < huge.first_page + huge.bytes / PAGE_BYTES
                })
        };
        for (index, page) in self.pages.iter() {
            if (page.refs > 0 || page.handle != NONE) && in_huge(index) {
                return Err(Error::Corrupt("a page inside a huge block is in use"));
            }
            let index = index as usize;
            if page.handle == NONE {
                if page.refs > 0 {
                    return Err(Error::Corrupt("a page live blocks touch has no handle"));
                }
                continue;
            }
            let slot = self
                .slots
                .get(page.handle as usize)
                .filter(|slot| slot.bytes > 0)
                .ok_or(Error::Corrupt("a page names a released handle"))?;
            if slot.huge {
                return Err(Error::Corrupt("a page names a huge block's handle"));
            }
            let first = slot.first_page as usize;
            if index < first || index >= first + (slot.bytes / PAGE_BYTES) as usize {
                return Err(Error::Corrupt("a page names a handle mapped elsewhere"));
            }
            used[page.handle as usize] += u32::from(page.refs > 0);
            pages[page.handle as usize] += 1;
        }
        let mut physical = 0;
        let mut idle = 0;
        let mut huge = 0;
        for (index, slot) in self.slots.iter().enumerate() {
            if slot.bytes == 0 {
                continue;
            }
            physical += slot.bytes;
            if slot.huge {
                if !slot.mapped
                    || slot.used != 1
                    || slot.cached
                    || slot.listed
                    || pages[index] != 0
                    || self.huge.get(&slot.first_page) != Some(&(index as u32))
                {
                    return Err(Error::Corrupt(
                        "a huge block's handle is not mapped under it alone",
                    ));
                }
                huge += 1;
                continue;
            }
            if !slot.mapped {
                if pages[index] != 0 || slot.used != 0 || slot.cached || slot.listed {
                    return Err(Error::Corrupt("an unmapped handle is in use or cached"));
                }
                idle += slot.bytes;
                continue;
            }
            if pages[index] != slot.bytes / PAGE_BYTES {
                return Err(Error::Corrupt(
                    "a handle is not mapped over its whole range",
                ));
            }
            if slot.used != used[index] {
                return Err(Error::Corrupt("a handle miscounts its used pages"));
            }
            let class = Self::class_of(slot.bytes) as usize;
            if (slot.used == 0) != slot.cached
                || (slot.cached && !slot.listed)
                || slot.listed != self.idle[class].contains(&(slot.first_page, index as u32))
            {
                return Err(Error::Corrupt(
                    "a handle is idle but not cached, or cached in use",
                ));
            }
            if slot.used == 0 {
                idle += slot.bytes;
            }
        }
        if huge != self.huge.len() {
            return Err(Error::Corrupt(
                "the huge blocks' handles differ from those listed",
            ));
        }
        let mut end = 0;
        for (&first, &slot) in &self.huge {
            if first < end {
                return Err(Error::Corrupt("two huge blocks' handles overlap"));
            }
            end = first + self.slots[slot as usize].bytes / PAGE_BYTES;
        }
        if physical != self.physical_bytes {
            return Err(Error::Corrupt(
                "physical bytes differ from the created handles",
            ));
        }
        let live_slots = || self.slots.iter().filter(|slot| slot.bytes > 0);
        let listed = live_slots().filter(|slot| slot.listed).count();
        if listed != self.idle[0].len() + self.idle[1].len() {
            return Err(Error::Corrupt(
                "the idle cache names handles that are not listed",
            ));
        }
        for class in [Class::Small, Class::Large] {
            let cached = live_slots()
                .filter(|slot| slot.cached && Self::class_of(slot.bytes) == class)
                .count();
            if cached != self.idle_count[class as usize] {
                return Err(Error::Corrupt(
                    "the idle count differs from the idle handles",
                ));
            }
        }
        if idle != self.idle_bytes {
            return Err(Error::Corrupt("idle bytes differ from the idle handles"));
        }
        Ok(())
    }
}
