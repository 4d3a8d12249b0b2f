//! The device side of a stitch model: which physical handle stands for each
//! of the model's handle numbers and where the device has it mapped. It
//! carries out the model's [`DriverOp`]s on a device through the pool's
//! [`Mapper`] (which counts and times every call, grants each mapping to
//! the device and the peers, and undoes a mapping whose grant failed), and
//! keeps to what the device really did, so a failed call never leaves the
//! pool believing in memory that is not there.

use memcore::{DriverCalls, DriverOp, HandleInfo};

use crate::mapping::{Mapper, Physical, Refused};
use crate::{CallTally, DeviceMemory, Error, Result};

/// Why a list of operations did not all succeed (the first failure).
#[derive(Debug)]
pub(super) enum Failure {
    /// `cuMemCreate` said the device is out of memory
    /// ([`DriverCode::OUT_OF_MEMORY`](crate::DriverCode::OUT_OF_MEMORY)).
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
    /// By the model's handle number; `None` where the device holds none. A
    /// held handle is mapped (if at all) inside the reservation.
    slots: Vec<Option<Physical>>,
    /// Handles the device still holds although the model released their
    /// number (their release failed); given back with the rest at the end.
    stranded: Vec<Physical>,
    /// Makes every call, granting each mapping to the device and the
    /// peers, and counts them.
    mapper: Mapper,
}

impl Mirror {
    /// The mirror of a pool reserved at `[base, base + reserved)` whose
    /// calls `mapper` made so far (the reservation).
    pub(super) fn new(base: u64, reserved: u64, mapper: Mapper) -> Self {
        Self {
            base,
            reserved,
            slots: Vec::new(),
            stranded: Vec::new(),
            mapper,
        }
    }

    /// Every VMM call made, counted and timed on the host.
    pub(super) fn calls(&self) -> DriverCalls {
        self.mapper.calls()
    }

    /// The grants of mappings to the peers.
    pub(super) fn peer_access(&self) -> CallTally {
        self.mapper.peer_access()
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
                if let Some(old) = self.slot(handle).take() {
                    self.stranded.push(old);
                }
                match self.mapper.create(device, bytes) {
                    Ok(made) => {
                        *self.slot(handle) = Some(made);
                        Ok(())
                    }
                    Err(error) if error.driver_code().is_some_and(|c| c.is_out_of_memory()) => {
                        Err(Failure::CreateRefused(error))
                    }
                    Err(error) => Err(Failure::Driver(error)),
                }
            }
            DriverOp::Map { handle, at, bytes } => {
                let Some(mut physical) = self.held(handle) else {
                    return Ok(());
                };
                let end = at.saturating_add(bytes);
                if end > self.reserved {
                    return Err(Failure::OutsideReservation { end });
                }
                let mapped = self.mapper.map(device, &mut physical, self.base + at);
                *self.slot(handle) = Some(physical);
                mapped.map_err(Failure::Driver)
            }
            DriverOp::Unmap { handle, at, .. } => {
                let mut physical = match self.held(handle) {
                    Some(held) if held.mapped_at() == Some(self.base + at) => held,
                    _ => return Ok(()),
                };
                let unmapped = self.mapper.unmap(device, &mut physical);
                *self.slot(handle) = Some(physical);
                unmapped.map_err(Failure::Driver)
            }
            DriverOp::Release { handle, .. } => {
                let Some(held) = self.held(handle) else {
                    return Ok(());
                };
                let released = self.mapper.release(device, held);
                match released {
                    Ok(()) => {
                        *self.slot(handle) = None;
                        Ok(())
                    }
                    Err(Refused { error, left }) => {
                        *self.slot(handle) = left;
                        Err(Failure::Driver(*error))
                    }
                }
            }
        }
    }

    fn held(&self, handle: u32) -> Option<Physical> {
        self.slots.get(handle as usize).copied().flatten()
    }

    fn slot(&mut self, handle: u32) -> &mut Option<Physical> {
        let index = handle as usize;
        if self.slots.len() <= index {
            self.slots.resize(index + 1, None);
        }
        &mut self.slots[index]
    }

    /// `Ok` if the device holds exactly the model's handles, each of the
    /// model's size and mapped where the model maps it; else
    /// [`Error::Inconsistent`].
    pub(super) fn check(&self, model: impl Iterator<Item = HandleInfo>) -> Result<()> {
        let apart = |what: String| {
            Error::Inconsistent(format!(
                "a stitched pool's device and model are apart: {what}"
            ))
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
            let model_at = info.mapped_at.map(|extent| self.base + extent.offset);
            if held.bytes() != info.bytes || held.mapped_at() != model_at {
                return Err(apart(format!(
                    "handle {}: model {} bytes at {model_at:x?}, device {} bytes at {:x?}",
                    info.handle,
                    info.bytes,
                    held.bytes(),
                    held.mapped_at()
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
        let held: Vec<Physical> = self
            .slots
            .drain(..)
            .flatten()
            .chain(self.stranded.drain(..))
            .collect();
        for physical in held {
            if let Err(Refused { error, left }) = self.mapper.release(device, physical) {
                self.stranded.extend(left);
                first = first.and(Err(*error));
            }
        }
        first.and(device.release(self.base, self.reserved))
    }
}
