//! The ledger of a process's own context, as a PyTorch user asks "where did my GPU
//! memory go": the context's terms from ctx's [`Ledger`], what the pool holds, and what
//! the process holds outside the pool.

use std::fmt::Write;

use ctx::{Ledger, LedgerItemKind};

use crate::facts::ContextFacts;

/// What the allocator adds to the context's figures. Bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolFigures {
    /// Bytes handed to the caller and not freed.
    pub live_bytes: u64,
    /// Freed bytes waiting for their stream's work before others may reuse them.
    pub pending_bytes: u64,
    /// Device memory the pool has mapped.
    pub mapped_bytes: u64,
    /// The most device memory the pool has mapped at once.
    pub peak_mapped_bytes: u64,
    /// Mapped bytes no block holds.
    pub free_bytes: u64,
    /// The largest request the pool can place without new device memory.
    pub largest_free_bytes: u64,
}

impl PoolFigures {
    /// External fragmentation of the pool's free bytes: `1 - largest / free`, 0 when
    /// nothing is free.
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_bytes.min(self.free_bytes) as f64 / self.free_bytes as f64
        }
    }
}

/// The terms of the ledger, computed once so the text and the tests agree. Bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// ctx's prediction for the context with its current limits.
    pub ledger: Ledger,
    /// `total - free` from `cuMemGetInfo`.
    pub used_bytes: u64,
    /// Device memory the pool has mapped.
    pub pool_bytes: u64,
    /// Free bytes inside the pool.
    pub pool_free_bytes: u64,
    /// `used` minus the context's terms and the pool: what other code in the process
    /// (cuBLAS/cuDNN workspaces, NCCL, module code, other allocators) holds.
    pub outside_bytes: u64,
}

/// The context's terms that the ledger predicts, in order.
const CONTEXT_TERMS: [LedgerItemKind; 5] = [
    LedgerItemKind::ContextBaseline,
    LedgerItemKind::LocalMemory,
    LedgerItemKind::ModuleCode,
    LedgerItemKind::MallocHeap,
    LedgerItemKind::PrintfFifo,
];

impl Explanation {
    /// The ledger of a context with `facts` whose pool holds `figures`.
    pub fn new(facts: &ContextFacts, figures: &PoolFigures) -> Self {
        let ledger = Ledger::predict(&facts.profile, &facts.limits, &[], figures.live_bytes);
        let used_bytes = facts.mem.total.saturating_sub(facts.mem.free);
        let context: u64 = CONTEXT_TERMS
            .iter()
            .filter_map(|kind| ledger.item(*kind))
            .map(|item| item.predicted)
            .sum();
        let pool_bytes = figures.mapped_bytes;
        Explanation {
            used_bytes,
            pool_bytes,
            pool_free_bytes: figures.free_bytes,
            outside_bytes: used_bytes
                .saturating_sub(context)
                .saturating_sub(pool_bytes),
            ledger,
        }
    }

    /// The ledger as text, one term a line.
    pub fn render(&self, device: i32, facts: &ContextFacts, figures: &PoolFigures) -> String {
        let mut out = String::new();
        let line = |out: &mut String, name: &str, bytes: u64, why: &str| {
            let _ = writeln!(out, "  {name:<30} {:>16}  {why}", mib(bytes));
        };
        let _ = writeln!(
            out,
            "cudamem: device {device} ({}), bytes in MiB",
            facts.profile.full_name
        );
        line(&mut out, "total", facts.mem.total, "cuMemGetInfo");
        line(
            &mut out,
            "used by this process",
            self.used_bytes,
            "total - free",
        );
        for kind in CONTEXT_TERMS {
            if let Some(item) = self.ledger.item(kind) {
                line(
                    &mut out,
                    &format!("  {}", item.name),
                    item.predicted,
                    &item.explanation,
                );
            }
        }
        line(
            &mut out,
            "  cudamem pool (physical)",
            self.pool_bytes,
            &format!(
                "mapped pages; peak {}",
                mib(figures.peak_mapped_bytes).trim()
            ),
        );
        line(
            &mut out,
            "    live",
            figures.live_bytes,
            "tensors not freed",
        );
        line(
            &mut out,
            "    freed, waiting on streams",
            figures.pending_bytes,
            "reusable by other streams once their work completes",
        );
        line(
            &mut out,
            "    free inside the pool",
            self.pool_free_bytes,
            &format!(
                "largest free block {}; fragmentation {:.1}%",
                mib(figures.largest_free_bytes).trim(),
                figures.fragmentation() * 100.0
            ),
        );
        line(
            &mut out,
            "  outside the pool",
            self.outside_bytes,
            "used - context - pool: cuBLAS/cuDNN workspaces, NCCL, module code, other allocators",
        );
        line(&mut out, "free", facts.mem.free, "cuMemGetInfo");
        out
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1 << 20))
}
