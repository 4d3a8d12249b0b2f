//! VMM driver calls counted by kind: the one record of them, whether a
//! model counts the calls it would make (and prices them by a cost table)
//! or a pool on a device counts the calls it made (and times them on the
//! host).

use core::time::Duration;

use crate::stitch::driver::DriverCosts;

/// One kind of VMM driver call, each on one handle or one reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverCall {
    /// cuMemAddressReserve: virtual address space, no memory.
    Reserve,
    /// cuMemCreate: physical memory comes into being.
    Create,
    /// cuMemRelease: physical memory goes back to the device.
    Release,
    /// cuMemMap: a handle is placed at a virtual address.
    Map,
    /// cuMemUnmap: a handle leaves its virtual address.
    Unmap,
    /// cuMemSetAccess: a mapped handle becomes readable and writable by
    /// the device that made it.
    SetAccess,
}

/// How often one kind of call was made, over how many bytes, and the host
/// time it took where someone timed it.
///
/// ```
/// use core::time::Duration;
/// use memcore::CallTally;
///
/// let mut tally = CallTally::default();
/// tally.add(2 << 20, Duration::from_micros(30));
/// let earlier = tally;
/// tally.add(4 << 20, Duration::from_micros(10));
/// assert_eq!((tally.calls, tally.bytes), (2, 6 << 20));
/// assert_eq!(tally.micros_per_call(), 20.0);
/// assert_eq!(tally.since(&earlier).calls, 1);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTally {
    /// Calls that returned (successful or not).
    pub calls: u64,
    /// Bytes the calls were asked to cover.
    pub bytes: u64,
    /// Host time in them, all calls together; zero where nobody timed them
    /// (a model's count).
    pub time: Duration,
}

impl CallTally {
    /// Count one call covering `bytes` that took `time`.
    pub fn add(&mut self, bytes: u64, time: Duration) {
        self.calls += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        self.time = self.time.saturating_add(time);
    }

    /// Host time per call, microseconds (0 without calls).
    pub fn micros_per_call(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.time.as_secs_f64() * 1e6 / self.calls as f64
        }
    }

    /// The calls between `earlier` (a snapshot of the same tally) and `self`.
    pub fn since(&self, earlier: &CallTally) -> CallTally {
        CallTally {
            calls: self.calls.saturating_sub(earlier.calls),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            time: self.time.saturating_sub(earlier.time),
        }
    }

    fn plus(&self, other: &CallTally) -> CallTally {
        CallTally {
            calls: self.calls + other.calls,
            bytes: self.bytes.saturating_add(other.bytes),
            time: self.time.saturating_add(other.time),
        }
    }
}

/// VMM driver calls by kind: what a model would call (priced in
/// `modeled_ns` by a cost table) or what a pool called (timed on the host).
///
/// A pool that grows its one range at the end pays one create, one map and
/// one access grant per growth; a reservation is made once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DriverCalls {
    /// cuMemAddressReserve.
    pub reserve: CallTally,
    /// cuMemCreate: the physical memory.
    pub create: CallTally,
    /// cuMemMap: the physical memory into the reservation.
    pub map: CallTally,
    /// cuMemSetAccess: read-write access for the device itself, one per
    /// handle (grants to other devices are counted apart by the pools that
    /// make them).
    pub set_access: CallTally,
    /// cuMemUnmap.
    pub unmap: CallTally,
    /// cuMemRelease: the physical memory back to the driver.
    pub release: CallTally,
    /// What the calls take by the cost table they were recorded with,
    /// nanoseconds; 0 for calls counted on a device
    /// ([`DriverCalls::tally_mut`]), which were timed instead.
    pub modeled_ns: u64,
}

impl DriverCalls {
    /// The calls of `kind`.
    pub fn tally(&self, kind: DriverCall) -> &CallTally {
        match kind {
            DriverCall::Reserve => &self.reserve,
            DriverCall::Create => &self.create,
            DriverCall::Release => &self.release,
            DriverCall::Map => &self.map,
            DriverCall::Unmap => &self.unmap,
            DriverCall::SetAccess => &self.set_access,
        }
    }

    /// The calls of `kind`, to count one made on a device.
    pub fn tally_mut(&mut self, kind: DriverCall) -> &mut CallTally {
        match kind {
            DriverCall::Reserve => &mut self.reserve,
            DriverCall::Create => &mut self.create,
            DriverCall::Release => &mut self.release,
            DriverCall::Map => &mut self.map,
            DriverCall::Unmap => &mut self.unmap,
            DriverCall::SetAccess => &mut self.set_access,
        }
    }

    /// Count one call of `kind` on a handle of `bytes`, priced by `costs`.
    pub fn record(&mut self, kind: DriverCall, bytes: u64, costs: &DriverCosts) {
        self.tally_mut(kind).add(bytes, Duration::ZERO);
        self.modeled_ns = self.modeled_ns.saturating_add(costs.ns(kind, bytes));
    }

    /// Count what backing a new range with one fresh handle of `bytes`
    /// takes: create it, map it, grant access. This is how a pool that
    /// grows its one range at the end pays for each growth.
    ///
    /// ```
    /// use memcore::{DriverCalls, H200_DRIVER_COSTS, PAGE_BYTES};
    ///
    /// let mut calls = DriverCalls::default();
    /// calls.grow(PAGE_BYTES, &H200_DRIVER_COSTS);
    /// assert_eq!((calls.create.calls, calls.map.calls, calls.set_access.calls), (1, 1, 1));
    /// assert_eq!(calls.total(), 3);
    /// assert!(calls.modeled_ns > 0);
    /// ```
    pub fn grow(&mut self, bytes: u64, costs: &DriverCosts) {
        self.record(DriverCall::Create, bytes, costs);
        self.record(DriverCall::Map, bytes, costs);
        self.record(DriverCall::SetAccess, bytes, costs);
    }

    /// Count `count` growths of one fresh handle of `bytes` each, as
    /// [`DriverCalls::grow`] counts one, in one step however many.
    pub fn grow_many(&mut self, count: u64, bytes: u64, costs: &DriverCosts) {
        for kind in [DriverCall::Create, DriverCall::Map, DriverCall::SetAccess] {
            let tally = self.tally_mut(kind);
            tally.calls = tally.calls.saturating_add(count);
            tally.bytes = tally.bytes.saturating_add(count.saturating_mul(bytes));
            self.modeled_ns = self
                .modeled_ns
                .saturating_add(count.saturating_mul(costs.ns(kind, bytes)));
        }
    }

    /// Every call of `other` added to these.
    pub fn add(&mut self, other: &DriverCalls) {
        *self = DriverCalls {
            reserve: self.reserve.plus(&other.reserve),
            create: self.create.plus(&other.create),
            map: self.map.plus(&other.map),
            set_access: self.set_access.plus(&other.set_access),
            unmap: self.unmap.plus(&other.unmap),
            release: self.release.plus(&other.release),
            modeled_ns: self.modeled_ns.saturating_add(other.modeled_ns),
        };
    }

    /// The calls between `earlier` (a snapshot of the same record) and
    /// `self`.
    pub fn since(&self, earlier: &DriverCalls) -> DriverCalls {
        DriverCalls {
            reserve: self.reserve.since(&earlier.reserve),
            create: self.create.since(&earlier.create),
            map: self.map.since(&earlier.map),
            set_access: self.set_access.since(&earlier.set_access),
            unmap: self.unmap.since(&earlier.unmap),
            release: self.release.since(&earlier.release),
            modeled_ns: self.modeled_ns.saturating_sub(earlier.modeled_ns),
        }
    }

    /// All calls, of every kind.
    pub fn total(&self) -> u64 {
        self.reserve.calls
            + self.create.calls
            + self.release.calls
            + self.map.calls
            + self.unmap.calls
            + self.set_access.calls
    }

    /// Host time of create, map and set-access together: what backing new
    /// memory cost.
    pub fn growth_time(&self) -> Duration {
        self.create.time + self.map.time + self.set_access.time
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::H200_DRIVER_COSTS;

    #[test]
    fn records_count_price_add_and_subtract() {
        let costs = H200_DRIVER_COSTS;
        let mut calls = DriverCalls::default();
        calls.record(DriverCall::Unmap, 32 << 20, &costs);
        calls.record(DriverCall::Release, 32 << 20, &costs);
        assert_eq!(calls.total(), 2);
        assert_eq!(
            calls.modeled_ns,
            costs.unmap_ns + costs.ns(DriverCall::Release, 32 << 20)
        );
        assert_eq!(calls.release.bytes, 32 << 20);
        let earlier = calls;
        calls
            .tally_mut(DriverCall::Map)
            .add(4096, Duration::from_nanos(700));
        calls
            .tally_mut(DriverCall::Create)
            .add(4096, Duration::from_nanos(300));
        let since = calls.since(&earlier);
        assert_eq!((since.total(), since.modeled_ns), (2, 0));
        assert_eq!(since.growth_time(), Duration::from_nanos(1000));
        assert_eq!(calls.tally(DriverCall::Map).calls, 1);
        let mut sum = earlier;
        sum.add(&since);
        assert_eq!(sum, calls);
        assert_eq!(calls.since(&calls), DriverCalls::default());
        assert_eq!(CallTally::default().micros_per_call(), 0.0);
    }
}
