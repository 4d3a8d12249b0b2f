//! The driver's rules for virtual address space, kept by every backend: a
//! mapping lies on whole pages inside one reservation and on top of nothing
//! else, and a reservation is released whole, once nothing in it is mapped.
//! Checking them before a call keeps the simulated device as strict as the
//! driver, and keeps the CUDA backend from handing the driver a range it
//! does not own.

use std::collections::BTreeMap;

use crate::{Error, Result};

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
    /// Start address -> mapping or chunk; never overlapping.
    pub(crate) backings: BTreeMap<u64, B>,
}

impl<B> Default for AddressSpace<B> {
    fn default() -> Self {
        Self {
            reservations: BTreeMap::new(),
            backings: BTreeMap::new(),
        }
    }
}

/// The error the driver gives for a range that breaks its rules.
pub(crate) fn invalid_value(op: &'static str, detail: impl core::fmt::Display) -> Error {
    Error::Device {
        op,
        detail: format!("CUDA_ERROR_INVALID_VALUE: {detail}"),
    }
}

impl<B: Backing> AddressSpace<B> {
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
    /// reservation, with nothing mapped there yet.
    pub(crate) fn check_map(&self, addr: u64, size: u64, page: u64) -> Result<()> {
        if size == 0 || size % page != 0 || addr % page != 0 {
            return Err(invalid_value(
                "map",
                format!("[{addr:#x}, +{size}) is not on {page}-byte pages"),
            ));
        }
        let end = addr
            .checked_add(size)
            .ok_or_else(|| invalid_value("map", "range overflows"))?;
        let inside = self
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(base, reserved)| end <= base + reserved);
        if !inside {
            return Err(invalid_value(
                "map",
                format!("[{addr:#x}, +{size}) is not inside a reservation"),
            ));
        }
        if self.overlaps_backing(addr, end) {
            return Err(invalid_value(
                "map",
                format!("[{addr:#x}, +{size}) is already mapped"),
            ));
        }
        Ok(())
    }
}
