//! A full walk of the allocator's structures, for tests and for callers
//! that want to know the bookkeeping is sound.

use super::Tlsf;
use super::class::{Class, FL_COUNT, SL_COUNT};
use super::node::{NONE, State};
use crate::{Error, Result};

/// Figures recounted from the physical block chains.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    managed: u64,
    live: u64,
    live_blocks: u64,
    padding: u64,
    free: u64,
    free_blocks: u64,
}

fn ensure(ok: bool, what: &'static str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Corrupt(what))
    }
}

impl Tlsf {
    /// Walk every structure and check that they agree: regions sorted and
    /// apart, each covered exactly by a chain of blocks, no two free blocks
    /// touching, every free block on the list of its class and nowhere
    /// else, the bitmaps matching the lists, the counters matching the
    /// blocks, and every node in a chain, spare or retired.
    ///
    /// O(blocks). Returns [`Error::Corrupt`] naming the first broken rule.
    ///
    /// ```
    /// use memcore::{Allocator, Tlsf};
    ///
    /// let mut tlsf = Tlsf::new();
    /// tlsf.add_region(0, 1 << 20)?;
    /// let a = tlsf.allocate(300, 512)?;
    /// tlsf.check()?;
    /// tlsf.free(a)?;
    /// tlsf.check()?;
    /// # Ok::<(), memcore::Error>(())
    /// ```
    pub fn check(&self) -> Result<()> {
        let node_count = self.nodes.len();
        let mut tally = Tally::default();
        let mut in_chains = 0usize;
        for (r, region) in self.regions.iter().enumerate() {
            ensure(region.extent.size > 0, "empty region")?;
            if let Some(next) = self.regions.get(r + 1) {
                ensure(
                    region.extent.end() < next.extent.offset,
                    "regions unsorted or touching",
                )?;
            }
            tally.managed += region.extent.size;
            let mut cursor = region.extent.offset;
            let mut prev = NONE;
            let mut prev_free = false;
            let mut index = region.first;
            while index != NONE {
                in_chains += 1;
                ensure(in_chains <= node_count, "cycle in a block chain")?;
                let node = self
                    .nodes
                    .get(index)
                    .ok_or(Error::Corrupt("link out of range"))?;
                ensure(node.prev_phys == prev, "prev_phys disagrees with the chain")?;
                ensure(
                    node.offset == cursor && node.size > 0,
                    "block chain has a gap",
                )?;
                match node.state {
                    State::Spare => return Err(Error::Corrupt("spare node in a block chain")),
                    State::Retired => {
                        return Err(Error::Corrupt("retired node in a block chain"));
                    }
                    State::Free => {
                        ensure(!prev_free, "two free blocks touch")?;
                        tally.free += node.size;
                        tally.free_blocks += 1;
                    }
                    State::Used => {
                        let padding = u64::from(node.lead) + u64::from(node.trail);
                        ensure(padding < node.size, "allocation outside its block")?;
                        tally.live += node.size - padding;
                        tally.live_blocks += 1;
                        tally.padding += padding;
                    }
                }
                prev_free = node.state == State::Free;
                cursor = node.end();
                prev = index;
                index = node.next_phys;
            }
            ensure(prev == region.last, "region's last block is wrong")?;
            ensure(
                cursor == region.extent.end(),
                "blocks do not cover the region",
            )?;
        }
        let counters = Tally {
            managed: self.managed_bytes,
            live: self.live_bytes,
            live_blocks: self.live_blocks,
            padding: self.padding_bytes,
            free: self.free_bytes(),
            free_blocks: self.free_blocks,
        };
        ensure(counters == tally, "counters disagree with the blocks")?;
        self.check_lists(tally.free_blocks)?;
        let (mut spare, spare_count) = self.nodes.spare_list();
        let mut walked = 0usize;
        while spare != NONE {
            walked += 1;
            ensure(walked <= node_count, "cycle in the spare list")?;
            let node = self
                .nodes
                .get(spare)
                .ok_or(Error::Corrupt("link out of range"))?;
            ensure(
                node.state == State::Spare,
                "non-spare node on the spare list",
            )?;
            spare = node.next_free;
        }
        ensure(walked == spare_count, "spare count is wrong")?;
        let retired = (0..node_count as u32)
            .filter(|&i| self.nodes.get(i).is_some_and(|n| n.state == State::Retired))
            .count();
        ensure(retired == self.nodes.retired(), "retired count is wrong")?;
        ensure(
            walked + in_chains + retired == node_count,
            "node neither in a chain, spare nor retired",
        )
    }

    /// Every class list: linked both ways, only free blocks of that class,
    /// marked in the bitmaps iff non-empty; `free_blocks` in all.
    fn check_lists(&self, free_blocks: u64) -> Result<()> {
        let mut listed = 0u64;
        for index in 0..FL_COUNT * SL_COUNT {
            let class = Class::from_index(index);
            let head = self.bins.head(class);
            ensure(
                self.bins.marked(class) == (head != NONE),
                "bitmap disagrees with a list",
            )?;
            let mut prev = NONE;
            let mut block = head;
            while block != NONE {
                listed += 1;
                ensure(listed <= free_blocks, "more listed blocks than free ones")?;
                let node = self
                    .nodes
                    .get(block)
                    .ok_or(Error::Corrupt("link out of range"))?;
                ensure(node.state == State::Free, "listed block is not free")?;
                ensure(
                    Class::of(node.size) == class,
                    "free block in the wrong class",
                )?;
                ensure(node.prev_free == prev, "prev_free disagrees with the list")?;
                prev = block;
                block = node.next_free;
            }
        }
        ensure(
            (0..FL_COUNT).all(|fl| self.bins.level_marks_agree(fl)),
            "first-level bitmap is wrong",
        )?;
        ensure(listed == free_blocks, "a free block is on no list")
    }
}
