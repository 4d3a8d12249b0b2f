//! The device side of a stitch model: which physical handle stands for each
//! of the model's handle numbers and where the device has it mapped. It
//! carries out the model's [`DriverOp`]s on a device, times every call, and
//! keeps to what the device really did, so a failed call never leaves the
//! pool believing in memory that is not there.

use memcore::{DriverOp, HandleInfo};

use crate::peers;
use crate::{CallTally, DeviceMemory, Error, PeerSet, PhysicalHandle, Result, VmmCalls};

/// A handle the device holds for one of the model's numbers.
#[derive(Debug, Clone, Copy)]
struct Held {
    handle: PhysicalHandle,
    bytes: u64,
    /// Arena offset the device has it mapped at (and access granted or
    /// tried), if mapped.
    mapped_at: Option<u64>,
}

/// Why a list of operations did not all succeed (the first failure).
#[derive(Debug)]
pub(super) enum Failure {
    /// `cuMemCreate` said the device is out of memory.
    CreateRefused(Error),
    /// A mapping would end past the reservation, at this arena offset.
    OutsideReservation { end: u64 },
    /// Any other failed call.
    Driver(Error),
}

/// The model's handles as the device holds them, and the calls made.
#[derive(Debug)]
pub(super) struct Mirror {
    /// Reservation start, a device address.
    pub(super) base: u64,
    /// Reservation size, bytes.
    pub(super) reserved: u64,
    /// By the model's handle number; `None` where the device holds none.
    slots: Vec<Option<Held>>,
    /// Handles the device still holds although the model released their
    /// number (their release failed); given back with the rest at the end.
    stranded: Vec<Held>,
    /// Every driver call, counted and timed on the host.
    pub(super) calls: VmmCalls,
    /// Devices every mapped handle is granted to, besides this one.
    peers: PeerSet,
    /// Those grants, counted and timed on the host.
    pub(super) peer_access: CallTally,
}

impl Mirror {
    pub(super) fn new(base: u64, reserved: u64, calls: VmmCalls, peers: PeerSet) -> Self {
        Self {
            base,
            reserved,
            slots: Vec::new(),
            stranded: Vec::new(),
            calls,
            peers,
            peer_access: CallTally::default(),
        }
    }

    /// Carries out `ops` in order and returns the first failure. After a
    /// failure the rest still runs, skipping what cannot apply: anything on
    /// a handle whose creation failed, and an unmap where the map failed.
    /// So the device then holds what the model holds less the failed
    /// pieces, which the caller rolls back in the model (its block freed,
    /// idle handles released) and carries out the same way.
    pub(super) fn carry_out<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        ops: &[DriverOp],
    ) -> Option<Failure> {
        let mut first = None;
        for op in ops {
            if let Err(failure) = self.apply(device, *op) {
                first.get_or_insert(failure);
            }
        }
        first
    }

    fn apply<D: DeviceMemory>(&mut self, device: &mut D, op: DriverOp) -> Result<(), Failure> {
        match op {
            DriverOp::Create { handle, bytes } => {
                let slot = self.slot(handle);
                if let Some(old) = slot.take() {
                    self.stranded.push(old);
                }
                let made = self
                    .calls
                    .create
                    .record(bytes, || device.create_physical(bytes));
                match made {
                    Ok(made) => {
                        *self.slot(handle) = Some(Held {
                            handle: made,
                            bytes,
                            mapped_at: None,
                        });
                        Ok(())
                    }
                    Err(error) if out_of_memory(&error) => Err(Failure::CreateRefused(error)),
                    Err(error) => Err(Failure::Driver(error)),
                }
            }
            DriverOp::Map { handle, at, bytes } => {
                let Some(held) = self.held(handle) else {
                    return Ok(());
                };
                let end = at.saturating_add(bytes);
                if end > self.reserved {
                    return Err(Failure::OutsideReservation { end });
                }
                let addr = self.base + at;
                self.calls
                    .map
                    .record(bytes, || device.map_physical(held.handle, addr))
                    .map_err(Failure::Driver)?;
                if let Some(Some(held)) = self.slots.get_mut(handle as usize) {
                    held.mapped_at = Some(at);
                }
                self.grant_access(device, addr, bytes)
                    .map_err(Failure::Driver)
            }
            DriverOp::Unmap { handle, at, bytes } => {
                match self.held(handle) {
                    Some(held) if held.mapped_at == Some(at) => {}
                    _ => return Ok(()),
                }
                let addr = self.base + at;
                self.calls
                    .unmap
                    .record(bytes, || device.unmap_physical(addr, bytes))
                    .map_err(Failure::Driver)?;
                if let Some(Some(held)) = self.slots.get_mut(handle as usize) {
                    held.mapped_at = None;
                }
                Ok(())
            }
            DriverOp::Release { handle, bytes } => {
                let Some(held) = self.held(handle) else {
                    return Ok(());
                };
                self.calls
                    .release
                    .record(bytes, || device.release_physical(held.handle))
                    .map_err(Failure::Driver)?;
                *self.slot(handle) = None;
                Ok(())
            }
        }
    }

    /// Makes a freshly mapped range readable and writable: the one place
    /// the pool grants access, so access for more devices goes here too.
    fn grant_access<D: DeviceMemory>(
        &mut self,
        device: &mut D,
        addr: u64,
        bytes: u64,
    ) -> Result<()> {
        self.calls
            .set_access
            .record(bytes, || device.grant_access(addr, bytes))?;
        peers::grant(device, addr, bytes, self.peers, &mut self.peer_access)
    }

    fn held(&self, handle: u32) -> Option<Held> {
        self.slots.get(handle as usize).copied().flatten()
    }

    fn slot(&mut self, handle: u32) -> &mut Option<Held> {
        let index = handle as usize;
        if self.slots.len() <= index {
            self.slots.resize(index + 1, None);
        }
        &mut self.slots[index]
    }

    /// `Ok` if the device holds exactly the model's handles, each of the
    /// model's size and mapped where the model maps it.
    pub(super) fn check(&self, model: impl Iterator<Item = HandleInfo>) -> Result<()> {
        let apart = |what: String| Error::Device {
            op: "stitched pool check",
            detail: format!("the device and the model are apart: {what}"),
        };
        let mut seen = 0usize;
        for info in model {
            seen += 1;
            let Some(held) = self.held(info.handle) else {
                return Err(apart(format!(
                    "no device handle for handle {}",
                    info.handle
                )));
            };
            let model_at = info.mapped_at.map(|extent| extent.offset);
            if held.bytes != info.bytes || held.mapped_at != model_at {
                return Err(apart(format!(
                    "handle {}: model {} bytes at {model_at:?}, device {} bytes at {:?}",
                    info.handle, info.bytes, held.bytes, held.mapped_at
                )));
            }
        }
        let held = self.slots.iter().flatten().count();
        if held != seen || !self.stranded.is_empty() {
            return Err(apart(format!(
                "the device holds {held} handles (and {} stranded), the model {seen}",
                self.stranded.len()
            )));
        }
        Ok(())
    }

    /// Unmaps and releases every handle the device holds, then the
    /// reservation; the first error is returned, the rest still attempted.
    pub(super) fn clear<D: DeviceMemory>(&mut self, device: &mut D) -> Result<()> {
        let mut first = Ok(());
        let held: Vec<Held> = self
            .slots
            .drain(..)
            .flatten()
            .chain(self.stranded.drain(..))
            .collect();
        for h in held {
            if let Some(at) = h.mapped_at {
                let addr = self.base + at;
                let unmapped = self
                    .calls
                    .unmap
                    .record(h.bytes, || device.unmap_physical(addr, h.bytes));
                if unmapped.is_err() {
                    first = first.and(unmapped);
                    continue;
                }
            }
            let released = self
                .calls
                .release
                .record(h.bytes, || device.release_physical(h.handle));
            first = first.and(released);
        }
        first.and(device.release(self.base, self.reserved))
    }
}

/// Whether a failed call said the device is out of memory.
fn out_of_memory(error: &Error) -> bool {
    matches!(error, Error::Device { detail, .. } if detail.contains("OUT_OF_MEMORY"))
}
