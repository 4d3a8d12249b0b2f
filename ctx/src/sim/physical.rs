//! Physical handles of the simulated device: memory that exists apart from
//! any address, so a handle unmapped here and mapped there carries its bytes,
//! as on the driver. A handle's number is never given out twice, so a stale
//! one is refused rather than taken for a newer handle.

use std::collections::BTreeMap;

use super::{Backing, BackingKind, SimCall, SimDevice};
use crate::address_space::invalid_value;
use crate::device::PhysicalHandle;
use crate::peers::PeerSet;
use crate::{Error, Result};

/// One physical handle; `data` is empty on an unbacked device.
#[derive(Debug)]
struct Handle {
    size: u64,
    data: Vec<u8>,
    /// Where it is mapped, if anywhere.
    mapped_at: Option<u64>,
}

/// The handles a simulated device holds, by number.
#[derive(Debug, Default)]
pub(super) struct Handles {
    by_number: BTreeMap<u64, Handle>,
    next: u64,
}

impl Handles {
    /// The bytes of handle `number` (empty if unbacked or unknown).
    pub(super) fn bytes(&self, number: u64) -> &[u8] {
        self.by_number.get(&number).map_or(&[], |h| &h.data)
    }

    /// The bytes of handle `number`, to write.
    pub(super) fn bytes_mut(&mut self, number: u64) -> Option<&mut [u8]> {
        self.by_number
            .get_mut(&number)
            .map(|h| h.data.as_mut_slice())
    }
}

impl SimDevice {
    pub(super) fn create_handle(&mut self, size: u64) -> Result<PhysicalHandle> {
        const OP: &str = "create_physical";
        if !self.config.vmm {
            return Err(Error::Unsupported("VMM is off on this simulated device"));
        }
        self.injected(SimCall::Create, OP)?;
        let g = self.checked_granularity(OP)?;
        if size == 0 || size % g != 0 {
            return Err(invalid_value(
                OP,
                format!("size {size} is not a positive multiple of {g}"),
            ));
        }
        let data = self.charge(OP, size)?;
        let number = self.handles.next;
        self.handles.next += 1;
        self.handles.by_number.insert(
            number,
            Handle {
                size,
                data,
                mapped_at: None,
            },
        );
        self.counters.creates += 1;
        Ok(PhysicalHandle(number))
    }

    /// Maps a handle at one address at a time: the driver allows more, the
    /// stitched pool never asks for it, so a second mapping is a bug here.
    pub(super) fn map_handle(&mut self, handle: PhysicalHandle, addr: u64) -> Result<()> {
        const OP: &str = "map_physical";
        self.injected(SimCall::Map, OP)?;
        let g = self.checked_granularity(OP)?;
        let held = self
            .handles
            .by_number
            .get(&handle.0)
            .ok_or_else(|| invalid_value(OP, format!("no handle {}", handle.0)))?;
        if let Some(at) = held.mapped_at {
            return Err(invalid_value(
                OP,
                format!("handle {} is already mapped at {at:#x}", handle.0),
            ));
        }
        let size = held.size;
        self.space.check_map(OP, addr, size, g)?;
        self.space.add_backing(
            addr,
            Backing {
                size,
                kind: BackingKind::Handle(handle.0),
                data: Vec::new(),
                peers: PeerSet::NONE,
                accessible: false,
            },
        );
        if let Some(held) = self.handles.by_number.get_mut(&handle.0) {
            held.mapped_at = Some(addr);
        }
        self.counters.maps += 1;
        Ok(())
    }

    /// Grants `devices` access to a run of whole handle mappings: the
    /// device itself where its ordinal is in the set, peers as its links
    /// allow (checked before anything changes).
    pub(super) fn grant_handle_access(
        &mut self,
        addr: u64,
        size: u64,
        devices: PeerSet,
    ) -> Result<()> {
        const OP: &str = "grant_access";
        self.injected(SimCall::Grant, OP)?;
        if devices.is_empty() {
            return Err(invalid_value(OP, "no device to grant access to"));
        }
        let starts = self
            .space
            .whole_run(addr, size, |b| matches!(b.kind, BackingKind::Handle(_)))
            .ok_or_else(|| {
                invalid_value(
                    OP,
                    format!("[{addr:#x}, +{size}) is not a run of whole handle mappings"),
                )
            })?;
        let own = devices.contains(self.ordinal);
        let peers = devices.without(self.ordinal);
        for peer in peers.iter() {
            if !self.links.can_access(peer, self.ordinal) {
                return Err(Error::PeerAccess {
                    device: self.ordinal,
                    peer,
                    why: if peer >= self.links.device_count() {
                        "no such device on this host"
                    } else {
                        "the host's links do not connect them"
                    },
                });
            }
        }
        for start in starts {
            if let Some(b) = self.space.backing_mut(start) {
                b.accessible |= own;
                b.peers = b.peers.union(peers);
            }
        }
        self.counters.grants += 1;
        Ok(())
    }

    pub(super) fn unmap_handle(&mut self, addr: u64, size: u64) -> Result<()> {
        self.injected(SimCall::Unmap, "unmap_physical")?;
        let number = match self.space.backings().get(&addr) {
            Some(b) if b.size == size => match b.kind {
                BackingKind::Handle(number) => Some(number),
                BackingKind::Chunk => None,
            },
            _ => None,
        };
        let Some(number) = number else {
            return Err(invalid_value(
                "unmap_physical",
                format!("[{addr:#x}, +{size}) is not one handle's mapping"),
            ));
        };
        self.space.remove_backing(addr);
        if let Some(held) = self.handles.by_number.get_mut(&number) {
            held.mapped_at = None;
        }
        self.counters.unmaps += 1;
        Ok(())
    }

    /// Refuses a handle that is still mapped: the driver would defer the
    /// release until the unmap, but the stitched pool always unmaps first,
    /// so a mapped handle here is a bug to report.
    pub(super) fn release_handle(&mut self, handle: PhysicalHandle) -> Result<()> {
        const OP: &str = "release_physical";
        self.injected(SimCall::Release, OP)?;
        match self.handles.by_number.get(&handle.0) {
            None => Err(invalid_value(OP, format!("no handle {}", handle.0))),
            Some(Handle {
                mapped_at: Some(at),
                ..
            }) => Err(invalid_value(
                OP,
                format!("handle {} is still mapped at {at:#x}", handle.0),
            )),
            Some(held) => {
                self.used_bytes -= held.size;
                self.handles.by_number.remove(&handle.0);
                self.counters.releases += 1;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{DeviceMemory, DriverCode, Error, PeerSet, SimConfig, SimDevice};

    const PAGE: u64 = 64 << 10;

    #[test]
    fn a_handle_carries_its_bytes_to_a_new_address() {
        let mut dev = SimDevice::new(SimConfig::small(4 * PAGE));
        let base = dev.reserve(8 * PAGE).unwrap();
        let handle = dev.create_physical(2 * PAGE).unwrap();
        assert_eq!(dev.used_bytes(), 2 * PAGE);
        let own = PeerSet::of(&[0]).unwrap();
        dev.map_physical(handle, base).unwrap();
        let err = dev.write(base, b"x").unwrap_err();
        assert_eq!(
            err,
            Error::InvalidAddress {
                addr: base,
                len: 1,
                why: "mapped without access"
            }
        );
        dev.grant_access(base, 2 * PAGE, own).unwrap();
        dev.write(base + PAGE + 7, b"stitched").unwrap();
        assert!(dev.release_physical(handle).is_err(), "still mapped");
        assert!(dev.free_chunk(base, 2 * PAGE).is_err(), "not a chunk");
        assert!(dev.unmap_physical(base, PAGE).is_err(), "half a handle");
        dev.unmap_physical(base, 2 * PAGE).unwrap();
        assert!(dev.read(base, &mut [0; 1]).is_err());
        dev.map_physical(handle, base + 4 * PAGE).unwrap();
        dev.grant_access(base + 4 * PAGE, 2 * PAGE, own).unwrap();
        let mut out = [0; 8];
        dev.read(base + 5 * PAGE + 7, &mut out).unwrap();
        assert_eq!(&out, b"stitched");
        dev.unmap_physical(base + 4 * PAGE, 2 * PAGE).unwrap();
        dev.release_physical(handle).unwrap();
        assert!(dev.release_physical(handle).is_err(), "released twice");
        assert!(dev.map_physical(handle, base).is_err(), "stale handle");
        assert_eq!(dev.used_bytes(), 0);
        dev.release(base, 8 * PAGE).unwrap();
    }

    #[test]
    fn handles_count_against_capacity_and_keep_the_mapping_rules() {
        let mut dev = SimDevice::new(SimConfig::small(4 * PAGE));
        let base = dev.reserve(4 * PAGE).unwrap();
        assert!(dev.create_physical(PAGE + 1).is_err(), "not whole pages");
        let a = dev.create_physical(3 * PAGE).unwrap();
        let err = dev.create_physical(2 * PAGE).unwrap_err();
        assert_eq!(err.driver_code(), Some(DriverCode::OUT_OF_MEMORY));
        assert!(
            dev.map_physical(a, base + 2 * PAGE).is_err(),
            "past the reservation"
        );
        dev.map_physical(a, base).unwrap();
        assert!(dev.map_physical(a, base).is_err(), "mapped twice");
        let b = dev.create_physical(PAGE).unwrap();
        assert!(dev.map_physical(b, base + PAGE).is_err(), "over a");
        dev.map_physical(b, base + 3 * PAGE).unwrap();
        dev.grant_access(base, 4 * PAGE, PeerSet::of(&[0]).unwrap())
            .unwrap();
        assert!(dev.release(base, 4 * PAGE).is_err(), "still mapped");
        assert_eq!(dev.counters().maps, 2);
    }
}
