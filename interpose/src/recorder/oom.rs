//! The explanation printed when a driver call returns out of memory: the
//! first few in full (with the ledger at that moment), the rest in a line.

use trace::event::{Call, LimitKind, MemInfoWhy};
use trace::process::Snapshot;
use trace::process::advice::{OutOfMemory, explain, explain_again};

use super::{FULL_EXPLANATIONS, State};
use crate::driver::read;

impl State {
    /// The explanation of an out-of-memory return, once it is recorded.
    pub(super) fn explain(
        &mut self,
        call: Call,
        request: Option<u64>,
        limit: Option<LimitKind>,
        caller: u32,
        thread: u32,
    ) -> String {
        self.out_of_memory += 1;
        let caller_path = self
            .libraries
            .get((caller as usize).wrapping_sub(1))
            .map_or_else(String::new, |(_, path)| path.clone());
        let oom = OutOfMemory {
            call,
            request,
            limit,
            caller: caller_path,
            ordinal: self.out_of_memory,
        };
        if self.out_of_memory > FULL_EXPLANATIONS {
            return explain_again(&oom, FULL_EXPLANATIONS);
        }
        self.read(MemInfoWhy::OutOfMemory, thread);
        let device = read::current_device();
        let whole = self.whole();
        let devices = whole.devices();
        let index = devices
            .iter()
            .position(|d| Some(d.facts.ordinal) == device)
            .or_else(|| devices.len().checked_sub(1));
        let snapshot = index.and_then(|index| Snapshot::of(&whole, index));
        explain(&oom, snapshot.as_ref())
    }
}
