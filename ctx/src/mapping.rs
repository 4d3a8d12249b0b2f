//! Physical memory as the pools hold it, made and given back in one place
//! above every backend: [`Mapper`] puts a device's VMM steps together
//! (create, map, grant to the device and its peers; unmap, release), undoes
//! what a failed step leaves, and counts and times every call; [`Physical`]
//! is the record a pool keeps of each handle. [`crate::Pool`]'s VMM growth
//! and shrink and [`crate::StitchedPool`]'s mirror both go through it, so a
//! rollback rule or a grant is written once and tested on the simulated
//! device.

use std::time::Instant;

use memcore::{CallTally, DriverCall, DriverCalls};

use crate::device::{DeviceMemory, PhysicalHandle};
use crate::peers::PeerSet;
use crate::{Error, Result};

/// One physical handle a pool holds and where it is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Physical {
    handle: PhysicalHandle,
    /// Bytes of the handle, as created.
    bytes: u64,
    /// The address the whole handle is mapped at, if mapped. Access is
    /// granted to the device and the mapper's peers over every mapping a
    /// [`Mapper::map`] made, except one whose rollback failed (the error
    /// said so); unmapped handles keep their contents.
    mapped_at: Option<u64>,
}

impl Physical {
    /// Bytes of the handle.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Where it is mapped, if anywhere.
    pub(crate) fn mapped_at(&self) -> Option<u64> {
        self.mapped_at
    }
}

/// A step that failed: its error, and the physical memory the rollback
/// could not give back (now the caller's to keep track of and give back
/// later), if any.
#[derive(Debug)]
pub(crate) struct Refused {
    /// Boxed: the path is cold, and a result this large would burden every
    /// call's return.
    pub(crate) error: Box<Error>,
    pub(crate) left: Option<Physical>,
}

/// How a pool maps: which devices each mapping is granted to, and the
/// calls it made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mapper {
    /// The pool's own device, granted every mapping first.
    own: PeerSet,
    /// Other devices granted every mapping after it; never the own device.
    peers: PeerSet,
    /// Every VMM call of the pool (its own grants in `set_access`).
    calls: DriverCalls,
    /// The grants to `peers`: one call per mapping, covering them all.
    peer_access: CallTally,
}

/// Runs `call`, counting it in `tally` with `bytes` and its host time.
fn timed<T>(tally: &mut CallTally, bytes: u64, call: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let result = call();
    tally.add(bytes, start.elapsed());
    result
}

impl Mapper {
    /// Maps for device `own`, granting every mapping to `peers` too (the
    /// own ordinal among them is left out). A device a [`PeerSet`] cannot
    /// name (ordinal 64 or more) is [`Error::InvalidConfig`].
    pub(crate) fn new(own: u32, peers: PeerSet) -> Result<Self> {
        let own_set = PeerSet::of(&[own]).map_err(|_| {
            Error::InvalidConfig("a pool's device ordinal must be below 64 (PeerSet::MAX_DEVICES)")
        })?;
        Ok(Self {
            own: own_set,
            peers: peers.without(own),
            calls: DriverCalls::default(),
            peer_access: CallTally::default(),
        })
    }

    /// The VMM calls made so far.
    pub(crate) fn calls(&self) -> DriverCalls {
        self.calls
    }

    /// The grants to peers made so far.
    pub(crate) fn peer_access(&self) -> CallTally {
        self.peer_access
    }

    /// Reserve `bytes` of address space, counted.
    pub(crate) fn reserve<D: DeviceMemory>(&mut self, device: &mut D, bytes: u64) -> Result<u64> {
        let tally = self.calls.tally_mut(DriverCall::Reserve);
        timed(tally, bytes, || device.reserve(bytes))
    }

    /// Create a handle of `bytes`, mapped nowhere.
    pub(crate) fn create<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        bytes: u64,
    ) -> Result<Physical> {
        let tally = self.calls.tally_mut(DriverCall::Create);
        let handle = timed(tally, bytes, || device.create_physical(bytes))?;
        Ok(Physical {
            handle,
            bytes,
            mapped_at: None,
        })
    }

    /// Map `physical`, mapped nowhere, at `addr` and grant the device, then
    /// its peers, access. If a grant fails the mapping is undone and the
    /// grant's error returned; `physical` then says where it is (mapped
    /// still only if the undoing failed too).
    pub(crate) fn map<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        physical: &mut Physical,
        addr: u64,
    ) -> Result<()> {
        if let Some(at) = physical.mapped_at {
            return Err(Error::Inconsistent(format!(
                "a handle mapped at {at:#x} was to be mapped again at {addr:#x}"
            )));
        }
        let bytes = physical.bytes;
        let tally = self.calls.tally_mut(DriverCall::Map);
        timed(tally, bytes, || device.map_physical(physical.handle, addr))?;
        physical.mapped_at = Some(addr);
        let granted = self.grant(device, addr, bytes);
        if granted.is_err() {
            // Nothing can have used the range yet; the grant's error is the
            // one to report.
            let _ = self.unmap(device, physical);
        }
        granted
    }

    /// Own access, then the peers', over a fresh mapping.
    fn grant<D: DeviceMemory>(&mut self, device: &mut D, addr: u64, bytes: u64) -> Result<()> {
        let own = self.own;
        let tally = self.calls.tally_mut(DriverCall::SetAccess);
        timed(tally, bytes, || device.grant_access(addr, bytes, own))?;
        if self.peers.is_empty() {
            return Ok(());
        }
        let peers = self.peers;
        timed(&mut self.peer_access, bytes, || {
            device.grant_access(addr, bytes, peers)
        })
    }

    /// Create a handle of `bytes` and map it at `addr` with access granted
    /// ([`Mapper::map`]): how a pool grows. On failure nothing of it stays,
    /// unless giving it back failed too ([`Refused::left`]).
    pub(crate) fn create_mapped<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        bytes: u64,
        addr: u64,
    ) -> Result<Physical, Refused> {
        let mut physical = self.create(device, bytes).map_err(|error| Refused {
            error: Box::new(error),
            left: None,
        })?;
        match self.map(device, &mut physical, addr) {
            Ok(()) => Ok(physical),
            Err(error) => Err(Refused {
                error: Box::new(error),
                left: self.release(device, physical).err().and_then(|r| r.left),
            }),
        }
    }

    /// Unmap `physical` if it is mapped; it keeps its contents. On failure
    /// it stays mapped.
    pub(crate) fn unmap<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        physical: &mut Physical,
    ) -> Result<()> {
        let Some(addr) = physical.mapped_at else {
            return Ok(());
        };
        let bytes = physical.bytes;
        let tally = self.calls.tally_mut(DriverCall::Unmap);
        timed(tally, bytes, || device.unmap_physical(addr, bytes))?;
        physical.mapped_at = None;
        Ok(())
    }

    /// Unmap `physical` if it is mapped, and release it: how a pool
    /// shrinks. On failure [`Refused::left`] is what remains, mapped or
    /// not.
    pub(crate) fn release<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        mut physical: Physical,
    ) -> Result<(), Refused> {
        let kept = |error, physical| Refused {
            error: Box::new(error),
            left: Some(physical),
        };
        if let Err(error) = self.unmap(device, &mut physical) {
            return Err(kept(error, physical));
        }
        let tally = self.calls.tally_mut(DriverCall::Release);
        timed(tally, physical.bytes, || {
            device.release_physical(physical.handle)
        })
        .map_err(|error| kept(error, physical))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DriverCode, PeerLinks, SimCall, SimConfig, SimDevice};

    const PAGE: u64 = 64 << 10;

    /// Device 0 of a host of two that reach each other, with a reservation
    /// of eight pages.
    fn device() -> (SimDevice, u64) {
        let mut dev = SimDevice::on_host(SimConfig::small(16 * PAGE), 0, PeerLinks::all(2));
        let base = dev.reserve(8 * PAGE).unwrap();
        (dev, base)
    }

    fn mapper(peers: &[u32]) -> Mapper {
        Mapper::new(0, PeerSet::of(peers).unwrap()).unwrap()
    }

    #[test]
    fn a_growth_is_created_mapped_and_granted_to_the_device_and_its_peers() {
        let (mut dev, base) = device();
        let mut mapper = mapper(&[0, 1]);
        let physical = mapper.create_mapped(&mut dev, 2 * PAGE, base).unwrap();
        assert_eq!(physical.mapped_at(), Some(base));
        dev.write(base + PAGE, b"mapped").unwrap();
        let mut out = [0; 6];
        dev.read_as(1, base + PAGE, &mut out).unwrap();
        assert_eq!(&out, b"mapped");
        let calls = mapper.calls();
        assert_eq!(
            (calls.create.calls, calls.map.calls, calls.set_access.calls),
            (1, 1, 1)
        );
        assert_eq!(mapper.peer_access().calls, 1, "one grant for the peer");
        mapper.release(&mut dev, physical).unwrap();
        assert_eq!(dev.used_bytes(), 0);
        let calls = mapper.calls();
        assert_eq!((calls.unmap.calls, calls.release.calls), (1, 1));
        dev.release(base, 8 * PAGE).unwrap();
    }

    #[test]
    fn a_failure_at_any_step_of_a_growth_leaves_nothing_behind() {
        for (call, peers) in [
            (SimCall::Create, &[][..]),
            (SimCall::Map, &[]),
            (SimCall::Grant, &[]),
            (SimCall::Grant, &[1]),
        ] {
            let (mut dev, base) = device();
            let mut mapper = mapper(peers);
            // The peer's grant is the second grant of the growth.
            let skip = u32::from(call == SimCall::Grant && !peers.is_empty());
            dev.faults().fail(call, skip, DriverCode::OUT_OF_MEMORY);
            let refused = mapper.create_mapped(&mut dev, 2 * PAGE, base).unwrap_err();
            assert_eq!(
                refused.error.driver_code(),
                Some(DriverCode::OUT_OF_MEMORY),
                "{call:?}"
            );
            assert!(refused.left.is_none(), "{call:?}: rolled back");
            assert_eq!(dev.used_bytes(), 0, "{call:?}: the handle is released");
            assert!(dev.read(base, &mut [0; 1]).is_err(), "{call:?}: unmapped");
            // What was undone was undone through the mapper, counted.
            let calls = mapper.calls();
            let failed = |step| u64::from(call == step);
            assert_eq!(
                calls.create.calls,
                calls.release.calls + failed(SimCall::Create)
            );
            assert_eq!(calls.map.calls, calls.unmap.calls + failed(SimCall::Map));
            // The range takes a growth again, and the reservation goes.
            let again = mapper.create_mapped(&mut dev, 2 * PAGE, base).unwrap();
            mapper.release(&mut dev, again).unwrap();
            dev.release(base, 8 * PAGE).unwrap();
        }
    }

    #[test]
    fn what_a_failed_rollback_leaves_is_handed_back_truthfully() {
        // The grant fails and so does the unmap undoing it, twice (once in
        // the map, once in the release after it): the handle stays mapped,
        // and the caller is told.
        let (mut dev, base) = device();
        let mut mapper = mapper(&[]);
        dev.faults()
            .fail(SimCall::Grant, 0, DriverCode::INVALID_VALUE);
        dev.faults().fail(SimCall::Unmap, 0, DriverCode(999));
        dev.faults().fail(SimCall::Unmap, 0, DriverCode(999));
        let refused = mapper.create_mapped(&mut dev, PAGE, base).unwrap_err();
        assert_eq!(refused.error.driver_code(), Some(DriverCode::INVALID_VALUE));
        let left = refused.left.expect("the mapping stayed");
        assert_eq!(left.mapped_at(), Some(base));
        assert_eq!(dev.used_bytes(), PAGE);
        // Given back later, it goes.
        mapper.release(&mut dev, left).unwrap();
        assert_eq!(dev.used_bytes(), 0);
        // The map fails and so does the release undoing the create: an
        // unmapped handle is left.
        dev.faults()
            .fail(SimCall::Map, 0, DriverCode::INVALID_VALUE);
        dev.faults().fail(SimCall::Release, 0, DriverCode(999));
        let left = mapper
            .create_mapped(&mut dev, PAGE, base)
            .unwrap_err()
            .left
            .expect("the handle stayed");
        assert_eq!(left.mapped_at(), None);
        // A failed release keeps it, unmapped; the next one goes through.
        dev.faults().fail(SimCall::Release, 0, DriverCode(999));
        let kept = mapper.release(&mut dev, left).unwrap_err().left.unwrap();
        assert_eq!(kept, left);
        mapper.release(&mut dev, kept).unwrap();
        assert_eq!(dev.used_bytes(), 0);
        dev.release(base, 8 * PAGE).unwrap();
    }

    #[test]
    fn a_handle_moves_between_addresses_with_its_contents() {
        let (mut dev, base) = device();
        let mut mapper = mapper(&[]);
        let mut physical = mapper.create(&mut dev, PAGE).unwrap();
        mapper.map(&mut dev, &mut physical, base).unwrap();
        dev.write(base + 8, b"moves").unwrap();
        assert!(
            matches!(
                mapper.map(&mut dev, &mut physical, base + PAGE),
                Err(Error::Inconsistent(_))
            ),
            "mapped twice"
        );
        mapper.unmap(&mut dev, &mut physical).unwrap();
        mapper.unmap(&mut dev, &mut physical).unwrap();
        assert_eq!(mapper.calls().unmap.calls, 1, "unmapped once");
        mapper
            .map(&mut dev, &mut physical, base + 3 * PAGE)
            .unwrap();
        let mut out = [0; 5];
        dev.read(base + 3 * PAGE + 8, &mut out).unwrap();
        assert_eq!(&out, b"moves");
        // A failed unmap leaves it mapped.
        dev.faults().fail(SimCall::Unmap, 0, DriverCode(999));
        assert!(mapper.unmap(&mut dev, &mut physical).is_err());
        assert_eq!(physical.mapped_at(), Some(base + 3 * PAGE));
        mapper.release(&mut dev, physical).unwrap();
        assert!(Mapper::new(64, PeerSet::NONE).is_err());
    }
}
