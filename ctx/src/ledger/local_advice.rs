//! When local memory is a big item of a ledger: how to find which kernel's
//! frame sets it, what to do about it, and the conclusion with the numbers.
//! Said once here, for every command that prints a ledger.

use std::fmt;

use crate::text::{LINE_WIDTH, wrap};
use memcore::bytes::{GIB, exact, human};

use super::{Ledger, LedgerItemKind, Limits};

/// Local memory at least this large is worth a word, bytes.
pub const BIG_LOCAL_BYTES: u64 = GIB;
/// ... as is local memory taking at least this share of the device.
pub const BIG_LOCAL_SHARE: f64 = 0.1;

/// How to read a kernel's local memory (bytes per thread), one tool a line.
pub const FIND_LOCAL_MEMORY: [&str; 3] = [
    "at build time: `nvcc -Xptxas -v file.cu` (or `ptxas -v file.ptx`) prints each kernel's \
     \"bytes stack frame\" and spill stores",
    "in a built binary: `cuobjdump --dump-resource-usage PROGRAM` prints each kernel's STACK and \
     LOCAL bytes",
    "at run time: cuFuncGetAttribute(&bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, kernel) \
     (cudaFuncGetAttributes: localSizeBytes)",
];

/// What lowers the reservation, one fix a line.
pub const REDUCE_LOCAL_MEMORY: [&str; 3] = [
    "smaller stack frames: no large per-thread arrays (use shared memory or a global buffer), \
     fewer register spills (__launch_bounds__, fewer live values), no deep recursion",
    "a low stack limit: cudaDeviceSetLimit(cudaLimitStackSize, bytes) or \
     cuCtxSetLimit(CU_LIMIT_STACK_SIZE, bytes); a kernel with a larger frame raises the limit \
     when it launches and the driver never lowers it again, so set it back after that kernel",
    "fewer resident threads: the driver reserves for every thread the GPU can hold at once, \
     whatever the launch; only a context on fewer SMs (an MPS active-thread percentage, a green \
     context) holds fewer",
];

/// Why local memory is big, and what it would be at the default stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalMemoryAdvice {
    /// The reservation, bytes: measured where a device showed it, else
    /// predicted.
    pub reservation_bytes: u64,
    /// Bytes per thread it is made of.
    pub per_thread_bytes: u64,
    /// Threads it is reserved for (SMs x threads per SM).
    pub threads: u64,
    /// Whether a kernel's frame, not the stack limit, sets it.
    pub set_by_kernel: bool,
    /// The reservation at the default stack limit and no larger frame, bytes.
    pub default_bytes: u64,
    /// The default stack limit, bytes per thread.
    pub default_stack_bytes: u64,
    /// The device's memory, bytes.
    pub total_bytes: u64,
}

impl LocalMemoryAdvice {
    /// What going back to the default stack would give back, bytes.
    pub fn saving_bytes(&self) -> u64 {
        self.reservation_bytes.saturating_sub(self.default_bytes)
    }

    /// The one-sentence conclusion, with the numbers.
    pub fn conclusion(&self) -> String {
        let share = if self.total_bytes == 0 {
            0.0
        } else {
            100.0 * self.reservation_bytes as f64 / self.total_bytes as f64
        };
        let cause = if self.set_by_kernel {
            format!(
                "the largest kernel frame, {} per thread",
                exact(self.per_thread_bytes)
            )
        } else {
            format!(
                "the stack limit, {} per thread",
                exact(self.per_thread_bytes)
            )
        };
        let fix = if self.set_by_kernel {
            "shrink that kernel's frame (or set the stack limit back after it runs)"
        } else {
            "lower the stack limit to what the kernels need"
        };
        format!(
            "conclusion: local memory is the big item, {} ({share:.1}% of the device), set by \
             {cause} for {} resident threads; {fix}: at the default {} it is {}, {} back.",
            human(self.reservation_bytes),
            self.threads,
            human(self.default_stack_bytes),
            human(self.default_bytes),
            human(self.saving_bytes()),
        )
    }
}

/// How to find a kernel's local memory, the fixes, then the conclusion,
/// wrapped within [`LINE_WIDTH`].
impl fmt::Display for LocalMemoryAdvice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "how to find a kernel's local memory:")?;
        for line in FIND_LOCAL_MEMORY {
            writeln!(f, "{}", wrap(line, LINE_WIDTH, "  - ", "    "))?;
        }
        writeln!(f, "what lowers it:")?;
        for line in REDUCE_LOCAL_MEMORY {
            writeln!(f, "{}", wrap(line, LINE_WIDTH, "  - ", "    "))?;
        }
        writeln!(f, "{}", wrap(&self.conclusion(), LINE_WIDTH, "", "  "))
    }
}

impl Ledger {
    /// Advice on local memory when it is a big item (at least
    /// [`BIG_LOCAL_BYTES`], or [`BIG_LOCAL_SHARE`] of the device) and more
    /// than the default stack would take; `None` otherwise.
    ///
    /// ```
    /// use ctx::{DeviceProfile, Ledger, Limits};
    ///
    /// let h200 = DeviceProfile::builtin("h200").unwrap();
    /// let plain = Ledger::predict(&h200, &Limits::cuda_default(), &[], 0);
    /// assert!(plain.local_memory_advice().is_none());
    /// let big = Ledger::predict(&h200, &Limits::cuda_default(), &[16 << 10], 0);
    /// let advice = big.local_memory_advice().unwrap();
    /// assert!(advice.set_by_kernel);
    /// assert_eq!(advice.saving_bytes(), 270_336 * (16384 - 1024));
    /// // A measurement wins.
    /// let mut measured = big.clone();
    /// measured.set_measured(ctx::LedgerItemKind::LocalMemory, 4 << 30);
    /// assert_eq!(measured.local_memory_advice().unwrap().reservation_bytes, 4 << 30);
    /// ```
    pub fn local_memory_advice(&self) -> Option<LocalMemoryAdvice> {
        // What a device measured wins over the prediction.
        let reservation = self
            .item(LedgerItemKind::LocalMemory)
            .and_then(|item| item.figure().bytes())
            .unwrap_or_else(|| self.local_memory_reservation_bytes());
        let total = self
            .item(LedgerItemKind::Total)
            .and_then(|item| item.figure().bytes())
            .unwrap_or(0);
        let big = reservation >= BIG_LOCAL_BYTES
            || (total > 0 && reservation as f64 >= BIG_LOCAL_SHARE * total as f64);
        let default_stack = Limits::cuda_default().stack_bytes;
        let threads = u64::from(self.sm_count).saturating_mul(u64::from(self.max_threads_per_sm));
        let default_bytes = threads.saturating_mul(default_stack);
        if !big || reservation <= default_bytes {
            return None;
        }
        Some(LocalMemoryAdvice {
            reservation_bytes: reservation,
            per_thread_bytes: self.per_thread_local_bytes,
            threads,
            set_by_kernel: self.largest_frame_bytes > self.limits.stack_bytes,
            default_bytes,
            default_stack_bytes: default_stack,
            total_bytes: total,
        })
    }
}
