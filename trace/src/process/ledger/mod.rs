//! [`Snapshot`]: one device of a process at one moment (its peak, or an
//! out-of-memory), as a ledger: every item predicted, measured where free
//! memory was read, and what the records do not name as its own line.
//!
//! The conversion to ctx's [`ctx::Ledger`] is made here and nowhere else
//! ([`Snapshot::ledger`]); the items ctx's ledger has no line for (callers,
//! VMM, pinned host memory, the stream-ordered pool, the unexplained rest)
//! are this module's own lines.

use std::fmt::Write as _;

use ctx::text::{LINE_WIDTH, wrap};
use ctx::{
    DeviceProfile, LOCAL_MEMORY_GRANULE, Ledger, LedgerItemKind, LedgerRow, Limits, Workload,
    local_memory_reservation_bytes, per_thread_local_bytes, render_rows,
};
use memcore::bytes::{exact, human};

use crate::event::LimitKind;
use crate::image::Answer;
use crate::process::accounting::{
    Accounting, CallerBytes, DeviceFacts, Kernel, Reading, StackSource, UnexplainedDrop,
};
use crate::process::libraries::file_name;

/// One device of a process at one moment. Sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The device.
    pub facts: DeviceFacts,
    /// The context's limits at the moment (the defaults where unread).
    pub limits: Limits,
    /// Who set the stack limit.
    pub stack_source: StackSource,
    /// The launched kernel with the largest local frame.
    pub largest_frame: Option<Kernel>,
    /// Kernels whose local memory was read.
    pub kernels_launched: usize,
    /// Module and library loads.
    pub module_loads: u64,
    /// Local memory reserved now, predicted by ctx's rule.
    pub local_predicted: u64,
    /// Local memory reserved now, measured: the share at context creation
    /// (predicted: it cannot be told apart there) plus what every change of
    /// the stack limit took.
    pub local_measured: Option<u64>,
    /// What module loads and first launches took, measured.
    pub module_measured: u64,
    /// Device bytes streams, events, graphs and pools took, measured.
    pub objects_measured: u64,
    /// The calls measured for them.
    pub object_calls: u64,
    /// What setting the malloc heap and printf FIFO limits took at once.
    pub heap_fifo_measured: u64,
    /// What the malloc heap took at the first launch of a kernel.
    pub heap_measured: u64,
    /// Whether the images loaded call `malloc`.
    pub calls_malloc: Answer,
    /// Whether the images loaded call `printf`.
    pub calls_printf: Answer,
    /// What could not be read of the images loaded.
    pub image_notes: Vec<String>,
    /// Drops of free memory no cause fits, with their calls.
    pub unexplained_drops: Vec<UnexplainedDrop>,
    /// Device bytes live in allocations and VMM handles.
    pub live_device_bytes: u64,
    /// Live device blocks.
    pub live_blocks: usize,
    /// Live bytes by calling library, largest first: (library path, bytes).
    pub callers: Vec<(String, CallerBytes)>,
    /// The largest live block and its caller.
    pub largest_block: Option<(u64, String)>,
    /// VMM address space reserved.
    pub vmm_reserved: u64,
    /// VMM bytes mapped.
    pub vmm_mapped: u64,
    /// VMM physical handles.
    pub vmm_created: u64,
    /// Pinned host memory (not device memory: counted apart).
    pub host_pinned: u64,
    /// Live bytes from `cuMemAllocAsync`.
    pub live_async: u64,
    /// The reading of free memory this snapshot is taken at.
    pub reading: Option<Reading>,
}

/// A ledger line this module adds to ctx's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraLine {
    /// Its name.
    pub name: String,
    /// Bytes.
    pub bytes: u64,
    /// Why, one line.
    pub why: String,
}

/// What a limit asks of the device ([`Snapshot::limit_cost`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitCost {
    /// Device bytes the new limit takes.
    pub bytes: u64,
    /// How those bytes are made, in words.
    pub how: String,
    /// What the current limit holds now (given back when the new one is
    /// taken).
    pub held: u64,
    /// Threads the value is reserved for (1 for the heap and FIFO).
    pub threads: u64,
    /// The step a per-thread value is rounded up to.
    pub granule: u64,
}

impl LimitCost {
    /// The largest value of the limit whose cost fits in `room` bytes.
    pub fn largest_fitting(&self, room: u64) -> u64 {
        room / self.threads / self.granule * self.granule
    }
}

/// `" of X"` where the limit `limit` differs from the `per_thread` bytes
/// the figure after it starts with (a limit rounded up, or a larger frame).
fn unless_same(limit: u64, per_thread: u64) -> String {
    if limit == per_thread {
        String::new()
    } else {
        format!(" of {}", exact(limit))
    }
}

impl Snapshot {
    /// Device `index` (of [`Accounting::devices`]) of `accounting` as it is,
    /// at its last reading of free memory.
    pub fn of(accounting: &Accounting, index: usize) -> Option<Snapshot> {
        let device = accounting.devices().get(index)?;
        let limits = Limits {
            stack_bytes: device.stack.unwrap_or(Limits::cuda_default().stack_bytes),
            malloc_heap_bytes: device
                .heap
                .unwrap_or(Limits::cuda_default().malloc_heap_bytes),
            printf_fifo_bytes: device
                .fifo
                .unwrap_or(Limits::cuda_default().printf_fifo_bytes),
        };
        let profile = profile(&device.facts);
        let largest_frame = device.largest_frame().cloned();
        let frame_bytes = largest_frame
            .as_ref()
            .map_or(0, |kernel| kernel.local_bytes);
        let local = |stack: u64, frame: u64| {
            local_memory_reservation_bytes(&profile, per_thread_local_bytes(&profile, stack, frame))
        };
        let local_predicted = local(limits.stack_bytes, frame_bytes);
        let local_measured = device
            .facts
            .stack_at_context
            .filter(|_| !device.local_change_unmeasured)
            .map(|stack| {
                let at_context = i128::from(local(stack, 0));
                let now = at_context + i128::from(device.local_change_measured);
                u64::try_from(now.max(0)).unwrap_or(u64::MAX)
            });
        let (vmm_reserved, vmm_mapped, vmm_created) = accounting.vmm_bytes();
        Some(Snapshot {
            facts: device.facts.clone(),
            limits,
            stack_source: device.stack_source.clone(),
            largest_frame,
            kernels_launched: device.kernels.len(),
            module_loads: device.module_loads,
            local_predicted,
            local_measured,
            module_measured: device.module_measured,
            objects_measured: device.objects_measured,
            object_calls: device.object_calls,
            heap_fifo_measured: device.heap_fifo_measured,
            heap_measured: device.heap_measured,
            calls_malloc: device.images_call_malloc,
            calls_printf: device.images_call_printf,
            image_notes: device.image_notes.clone(),
            unexplained_drops: device.unexplained_drops.clone(),
            live_device_bytes: accounting.live_device_bytes(),
            live_blocks: accounting.live_blocks(),
            callers: accounting.callers(),
            largest_block: accounting.largest_block(),
            vmm_reserved,
            vmm_mapped,
            vmm_created,
            host_pinned: accounting.live_host_bytes(),
            live_async: accounting.live_async_bytes(),
            reading: device.last_reading,
        })
    }

    /// Device bytes in use, measured (`total - free` at the reading).
    pub fn used_measured(&self) -> Option<u64> {
        self.reading
            .map(|reading| reading.total.saturating_sub(reading.free))
    }

    /// What the stream-ordered pool holds beyond its live allocations, where
    /// the pool was read.
    pub fn pool_held(&self) -> Option<u64> {
        self.reading?
            .pool_reserved
            .map(|reserved| reserved.saturating_sub(self.live_async))
    }

    /// The context's own share at creation, measured: `total - free` right
    /// after it, less its local memory.
    pub fn context_measured(&self) -> Option<u64> {
        let used = self.facts.used_at_context?;
        let profile = profile(&self.facts);
        let stack = self.facts.stack_at_context?;
        let local =
            local_memory_reservation_bytes(&profile, per_thread_local_bytes(&profile, stack, 0));
        Some(used.saturating_sub(local))
    }

    /// Bytes in use that no record names: measured use less the context,
    /// local memory (predicted where a change of it went unmeasured),
    /// modules, limits, live blocks and the pool's reserve. Negative when the
    /// records name more than the device showed.
    pub fn unexplained(&self) -> Option<i128> {
        let used = i128::from(self.used_measured()?);
        let named = i128::from(self.context_measured()?)
            + i128::from(self.local_measured.unwrap_or(self.local_predicted))
            + i128::from(self.module_measured)
            + i128::from(self.objects_measured)
            + i128::from(self.heap_fifo_measured)
            + i128::from(self.heap_measured)
            + i128::from(self.live_device_bytes)
            + i128::from(self.pool_held().unwrap_or(0));
        Some(used - named)
    }

    /// ctx's ledger of this snapshot: predicted by ctx's rules from what the
    /// device reported, with the measured column filled where a reading
    /// says.
    pub fn ledger(&self) -> Ledger {
        let profile = profile(&self.facts);
        let frames: Vec<u64> = self
            .largest_frame
            .iter()
            .map(|kernel| kernel.local_bytes)
            .collect();
        let mut ledger = Ledger::predict_workload(
            &profile,
            &self.limits,
            &Workload {
                kernels_local_bytes: &frames,
                calls_printf: self.calls_printf == Answer::Yes,
                calls_malloc: self.calls_malloc == Answer::Yes || self.heap_measured > 0,
                user_bytes: self.live_device_bytes,
                cm_heap_bytes: 0,
            },
        );
        if let Some(reading) = self.reading {
            ledger.set_measured(LedgerItemKind::Total, reading.total);
            ledger.set_measured(LedgerItemKind::Free, reading.free);
        }
        if let Some(bytes) = self.context_measured() {
            ledger.set_measured(LedgerItemKind::ContextBaseline, bytes);
        }
        if let Some(bytes) = self.local_measured {
            ledger.set_measured(LedgerItemKind::LocalMemory, bytes);
        }
        if self.module_loads > 0 || self.kernels_launched > 0 {
            ledger.set_measured(LedgerItemKind::ModuleCode, self.module_measured);
        }
        if self.heap_fifo_measured > 0 || self.heap_measured > 0 {
            ledger.set_measured(
                LedgerItemKind::MallocHeap,
                self.heap_fifo_measured + self.heap_measured,
            );
        }
        ledger
    }

    /// The ledger's rows as a process's ledger shows them: ctx's, except
    /// module code, whose prediction (ctx's rule knows the first module a
    /// context loads, not a program's many, lazily loaded ones) is left
    /// unknown where more than one module was loaded or the rule has no
    /// figure, beside what was measured.
    pub fn ledger_rows(&self) -> Vec<LedgerRow> {
        let ledger = self.ledger();
        ledger
            .items()
            .iter()
            .map(|item| {
                let mut row = item.row();
                let modules = item.kind == LedgerItemKind::ModuleCode
                    && (self.module_loads > 0 || self.kernels_launched > 0);
                if modules
                    && (self.module_loads > 1 || item.predicted.bytes().is_none_or(|b| b == 0))
                {
                    row.predicted = Some(ctx::Prediction::Unknown);
                    row.why = format!(
                        "unknown before the run ({} module loads, {} kernels launched); measured \
                         as free memory taken around each load and first launch",
                        self.module_loads, self.kernels_launched
                    );
                }
                row
            })
            .collect()
    }

    /// The lines ctx's ledger has no place for.
    pub fn extra_lines(&self) -> Vec<ExtraLine> {
        let mut lines = Vec::new();
        for (path, bytes) in self.callers.iter().filter(|(_, b)| b.device_bytes > 0) {
            lines.push(ExtraLine {
                name: format!("  by {}", file_name(path)),
                bytes: bytes.device_bytes,
                why: format!(
                    "{} live block{}, the largest {}",
                    bytes.blocks,
                    if bytes.blocks == 1 { "" } else { "s" },
                    human(bytes.largest)
                ),
            });
        }
        if self.vmm_reserved > 0 || self.vmm_created > 0 {
            lines.push(ExtraLine {
                name: "VMM physical".into(),
                bytes: self.vmm_created,
                why: format!(
                    "cuMemCreate handles (in user allocations); {} mapped, {} of address space reserved",
                    human(self.vmm_mapped),
                    human(self.vmm_reserved)
                ),
            });
        }
        if self.object_calls > 0 {
            lines.push(ExtraLine {
                name: "driver objects".into(),
                bytes: self.objects_measured,
                why: format!(
                    "the driver's own memory for streams, events, graphs and pools: free memory \
                     taken around {} of their creations and first graph uploads and launches",
                    self.object_calls
                ),
            });
        }
        if let Some(held) = self.pool_held().filter(|&held| held > 0) {
            lines.push(ExtraLine {
                name: "held by the driver's async pool".into(),
                bytes: held,
                why: format!(
                    "CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT less the {} live in cuMemAllocAsync \
                     blocks: freed memory the stream-ordered pool keeps",
                    human(self.live_async)
                ),
            });
        }
        if self.host_pinned > 0 {
            lines.push(ExtraLine {
                name: "pinned host".into(),
                bytes: self.host_pinned,
                why: "cuMemHostAlloc/cuMemAllocHost: host memory, not counted in the device's"
                    .into(),
            });
        }
        lines
    }

    /// The local-memory line in words: which kernel (or limit) sets it, how
    /// many bytes per thread, and what that reserves.
    pub fn local_memory_cause(&self) -> String {
        let profile = profile(&self.facts);
        let per_thread = per_thread_local_bytes(
            &profile,
            self.limits.stack_bytes,
            self.largest_frame.as_ref().map_or(0, |k| k.local_bytes),
        );
        let threads = format!(
            "{} per thread x {} threads/SM x {} SMs = {}",
            exact(per_thread),
            profile.max_threads_per_sm,
            profile.sm_count,
            human(self.local_predicted)
        );
        let frame = self.largest_frame.as_ref().filter(|kernel| {
            kernel.local_bytes >= self.limits.stack_bytes && kernel.local_bytes > 0
        });
        match (frame, &self.stack_source) {
            (Some(kernel), _) => format!(
                "kernel {} has a {} local frame per thread: {threads}",
                kernel.name,
                exact(kernel.local_bytes)
            ),
            (None, StackSource::SetLimit) => format!(
                "the program set the stack limit{} (cuCtxSetLimit / cudaDeviceSetLimit): \
                 {threads}",
                unless_same(self.limits.stack_bytes, per_thread)
            ),
            (None, StackSource::Kernel(name)) => format!(
                "the first launch of {name} raised the stack limit{}: {threads}",
                unless_same(self.limits.stack_bytes, per_thread)
            ),
            (None, StackSource::Default) => format!(
                "the default stack limit{}: {threads}",
                unless_same(self.limits.stack_bytes, per_thread)
            ),
        }
    }

    /// What setting limit `which` to `value` asks of the device, and how
    /// that figure is made: the stack limit reserves local memory for every
    /// resident thread (the largest frame counted); the heap and the printf
    /// FIFO take the value itself. `None` for a limit that takes no memory.
    pub fn limit_cost(&self, which: LimitKind, value: u64) -> Option<LimitCost> {
        match which {
            LimitKind::Stack => {
                let profile = profile(&self.facts);
                let frame = self.largest_frame.as_ref().map_or(0, |k| k.local_bytes);
                let per_thread = per_thread_local_bytes(&profile, value, frame);
                Some(LimitCost {
                    bytes: local_memory_reservation_bytes(&profile, per_thread),
                    how: format!(
                        "{} per thread x {} threads/SM x {} SMs of local memory",
                        exact(per_thread),
                        profile.max_threads_per_sm,
                        profile.sm_count
                    ),
                    held: self.local_measured.unwrap_or(self.local_predicted),
                    threads: profile.max_resident_threads().max(1),
                    granule: profile.local_memory_granule_bytes.max(1),
                })
            }
            LimitKind::MallocHeap => Some(LimitCost {
                bytes: value,
                how: "the malloc heap".to_owned(),
                held: self.heap_measured,
                threads: 1,
                granule: 1,
            }),
            LimitKind::PrintfFifo => Some(LimitCost {
                bytes: value,
                how: "the printf FIFO".to_owned(),
                held: 0,
                threads: 1,
                granule: 1,
            }),
            LimitKind::Other(_) => None,
        }
    }

    /// The snapshot as text: ctx's ledger table, then this module's lines,
    /// then the unexplained rest.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let extra = self.extra_lines();
        let width = extra
            .iter()
            .map(|line| line.name.chars().count())
            .chain(["unexplained".len()])
            .max()
            .unwrap_or(0);
        let named = |out: &mut String, name: &str, bytes: &str, why: &str| {
            let head = format!("{name:<width$} {bytes:>10}  ");
            let indent = " ".repeat(head.chars().count());
            let _ = writeln!(out, "{}", wrap(why, LINE_WIDTH, &head, &indent));
        };
        if self.facts.sm_count.is_none() || self.facts.threads_per_sm.is_none() {
            let said = format!(
                "no context was made in this process (a forked child works in its parent's): \
                 {} live in {} blocks",
                human(self.live_device_bytes),
                self.live_blocks
            );
            let _ = writeln!(out, "{}", wrap(&said, LINE_WIDTH, "", "  "));
            for line in &extra {
                named(&mut out, &line.name, &human(line.bytes), &line.why);
            }
            return out;
        }
        let ledger = self.ledger();
        let header = self.limits.header(ledger.device());
        let _ = writeln!(out, "{}", wrap(&header, LINE_WIDTH, "", "  "));
        let _ = render_rows(&mut out, &self.ledger_rows());
        let cause = self.local_memory_cause();
        let _ = writeln!(
            out,
            "{}",
            wrap(&cause, LINE_WIDTH, "local memory cause: ", "  ")
        );
        if !self.image_notes.is_empty() {
            let notes = format!(
                "module images not read whole ({}): whether their code calls malloc is \
                 judged from the drops' sizes",
                self.image_notes.join("; ")
            );
            let _ = writeln!(out, "{}", wrap(&notes, LINE_WIDTH, "", "  "));
        }
        for line in &extra {
            named(&mut out, &line.name, &human(line.bytes), &line.why);
        }
        match (self.unexplained(), self.used_measured()) {
            (Some(rest), Some(used)) => {
                let share = if used == 0 {
                    0.0
                } else {
                    rest as f64 / used as f64 * 100.0
                };
                let mut why = format!(
                    "{share:.1}% of the {} in use: not named by any record (other processes, \
                     driver rounding of small allocations, calls not recorded)",
                    human(used)
                );
                for drop in &self.unexplained_drops {
                    why.push_str(&format!("; {drop}"));
                }
                named(&mut out, "unexplained", &signed_human(rest), &why);
            }
            _ => named(
                &mut out,
                "unexplained",
                "-",
                "free memory was not read on this device",
            ),
        }
        out
    }
}

/// `bytes` with a sign, for people.
pub fn signed_human(bytes: i128) -> String {
    memcore::bytes::signed(bytes, false, human)
}

/// The profile ctx's rules read: what the device reported, with the
/// measured costs of a built-in profile of the same model.
fn profile(facts: &DeviceFacts) -> DeviceProfile {
    let sm_count = facts
        .sm_count
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    let threads = facts
        .threads_per_sm
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    let total = facts.total.unwrap_or(0);
    let builtin = DeviceProfile::all()
        .iter()
        .find(|p| {
            p.sm_count == sm_count
                && p.max_threads_per_sm == threads
                && p.total_bytes.abs_diff(total) <= p.total_bytes / 50
        })
        .copied();
    DeviceProfile {
        name: builtin.map_or("device", |p| p.name),
        full_name: builtin.map_or("this device", |p| p.full_name),
        sm_count,
        max_threads_per_sm: threads,
        total_bytes: total,
        compute_capability: builtin.map_or((0, 0), |p| p.compute_capability),
        context_baseline_bytes: builtin.and_then(|p| p.context_baseline_bytes),
        first_module_bytes: builtin.and_then(|p| p.first_module_bytes),
        printf_module_bytes: builtin.and_then(|p| p.printf_module_bytes),
        malloc_module_bytes: builtin.and_then(|p| p.malloc_module_bytes),
        local_memory_granule_bytes: builtin
            .map_or(LOCAL_MEMORY_GRANULE, |p| p.local_memory_granule_bytes),
        source: if builtin.is_some() {
            "SMs, threads and total read from the device; context and module costs of the \
             built-in profile of this model"
        } else {
            "SMs, threads and total read from the device; no built-in profile of this model"
        },
    }
}

#[cfg(test)]
mod tests;
