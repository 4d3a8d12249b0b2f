//! The driver's rules for virtual address space, kept by every backend: a
//! mapping lies on whole pages inside one reservation and on top of nothing
//! else, and a reservation is released whole, once nothing in it is mapped.
//! Checking them before a call keeps the simulated device as strict as the
//! driver, and keeps the CUDA backend from handing the driver a range it
//! does not own.

use std::collections::BTreeMap;

use crate::{DriverCode, Error, Result};

/// What a backend keeps for each mapping or chunk.
pub(crate) trait Backing {
    /// Bytes it covers.
    fn size(&self) -> u64;
}

/// Reservations and what backs memory inside (or outside) them.
#[derive(Debug)]
pub(crate) struct AddressSpace<B> {
    /// Reservation base -> size, bytes.
    pub(crate) reservations: BTreeMap<u64, u64>,
    /// Start address -> mapping or chunk; never overlapping. Changed only
    /// through [`AddressSpace::add_backing`] and
    /// [`AddressSpace::remove_backing`], which keep `covered` in step.
    backings: BTreeMap<u64, B>,
    /// Runs of adjacent backings merged: start -> end. A pool that grew page
    /// by page holds thousands of backings but one run, so checking a range
    /// is one lookup whatever the number of backings.
    covered: BTreeMap<u64, u64>,
}

impl<B> Default for AddressSpace<B> {
    fn default() -> Self {
        Self {
            reservations: BTreeMap::new(),
            backings: BTreeMap::new(),
            covered: BTreeMap::new(),
        }
    }
}

/// The error the driver gives for an argument or a range that breaks its
/// rules; both backends refuse such ranges with it before any call.
pub(crate) fn invalid_value(op: &'static str, detail: impl Into<String>) -> Error {
    Error::driver(op, DriverCode::INVALID_VALUE, detail)
}

impl<B: Backing> AddressSpace<B> {
    /// The backings, by start address.
    pub(crate) fn backings(&self) -> &BTreeMap<u64, B> {
        &self.backings
    }

    /// The backing that starts at `start`, to change what it holds.
    pub(crate) fn backing_mut(&mut self, start: u64) -> Option<&mut B> {
        self.backings.get_mut(&start)
    }

    /// Records a backing at `start`; the caller has checked it overlaps none.
    pub(crate) fn add_backing(&mut self, start: u64, backing: B) {
        let mut run = (start, start.saturating_add(backing.size()));
        self.backings.insert(start, backing);
        if let Some((&before, &end)) = self.covered.range(..=run.0).next_back() {
            if end >= run.0 {
                self.covered.remove(&before);
                run = (before, run.1.max(end));
            }
        }
        if let Some(end) = self.covered.remove(&run.1) {
            run.1 = end;
        }
        self.covered.insert(run.0, run.1);
    }

    /// Forgets the backing at `start` and returns it.
    pub(crate) fn remove_backing(&mut self, start: u64) -> Option<B> {
        let backing = self.backings.remove(&start)?;
        let end = start.saturating_add(backing.size());
        if let Some((&run_start, &run_end)) = self.covered.range(..=start).next_back() {
            self.covered.remove(&run_start);
            if run_start < start {
                self.covered.insert(run_start, start);
            }
            if end < run_end {
                self.covered.insert(end, run_end);
            }
        }
        Some(backing)
    }

    /// `Ok` if every byte of `[addr, addr + len)` is backed. (The simulated
    /// device finds the pieces of a range instead, so without the CUDA
    /// backend only the tests call this.)
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn check_backed(&self, addr: u64, len: u64) -> Result<()> {
        let invalid = |why| Error::InvalidAddress { addr, len, why };
        let end = addr
            .checked_add(len)
            .ok_or(invalid("range overflows the address space"))?;
        let backed = len == 0
            || self
                .covered
                .range(..=addr)
                .next_back()
                .is_some_and(|(_, &run_end)| run_end >= end);
        if backed {
            Ok(())
        } else {
            Err(invalid("not mapped"))
        }
    }

    /// The starts of the backings that make up `[addr, addr + size)` exactly,
    /// each one `accepted` (e.g. a VMM mapping, not a chunk); `None` if the
    /// range is empty or is not such a run of whole backings.
    pub(crate) fn whole_run(
        &self,
        addr: u64,
        size: u64,
        accepted: impl Fn(&B) -> bool,
    ) -> Option<Vec<u64>> {
        let end = addr.checked_add(size)?;
        let mut cursor = addr;
        let mut starts = Vec::new();
        while cursor < end {
            let backing = self.backings.get(&cursor)?;
            let next = cursor.checked_add(backing.size())?;
            if !accepted(backing) || next > end || backing.size() == 0 {
                return None;
            }
            starts.push(cursor);
            cursor = next;
        }
        (size > 0).then_some(starts)
    }

    /// Forgets every backing and returns them (the CUDA backend's drop).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn take_backings(&mut self) -> BTreeMap<u64, B> {
        self.covered.clear();
        std::mem::take(&mut self.backings)
    }

    /// Whether any backing shares a byte with `[addr, end)`.
    pub(crate) fn overlaps_backing(&self, addr: u64, end: u64) -> bool {
        let before = self
            .backings
            .range(..addr)
            .next_back()
            .is_some_and(|(start, b)| start + b.size() > addr);
        before || self.backings.range(addr..end).next().is_some()
    }

    /// `Ok` if `[base, +size)` is exactly one reservation with nothing mapped.
    pub(crate) fn check_release(&self, base: u64, size: u64) -> Result<()> {
        if self.reservations.get(&base) != Some(&size) {
            return Err(invalid_value(
                "release",
                format!("no reservation [{base:#x}, +{size})"),
            ));
        }
        if self.overlaps_backing(base, base + size) {
            return Err(invalid_value(
                "release",
                "part of the reservation is still mapped",
            ));
        }
        Ok(())
    }

    /// `Ok` if `[addr, +size)` is whole `page`-byte pages inside one
    /// reservation, with nothing mapped there yet; else the error of `op`.
    pub(crate) fn check_map(
        &self,
        op: &'static str,
        addr: u64,
        size: u64,
        page: u64,
    ) -> Result<()> {
        if size == 0 || size % page != 0 || addr % page != 0 {
            return Err(invalid_value(
                op,
                format!("[{addr:#x}, +{size}) is not on {page}-byte pages"),
            ));
        }
        let end = addr
            .checked_add(size)
            .ok_or_else(|| invalid_value(op, "range overflows"))?;
        let inside = self
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(base, reserved)| end <= base + reserved);
        if !inside {
            return Err(invalid_value(
                op,
                format!("[{addr:#x}, +{size}) is not inside a reservation"),
            ));
        }
        if self.overlaps_backing(addr, end) {
            return Err(invalid_value(
                op,
                format!("[{addr:#x}, +{size}) is already mapped"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Backing for u64 {
        fn size(&self) -> u64 {
            *self
        }
    }

    /// Whether every byte of `[addr, addr + len)` lies in some backing,
    /// looked up byte by byte.
    fn backed_bytewise(space: &AddressSpace<u64>, addr: u64, len: u64) -> bool {
        (addr..addr + len).all(|byte| {
            space
                .backings()
                .iter()
                .any(|(&start, &size)| start <= byte && byte < start + size)
        })
    }

    #[test]
    fn covered_runs_follow_backings_added_and_removed() {
        // Sixteen slots of 4 bytes; a simple generator picks which to add or
        // remove, and every range is checked against a byte-by-byte answer.
        let mut space = AddressSpace::<u64>::default();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for step in 0..400 {
            let slot = next(16) * 4;
            if space.backings().contains_key(&slot) {
                assert_eq!(space.remove_backing(slot), Some(4));
            } else {
                space.add_backing(slot, 4);
            }
            for addr in 0..66 {
                for len in 0..12 {
                    assert_eq!(
                        space.check_backed(addr, len).is_ok(),
                        len == 0 || backed_bytewise(&space, addr, len),
                        "step {step}: [{addr}, +{len}) with {:?}",
                        space.backings()
                    );
                }
            }
        }
        assert_eq!(space.remove_backing(1000), None);
        assert!(matches!(
            space.check_backed(u64::MAX, 2),
            Err(Error::InvalidAddress { .. })
        ));
        space.take_backings();
        assert!(space.check_backed(0, 1).is_err());
    }
}
