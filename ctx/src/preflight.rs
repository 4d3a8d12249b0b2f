//! Preflight ([`Preflight`]): a kernel's local-memory cost before launch.

use crate::ledger::{Limits, local_memory_reservation_bytes, per_thread_local_bytes};
use crate::profile::DeviceProfile;

/// The cost of launching one kernel. Sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PreflightReport {
    /// The kernel's local frame per thread.
    pub kernel_local_bytes: u64,
    /// Local memory per thread reserved now.
    pub current_per_thread_bytes: u64,
    /// Local memory per thread after the launch.
    pub new_per_thread_bytes: u64,
    /// Device-wide local memory reservation now.
    pub current_reservation_bytes: u64,
    /// Device-wide local memory reservation after the launch.
    pub new_reservation_bytes: u64,
    /// What the launch adds: `new - current` reservation.
    pub extra_reservation_bytes: u64,
    /// Free device memory the check assumed.
    pub free_bytes: u64,
    /// Whether the extra reservation fits in `free_bytes`.
    pub fits: bool,
}

/// Preflight checks: what launching a kernel with a given local frame will
/// cost in device memory, before it is launched.
///
/// Launching a kernel whose local frame is larger than what the context
/// reserves per thread makes the driver grow the local memory reservation
/// for every resident thread of the device, and it does not shrink it back
/// afterwards. A preflight tells how many bytes that takes and whether they
/// are free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preflight;

impl Preflight {
    /// What launching a kernel with `local_bytes` of local frame per thread
    /// costs on `profile`, when the context reserves
    /// `current_per_thread_bytes` per thread now (at least the stack limit
    /// in `limits`) and `free_bytes` are free.
    ///
    /// ```
    /// use ctx::{DeviceProfile, Limits, Preflight};
    ///
    /// let h200 = DeviceProfile::builtin("h200").unwrap();
    /// let report = Preflight::kernel(&h200, &Limits::cuda_default(), 1024, 16 << 10, 1 << 30);
    /// // 15 KiB more for each of 270,336 threads: about 3.9 GiB, more than the 1 GiB free.
    /// assert_eq!(report.extra_reservation_bytes, 270_336 * (15 << 10));
    /// assert!(!report.fits);
    /// ```
    pub fn kernel(
        profile: &DeviceProfile,
        limits: &Limits,
        current_per_thread_bytes: u64,
        local_bytes: u64,
        free_bytes: u64,
    ) -> PreflightReport {
        let current = per_thread_local_bytes(profile, limits.stack_bytes, current_per_thread_bytes);
        let new = per_thread_local_bytes(profile, current, local_bytes);
        let current_reservation = local_memory_reservation_bytes(profile, current);
        let new_reservation = local_memory_reservation_bytes(profile, new);
        let extra = new_reservation - current_reservation;
        PreflightReport {
            kernel_local_bytes: local_bytes,
            current_per_thread_bytes: current,
            new_per_thread_bytes: new,
            current_reservation_bytes: current_reservation,
            new_reservation_bytes: new_reservation,
            extra_reservation_bytes: extra,
            free_bytes,
            fits: extra <= free_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> DeviceProfile {
        DeviceProfile::builtin("h200").unwrap()
    }

    #[test]
    fn a_frame_within_the_stack_costs_nothing() {
        let report = Preflight::kernel(&h200(), &Limits::cuda_default(), 1024, 800, 0);
        assert_eq!(report.extra_reservation_bytes, 0);
        assert_eq!(report.new_reservation_bytes, 276_824_064);
        assert!(report.fits);
    }

    #[test]
    fn a_larger_frame_costs_the_difference_for_every_thread() {
        let report = Preflight::kernel(&h200(), &Limits::cuda_default(), 1024, 16384, 5 << 30);
        assert_eq!(report.new_reservation_bytes, 4_429_185_024);
        assert_eq!(report.extra_reservation_bytes, 4_429_185_024 - 276_824_064);
        assert!(report.fits);
    }

    #[test]
    fn an_earlier_kernel_already_raised_the_reservation() {
        let report = Preflight::kernel(&h200(), &Limits::cuda_default(), 16384, 4096, 0);
        assert_eq!(report.current_per_thread_bytes, 16384);
        assert_eq!(report.extra_reservation_bytes, 0);
    }

    #[test]
    fn odd_frames_round_to_the_granule() {
        let report = Preflight::kernel(&h200(), &Limits::cuda_default(), 1024, 1025, u64::MAX);
        assert_eq!(report.new_per_thread_bytes, 1040);
        assert_eq!(report.extra_reservation_bytes, 270_336 * 16);
    }
}
