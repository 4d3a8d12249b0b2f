//! Block metadata kept beside the managed memory (the allocator never
//! touches the memory itself), in a table whose entries are recycled.
//!
//! A node is 40 bytes: the block's offset and size, four 32-bit links, and
//! the live allocation's exact extent kept as two small paddings rather than
//! a second offset and size.

use alloc::vec::Vec;

/// The null link.
pub(super) const NONE: u32 = u32::MAX;

/// What a table entry currently describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum State {
    /// Not a block; on the spare list.
    Spare,
    /// A free block, on its class's list.
    Free,
    /// A live allocation.
    Used,
    /// Never used again: its generation has run out, so a new one could
    /// repeat the generation of an allocation still held somewhere.
    Retired,
}

/// One block of a region: `[offset, offset + size)` bytes, linked to its
/// physical neighbours and, when free, to the others of its size class.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    /// First byte of the block.
    pub(super) offset: u64,
    /// Bytes the block covers, padding included.
    pub(super) size: u64,
    /// The block just below, [`NONE`] at the start of a region.
    pub(super) prev_phys: u32,
    /// The block just above, [`NONE`] at the end of a region.
    pub(super) next_phys: u32,
    /// Previous block of the same class list (free blocks only).
    pub(super) prev_free: u32,
    /// Next block of the same class list (free blocks), or the next spare
    /// entry (spare entries).
    pub(super) next_free: u32,
    /// Bumped whenever a live allocation ends, so its id goes stale. Never
    /// wraps: an entry whose generation reaches `u32::MAX` is retired at
    /// its next change instead ([`State::Retired`]).
    pub(super) generation: u32,
    pub(super) state: State,
    /// Bytes between the block's start and the allocation's (used blocks
    /// only). Always under a granule: a larger gap is split off as a free
    /// block.
    pub(super) lead: u8,
    /// Bytes between the allocation's end and the block's (used blocks
    /// only). Under two granules: the request's rounding to a granule plus a
    /// tail too small to split off.
    pub(super) trail: u16,
}

// Every allocate and free reads and writes a handful of nodes; at scale
// each is a cache miss, so keep the node from growing unnoticed.
const _: () = assert!(core::mem::size_of::<Node>() == 40);

impl Node {
    #[inline]
    pub(super) fn end(&self) -> u64 {
        self.offset + self.size
    }

    /// Aligned start handed to the caller, bytes (used blocks only).
    #[inline]
    pub(super) fn alloc_offset(&self) -> u64 {
        self.offset + u64::from(self.lead)
    }

    /// One past the caller's last byte (used blocks only).
    #[inline]
    pub(super) fn alloc_end(&self) -> u64 {
        self.end() - u64::from(self.trail)
    }

    /// A free, unlinked block `[offset, offset + size)`.
    #[inline]
    fn fresh(offset: u64, size: u64, generation: u32) -> Node {
        Node {
            offset,
            size,
            prev_phys: NONE,
            next_phys: NONE,
            prev_free: NONE,
            next_free: NONE,
            generation,
            state: State::Free,
            lead: 0,
            trail: 0,
        }
    }
}

/// The node table and its list of spare entries.
#[derive(Debug, Clone)]
pub(super) struct Nodes {
    table: Vec<Node>,
    spare_head: u32,
    spare: usize,
    /// Entries retired for good.
    retired: usize,
}

impl Nodes {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            table: Vec::with_capacity(capacity),
            spare_head: NONE,
            spare: 0,
            retired: 0,
        }
    }

    /// Entries in the table, spare ones included.
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether `count` more entries can be taken without running out of
    /// 32-bit indices.
    #[inline]
    pub(super) fn can_take(&self, count: usize) -> bool {
        self.spare >= count || self.table.len() + count - self.spare < NONE as usize
    }

    /// An entry for a new free block, spare if there is one, with its links
    /// cleared; the caller links it. Callers check
    /// [`can_take`](Self::can_take) first.
    #[inline]
    pub(super) fn take(&mut self, offset: u64, size: u64) -> u32 {
        let index = self.spare_head;
        match self.table.get_mut(index as usize) {
            Some(node) => {
                debug_assert_eq!(node.state, State::Spare);
                self.spare_head = node.next_free;
                self.spare -= 1;
                *node = Node::fresh(offset, size, node.generation);
                index
            }
            None => self.push(offset, size),
        }
    }

    /// A brand-new entry at the end of the table.
    fn push(&mut self, offset: u64, size: u64) -> u32 {
        let index = self.table.len();
        debug_assert!(index < NONE as usize);
        self.table.push(Node::fresh(offset, size, 0));
        index as u32
    }

    /// Put an entry back on the spare list; ids naming it go stale. An
    /// entry whose generation has run out is retired instead.
    #[inline]
    pub(super) fn give_back(&mut self, index: u32) {
        let spare_head = self.spare_head;
        let node = &mut self.table[index as usize];
        let Some(generation) = node.generation.checked_add(1) else {
            self.retire(index);
            return;
        };
        node.state = State::Spare;
        node.generation = generation;
        node.next_free = spare_head;
        self.spare_head = index;
        self.spare += 1;
    }

    /// Take entry `index` (unlinked from every chain and list) out of use
    /// for good, so no id naming it can ever match again.
    #[cold]
    pub(super) fn retire(&mut self, index: u32) {
        let node = &mut self.table[index as usize];
        node.state = State::Retired;
        node.prev_phys = NONE;
        node.next_phys = NONE;
        node.prev_free = NONE;
        node.next_free = NONE;
        self.retired += 1;
    }

    /// Entries retired for good, for the consistency check.
    pub(super) fn retired(&self) -> usize {
        self.retired
    }

    /// Make every entry spare (all ids go stale), keeping the table's
    /// memory.
    pub(super) fn give_back_all(&mut self) {
        self.spare_head = NONE;
        self.spare = 0;
        for index in (0..self.table.len() as u32).rev() {
            match self.table[index as usize].state {
                State::Retired => {}
                State::Spare => {
                    // Already stale; relink only.
                    let node = &mut self.table[index as usize];
                    node.next_free = self.spare_head;
                    self.spare_head = index;
                    self.spare += 1;
                }
                State::Free | State::Used => self.give_back(index),
            }
        }
    }

    /// Entry `index`, if it exists.
    #[inline]
    pub(super) fn get(&self, index: u32) -> Option<&Node> {
        self.table.get(index as usize)
    }

    /// Head of the spare list and its length, for the consistency check.
    pub(super) fn spare_list(&self) -> (u32, usize) {
        (self.spare_head, self.spare)
    }
}

impl core::ops::Index<u32> for Nodes {
    type Output = Node;
    #[inline]
    fn index(&self, index: u32) -> &Node {
        &self.table[index as usize]
    }
}

impl core::ops::IndexMut<u32> for Nodes {
    #[inline]
    fn index_mut(&mut self, index: u32) -> &mut Node {
        &mut self.table[index as usize]
    }
}
