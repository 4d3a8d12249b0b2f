//! What the VMM driver calls a stitched pool makes are modeled to take,
//! and the operations it logs for a backend to carry out.
//!
//! Every call acts on one physical handle: a range stitched from sixteen
//! handles costs sixteen maps and sixteen access grants, which is what the
//! driver charges for (cuMemSetAccess is paid per handle in the range,
//! whatever the range's length).

use crate::DriverCall;

/// How long each VMM driver call takes, in nanoseconds, by handle size.
///
/// `create` and `release` are tables of `(handle bytes, ns)` sorted by
/// bytes; a size between two rows is interpolated linearly, one outside
/// the table takes the nearest row. `map`, `unmap` and `set_access` are
/// per handle whatever its size; a reservation is priced at nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverCosts {
    /// cuMemCreate.
    pub create: &'static [(u64, u64)],
    /// cuMemRelease.
    pub release: &'static [(u64, u64)],
    /// cuMemMap, per handle.
    pub map_ns: u64,
    /// cuMemUnmap, per handle.
    pub unmap_ns: u64,
    /// cuMemSetAccess, per handle in the range.
    pub set_access_ns: u64,
}

/// cuMemCreate, as measured with driver 580 by a small CUDA C program
/// (BENCHMARKS.md quotes the costs).
const H200_CREATE: &[(u64, u64)] = &[(2 << 20, 9_600), (32 << 20, 11_900), (1 << 30, 32_000)];

/// The H200's costs (driver 580), as measured by a small CUDA C program
/// (BENCHMARKS.md quotes them). cuMemRelease was not measured there: it takes
/// cuMemCreate's cost. cuMemUnmap was measured over 2 MiB handles only and
/// is taken per handle whatever its size.
pub const H200_DRIVER_COSTS: DriverCosts = DriverCosts {
    create: H200_CREATE,
    release: H200_CREATE,
    map_ns: 1_000,
    unmap_ns: 16_000,
    set_access_ns: 27_000,
};

impl DriverCosts {
    /// Nanoseconds for one call on a handle of `bytes` from `table`.
    fn lookup(table: &[(u64, u64)], bytes: u64) -> u64 {
        let Some(&(first_bytes, first_ns)) = table.first() else {
            return 0;
        };
        if bytes <= first_bytes {
            return first_ns;
        }
        for pair in table.windows(2) {
            let [(low_bytes, low_ns), (high_bytes, high_ns)] = [pair[0], pair[1]];
            if bytes <= high_bytes {
                let span = (high_bytes - low_bytes) as u128;
                let past = (bytes - low_bytes) as u128;
                let rise = high_ns.abs_diff(low_ns) as u128 * past / span;
                return if high_ns >= low_ns {
                    low_ns + rise as u64
                } else {
                    low_ns - rise as u64
                };
            }
        }
        table.last().map_or(0, |&(_, ns)| ns)
    }

    /// Nanoseconds one call of `kind` on a handle of `bytes` takes.
    ///
    /// ```
    /// use memcore::{DriverCall, H200_DRIVER_COSTS};
    ///
    /// let costs = H200_DRIVER_COSTS;
    /// // Access is paid per handle, whatever its size.
    /// assert_eq!(
    ///     costs.ns(DriverCall::SetAccess, 2 << 20),
    ///     costs.ns(DriverCall::SetAccess, 1 << 30)
    /// );
    /// // A larger handle takes longer to create, but not in proportion.
    /// let small = costs.ns(DriverCall::Create, 2 << 20);
    /// let large = costs.ns(DriverCall::Create, 32 << 20);
    /// assert!(small < large && large < 16 * small);
    /// ```
    pub fn ns(&self, kind: DriverCall, bytes: u64) -> u64 {
        match kind {
            DriverCall::Create => Self::lookup(self.create, bytes),
            DriverCall::Release => Self::lookup(self.release, bytes),
            DriverCall::Map => self.map_ns,
            DriverCall::Unmap => self.unmap_ns,
            DriverCall::SetAccess => self.set_access_ns,
            // Not measured; a pool reserves once.
            DriverCall::Reserve => 0,
        }
    }
}

/// One driver operation, in the order a stitched pool's backend must carry
/// them out ([`crate::Stitch::take_ops`]). Handles are the pool's numbers
/// ([`crate::HandleInfo::handle`]); a released handle's number is reused by
/// a later `Create`. Addresses are bytes from the virtual arena's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverOp {
    /// cuMemCreate: a new handle of `bytes`.
    Create {
        /// The handle's number.
        handle: u32,
        /// Its physical bytes.
        bytes: u64,
    },
    /// cuMemMap of the whole handle at `at`, then cuMemSetAccess over it.
    Map {
        /// The handle's number.
        handle: u32,
        /// First virtual byte it is mapped at.
        at: u64,
        /// Bytes mapped: the handle's.
        bytes: u64,
    },
    /// cuMemUnmap of the handle from `at`.
    Unmap {
        /// The handle's number.
        handle: u32,
        /// First virtual byte it was mapped at.
        at: u64,
        /// Bytes unmapped: the handle's.
        bytes: u64,
    },
    /// cuMemRelease: the handle's memory goes back to the device.
    Release {
        /// The handle's number.
        handle: u32,
        /// Its physical bytes.
        bytes: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_cost_interpolates_between_measured_sizes_and_holds_beyond() {
        let costs = H200_DRIVER_COSTS;
        let at = |bytes| costs.ns(DriverCall::Create, bytes);
        assert_eq!(at(2 << 20), H200_CREATE[0].1);
        assert_eq!(at(1 << 20), H200_CREATE[0].1);
        assert_eq!(at(32 << 20), H200_CREATE[1].1);
        assert_eq!(at(4 << 30), H200_CREATE[2].1);
        let mid = at(17 << 20);
        assert_eq!(mid, (H200_CREATE[0].1 + H200_CREATE[1].1) / 2);
        assert_eq!(costs.ns(DriverCall::Reserve, 1 << 40), 0);
    }
}
