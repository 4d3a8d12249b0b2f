//! The context ledger ([`Ledger`]) and the local-memory rule it is built on.

use std::fmt;

use crate::error::{Error, Result};
use crate::profile::DeviceProfile;

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
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LedgerItem {
    /// Which line.
    pub kind: LedgerItemKind,
    /// Its short name.
    pub name: &'static str,
    /// What the model predicts.
    pub predicted: u64,
    /// What a real device showed, where someone measured it.
    pub measured: Option<u64>,
    /// Where the prediction comes from, one line.
    pub explanation: String,
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
/// assert_eq!(ledger.local_memory_reservation_bytes, 4_429_185_024);
/// assert_eq!(ledger.item(LedgerItemKind::LocalMemory).unwrap().predicted, 4_429_185_024);
/// println!("{ledger}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Ledger {
    /// The profile's short name.
    pub device: &'static str,
    /// The limits the prediction assumed.
    pub limits: Limits,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Resident threads per multiprocessor.
    pub max_threads_per_sm: u32,
    /// Local memory per thread: the larger of the stack limit and the
    /// largest kernel frame, rounded up to the profile's granule.
    pub per_thread_local_bytes: u64,
    /// `max_threads_per_sm * per_thread_local_bytes`.
    pub local_memory_per_sm_bytes: u64,
    /// `sm_count * local_memory_per_sm_bytes`.
    pub local_memory_reservation_bytes: u64,
    /// The lines, in [`LedgerItemKind::ALL`] order.
    pub items: Vec<LedgerItem>,
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
    /// Bytes a `cm_malloc` heap takes from the pool
    /// ([`crate::device_heap_bytes`]); 0 for none.
    pub cm_heap_bytes: u64,
}

/// A prediction and the line explaining it.
type Line = (LedgerItemKind, u64, String);

const UNKNOWN: &str = "not known for this device; the CUDA backend measures it";

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
        let per_sm = u64::from(profile.max_threads_per_sm).saturating_mul(per_thread);
        let reservation = u64::from(profile.sm_count).saturating_mul(per_sm);
        let frame_source = if largest_frame > limits.stack_bytes {
            format!("largest kernel frame {largest_frame} B")
        } else {
            format!("stack limit {} B", limits.stack_bytes)
        };
        let mut lines: Vec<Line> = vec![
            (
                LedgerItemKind::Total,
                profile.total_bytes,
                format!("{}: {}", profile.full_name, profile.source),
            ),
            match profile.context_baseline_bytes {
                Some(bytes) => (
                    LedgerItemKind::ContextBaseline,
                    bytes,
                    "taken by creating the context, less its local memory (measured)".into(),
                ),
                None => (LedgerItemKind::ContextBaseline, 0, UNKNOWN.into()),
            },
            (
                LedgerItemKind::LocalMemory,
                reservation,
                format!(
                    "{per_thread} B/thread ({frame_source}, {} B granule) x {} threads/SM x {} SMs",
                    profile.local_memory_granule_bytes,
                    profile.max_threads_per_sm,
                    profile.sm_count
                ),
            ),
            module_line(profile, workload),
            if workload.calls_malloc {
                (
                    LedgerItemKind::MallocHeap,
                    limits.malloc_heap_bytes,
                    "heap limit, taken at the first launch of a kernel calling malloc".into(),
                )
            } else {
                (
                    LedgerItemKind::MallocHeap,
                    0,
                    format!(
                        "limit {} B, taken only once a kernel calling malloc runs",
                        limits.malloc_heap_bytes
                    ),
                )
            },
            (
                LedgerItemKind::CmHeap,
                workload.cm_heap_bytes,
                if workload.cm_heap_bytes == 0 {
                    "none (a cm_malloc DeviceHeap takes its regions from the pool)".into()
                } else {
                    "cm_malloc's DeviceHeap: descriptor and regions (1 MiB chunks and their \
                     maps), taken from the pool; it grows between launches"
                        .into()
                },
            ),
            fifo_line(profile, limits, workload),
            (
                LedgerItemKind::UserAllocations,
                workload.user_bytes,
                "the program's own allocations".into(),
            ),
            (
                LedgerItemKind::Fragmentation,
                0,
                "free memory no single allocation can get; a probe on a real GPU fills it in"
                    .into(),
            ),
        ];
        let spent = lines[1..]
            .iter()
            .fold(0u64, |sum, (_, bytes, _)| sum.saturating_add(*bytes));
        lines.push((
            LedgerItemKind::Free,
            profile.total_bytes.saturating_sub(spent),
            "total minus everything above".into(),
        ));
        Ledger {
            device: profile.name,
            limits: *limits,
            sm_count: profile.sm_count,
            max_threads_per_sm: profile.max_threads_per_sm,
            per_thread_local_bytes: per_thread,
            local_memory_per_sm_bytes: per_sm,
            local_memory_reservation_bytes: reservation,
            items: lines
                .into_iter()
                .map(|(kind, predicted, explanation)| LedgerItem {
                    kind,
                    name: kind.name(),
                    predicted,
                    measured: None,
                    explanation,
                })
                .collect(),
        }
    }

    /// The line of `kind`.
    pub fn item(&self, kind: LedgerItemKind) -> Option<&LedgerItem> {
        self.items.iter().find(|item| item.kind == kind)
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
        let Some(total) = self.item(LedgerItemKind::Total).map(|item| item.predicted) else {
            return Ok(());
        };
        let taken = self
            .items
            .iter()
            .filter(|item| !matches!(item.kind, LedgerItemKind::Total | LedgerItemKind::Free));
        let mut sum = 0u64;
        for item in taken {
            if item.predicted > total {
                return Err(Error::ExceedsDevice {
                    what: item.name,
                    bytes: item.predicted,
                    total_bytes: total,
                });
            }
            sum = sum.saturating_add(item.predicted);
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
        return (kind, 0, "no module loaded".into());
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
        Some(bytes) => (kind, bytes, format!("{what}, as measured")),
        None => (kind, 0, UNKNOWN.into()),
    }
}

/// The printf FIFO line. Where the printf module's cost was measured, the
/// FIFO showed no cost of its own (the load cost did not change with it).
fn fifo_line(profile: &DeviceProfile, limits: &Limits, workload: &Workload<'_>) -> Line {
    let kind = LedgerItemKind::PrintfFifo;
    match (workload.calls_printf, profile.printf_module_bytes) {
        (false, _) => (
            kind,
            0,
            format!(
                "limit {} B; no kernel calls printf",
                limits.printf_fifo_bytes
            ),
        ),
        (true, Some(_)) => (
            kind,
            0,
            format!(
                "limit {} B; no cost apart from the printf module load (measured)",
                limits.printf_fifo_bytes
            ),
        ),
        (true, None) => (kind, limits.printf_fifo_bytes, "printf FIFO limit".into()),
    }
}

/// `bytes` with its size in MiB, for tables.
fn with_mib(bytes: u64) -> String {
    format!("{bytes} ({:.1} MiB)", bytes as f64 / f64::from(1 << 20))
}

impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "ledger of {}: stack {} B/thread, malloc heap {} B, printf FIFO {} B",
            self.device,
            self.limits.stack_bytes,
            self.limits.malloc_heap_bytes,
            self.limits.printf_fifo_bytes
        )?;
        writeln!(
            f,
            "{:<18} {:>30} {:>30}  why",
            "item", "predicted", "measured"
        )?;
        for item in &self.items {
            let measured = item.measured.map_or_else(|| "-".to_string(), with_mib);
            writeln!(
                f,
                "{:<18} {:>30} {:>30}  {}",
                item.name,
                with_mib(item.predicted),
                measured,
                item.explanation
            )?;
        }
        writeln!(
            f,
            "local memory: {} B/thread x {} threads = {} per SM; x {} SMs = {}",
            self.per_thread_local_bytes,
            self.max_threads_per_sm,
            with_mib(self.local_memory_per_sm_bytes),
            self.sm_count,
            with_mib(self.local_memory_reservation_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(name: &str) -> DeviceProfile {
        DeviceProfile::builtin(name).unwrap()
    }

    fn predicted(ledger: &Ledger, kind: LedgerItemKind) -> u64 {
        ledger.item(kind).unwrap().predicted
    }

    #[test]
    fn h200_default_stack_reserves_264_mib() {
        let ledger = Ledger::predict(&profile("h200"), &Limits::cuda_default(), &[], 0);
        assert_eq!(ledger.per_thread_local_bytes, 1024);
        assert_eq!(ledger.local_memory_per_sm_bytes, 2048 * 1024);
        assert_eq!(ledger.local_memory_reservation_bytes, 132 * 2048 * 1024);
        assert_eq!(ledger.local_memory_reservation_bytes, 276_824_064);
        assert_eq!(predicted(&ledger, LedgerItemKind::ModuleCode), 0);
    }

    #[test]
    fn a_16_kib_frame_raises_the_h200_reservation_to_4_gb() {
        let ledger = Ledger::predict(
            &profile("h200"),
            &Limits::cuda_default(),
            &[512, 16384, 0],
            0,
        );
        assert_eq!(ledger.per_thread_local_bytes, 16384);
        assert_eq!(ledger.local_memory_reservation_bytes, 4_429_185_024);
        // A module without printf or malloc costs nothing visible (measured).
        assert_eq!(predicted(&ledger, LedgerItemKind::ModuleCode), 0);
    }

    #[test]
    fn gtx280_with_one_kib_per_thread() {
        let ledger = Ledger::predict(&profile("gtx280"), &Limits::cuda_default(), &[1024], 0);
        assert_eq!(ledger.local_memory_reservation_bytes, 30 * 1024 * 1024);
        assert_eq!(predicted(&ledger, LedgerItemKind::ContextBaseline), 0);
    }

    #[test]
    fn frames_round_up_to_the_granule() {
        let p = profile("h200");
        assert_eq!(per_thread_local_bytes(&p, 1024, 1025), 1040);
        assert_eq!(per_thread_local_bytes(&p, 0, 1), 16);
        assert_eq!(per_thread_local_bytes(&p, 0, 0), 0);
        let mut coarse = p;
        coarse.local_memory_granule_bytes = 512;
        assert_eq!(per_thread_local_bytes(&coarse, 1024, 1025), 1536);
    }

    #[test]
    fn free_is_total_minus_every_item() {
        let p = profile("h200");
        let limits = Limits::cuda_default();
        let ledger = Ledger::predict(&p, &limits, &[2048], 1 << 30);
        let expected = 150_109_880_320 - 275_578_880 - 132 * 2048 * 2048 - (1 << 30);
        assert_eq!(predicted(&ledger, LedgerItemKind::Free), expected);
        let order: Vec<_> = ledger.items.iter().map(|i| i.kind).collect();
        assert_eq!(order, LedgerItemKind::ALL);
    }

    #[test]
    fn a_cm_heap_is_a_line_of_its_own_and_comes_out_of_free() {
        let p = profile("h200");
        let limits = Limits::cuda_default();
        let heap = crate::device_heap_bytes(256 << 20);
        let with = |cm_heap_bytes| {
            Ledger::predict_workload(
                &p,
                &limits,
                &Workload {
                    kernels_local_bytes: &[],
                    calls_printf: false,
                    calls_malloc: false,
                    user_bytes: 0,
                    cm_heap_bytes,
                },
            )
        };
        let (none, some) = (with(0), with(heap));
        assert_eq!(predicted(&none, LedgerItemKind::CmHeap), 0);
        assert_eq!(predicted(&some, LedgerItemKind::CmHeap), heap);
        assert_eq!(
            predicted(&none, LedgerItemKind::Free) - predicted(&some, LedgerItemKind::Free),
            heap
        );
        assert_eq!(
            predicted(&some, LedgerItemKind::MallocHeap),
            predicted(&none, LedgerItemKind::MallocHeap)
        );
    }

    #[test]
    fn a_fresh_h200_context_matches_the_measurement() {
        // Measured: total - free = 552,402,944 bytes right after creation.
        let ledger = Ledger::predict(&profile("h200"), &Limits::cuda_default(), &[], 0);
        let used = 150_109_880_320 - predicted(&ledger, LedgerItemKind::Free);
        assert_eq!(used, 552_402_944);
    }

    #[test]
    fn printf_and_malloc_bring_their_module_and_heap_costs() {
        let p = profile("h200");
        let limits = Limits::cuda_default();
        let workload = |calls_printf, calls_malloc| Workload {
            kernels_local_bytes: &[64],
            calls_printf,
            calls_malloc,
            user_bytes: 0,
            cm_heap_bytes: 0,
        };
        let malloc = Ledger::predict_workload(&p, &limits, &workload(false, true));
        assert_eq!(predicted(&malloc, LedgerItemKind::ModuleCode), 144_703_488);
        assert_eq!(predicted(&malloc, LedgerItemKind::MallocHeap), 8_388_608);
        assert_eq!(predicted(&malloc, LedgerItemKind::PrintfFifo), 0);
        let printf = Ledger::predict_workload(&p, &limits, &workload(true, false));
        assert_eq!(predicted(&printf, LedgerItemKind::ModuleCode), 67_108_864);
        assert_eq!(predicted(&printf, LedgerItemKind::MallocHeap), 0);
        // Unmeasured devices count the FIFO at its limit.
        let a100 = Ledger::predict_workload(&profile("a100-80gb"), &limits, &workload(true, true));
        assert_eq!(predicted(&a100, LedgerItemKind::PrintfFifo), 8_650_752);
        assert_eq!(predicted(&a100, LedgerItemKind::ModuleCode), 0);
        assert!(
            a100.item(LedgerItemKind::ModuleCode)
                .unwrap()
                .explanation
                .contains("not known")
        );
    }

    #[test]
    fn a_tiny_device_saturates_free_at_zero() {
        let ledger = Ledger::predict(&profile("gtx280"), &Limits::cuda_default(), &[1 << 20], 0);
        assert_eq!(predicted(&ledger, LedgerItemKind::Free), 0);
        // ... and the check says the reservation cannot happen.
        assert_eq!(
            ledger.check_fits(),
            Err(Error::ExceedsDevice {
                what: "local memory",
                bytes: 30 * 1024 * (1 << 20),
                total_bytes: profile("gtx280").total_bytes,
            })
        );
    }

    #[test]
    fn reservations_larger_than_the_device_fail_the_check() {
        let h200 = profile("h200");
        let stack = |bytes| Limits {
            stack_bytes: bytes,
            ..Limits::cuda_default()
        };
        assert_eq!(
            Ledger::predict(&h200, &stack(1024), &[], 0).check_fits(),
            Ok(())
        );
        // A saturated reservation (a u64::MAX stack) is caught, not printed.
        let err = Ledger::predict(&h200, &stack(u64::MAX), &[], 0)
            .check_fits()
            .unwrap_err();
        assert!(
            matches!(err, Error::ExceedsDevice { what: "local memory", bytes: u64::MAX, total_bytes }
                if total_bytes == h200.total_bytes),
            "{err}"
        );
        // Items that fit one by one but not together: the context's own
        // 552,402,944 bytes beside user allocations of all but 100 MiB.
        let user = |bytes: u64| h200.total_bytes - bytes;
        let err = Ledger::predict(&h200, &Limits::cuda_default(), &[], user(100 << 20))
            .check_fits()
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::ExceedsDevice {
                    what: "the items together",
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            Ledger::predict(&h200, &Limits::cuda_default(), &[], user(1 << 30))
                .check_fits()
                .is_ok()
        );
    }

    #[test]
    fn measurements_are_recorded_and_shown() {
        let mut ledger = Ledger::predict(&profile("h200"), &Limits::cuda_default(), &[], 0);
        ledger.set_measured(LedgerItemKind::LocalMemory, 276_824_064);
        assert_eq!(
            ledger.item(LedgerItemKind::LocalMemory).unwrap().measured,
            Some(276_824_064)
        );
        let table = ledger.to_string();
        assert!(table.contains("local memory"));
        assert!(table.contains("276824064 (264.0 MiB)"), "{table}");
        assert!(table.contains("x 132 SMs"));
    }
}
