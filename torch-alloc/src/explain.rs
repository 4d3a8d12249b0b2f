//! The ledger of a process's own context, as a PyTorch user asks "where did my GPU
//! memory go": the context's terms from ctx's [`Ledger`], what the pool holds, and what
//! the process holds outside the pool.

use ctx::{Ledger, LedgerRow, render_rows};
use memcore::bytes;

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

impl Explanation {
    /// The ledger of a context with `facts` whose pool holds `figures`.
    pub fn new(facts: &ContextFacts, figures: &PoolFigures) -> Self {
        let ledger = Ledger::predict(&facts.profile, &facts.limits, &[], figures.live_bytes);
        let used_bytes = facts.mem.total.saturating_sub(facts.mem.free);
        let pool_bytes = figures.mapped_bytes;
        Explanation {
            used_bytes,
            pool_bytes,
            pool_free_bytes: figures.free_bytes,
            outside_bytes: used_bytes
                .saturating_sub(ledger.context_bytes())
                .saturating_sub(pool_bytes),
            ledger,
        }
    }

    /// The ledger as text, one term a line (ctx's ledger table): what the device and
    /// the pool report under measured, the context's terms as the ledger predicts
    /// them, and what the process holds outside the pool as the difference.
    pub fn render(&self, device: i32, facts: &ContextFacts, figures: &PoolFigures) -> String {
        let measured = |item: &str, bytes: u64, why: &str| LedgerRow {
            item: item.into(),
            predicted: None,
            measured: Some(bytes),
            why: why.into(),
        };
        let mut rows = vec![
            measured("total", facts.mem.total, "cuMemGetInfo"),
            measured("used by this process", self.used_bytes, "total - free"),
        ];
        rows.extend(self.ledger.context_items().map(|item| LedgerRow {
            item: format!("  {}", item.name()),
            ..item.row()
        }));
        rows.extend([
            measured(
                "  cudamem pool (physical)",
                self.pool_bytes,
                &format!(
                    "mapped pages; peak {}",
                    bytes::human(figures.peak_mapped_bytes)
                ),
            ),
            measured("    live", figures.live_bytes, "tensors not freed"),
            measured(
                "    freed, waiting on streams",
                figures.pending_bytes,
                "reusable by other streams once their work completes",
            ),
            measured(
                "    free inside the pool",
                self.pool_free_bytes,
                &format!(
                    "largest free block {}; fragmentation {:.1}%",
                    bytes::human(figures.largest_free_bytes),
                    figures.fragmentation() * 100.0
                ),
            ),
            LedgerRow {
                item: "  outside the pool".into(),
                predicted: Some(ctx::Prediction::Bytes(self.outside_bytes)),
                measured: None,
                why: "used - context - pool: cuBLAS/cuDNN workspaces, NCCL, module code, \
                      other allocators"
                    .into(),
            },
            measured("free", facts.mem.free, "cuMemGetInfo"),
        ]);
        let mut out = format!("cudamem: device {device} ({})\n", facts.profile.full_name);
        // Writing to a String cannot fail.
        let _ = render_rows(&mut out, &rows);
        out
    }
}
