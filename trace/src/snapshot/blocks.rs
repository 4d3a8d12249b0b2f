//! PyTorch's own count of allocated bytes (`torch.cuda.max_memory_allocated`),
//! rebuilt from a history: the caching allocator counts the block it hands
//! out, not the request. Every request is rounded up to whole blocks, and a
//! free block that serves it is split only as PyTorch's rule says
//! ([`memcore::pytorch`] holds the sizes and the rule): a large-pool block
//! can be taken whole by a request somewhat smaller than itself. With
//! expandable segments every block is split, so the rounded request is the
//! block. The bytes count from the allocation to the free request; the block
//! returns to its segment (merging with free neighbours) at the free's
//! completion.

use std::collections::{BTreeMap, HashMap};

use memcore::pytorch;

#[derive(Debug, Clone, Copy)]
struct Block {
    bytes: u64,
    /// Start of the segment the block belongs to: blocks merge only within one.
    segment: u64,
    small: bool,
    free: bool,
}

/// The caching allocator's blocks as a history shows them.
#[derive(Debug, Default)]
pub struct BlockModel {
    blocks: BTreeMap<u64, Block>,
    /// Bytes counted for each allocated address.
    counted: HashMap<u64, u64>,
    /// Expandable segments seen: every block is its rounded request.
    expandable: bool,
    allocated: u64,
    peak: u64,
}

impl BlockModel {
    /// Most bytes counted as allocated at once.
    pub fn peak_allocated_bytes(&self) -> u64 {
        self.peak
    }

    /// `segment_alloc`: a new segment, one free block.
    pub fn segment_alloc(&mut self, address: u64, bytes: u64) {
        self.blocks.insert(
            address,
            Block {
                bytes,
                segment: address,
                small: bytes == pytorch::SMALL_BUFFER_BYTES,
                free: true,
            },
        );
    }

    /// `segment_free`: the segment's blocks go.
    pub fn segment_free(&mut self, address: u64, bytes: u64) {
        let end = address.saturating_add(bytes);
        let inside: Vec<u64> = self.blocks.range(address..end).map(|(&at, _)| at).collect();
        for at in inside {
            self.blocks.remove(&at);
        }
    }

    /// `segment_map` / `segment_unmap`: an expandable segment.
    pub fn expandable(&mut self) {
        self.expandable = true;
    }

    /// `alloc` of `size` bytes at `address`.
    pub fn alloc(&mut self, address: u64, size: u64) {
        let request = pytorch::round_size(size);
        let mut counted = request;
        let found = self
            .blocks
            .get(&address)
            .copied()
            .filter(|block| !self.expandable && block.free && block.bytes >= request);
        if let Some(mut block) = found {
            let remaining = block.bytes - request;
            block.free = false;
            if pytorch::should_split(block.bytes, request, block.small) {
                block.bytes = request;
                let rest = Block {
                    bytes: remaining,
                    free: true,
                    ..block
                };
                self.blocks.insert(address + request, rest);
            }
            self.blocks.insert(address, block);
            counted = block.bytes;
        }
        if let Some(earlier) = self.counted.insert(address, counted) {
            self.allocated = self.allocated.saturating_sub(earlier);
        }
        self.allocated = self.allocated.saturating_add(counted);
        self.peak = self.peak.max(self.allocated);
    }

    /// `free_requested`: the block no longer counts as allocated. A block
    /// the history never allocated was never counted.
    pub fn free_requested(&mut self, address: u64) {
        if let Some(bytes) = self.counted.remove(&address) {
            self.allocated -= bytes;
        }
    }

    /// `free_completed`: the block is free in its segment again.
    pub fn free_completed(&mut self, address: u64) {
        let Some(mut block) = self.blocks.remove(&address).filter(|b| !b.free) else {
            return;
        };
        let mut start = address;
        block.free = true;
        if let Some(next) = self
            .blocks
            .get(&(address + block.bytes))
            .copied()
            .filter(|next| next.free && next.segment == block.segment)
        {
            self.blocks.remove(&(address + block.bytes));
            block.bytes += next.bytes;
        }
        if let Some((&before, previous)) = self.blocks.range(..address).next_back() {
            if previous.free
                && previous.segment == block.segment
                && before + previous.bytes == address
            {
                start = before;
                block.bytes += previous.bytes;
            }
        }
        self.blocks.insert(start, block);
    }
}
