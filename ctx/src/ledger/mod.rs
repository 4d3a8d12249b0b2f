//! The context ledger ([`Ledger`]) and the local-memory rule it is built on;
//! figure.rs says what is known of each item, table.rs writes it (and any
//! rows like its own) as text.

mod figure;
mod local_advice;
mod table;

use std::fmt;

use crate::text::{LINE_WIDTH, wrap};
use memcore::bytes::{exact, human};

use crate::error::{Error, Result};
use crate::profile::DeviceProfile;
pub use figure::{Figure, Prediction};
pub use local_advice::{
    BIG_LOCAL_BYTES, BIG_LOCAL_SHARE, FIND_LOCAL_MEMORY, LocalMemoryAdvice, REDUCE_LOCAL_MEMORY,
};
pub use table::{LedgerRow, render_rows};

/// Context limits that cost device memory (`cuCtxGetLimit`), bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Limits {
    /// `CU_LIMIT_STACK_SIZE`: stack per thread.
    pub stack_bytes: u64,
    /// `CU_LIMIT_MALLOC_HEAP_SIZE`: heap of in-kernel `malloc`.
    pub malloc_heap_bytes: u64,
    /// `CU_LIMIT_PRINTF_FIFO_SIZE`: buffer of in-kernel `printf`.
    pub printf_fifo_bytes: u64,
}

impl Limits {
    /// The limits of a fresh context, as read on the H200 (driver 580):
    /// stack 1024 bytes per thread, malloc heap 8 MiB, printf FIFO
    /// 8,650,752 bytes.
    pub const fn cuda_default() -> Self {
        Self {
            stack_bytes: 1024,
            malloc_heap_bytes: 8 << 20,
            printf_fifo_bytes: 8_650_752,
        }
    }

    /// The ledger's first line for a context on `device` with these
    /// limits: the one header every ledger (predicted or of a recorded
    /// process) prints.
    ///
    /// ```
    /// use ctx::Limits;
    ///
    /// assert_eq!(
    ///     Limits::cuda_default().header("h200"),
    ///     "ledger of h200: stack 1.00 KiB (1024 B) per thread, malloc heap 8.00 MiB, printf FIFO 8.25 MiB"
    /// );
    /// ```
    pub fn header(&self, device: &str) -> String {
        format!(
            "ledger of {device}: stack {} per thread, malloc heap {}, printf FIFO {}",
            exact(self.stack_bytes),
            human(self.malloc_heap_bytes),
            human(self.printf_fifo_bytes)
        )
    }
}

/// Which line of the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum LedgerItemKind {
    /// Device memory in all.
    Total,
    /// Driver and context, right after context creation.
    ContextBaseline,
    /// Local memory (stacks and spilled locals) for every resident thread.
    LocalMemory,
    /// Code and constants of loaded modules.
    ModuleCode,
    /// The in-kernel `malloc` heap.
    MallocHeap,
    /// The heap of `cm_malloc` (our in-kernel allocator): bytes it takes
    /// from the pool (`DeviceHeap`).
    CmHeap,
    /// The in-kernel `printf` buffer.
    PrintfFifo,
    /// The program's own allocations (pool or outside it).
    UserAllocations,
    /// Free bytes no allocation can use (lost to fragmentation of the
    /// device's physical memory).
    Fragmentation,
    /// What is left.
    Free,
}

impl LedgerItemKind {
    /// Every kind, in ledger order.
    pub const ALL: [LedgerItemKind; 10] = [
        Self::Total,
        Self::ContextBaseline,
        Self::LocalMemory,
        Self::ModuleCode,
        Self::MallocHeap,
        Self::CmHeap,
        Self::PrintfFifo,
        Self::UserAllocations,
        Self::Fragmentation,
        Self::Free,
    ];

    /// Whether the line is one of the context's own terms: what creating
    /// the context and running kernels in it take, before and besides any
    /// allocation (the driver and context, local memory, module code, the
    /// malloc heap, the printf FIFO). A `cm_malloc` heap, the program's
    /// allocations, fragmentation, the total and what is free are not.
    pub const fn is_context(self) -> bool {
        matches!(
            self,
            Self::ContextBaseline
                | Self::LocalMemory
                | Self::ModuleCode
                | Self::MallocHeap
                | Self::PrintfFifo
        )
    }

    /// The short name shown in tables.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Total => "total",
            Self::ContextBaseline => "driver + context",
            Self::LocalMemory => "local memory",
            Self::ModuleCode => "module code",
            Self::MallocHeap => "malloc heap",
            Self::CmHeap => "cm_malloc heap",
            Self::PrintfFifo => "printf FIFO",
            Self::UserAllocations => "user allocations",
            Self::Fragmentation => "fragmentation",
            Self::Free => "free",
        }
    }
}

/// One line of the ledger. Sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerItem {
    /// Which line.
    pub kind: LedgerItemKind,
    /// What the model says: bytes, a bound, or unknown where the profile
    /// lacks the figure.
    pub predicted: Prediction,
    /// What a real device showed, where someone measured it.
    pub measured: Option<u64>,
    /// Where the prediction comes from, one line.
    pub explanation: String,
}

impl LedgerItem {
    /// Its short name ([`LedgerItemKind::name`]).
    pub const fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// What a reader should take the line's bytes for: measured where a
    /// device showed them, else the prediction.
    pub const fn figure(&self) -> Figure {
        Figure::new(self.predicted, self.measured)
    }

    /// The line as a row of a ledger table.
    pub fn row(&self) -> LedgerRow {
        LedgerRow {
            item: self.name().into(),
            predicted: Some(self.predicted),
            measured: self.measured,
            why: self.explanation.clone(),
        }
    }
}

/// As a JSON object: `kind`, `name`, `predicted` (bytes, or null where the
/// model has no exact figure), `at_most` (the bound of a bounded line, else
/// null), `measured`, `state` (`measured`, `predicted`, `at_most` or
/// `unknown`: what a reader should take the line for), `explanation`.
#[cfg(feature = "serde")]
impl serde::Serialize for LedgerItem {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let bound = match self.predicted {
            Prediction::AtMost(bytes) => Some(bytes),
            Prediction::Bytes(_) | Prediction::Unknown => None,
        };
        let mut item = serializer.serialize_struct("LedgerItem", 7)?;
        item.serialize_field("kind", &self.kind)?;
        item.serialize_field("name", self.name())?;
        item.serialize_field("predicted", &self.predicted.bytes())?;
        item.serialize_field("at_most", &bound)?;
        item.serialize_field("measured", &self.measured)?;
        item.serialize_field("state", self.figure().state())?;
        item.serialize_field("explanation", &self.explanation)?;
        item.end()
    }
}

/// The context ledger: where a GPU's memory goes before and besides the
/// program's own allocations, item by item, predicted from a
/// [`DeviceProfile`] and the context's limits, and (on a real GPU) measured.
///
/// The largest hidden item is local memory: the driver reserves, for every
/// thread that can be resident at once, as many bytes as the larger of the
/// stack limit and the largest local frame of a loaded kernel. An H200 has
/// 132 SMs x 2048 threads = 270,336 such threads, so every KiB of
/// per-thread local memory costs 264 MiB of device memory.
///
/// ```
/// use ctx::{DeviceProfile, Ledger, LedgerItemKind, Limits};
///
/// let h200 = DeviceProfile::builtin("h200").unwrap();
/// // One kernel with a 16 KiB local frame: 16 KiB for each of 270,336 threads.
/// let ledger = Ledger::predict(&h200, &Limits::cuda_default(), &[16 << 10], 0);
/// assert_eq!(ledger.local_memory_reservation_bytes(), 4_429_185_024);
/// let local = ledger.item(LedgerItemKind::LocalMemory).unwrap();
/// assert_eq!(local.predicted, ctx::Prediction::Bytes(4_429_185_024));
/// println!("{ledger}");
/// ```
///
/// The figures a ledger derives (the local memory per SM and in all, the
/// context's share) are computed from its inputs and items on each call,
/// never stored beside them, and the items are read-only outside this
/// crate but for their measured column ([`Ledger::set_measured`]), so no
/// figure can disagree with another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    /// The profile's short name.
    device: &'static str,
    /// The limits the prediction assumed.
    limits: Limits,
    /// Streaming multiprocessors.
    sm_count: u32,
    /// Resident threads per multiprocessor.
    max_threads_per_sm: u32,
    /// Local memory per thread: the larger of the stack limit and the
    /// largest kernel frame, rounded up to the profile's granule. The
    /// `LocalMemory` item predicts `sm_count * max_threads_per_sm *` this.
    per_thread_local_bytes: u64,
    /// The largest local frame of a loaded kernel, bytes per thread (0 for
    /// none).
    largest_frame_bytes: u64,
    /// The lines, one per kind, in [`LedgerItemKind::ALL`] order.
    items: Vec<LedgerItem>,
}

/// As a JSON object: the inputs, the derived local-memory figures and the
/// items.
#[cfg(feature = "serde")]
impl serde::Serialize for Ledger {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut ledger = serializer.serialize_struct("Ledger", 8)?;
        ledger.serialize_field("device", self.device)?;
        ledger.serialize_field("limits", &self.limits)?;
        ledger.serialize_field("sm_count", &self.sm_count)?;
        ledger.serialize_field("max_threads_per_sm", &self.max_threads_per_sm)?;
        ledger.serialize_field("per_thread_local_bytes", &self.per_thread_local_bytes)?;
        ledger.serialize_field(
            "local_memory_per_sm_bytes",
            &self.local_memory_per_sm_bytes(),
        )?;
        ledger.serialize_field(
            "local_memory_reservation_bytes",
            &self.local_memory_reservation_bytes(),
        )?;
        ledger.serialize_field("items", &self.items)?;
        ledger.end()
    }
}

/// Local memory per thread, bytes: the larger of the stack limit and the
/// largest kernel frame, rounded up to the profile's granule.
pub fn per_thread_local_bytes(
    profile: &DeviceProfile,
    stack_bytes: u64,
    kernel_local_bytes: u64,
) -> u64 {
    let granule = profile.local_memory_granule_bytes.max(1);
    stack_bytes
        .max(kernel_local_bytes)
        .div_ceil(granule)
        .saturating_mul(granule)
}

/// Device-wide local memory reservation for `per_thread` bytes per thread,
/// bytes: every thread that can be resident at once gets its own.
///
/// The driver reserves whole 2 MiB pages; how close this comes to what it
/// reserves is measured in BENCHMARKS.md ("The ledger, predicted against
/// measured").
pub fn local_memory_reservation_bytes(profile: &DeviceProfile, per_thread: u64) -> u64 {
    profile.max_resident_threads().saturating_mul(per_thread)
}

/// What a program does that decides its context's memory, beyond the
/// limits. Sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Workload<'a> {
    /// Local frame per thread of each kernel of the loaded module(s); no
    /// module is loaded if this is empty and nothing below is called.
    pub kernels_local_bytes: &'a [u64],
    /// Whether some kernel calls device `printf`.
    pub calls_printf: bool,
    /// Whether some kernel calls device `malloc` (and is launched).
    pub calls_malloc: bool,
    /// The program's own allocations.
    pub user_bytes: u64,
    /// Bytes a `cm_malloc` heap takes from the pool (`device_heap_bytes`,
    /// feature `kernels`); 0 for none.
    pub cm_heap_bytes: u64,
}

/// A prediction and the line explaining it.
type Line = (LedgerItemKind, Prediction, String);

const UNKNOWN: &str = "not measured on this model, and no rule gives it: `cudamem explain \
                       --device N` measures it on the GPU";

impl Ledger {
    /// Predict the ledger of a context on `profile` with `limits`, one
    /// loaded module holding kernels whose local frames are
    /// `kernels_local_bytes` (none loaded if empty) and that call neither
    /// device `printf` nor `malloc`, and `user_bytes` of the program's own
    /// allocations. See [`Ledger::predict_workload`] for kernels that do.
    pub fn predict(
        profile: &DeviceProfile,
        limits: &Limits,
        kernels_local_bytes: &[u64],
        user_bytes: u64,
    ) -> Ledger {
        let workload = Workload {
            kernels_local_bytes,
            calls_printf: false,
            calls_malloc: false,
            user_bytes,
            cm_heap_bytes: 0,
        };
        Self::predict_workload(profile, limits, &workload)
    }

    /// Predict the ledger of a context on `profile` with `limits` running
    /// `workload`.
    pub fn predict_workload(
        profile: &DeviceProfile,
        limits: &Limits,
        workload: &Workload<'_>,
    ) -> Ledger {
        let largest_frame = workload
            .kernels_local_bytes
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        let per_thread = per_thread_local_bytes(profile, limits.stack_bytes, largest_frame);
        let reservation = per_sm(profile.max_threads_per_sm, per_thread)
            .saturating_mul(u64::from(profile.sm_count));
        let frame_source = if largest_frame > limits.stack_bytes {
            format!("the largest kernel frame, {}", exact(largest_frame))
        } else {
            format!("the stack limit, {}", human(limits.stack_bytes))
        };
        let mut lines: Vec<Line> = vec![
            (
                LedgerItemKind::Total,
                Prediction::Bytes(profile.total_bytes),
                format!("{}: {}", profile.full_name, profile.source),
            ),
            match profile.context_baseline_bytes {
                Some(bytes) => (
                    LedgerItemKind::ContextBaseline,
                    Prediction::Bytes(bytes),
                    format!(
                        "taken by creating the context, less its local memory (measured on an {})",
                        profile.full_name
                    ),
                ),
                None => (
                    LedgerItemKind::ContextBaseline,
                    Prediction::Unknown,
                    UNKNOWN.into(),
                ),
            },
            (
                LedgerItemKind::LocalMemory,
                Prediction::Bytes(reservation),
                format!(
                    "{} per thread x {} threads/SM x {} SMs: {frame_source}, rounded up to {}",
                    human(per_thread),
                    profile.max_threads_per_sm,
                    profile.sm_count,
                    human(profile.local_memory_granule_bytes),
                ),
            ),
            module_line(profile, workload),
            if workload.calls_malloc {
                (
                    LedgerItemKind::MallocHeap,
                    Prediction::Bytes(limits.malloc_heap_bytes),
                    "heap limit, taken at the first launch of a kernel calling malloc".into(),
                )
            } else {
                (
                    LedgerItemKind::MallocHeap,
                    Prediction::Bytes(0),
                    format!(
                        "limit {}, taken only once a kernel calling malloc runs",
                        human(limits.malloc_heap_bytes)
                    ),
                )
            },
            (
                LedgerItemKind::CmHeap,
                Prediction::Bytes(workload.cm_heap_bytes),
                if workload.cm_heap_bytes == 0 {
                    "none (a cm_malloc heap takes its regions from the pool)".into()
                } else {
                    "cm_malloc's heap: descriptor and regions (1 MiB chunks and their \
                     maps), taken from the pool; it grows between launches"
                        .into()
                },
            ),
            fifo_line(profile, limits, workload),
            (
                LedgerItemKind::UserAllocations,
                Prediction::Bytes(workload.user_bytes),
                "the program's own allocations".into(),
            ),
            (
                LedgerItemKind::Fragmentation,
                Prediction::Bytes(0),
                "none in a fresh context; a probe on the GPU measures it".into(),
            ),
        ];
        let spent = lines[1..].iter().fold(0u64, |sum, (_, predicted, _)| {
            sum.saturating_add(predicted.known_or_zero())
        });
        let left = profile.total_bytes.saturating_sub(spent);
        let unknown: Vec<&'static str> = lines
            .iter()
            .filter(|(_, predicted, _)| predicted.bytes().is_none())
            .map(|(kind, _, _)| kind.name())
            .collect();
        lines.push(if unknown.is_empty() {
            (
                LedgerItemKind::Free,
                Prediction::Bytes(left),
                "total minus everything above".into(),
            )
        } else {
            (
                LedgerItemKind::Free,
                Prediction::AtMost(left),
                format!(
                    "total minus the known items above; the unknown {} take more",
                    unknown.join(" and ")
                ),
            )
        });
        Ledger {
            device: profile.name,
            limits: *limits,
            sm_count: profile.sm_count,
            max_threads_per_sm: profile.max_threads_per_sm,
            per_thread_local_bytes: per_thread,
            largest_frame_bytes: largest_frame,
            items: lines
                .into_iter()
                .map(|(kind, predicted, explanation)| LedgerItem {
                    kind,
                    predicted,
                    measured: None,
                    explanation,
                })
                .collect(),
        }
    }

    /// The profile's short name.
    pub fn device(&self) -> &'static str {
        self.device
    }

    /// The limits the prediction assumed.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Resident threads per multiprocessor.
    pub fn max_threads_per_sm(&self) -> u32 {
        self.max_threads_per_sm
    }

    /// Local memory per thread, bytes: the larger of the stack limit and
    /// the largest kernel frame, rounded up to the profile's granule.
    pub fn per_thread_local_bytes(&self) -> u64 {
        self.per_thread_local_bytes
    }

    /// Local memory per multiprocessor, bytes: `max_threads_per_sm *
    /// per_thread_local_bytes`.
    pub fn local_memory_per_sm_bytes(&self) -> u64 {
        per_sm(self.max_threads_per_sm, self.per_thread_local_bytes)
    }

    /// The device-wide local-memory reservation, bytes: what the
    /// `LocalMemory` item predicts, `sm_count * local_memory_per_sm_bytes`.
    pub fn local_memory_reservation_bytes(&self) -> u64 {
        self.item(LedgerItemKind::LocalMemory)
            .map_or(0, |item| item.predicted.known_or_zero())
    }

    /// The lines, in [`LedgerItemKind::ALL`] order.
    pub fn items(&self) -> &[LedgerItem] {
        &self.items
    }

    /// The line of `kind`.
    pub fn item(&self, kind: LedgerItemKind) -> Option<&LedgerItem> {
        self.items.iter().find(|item| item.kind == kind)
    }

    /// The context's own terms ([`LedgerItemKind::is_context`]), in order.
    pub fn context_items(&self) -> impl Iterator<Item = &LedgerItem> {
        self.items.iter().filter(|item| item.kind.is_context())
    }

    /// What the context's own terms take together, predicted, bytes
    /// (saturating); a term the model does not know counts 0, so on a
    /// profile lacking a figure this is a lower bound
    /// ([`Ledger::unknown_items`] names what it leaves out).
    ///
    /// ```
    /// use ctx::{DeviceProfile, Ledger, Limits};
    ///
    /// let h200 = DeviceProfile::builtin("h200").unwrap();
    /// let ledger = Ledger::predict(&h200, &Limits::cuda_default(), &[], 1 << 30);
    /// // A fresh context: its baseline and the default stack's local memory;
    /// // the program's own gigabyte is not the context's.
    /// assert_eq!(ledger.context_bytes(), 552_402_944);
    /// ```
    pub fn context_bytes(&self) -> u64 {
        self.context_items().fold(0u64, |sum, item| {
            sum.saturating_add(item.predicted.known_or_zero())
        })
    }

    /// The lines neither measured nor predicted: what a model of this
    /// profile cannot say.
    pub fn unknown_items(&self) -> impl Iterator<Item = &LedgerItem> {
        self.items
            .iter()
            .filter(|item| item.figure() == Figure::Unknown)
    }

    /// Whether a device measured any line: otherwise the ledger is a model.
    pub fn is_measured(&self) -> bool {
        self.items.iter().any(|item| item.measured.is_some())
    }

    /// Every line as a row of a ledger table ([`render_rows`]).
    pub fn rows(&self) -> Vec<LedgerRow> {
        self.items.iter().map(LedgerItem::row).collect()
    }

    /// Check the prediction could happen: fails with
    /// [`Error::ExceedsDevice`] when an item the context takes (or all of
    /// them together) is larger than the device's memory, as a huge stack
    /// limit or kernel frame makes local memory. [`Ledger::predict`] itself
    /// saturates rather than fails, so a caller decides.
    ///
    /// ```
    /// use ctx::{DeviceProfile, Ledger, Limits};
    ///
    /// let h200 = DeviceProfile::builtin("h200").unwrap();
    /// let fits = Ledger::predict(&h200, &Limits::cuda_default(), &[16 << 10], 0);
    /// assert!(fits.check_fits().is_ok());
    /// // 200 GiB of local memory per thread cannot be reserved for 270,336 threads.
    /// let huge = Ledger::predict(&h200, &Limits::cuda_default(), &[200 << 30], 0);
    /// assert!(huge.check_fits().is_err());
    /// ```
    pub fn check_fits(&self) -> Result<()> {
        let Some(total) = self
            .item(LedgerItemKind::Total)
            .and_then(|item| item.predicted.bytes())
        else {
            return Ok(());
        };
        let taken = self
            .items
            .iter()
            .filter(|item| !matches!(item.kind, LedgerItemKind::Total | LedgerItemKind::Free));
        let mut sum = 0u64;
        for item in taken {
            let bytes = item.predicted.known_or_zero();
            if bytes > total {
                return Err(Error::ExceedsDevice {
                    what: item.name(),
                    bytes,
                    total_bytes: total,
                });
            }
            sum = sum.saturating_add(bytes);
        }
        if sum > total {
            return Err(Error::ExceedsDevice {
                what: "the items together",
                bytes: sum,
                total_bytes: total,
            });
        }
        Ok(())
    }

    /// Record what a real device showed for `kind`, bytes.
    pub fn set_measured(&mut self, kind: LedgerItemKind, bytes: u64) {
        if let Some(item) = self.items.iter_mut().find(|item| item.kind == kind) {
            item.measured = Some(bytes);
        }
    }
}

/// The module line: loading the first module costs more when its kernels
/// call device `printf` or `malloc` (the driver loads their support then).
fn module_line(profile: &DeviceProfile, workload: &Workload<'_>) -> Line {
    let kind = LedgerItemKind::ModuleCode;
    let loaded =
        !workload.kernels_local_bytes.is_empty() || workload.calls_printf || workload.calls_malloc;
    if !loaded {
        return (kind, Prediction::Bytes(0), "no module loaded".into());
    }
    let (cost, what) = match (workload.calls_printf, workload.calls_malloc) {
        (false, false) => (profile.first_module_bytes, "first module loaded"),
        (true, false) => (profile.printf_module_bytes, "first module calling printf"),
        (false, true) => (profile.malloc_module_bytes, "first module calling malloc"),
        (true, true) => (
            profile.printf_module_bytes.max(profile.malloc_module_bytes),
            "first module calling printf and malloc (the larger of the two)",
        ),
    };
    match cost {
        Some(bytes) => (
            kind,
            Prediction::Bytes(bytes),
            format!("{what}, as measured on an {}", profile.full_name),
        ),
        None => (kind, Prediction::Unknown, UNKNOWN.into()),
    }
}

/// The printf FIFO line. Where the printf module's cost was measured, the
/// FIFO showed no cost of its own (the load cost did not change with it).
fn fifo_line(profile: &DeviceProfile, limits: &Limits, workload: &Workload<'_>) -> Line {
    let kind = LedgerItemKind::PrintfFifo;
    match (workload.calls_printf, profile.printf_module_bytes) {
        (false, _) => (
            kind,
            Prediction::Bytes(0),
            format!(
                "limit {}; no kernel calls printf",
                human(limits.printf_fifo_bytes)
            ),
        ),
        (true, Some(_)) => (
            kind,
            Prediction::Bytes(0),
            format!(
                "limit {}; no cost apart from the printf module load (measured)",
                human(limits.printf_fifo_bytes)
            ),
        ),
        (true, None) => (
            kind,
            Prediction::Bytes(limits.printf_fifo_bytes),
            "printf FIFO limit".into(),
        ),
    }
}

/// Local memory per multiprocessor for `per_thread` bytes per thread.
fn per_sm(max_threads_per_sm: u32, per_thread: u64) -> u64 {
    u64::from(max_threads_per_sm).saturating_mul(per_thread)
}

/// The limits, the table of every line ([`render_rows`]), and how local
/// memory adds up, every line within [`LINE_WIDTH`].
impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits = self.limits.header(self.device);
        writeln!(f, "{}", wrap(&limits, LINE_WIDTH, "", "  "))?;
        render_rows(f, &self.rows())?;
        let local = format!(
            "local memory: {} per thread x {} threads = {} per SM; x {} SMs = {}",
            human(self.per_thread_local_bytes),
            self.max_threads_per_sm,
            human(self.local_memory_per_sm_bytes()),
            self.sm_count,
            human(self.local_memory_reservation_bytes())
        );
        writeln!(f, "{}", wrap(&local, LINE_WIDTH, "", "  "))
    }
}

#[cfg(test)]
mod tests;
