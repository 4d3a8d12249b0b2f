//! The VMM driver calls a stitched pool makes, counted by kind, and the
//! time they are modeled to take.
//!
//! Every call acts on one physical handle: a range stitched from sixteen
//! handles costs sixteen maps and sixteen access grants, which is what the
//! driver charges for (cuMemSetAccess is paid per handle in the range,
//! whatever the range's length).

/// How long each VMM driver call takes, in nanoseconds, by handle size.
///
/// `create` and `release` are tables of `(handle bytes, ns)` sorted by
/// bytes; a size between two rows is interpolated linearly, one outside
/// the table takes the nearest row. `map`, `unmap` and `set_access` are
/// per handle whatever its size.
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
        }
    }
}

/// One kind of VMM driver call, each on one handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverCall {
    /// cuMemCreate: physical memory comes into being.
    Create,
    /// cuMemRelease: physical memory goes back to the device.
    Release,
    /// cuMemMap: a handle is placed at a virtual address.
    Map,
    /// cuMemUnmap: a handle leaves its virtual address.
    Unmap,
    /// cuMemSetAccess: a mapped handle becomes readable and writable.
    SetAccess,
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

/// Driver calls made so far, by kind, and their modeled time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DriverCalls {
    /// cuMemCreate calls.
    pub creates: u64,
    /// cuMemRelease calls.
    pub releases: u64,
    /// cuMemMap calls.
    pub maps: u64,
    /// cuMemUnmap calls.
    pub unmaps: u64,
    /// cuMemSetAccess calls, one per handle.
    pub set_access: u64,
    /// What all of them take by the cost table, nanoseconds.
    pub modeled_ns: u64,
}

impl DriverCalls {
    /// Count one call of `kind` on a handle of `bytes`, priced by `costs`.
    pub fn record(&mut self, kind: DriverCall, bytes: u64, costs: &DriverCosts) {
        let counter = match kind {
            DriverCall::Create => &mut self.creates,
            DriverCall::Release => &mut self.releases,
            DriverCall::Map => &mut self.maps,
            DriverCall::Unmap => &mut self.unmaps,
            DriverCall::SetAccess => &mut self.set_access,
        };
        *counter += 1;
        self.modeled_ns = self.modeled_ns.saturating_add(costs.ns(kind, bytes));
    }

    /// Count what backing a new range with one fresh handle of `bytes`
    /// takes: create it, map it, grant access. This is how a pool that
    /// grows its one range at the end pays for each growth.
    ///
    /// ```
    /// use memcore::{DriverCalls, H200_DRIVER_COSTS};
    ///
    /// let mut calls = DriverCalls::default();
    /// calls.grow(2 << 20, &H200_DRIVER_COSTS);
    /// assert_eq!((calls.creates, calls.maps, calls.set_access), (1, 1, 1));
    /// assert!(calls.modeled_ns > 0);
    /// ```
    pub fn grow(&mut self, bytes: u64, costs: &DriverCosts) {
        self.record(DriverCall::Create, bytes, costs);
        self.record(DriverCall::Map, bytes, costs);
        self.record(DriverCall::SetAccess, bytes, costs);
    }

    /// Every call of `other` added to these.
    pub fn add(&mut self, other: &DriverCalls) {
        self.creates += other.creates;
        self.releases += other.releases;
        self.maps += other.maps;
        self.unmaps += other.unmaps;
        self.set_access += other.set_access;
        self.modeled_ns = self.modeled_ns.saturating_add(other.modeled_ns);
    }

    /// All calls, of every kind.
    pub fn total(&self) -> u64 {
        self.creates + self.releases + self.maps + self.unmaps + self.set_access
    }
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
        let mut calls = DriverCalls::default();
        calls.record(DriverCall::Unmap, 32 << 20, &costs);
        calls.record(DriverCall::Release, 32 << 20, &costs);
        assert_eq!(calls.total(), 2);
        assert_eq!(calls.modeled_ns, costs.unmap_ns + at(32 << 20));
    }
}
