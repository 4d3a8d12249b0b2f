//! How much a pool that was refused a request grows by: what
//! [`Allocator::growth_needed`](crate::Allocator::growth_needed) says the
//! request needs, in whole pages, or a whole step where there is room. One
//! rule for every pool and every kind of growth, so none guesses.

use crate::align_up;
use crate::vmm::FULL_BANDWIDTH_HANDLE_BYTES;

/// How a growing pool sizes each growth. Sizes in bytes.
///
/// A growth takes the request's need rounded up to whole pages, or a whole
/// step if that is larger: the step is `min_bytes`, or the `1 / divisor`
/// share of what the pool holds (capped at
/// [`FULL_BANDWIDTH_HANDLE_BYTES`]) if that is larger, in whole pages. A
/// step larger than the room left shrinks to the room, never below the
/// need; if the device refuses a step, the pool tries the need alone
/// ([`GrowthStep`]).
///
/// ```
/// use memcore::{GrowthRule, GrowthStep, PAGE_BYTES};
///
/// const MIB: u64 = 1 << 20;
/// let rule = GrowthRule { page_bytes: PAGE_BYTES, min_bytes: 8 * MIB, divisor: 0 };
/// // 3 MiB needed: two pages, but a step is 8 MiB.
/// assert_eq!(rule.step(3 * MIB, 0, u64::MAX), Some(GrowthStep { bytes: 8 * MIB, need: 4 * MIB }));
/// // Only 6 MiB of room: the step shrinks to it.
/// assert_eq!(rule.step(3 * MIB, 0, 6 * MIB), Some(GrowthStep { bytes: 6 * MIB, need: 4 * MIB }));
/// // A pool holding 1 GiB with divisor 8 steps by 32 MiB (the cap), not 128 MiB.
/// let share = GrowthRule { divisor: 8, ..rule };
/// assert_eq!(share.step(MIB, 1 << 30, u64::MAX).map(|s| s.bytes), Some(32 * MIB));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowthRule {
    /// The unit a pool grows in (the device's page), bytes; a power of two
    /// (any other makes [`GrowthRule::step`] refuse every growth).
    pub page_bytes: u64,
    /// The fewest bytes one growth takes where there is room (0: what the
    /// request needs).
    pub min_bytes: u64,
    /// Each growth takes at least the pool's held bytes divided by this,
    /// capped at [`FULL_BANDWIDTH_HANDLE_BYTES`]; 0: off.
    pub divisor: u32,
}

/// One growth as [`GrowthRule::step`] sizes it: take `bytes`; if the device
/// refuses them and `bytes > need`, take `need`. Both are whole pages, and
/// `need <= bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowthStep {
    /// Bytes to take first: the need, or a whole step where there is room.
    pub bytes: u64,
    /// The fewest whole pages that hold the request.
    pub need: u64,
}

impl GrowthRule {
    /// The growth for a request that needs `needed` more bytes (what
    /// `growth_needed` answered) from a pool holding `held` bytes that may
    /// take `room` more. `None` when the need, rounded up to pages, passes
    /// the 64-bit address space, or the page is not a power of two: no
    /// growth can hold the request. The need may exceed `room`; the caller
    /// refuses that growth as it would any past its limit.
    pub fn step(&self, needed: u64, held: u64, room: u64) -> Option<GrowthStep> {
        let page = self.page_bytes;
        if !page.is_power_of_two() {
            return None;
        }
        let need = align_up(needed.max(1), page)?;
        let share = match self.divisor {
            0 => 0,
            divisor => (held / u64::from(divisor)).min(FULL_BANDWIDTH_HANDLE_BYTES),
        };
        let step = align_up(self.min_bytes.max(share), page).unwrap_or(u64::MAX);
        let room = room - room % page;
        Some(GrowthStep {
            bytes: need.max(step.min(room)),
            need,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 2 << 20;

    fn rule(min_bytes: u64, divisor: u32) -> GrowthRule {
        GrowthRule {
            page_bytes: PAGE,
            min_bytes,
            divisor,
        }
    }

    #[test]
    fn the_need_is_whole_pages_and_never_shrinks() {
        assert_eq!(
            rule(0, 0).step(0, 0, 0),
            Some(GrowthStep {
                bytes: PAGE,
                need: PAGE
            })
        );
        // No room at all: the need still stands, for the caller to refuse.
        assert_eq!(
            rule(64 * PAGE, 0)
                .step(PAGE + 1, 0, PAGE - 1)
                .unwrap()
                .bytes,
            2 * PAGE
        );
        assert_eq!(rule(0, 0).step(u64::MAX, 0, u64::MAX), None);
        assert_eq!(
            GrowthRule {
                page_bytes: 3,
                ..rule(0, 0)
            }
            .step(1, 0, 9),
            None
        );
    }

    #[test]
    fn the_step_is_the_larger_of_the_minimum_and_the_share_in_pages_within_the_room() {
        // A minimum that is not whole pages rounds up.
        assert_eq!(
            rule(PAGE + 1, 0).step(1, 0, u64::MAX).unwrap().bytes,
            2 * PAGE
        );
        // The share of 40 pages by 4 is 10 pages, over a 2-page minimum.
        assert_eq!(
            rule(2 * PAGE, 4)
                .step(1, 40 * PAGE, u64::MAX)
                .unwrap()
                .bytes,
            10 * PAGE
        );
        // The share is capped at a full-bandwidth handle.
        let capped = rule(0, 2).step(1, 1 << 40, u64::MAX).unwrap();
        assert_eq!(capped.bytes, FULL_BANDWIDTH_HANDLE_BYTES);
        // Room that is not whole pages counts down to pages.
        assert_eq!(
            rule(8 * PAGE, 0).step(1, 0, 5 * PAGE + 7).unwrap().bytes,
            5 * PAGE
        );
        // A minimum near 2^64 is a step as large as the room.
        assert_eq!(
            rule(u64::MAX, 0).step(1, 0, 9 * PAGE).unwrap().bytes,
            9 * PAGE
        );
    }
}
