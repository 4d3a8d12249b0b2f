//! Measuring what context operations cost in device memory, and filling the measured
//! column of a [`Ledger`].
//!
//! The only window into the driver's own use of memory is `cuMemGetInfo`, so every
//! measurement is a difference of free bytes around one step, taken after the device
//! is idle. Other processes on the same GPU show up in these differences too.

use super::{
    CudaContext, Function, LaunchConfig, Limit, Module,
    driver::{self, check},
};
use crate::{Ledger, LedgerItemKind, Limits, MemInfo, Result};

/// The step of the fragmentation probe's search, bytes: the VMM page of current GPUs.
const PROBE_GRANULE: u64 = memcore::PAGE_BYTES;

/// Free device memory before and after one step, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MemoryDelta {
    /// Free bytes before the step.
    pub free_before: u64,
    /// Free bytes after the step, with the device idle.
    pub free_after: u64,
}

impl MemoryDelta {
    /// Device memory the step took, bytes (0 if it gave memory back).
    pub fn cost_bytes(&self) -> u64 {
        self.free_before.saturating_sub(self.free_after)
    }

    /// Device memory the step gave back, bytes (0 if it took memory).
    pub fn released_bytes(&self) -> u64 {
        self.free_after.saturating_sub(self.free_before)
    }
}

/// What the fragmentation probe found, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LargestAllocation {
    /// Free bytes `cuMemGetInfo` reported before probing.
    pub free_bytes: u64,
    /// The largest single `cuMemAlloc` that succeeded, a multiple of 2 MiB (0 if none
    /// did).
    pub largest_bytes: u64,
    /// `cuMemAlloc` attempts made.
    pub probes: u32,
}

impl LargestAllocation {
    /// Free bytes no single allocation could get: fragmentation of physical memory plus
    /// the probe's 2 MiB rounding.
    pub fn unusable_bytes(&self) -> u64 {
        self.free_bytes.saturating_sub(self.largest_bytes)
    }
}

impl CudaContext {
    /// Runs `step`, waits for the device, and returns its result with the change in
    /// free memory around it.
    pub fn measure<T>(&self, step: impl FnOnce() -> Result<T>) -> Result<(T, MemoryDelta)> {
        self.synchronize()?;
        let before = self.mem_info()?;
        let value = step()?;
        self.synchronize()?;
        let after = self.mem_info()?;
        Ok((
            value,
            MemoryDelta {
                free_before: before.free,
                free_after: after.free,
            },
        ))
    }

    /// What setting the stack limit to `stack_bytes` per thread costs. The limit stays
    /// set.
    pub fn measure_stack_limit(&self, stack_bytes: u64) -> Result<MemoryDelta> {
        Ok(self
            .measure(|| self.set_limit(Limit::StackBytes, stack_bytes))?
            .1)
    }

    /// Loads a PTX module (see [`load_ptx`](Self::load_ptx)) and what loading it cost.
    pub fn measure_module_load(&self, name: &str, ptx: &str) -> Result<(Module, MemoryDelta)> {
        self.measure(|| self.load_ptx(name, ptx))
    }

    /// Looks a kernel up and reads its local size, and what that cost: with lazy module
    /// loading the kernel's code is loaded here, and reading its local size can raise
    /// the stack limit to it.
    pub fn measure_function(
        &self,
        module: &Module,
        name: &str,
    ) -> Result<((Function, u64), MemoryDelta)> {
        self.measure(|| {
            let function = module.function(name)?;
            let local_bytes = function.local_bytes()?;
            Ok((function, local_bytes))
        })
    }

    /// Launches a kernel on the default stream, waits for it, and returns what the launch
    /// cost (a first launch can raise the stack limit to the kernel's local size, and a
    /// kernel calling `malloc` makes the driver reserve the malloc heap).
    pub fn measure_launch(
        &self,
        function: &Function,
        config: &LaunchConfig,
        params: &[u8],
    ) -> Result<MemoryDelta> {
        Ok(self.measure(|| function.launch(config, params, None))?.1)
    }

    /// The largest block one `cuMemAlloc` can get now: tries all free memory (rounded
    /// down to 2 MiB) first, then halves the gap between the largest success and the
    /// smallest failure, at most `max_probes` attempts in all. Each success is freed at
    /// once. Only `CUDA_ERROR_OUT_OF_MEMORY` counts as a failed probe; other errors are
    /// returned.
    pub fn largest_allocation(&self, max_probes: u32) -> Result<LargestAllocation> {
        self.synchronize()?;
        let free_bytes = self.mem_info()?.free;
        let mut fits = 0u64;
        let mut fails = free_bytes / PROBE_GRANULE * PROBE_GRANULE + PROBE_GRANULE;
        let mut probes = 0;
        let mut candidate = fails - PROBE_GRANULE;
        while probes < max_probes && candidate > fits {
            probes += 1;
            if self.try_alloc(candidate)? {
                fits = candidate;
            } else {
                fails = candidate;
            }
            candidate = (fits + (fails - fits) / 2) / PROBE_GRANULE * PROBE_GRANULE;
        }
        Ok(LargestAllocation {
            free_bytes,
            largest_bytes: fits,
            probes,
        })
    }

    /// Whether `bytes` can be allocated in one piece now; frees it again at once.
    fn try_alloc(&self, bytes: u64) -> Result<bool> {
        let size = usize::try_from(bytes).unwrap_or(usize::MAX);
        self.bind()?;
        let mut address = 0;
        // SAFETY: `address` is a valid out-pointer; the context is current.
        let code = unsafe { driver::cuMemAlloc_v2(&mut address, size) };
        if driver::driver_code(code).is_out_of_memory() {
            return Ok(false);
        }
        check("cuMemAlloc", code)?;
        // SAFETY: `address` was just allocated and nothing uses it.
        check("cuMemFree", unsafe { driver::cuMemFree_v2(address) })?;
        Ok(true)
    }

    /// Fills the measured column of `ledger` with what can be read without changing the
    /// context: total and free memory now, the driver-and-context baseline seen when this
    /// context was opened, and fragmentation from [`largest_allocation`](Self::largest_allocation)
    /// (`max_probes` attempts; 0 skips it). Returns the memory figures it used.
    ///
    /// Local memory, module code and the malloc heap only show as differences around
    /// the steps that cause them; record those with [`Ledger::set_measured`] from
    /// [`measure_stack_limit`](Self::measure_stack_limit),
    /// [`measure_module_load`](Self::measure_module_load) and
    /// [`measure_launch`](Self::measure_launch).
    pub fn fill_measured(&self, ledger: &mut Ledger, max_probes: u32) -> Result<MemInfo> {
        self.synchronize()?;
        let now = self.mem_info()?;
        let at_open = self.mem_info_at_open();
        ledger.set_measured(LedgerItemKind::Total, now.total);
        // The local-memory reservation is what dropping the stack limit to 0
        // gives back (the hungriest loaded kernel raises the limit to its own
        // frame, so the limit covers kernels too); the limit is restored after.
        let stack = self.limit(Limit::StackBytes)?;
        let local = self.measure(|| self.set_limit(Limit::StackBytes, 0))?.1;
        self.set_limit(Limit::StackBytes, stack)?;
        self.synchronize()?;
        let local_bytes = local.released_bytes();
        ledger.set_measured(LedgerItemKind::LocalMemory, local_bytes);
        // A fresh context holds the default stack's local memory already; the
        // baseline is the rest, known only while the limit is still the one
        // the context opened with.
        if stack == Limits::cuda_default().stack_bytes {
            ledger.set_measured(
                LedgerItemKind::ContextBaseline,
                at_open
                    .total
                    .saturating_sub(at_open.free)
                    .saturating_sub(local_bytes),
            );
        }
        ledger.set_measured(LedgerItemKind::Free, now.free);
        if max_probes > 0 {
            let probe = self.largest_allocation(max_probes)?;
            ledger.set_measured(LedgerItemKind::Fragmentation, probe.unusable_bytes());
        }
        Ok(now)
    }
}
