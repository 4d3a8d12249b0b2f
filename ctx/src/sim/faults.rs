//! Failures a test makes the simulated device report: a chosen call fails
//! with a chosen driver code and changes nothing, as a refusing driver's
//! call would, so every rollback path above the device can be walked on
//! the CPU.

use std::sync::{Arc, Mutex, PoisonError};

use crate::DriverCode;

/// A [`SimDevice`](crate::SimDevice) call a test can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimCall {
    /// `reserve`.
    Reserve,
    /// `create_physical`.
    Create,
    /// `map_physical`.
    Map,
    /// `grant_access`.
    Grant,
    /// `unmap_physical`.
    Unmap,
    /// `release_physical`.
    Release,
    /// `alloc_chunk`.
    AllocChunk,
    /// `free_chunk`.
    FreeChunk,
}

#[derive(Debug, Clone, Copy)]
struct Fault {
    call: SimCall,
    /// Calls of `call` still to succeed before this one fails.
    skip: u32,
    code: DriverCode,
}

/// The failures planned for one simulated device, shared with whoever
/// holds this handle ([`SimDevice::faults`](crate::SimDevice::faults)), so a
/// test plans them while a pool owns the device.
///
/// ```
/// use ctx::{DeviceMemory, DriverCode, SimCall, SimConfig, SimDevice};
///
/// let mut dev = SimDevice::new(SimConfig::small(1 << 20));
/// dev.faults().fail(SimCall::Create, 1, DriverCode::OUT_OF_MEMORY);
/// let first = dev.create_physical(64 << 10)?;
/// let refused = dev.create_physical(64 << 10).unwrap_err();
/// assert_eq!(refused.driver_code(), Some(DriverCode::OUT_OF_MEMORY));
/// assert_eq!(dev.used_bytes(), 64 << 10, "the refused call took nothing");
/// dev.release_physical(first)?;
/// # Ok::<(), ctx::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SimFaults(Arc<Mutex<Vec<Fault>>>);

impl SimFaults {
    /// Let `skip` more calls of `call` through, then fail the next one with
    /// `code`. Several failures of one call each count every call of it,
    /// including those another failure took.
    pub fn fail(&self, call: SimCall, skip: u32, code: DriverCode) {
        self.planned().push(Fault { call, skip, code });
    }

    /// Forget every failure not yet reported.
    pub fn clear(&self) {
        self.planned().clear();
    }

    /// Failures planned and not yet reported.
    pub fn pending(&self) -> usize {
        self.planned().len()
    }

    /// Counts one call of `call`: the code it must fail with, if one is due.
    pub(super) fn take(&self, call: SimCall) -> Option<DriverCode> {
        let mut planned = self.planned();
        if planned.is_empty() {
            return None;
        }
        let due = planned
            .iter()
            .position(|fault| fault.call == call && fault.skip == 0);
        let code = due.map(|index| planned.remove(index).code);
        for fault in planned.iter_mut().filter(|fault| fault.call == call) {
            fault.skip = fault.skip.saturating_sub(1);
        }
        code
    }

    fn planned(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_counts_its_own_calls() {
        let faults = SimFaults::default();
        faults.fail(SimCall::Map, 2, DriverCode(7));
        faults.fail(SimCall::Map, 0, DriverCode(8));
        faults.fail(SimCall::Unmap, 0, DriverCode(9));
        let shared = faults.clone();
        let maps: Vec<_> = (0..4).map(|_| shared.take(SimCall::Map)).collect();
        assert_eq!(maps, [Some(DriverCode(8)), None, Some(DriverCode(7)), None]);
        assert_eq!(faults.pending(), 1);
        faults.clear();
        assert_eq!(faults.take(SimCall::Unmap), None);
    }
}
