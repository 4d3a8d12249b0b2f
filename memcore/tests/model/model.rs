//! The reference model: what each live block should be, which handles are
//! dead, and which regions are managed. Simple enough to be obviously right;
//! offsets come from the heap (placement is the allocator's choice), the
//! model then holds the heap to them.

use std::collections::BTreeMap;

use memcore::{BlockFlags, BlockInfo, Extent, Handle};

/// A live block as the model knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelBlock {
    /// Offset in bytes.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
    /// Alignment in bytes.
    pub align: u64,
    pub pinned: bool,
    /// Its contents are `device::pattern(seed, i)`.
    pub seed: u64,
}

impl ModelBlock {
    pub fn extent(&self) -> Extent {
        Extent::new(self.offset, self.size)
    }

    pub fn flags(&self) -> BlockFlags {
        if self.pinned {
            BlockFlags::PINNED
        } else {
            BlockFlags::empty()
        }
    }

    pub fn info(&self) -> BlockInfo {
        BlockInfo {
            offset: self.offset,
            size: self.size,
            align: self.align,
            flags: self.flags(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Model {
    pub blocks: BTreeMap<Handle, ModelBlock>,
    /// Handles freed already; each must stay dead.
    pub dead: Vec<Handle>,
    /// Managed regions, sorted, touching ones merged.
    pub regions: Vec<Extent>,
}

impl Model {
    /// The `index`-th live handle, if any is live.
    pub fn live(&self, pick: proptest::sample::Index) -> Option<Handle> {
        if self.blocks.is_empty() {
            return None;
        }
        self.blocks
            .keys()
            .nth(pick.index(self.blocks.len()))
            .copied()
    }

    /// The `index`-th dead handle, if any.
    pub fn dead(&self, pick: proptest::sample::Index) -> Option<Handle> {
        if self.dead.is_empty() {
            return None;
        }
        Some(self.dead[pick.index(self.dead.len())])
    }

    /// Manage `extent` too (it overlaps no region).
    pub fn add_region(&mut self, extent: Extent) {
        self.regions.push(extent);
        self.regions.sort();
        let mut merged: Vec<Extent> = Vec::with_capacity(self.regions.len());
        for r in self.regions.drain(..) {
            match merged.last_mut() {
                Some(last) if last.end() == r.offset => last.size += r.size,
                _ => merged.push(r),
            }
        }
        self.regions = merged;
    }

    /// Stop managing `tail`, the end of the highest region.
    pub fn release_tail(&mut self, tail: Extent) {
        if let Some(last) = self.regions.last_mut() {
            last.size -= tail.size;
            if last.size == 0 {
                self.regions.pop();
            }
        }
    }

    pub fn managed_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }

    pub fn live_bytes(&self) -> u64 {
        self.blocks.values().map(|b| b.size).sum()
    }

    /// Live extents sorted by offset.
    pub fn extents(&self) -> Vec<Extent> {
        let mut extents: Vec<Extent> = self.blocks.values().map(ModelBlock::extent).collect();
        extents.sort();
        extents
    }

    /// The free ranges between live blocks, region by region: what an
    /// allocator without padding must report.
    pub fn holes(&self) -> Vec<Extent> {
        let extents = self.extents();
        let mut holes = Vec::new();
        for r in &self.regions {
            let mut cursor = r.offset;
            for e in extents.iter().filter(|e| r.contains(e)) {
                if e.offset > cursor {
                    holes.push(Extent::new(cursor, e.offset - cursor));
                }
                cursor = e.end();
            }
            if r.end() > cursor {
                holes.push(Extent::new(cursor, r.end() - cursor));
            }
        }
        holes
    }
}

/// Whether a `size`-byte, `align`-aligned request fits in `hole`.
pub fn fits(hole: Extent, size: u64, align: u64) -> bool {
    memcore::align_up(hole.offset, align)
        .and_then(|at| at.checked_add(size))
        .is_some_and(|end| end <= hole.end())
}
