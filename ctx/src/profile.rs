//! What the ledger needs to know about a GPU model, for the models it knows
//! without a device at hand.
//!
//! Sources differ per figure and are named on each profile: the H200's were
//! measured on such a GPU with the driver; every other model's come from
//! NVIDIA's spec sheets and the CUDA programming guide's compute capability
//! table, and what only a device can show (the driver and context, module
//! costs) is unknown for them, never 0.
//!
//! The H200 costs were measured on 2026-11-30 (driver 580.159.04) with small
//! driver-API programs, each step in a fresh primary context, as the drop of
//! `cuMemGetInfo` free bytes (which moves in whole 2 MiB pages):
//! - a fresh context takes 552,402,944 bytes, of which 276,824,064 are the
//!   local memory for the default 1024-byte stack (setting the stack limit to
//!   0 gives exactly that back); the rest, 275,578,880, is the baseline here;
//! - the local memory reservation follows `132 x 2048 x stack` (stack rounded
//!   up to 16 bytes) to within one 2 MiB page, for stack limits from 0 to
//!   64 KiB; launching a kernel with a 16 KiB frame cost exactly
//!   `270,336 x (16384 - 1024)` bytes and left the stack limit at 16384;
//! - loading a module costs nothing visible unless its kernels call device
//!   `printf` (the first such module: 67,108,864 bytes, whatever the FIFO
//!   limit, 1 MiB to 64 MiB) or `malloc` (the first such module:
//!   144,703,488 bytes; a module with both: 146,800,640);
//! - the malloc heap is taken at the first launch of a kernel that calls
//!   `malloc`: the heap limit (at least 4 MiB) plus 2 MiB.

use memcore::bytes::GIB;

/// The default rounding of per-thread local memory, in bytes: on the H200
/// the reservation grows in steps of 16 bytes per thread (measured).
pub const LOCAL_MEMORY_GRANULE: u64 = 16;

/// A GPU model as the ledger sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceProfile {
    /// Short lowercase name: `h200`, `h100`, `a100-80gb`, `rtx4090`, ...
    pub name: &'static str,
    /// The marketing name.
    pub full_name: &'static str,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Most threads resident on one multiprocessor.
    pub max_threads_per_sm: u32,
    /// Device memory in all, bytes, as `cuMemGetInfo` reports the total.
    pub total_bytes: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// What the driver and a fresh context take besides the local memory
    /// of the default stack, bytes: `total - free` right after the context
    /// is created, minus that local memory reservation. `None` where nobody
    /// measured it.
    pub context_baseline_bytes: Option<u64>,
    /// What loading the first module whose kernels call neither device
    /// `printf` nor `malloc` costs, bytes; `None` where nobody measured it.
    pub first_module_bytes: Option<u64>,
    /// What loading the first module whose kernels call device `printf`
    /// costs, bytes (the printf FIFO included); `None` where unmeasured.
    pub printf_module_bytes: Option<u64>,
    /// What loading the first module whose kernels call device `malloc`
    /// costs, bytes (the heap itself comes at the first launch); `None`
    /// where unmeasured.
    pub malloc_module_bytes: Option<u64>,
    /// Per-thread local memory is rounded up to a multiple of this, bytes.
    pub local_memory_granule_bytes: u64,
    /// Where the figures come from.
    pub source: &'static str,
}

/// What the data sheets give: SMs and memory from NVIDIA's product
/// specifications, threads per SM from the CUDA C++ Programming Guide's
/// table of compute capabilities. Memory is the nominal capacity; the
/// driver's total is a little lower (ECC and reserved pages).
const SPEC_SHEET: &str = "NVIDIA spec sheet (SMs, memory: nominal capacity, the driver's total \
                          is a little lower); CUDA programming guide, compute capability table \
                          (threads per SM); driver and context costs not measured on this model";

/// A model known only from its data sheets, its memory given in GiB.
const fn spec_sheet(
    name: &'static str,
    full_name: &'static str,
    sm_count: u32,
    max_threads_per_sm: u32,
    total_gib: u64,
    compute_capability: (u32, u32),
) -> DeviceProfile {
    DeviceProfile {
        name,
        full_name,
        sm_count,
        max_threads_per_sm,
        total_bytes: total_gib * GIB,
        compute_capability,
        context_baseline_bytes: None,
        first_module_bytes: None,
        printf_module_bytes: None,
        malloc_module_bytes: None,
        local_memory_granule_bytes: LOCAL_MEMORY_GRANULE,
        source: SPEC_SHEET,
    }
}

/// The built-in profiles, one row per model; only the H200's driver and
/// context costs were measured.
static BUILTIN: [DeviceProfile; 13] = [
    DeviceProfile {
        name: "h200",
        full_name: "NVIDIA H200",
        sm_count: 132,
        max_threads_per_sm: 2048,
        total_bytes: 150_109_880_320,
        compute_capability: (9, 0),
        // 552,402,944 at context creation minus 276,824,064 of local memory.
        context_baseline_bytes: Some(275_578_880),
        first_module_bytes: Some(0),
        // 64 MiB and 138 MiB.
        printf_module_bytes: Some(67_108_864),
        malloc_module_bytes: Some(144_703_488),
        local_memory_granule_bytes: LOCAL_MEMORY_GRANULE,
        source: "measured on an H200 with driver 580.159.04: SMs, threads per SM, the \
                 driver's total, driver and context, module costs, local memory granule",
    },
    spec_sheet("a100-40gb", "NVIDIA A100 40GB", 108, 2048, 40, (8, 0)),
    spec_sheet("a100-80gb", "NVIDIA A100 80GB", 108, 2048, 80, (8, 0)),
    spec_sheet("h100", "NVIDIA H100 SXM5 80GB", 132, 2048, 80, (9, 0)),
    spec_sheet("h100-pcie", "NVIDIA H100 PCIe 80GB", 114, 2048, 80, (9, 0)),
    spec_sheet("l40s", "NVIDIA L40S", 142, 1536, 48, (8, 9)),
    spec_sheet("l4", "NVIDIA L4", 58, 1536, 24, (8, 9)),
    spec_sheet("a10", "NVIDIA A10", 72, 1536, 24, (8, 6)),
    spec_sheet("t4", "NVIDIA T4", 40, 1024, 16, (7, 5)),
    spec_sheet("v100", "NVIDIA V100 SXM2 32GB", 80, 2048, 32, (7, 0)),
    spec_sheet("rtx4090", "NVIDIA GeForce RTX 4090", 128, 1536, 24, (8, 9)),
    spec_sheet("rtx3090", "NVIDIA GeForce RTX 3090", 82, 1536, 24, (8, 6)),
    spec_sheet("gtx280", "NVIDIA GeForce GTX 280", 30, 1024, 1, (1, 3)),
];

impl DeviceProfile {
    /// The built-in profile called `name` (see [`DeviceProfile::name`]).
    ///
    /// ```
    /// let h200 = ctx::DeviceProfile::builtin("h200").unwrap();
    /// assert_eq!(h200.sm_count, 132);
    /// assert!(ctx::DeviceProfile::builtin("voodoo2").is_none());
    /// ```
    pub fn builtin(name: &str) -> Option<Self> {
        BUILTIN.iter().find(|p| p.name == name).copied()
    }

    /// Every built-in profile.
    pub fn all() -> &'static [DeviceProfile] {
        &BUILTIN
    }

    /// Most threads resident on the whole device at once.
    pub fn max_resident_threads(&self) -> u64 {
        u64::from(self.sm_count) * u64::from(self.max_threads_per_sm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_short_and_lowercase() {
        for (i, p) in DeviceProfile::all().iter().enumerate() {
            assert_eq!(p.name, p.name.to_lowercase());
            assert!(!p.name.contains(' '));
            assert_eq!(DeviceProfile::builtin(p.name), Some(*p));
            assert!(DeviceProfile::all()[..i].iter().all(|q| q.name != p.name));
            assert!(p.local_memory_granule_bytes.is_power_of_two());
        }
    }

    #[test]
    fn the_common_models_are_there_and_only_the_h200_is_measured() {
        for name in [
            "a100-40gb",
            "a100-80gb",
            "h100",
            "h100-pcie",
            "h200",
            "l40s",
            "l4",
            "t4",
            "a10",
            "v100",
            "rtx4090",
            "rtx3090",
        ] {
            let p = DeviceProfile::builtin(name).unwrap_or_else(|| panic!("no {name}"));
            assert!(p.sm_count > 0 && p.max_threads_per_sm >= 1024, "{name}");
            assert!(p.total_bytes >= 16 * GIB, "{name}");
            assert_eq!(p.context_baseline_bytes.is_some(), name == "h200", "{name}");
            assert!(!p.source.is_empty());
        }
        // The programming guide's threads per SM for each compute capability.
        for p in DeviceProfile::all() {
            let threads = match p.compute_capability {
                (7, 5) | (1, _) => 1024,
                (8, 6) | (8, 9) => 1536,
                _ => 2048,
            };
            assert_eq!(p.max_threads_per_sm, threads, "{}", p.name);
        }
    }

    #[test]
    fn h200_matches_the_measured_device() {
        let p = DeviceProfile::builtin("h200").unwrap();
        assert_eq!(p.max_resident_threads(), 270_336);
        assert_eq!(p.total_bytes, 150_109_880_320);
        assert_eq!(p.compute_capability, (9, 0));
    }
}
