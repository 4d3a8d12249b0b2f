//! The page table of a stitched pool: what each 2 MiB page of the virtual
//! arena holds. The arena's low [`DENSE_PAGES`] pages, where best fit keeps
//! every block of a real program, are one vector grown to the highest page
//! touched (one index on the warm path); pages above it, which only blocks
//! beside huge ones reach, are in leaves of [`LEAF_PAGES`] pages made on
//! first touch. So the table's memory follows the pages blocks touch, not
//! the highest address one reached.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

/// No handle.
pub(super) const NONE: u32 = u32::MAX;

/// Pages held in the dense vector (8 TiB of the arena, 32 MiB of table at
/// most).
pub(super) const DENSE_PAGES: u64 = 1 << 22;

/// Pages in one leaf above [`DENSE_PAGES`] (8 GiB of the arena, 32 KiB of
/// table).
pub(super) const LEAF_PAGES: u64 = 1 << 12;

/// One 2 MiB page of the virtual arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Page {
    /// Live blocks with at least one byte in the page.
    pub(super) refs: u32,
    /// The handle mapped over the page, or [`NONE`].
    pub(super) handle: u32,
}

pub(super) const EMPTY_PAGE: Page = Page {
    refs: 0,
    handle: NONE,
};

/// Pages by number; a page never touched is [`EMPTY_PAGE`].
#[derive(Debug, Clone, Default)]
pub(super) struct PageTable {
    /// Pages below [`DENSE_PAGES`], up to the highest touched.
    dense: Vec<Page>,
    /// Leaves of the pages above, by `(page - DENSE_PAGES) / LEAF_PAGES`.
    leaves: Vec<Option<Box<[Page]>>>,
}

impl PageTable {
    fn split(page: u64) -> (usize, usize) {
        let above = page - DENSE_PAGES;
        ((above / LEAF_PAGES) as usize, (above % LEAF_PAGES) as usize)
    }

    /// The page, or [`EMPTY_PAGE`] where none was touched.
    #[inline]
    pub(super) fn get(&self, page: u64) -> Page {
        match self.dense.get(page as usize) {
            Some(&entry) => entry,
            None => self.get_above(page),
        }
    }

    #[cold]
    #[inline(never)]
    fn get_above(&self, page: u64) -> Page {
        if page < DENSE_PAGES {
            return EMPTY_PAGE;
        }
        let (leaf, index) = Self::split(page);
        match self.leaves.get(leaf) {
            Some(Some(pages)) => pages[index],
            _ => EMPTY_PAGE,
        }
    }

    /// The page to change, if it was touched.
    #[inline]
    pub(super) fn get_mut(&mut self, page: u64) -> Option<&mut Page> {
        let index = page as usize;
        if index < self.dense.len() {
            return Some(&mut self.dense[index]);
        }
        self.get_mut_above(page)
    }

    #[cold]
    #[inline(never)]
    fn get_mut_above(&mut self, page: u64) -> Option<&mut Page> {
        if page < DENSE_PAGES {
            return None;
        }
        let (leaf, index) = Self::split(page);
        match self.leaves.get_mut(leaf) {
            Some(Some(pages)) => Some(&mut pages[index]),
            _ => None,
        }
    }

    /// The page to change, made if need be.
    #[inline]
    pub(super) fn entry(&mut self, page: u64) -> &mut Page {
        let index = page as usize;
        if index < self.dense.len() {
            return &mut self.dense[index];
        }
        self.entry_above(page)
    }

    /// A page past the dense vector's end: the vector grown to it, or its
    /// leaf made.
    #[cold]
    #[inline(never)]
    fn entry_above(&mut self, page: u64) -> &mut Page {
        if page < DENSE_PAGES {
            let index = page as usize;
            self.dense.resize(index + 1, EMPTY_PAGE);
            return &mut self.dense[index];
        }
        let (leaf, index) = Self::split(page);
        if leaf >= self.leaves.len() {
            self.leaves.resize_with(leaf + 1, || None);
        }
        let pages = self.leaves[leaf]
            .get_or_insert_with(|| vec![EMPTY_PAGE; LEAF_PAGES as usize].into_boxed_slice());
        &mut pages[index]
    }

    /// Every page held, with its number, lowest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, Page)> + '_ {
        let dense = self
            .dense
            .iter()
            .enumerate()
            .map(|(index, &page)| (index as u64, page));
        let leaves = self
            .leaves
            .iter()
            .enumerate()
            .filter_map(|(leaf, pages)| {
                Some((DENSE_PAGES + leaf as u64 * LEAF_PAGES, pages.as_ref()?))
            })
            .flat_map(|(first, pages)| {
                pages
                    .iter()
                    .enumerate()
                    .map(move |(index, &page)| (first + index as u64, page))
            });
        dense.chain(leaves)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_pages_are_one_vector_and_high_ones_leaves_made_where_touched() {
        let mut table = PageTable::default();
        assert_eq!(table.get(5), EMPTY_PAGE);
        assert!(table.get_mut(5).is_none());
        table.entry(9).refs = 1;
        assert_eq!(table.iter().count(), 10);
        assert!(table.get_mut(5).is_some());
        let far = DENSE_PAGES + 1000 * LEAF_PAGES + 7;
        table.entry(far).refs = 3;
        assert_eq!(table.get(far).refs, 3);
        assert!(table.get_mut(far - 7).is_some());
        assert!(table.get_mut(far - LEAF_PAGES).is_none());
        assert_eq!(table.get(DENSE_PAGES - 1), EMPTY_PAGE);
        // Ten dense pages and one leaf, however far it lies.
        assert_eq!(table.iter().count(), 10 + LEAF_PAGES as usize);
        assert_eq!(
            table.iter().find(|(_, page)| page.refs == 3),
            Some((
                far,
                Page {
                    refs: 3,
                    handle: NONE
                }
            ))
        );
    }
}
