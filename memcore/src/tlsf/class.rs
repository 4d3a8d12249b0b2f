//! Size classes and the bitmaps that find a non-empty one in O(1).
//!
//! A free block of `size` bytes lives in the list of its class
//! `(fl, sl)`. Below [`LINEAR_LIMIT`] the classes are one granule (256 bytes)
//! wide; above it, `fl` is `floor(log2(size))` (shifted down so the linear
//! range is level 0) and `sl` splits each power of two into
//! [`SL_COUNT`] equal steps. Every size up to `u64::MAX` has a class.

use super::node::NONE;

/// log2 of the granule: sizes are rounded up to it, and it is the smallest
/// free block an allocation splits off.
pub(super) const GRANULE_LOG2: u32 = 8;
/// The granule in bytes; equal to [`crate::DEFAULT_ALIGN`].
pub(super) const GRANULE: u64 = 1 << GRANULE_LOG2;
/// log2 of the number of second-level classes per first level.
const SL_BITS: u32 = 5;
/// Second-level classes per first level.
pub(super) const SL_COUNT: usize = 1 << SL_BITS;
/// log2 of [`LINEAR_LIMIT`].
const LINEAR_LOG2: u32 = GRANULE_LOG2 + SL_BITS;
/// Sizes below this many bytes have classes one granule wide.
pub(super) const LINEAR_LIMIT: u64 = 1 << LINEAR_LOG2;
/// First-level classes: level 0 is the linear range, then one per power of
/// two from `LINEAR_LIMIT` to `2^63`.
pub(super) const FL_COUNT: usize = (64 - LINEAR_LOG2 + 1) as usize;

/// A size class: its position in the flat table of lists, level `fl`
/// times [`SL_COUNT`] plus step `sl`, so classes order as their sizes do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Class(u32);

/// Classes in all: [`FL_COUNT`] levels of [`SL_COUNT`] steps.
const CLASS_COUNT: usize = FL_COUNT * SL_COUNT;

impl Class {
    const fn new(fl: u32, sl: u32) -> Class {
        Class(fl << SL_BITS | sl)
    }

    /// First-level index.
    #[inline]
    fn fl(self) -> usize {
        (self.0 >> SL_BITS) as usize
    }

    /// Second-level index.
    #[inline]
    fn sl(self) -> u32 {
        self.0 & (SL_COUNT as u32 - 1)
    }

    /// The class whose size range holds `size` bytes.
    #[inline]
    pub(super) fn of(size: u64) -> Class {
        if size < LINEAR_LIMIT {
            Class((size >> GRANULE_LOG2) as u32)
        } else {
            let log2 = 63 - size.leading_zeros();
            // `size >> (log2 - SL_BITS)` is SL_COUNT plus the step, which
            // carries the level one up: level `log2 - LINEAR_LOG2 + 1`.
            Class(((log2 - LINEAR_LOG2) << SL_BITS) + (size >> (log2 - SL_BITS)) as u32)
        }
    }

    /// The lowest class in which every block holds at least `size` bytes:
    /// `size` rounded up to the next class boundary. `None` when that
    /// boundary is past `u64::MAX`.
    #[inline]
    pub(super) fn at_least(size: u64) -> Option<Class> {
        if size < LINEAR_LIMIT {
            // One class per granule; the class past the last linear one is
            // level 1, step 0, whose lowest size is `LINEAR_LIMIT`.
            return Some(Class(size.div_ceil(GRANULE) as u32));
        }
        let step = 1 << (63 - size.leading_zeros() - SL_BITS);
        let rounded = size.checked_add(step - 1)? & !(step - 1);
        Some(Class::of(rounded))
    }

    /// The next class up, if any.
    pub(super) fn next(self) -> Option<Class> {
        ((self.0 as usize) + 1 < CLASS_COUNT).then_some(Class(self.0 + 1))
    }

    /// Position in the flat table of list heads.
    #[inline]
    pub(super) fn index(self) -> usize {
        self.0 as usize
    }

    /// The class at a position of the flat table.
    pub(super) fn from_index(index: usize) -> Class {
        debug_assert!(index < CLASS_COUNT);
        Class(index as u32)
    }
}

/// The heads of the per-class free lists, and two levels of bitmaps saying
/// which lists are non-empty.
#[derive(Debug, Clone)]
pub(super) struct Bins {
    /// Head node of each class's list, [`NONE`] when empty.
    heads: alloc::vec::Vec<u32>,
    /// Bit `fl` set iff some list of level `fl` is non-empty.
    fl_map: u64,
    /// Bit `sl` of entry `fl` set iff list `(fl, sl)` is non-empty.
    sl_map: [u32; FL_COUNT],
}

impl Bins {
    pub(super) fn new() -> Self {
        Self {
            heads: alloc::vec![NONE; CLASS_COUNT],
            fl_map: 0,
            sl_map: [0; FL_COUNT],
        }
    }

    #[inline]
    pub(super) fn head(&self, class: Class) -> u32 {
        self.heads[class.index()]
    }

    /// Point the list of `class` at `node`. The list was non-empty: its
    /// bits are set already.
    #[inline]
    pub(super) fn set_head(&mut self, class: Class, node: u32) {
        debug_assert!(self.marked(class) && node != NONE);
        self.heads[class.index()] = node;
    }

    /// Start the empty list of `class` with `node`, marking it non-empty.
    #[inline]
    pub(super) fn set_first(&mut self, class: Class, node: u32) {
        debug_assert!(node != NONE);
        self.heads[class.index()] = node;
        self.sl_map[class.fl()] |= 1 << class.sl();
        self.fl_map |= 1 << class.fl();
    }

    /// Point the list of `class` at `node`, which is [`NONE`] when the list
    /// is now empty; the bitmaps follow.
    #[inline]
    pub(super) fn replace_head(&mut self, class: Class, node: u32) {
        self.heads[class.index()] = node;
        if node == NONE {
            let level = &mut self.sl_map[class.fl()];
            *level &= !(1 << class.sl());
            if *level == 0 {
                self.fl_map &= !(1 << class.fl());
            }
        }
    }

    /// The first non-empty class at or above `from`.
    #[inline]
    pub(super) fn first_nonempty_from(&self, from: Class) -> Option<Class> {
        let fl = from.fl();
        let same_level = self.sl_map[fl] & (u32::MAX << from.sl());
        if same_level != 0 {
            return Some(Class(from.0 + (same_level.trailing_zeros() - from.sl())));
        }
        // FL_COUNT < 64, so the shift never overflows.
        let levels = self.fl_map & (u64::MAX << (fl + 1));
        if levels == 0 {
            return None;
        }
        let fl = levels.trailing_zeros();
        Some(Class::new(fl, self.sl_map[fl as usize].trailing_zeros()))
    }

    /// The highest non-empty class.
    pub(super) fn highest_nonempty(&self) -> Option<Class> {
        if self.fl_map == 0 {
            return None;
        }
        let fl = 63 - self.fl_map.leading_zeros();
        Some(Class::new(
            fl,
            31 - self.sl_map[fl as usize].leading_zeros(),
        ))
    }

    /// Whether the bitmaps say the list of `class` is non-empty.
    pub(super) fn marked(&self, class: Class) -> bool {
        self.sl_map[class.fl()] & (1 << class.sl()) != 0 && self.fl_map & (1 << class.fl()) != 0
    }

    /// Whether level `fl` is marked exactly when one of its lists is.
    pub(super) fn level_marks_agree(&self, fl: usize) -> bool {
        (self.fl_map & (1 << fl) != 0) == (self.sl_map[fl] != 0)
    }

    /// Empty every list.
    pub(super) fn clear(&mut self) {
        self.heads.fill(NONE);
        self.fl_map = 0;
        self.sl_map = [0; FL_COUNT];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_partition_sizes_in_order() {
        let mut sizes = alloc::vec![1, 255, 256, 8191, 8192, 8447, 8448, 16383, 16384];
        for log2 in 14..64 {
            let p = 1u64 << log2;
            sizes.extend([p - 1, p, p + 1, p + (p >> SL_BITS), u64::MAX]);
        }
        sizes.sort_unstable();
        for w in sizes.windows(2) {
            assert!(Class::of(w[0]) <= Class::of(w[1]), "{w:?}");
        }
        assert_eq!(Class::of(u64::MAX).fl(), FL_COUNT - 1);
        assert_eq!(Class::of(u64::MAX).index(), CLASS_COUNT - 1);
        assert_eq!(Class::of(8191), Class::new(0, 31));
        assert_eq!(Class::of(8192), Class::new(1, 0));
        assert_eq!(Class::of(8192 + 256), Class::new(1, 1));
        assert_eq!(Class::of(16384 + 511), Class::new(2, 0));
        assert_eq!(Class::of(16384 + 512), Class::new(2, 1));
    }

    #[test]
    fn at_least_rounds_up_to_a_class_boundary() {
        for size in [
            1u64,
            256,
            300,
            8191,
            8192,
            8193,
            17000,
            1 << 40,
            (1 << 40) + 1,
        ] {
            let class = Class::at_least(size).unwrap();
            assert!(class >= Class::of(size));
            // Every size in the class is at least `size`: the class's
            // lowest member is >= size, i.e. size - 1 is in a lower class.
            assert!(Class::of(size - 1) < class, "{size}");
        }
        assert_eq!(Class::at_least(u64::MAX), None);
    }

    #[test]
    fn bitmaps_find_first_and_highest_lists() {
        let mut bins = Bins::new();
        assert_eq!(bins.first_nonempty_from(Class::of(1)), None);
        bins.set_first(Class::of(300), 7);
        bins.set_first(Class::of(1 << 40), 9);
        assert_eq!(bins.first_nonempty_from(Class::of(1)), Some(Class::of(300)));
        assert_eq!(
            bins.first_nonempty_from(Class::of(600)),
            Some(Class::of(1 << 40))
        );
        assert_eq!(bins.highest_nonempty(), Some(Class::of(1 << 40)));
        bins.replace_head(Class::of(1 << 40), NONE);
        assert_eq!(bins.highest_nonempty(), Some(Class::of(300)));
        assert!(bins.marked(Class::of(300)));
        assert!((0..FL_COUNT).all(|fl| bins.level_marks_agree(fl)));
    }
}
