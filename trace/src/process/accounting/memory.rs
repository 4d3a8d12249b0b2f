//! The records of memory the program holds: allocations and frees (device,
//! managed, stream-ordered, pinned host), and VMM reservations, physical
//! handles and mappings.

use std::collections::hash_map::Entry;

use super::{Accounting, Block, call_allocating};
use crate::event::Call;

impl Accounting {
    pub(super) fn allocated(&mut self, call: Call, ptr: u64, size: u64, caller: u32, result: i32) {
        if result != 0 {
            self.failed(result);
            return;
        }
        self.counts.allocations += 1;
        let block = Block { size, caller, call };
        if call.is_host() {
            if let Some(old) = self.host.insert(ptr, block) {
                self.live_host_bytes -= old.size;
                self.caller(old.caller).host_bytes -= old.size;
            }
            self.live_host_bytes += size;
            self.caller(caller).host_bytes += size;
        } else {
            if let Some(old) = self.live.insert(ptr, block) {
                // The driver handed out a live pointer again: its free went
                // by unseen. The new block replaces it.
                self.live_device_bytes -= old.size;
                self.remove_device(old);
            }
            self.live_device_bytes += size;
            self.add_device(block);
        }
    }

    pub(super) fn freed(&mut self, call: Call, ptr: u64) {
        self.counts.frees += 1;
        let table = if call.is_host() {
            &mut self.host
        } else {
            &mut self.live
        };
        let Some(block) = table.remove(&ptr) else {
            self.counts.unknown_frees += 1;
            return;
        };
        self.last_freed = Some((ptr, block));
        if call.is_host() {
            self.live_host_bytes -= block.size;
            self.caller(block.caller).host_bytes -= block.size;
        } else {
            self.live_device_bytes -= block.size;
            self.remove_device(block);
        }
    }

    /// The size and calling library of the live block a free of `ptr` by
    /// `call` would release: what a `free-failed` record must carry.
    pub fn block_of(&self, call: Call, ptr: u64) -> Option<(u64, u32)> {
        let table = if call.is_host() {
            &self.host
        } else {
            &self.live
        };
        table.get(&ptr).map(|block| (block.size, block.caller))
    }

    pub(super) fn free_failed(&mut self, call: Call, ptr: u64, size: u64, caller: u32) {
        // The free did not happen: the block is live again, made by the
        // call that made it (a stream-ordered free of a plain allocation
        // stays a plain allocation), where the free just before saw it.
        let allocating = match self.last_freed.take() {
            Some((freed, block)) if freed == ptr => block.call,
            _ => call_allocating(call),
        };
        self.counts.frees -= 1;
        self.allocated(allocating, ptr, size, caller, 0);
        self.counts.allocations -= 1;
    }

    pub(super) fn reserved(&mut self, ptr: u64, size: u64, result: i32) {
        // A second reservation at a live start (a driver refuses it; a log
        // may still say it) keeps the first.
        if let (0, Entry::Vacant(slot)) = (result, self.reserved.entry(ptr)) {
            slot.insert(size);
            self.reserved_bytes += size;
        }
    }

    pub(super) fn address_freed(&mut self, ptr: u64) {
        if let Some(size) = self.reserved.remove(&ptr) {
            self.reserved_bytes -= size;
        }
    }

    pub(super) fn created(
        &mut self,
        handle: u64,
        size: u64,
        device: i32,
        caller: u32,
        result: i32,
    ) {
        if result != 0 {
            self.failed(result);
            return;
        }
        self.counts.allocations += 1;
        let block = Block {
            size,
            caller,
            call: Call::MemCreate,
        };
        if device < 0 {
            if let Some(old) = self.host.insert(handle, block) {
                self.live_host_bytes -= old.size;
                self.caller(old.caller).host_bytes -= old.size;
            }
            self.live_host_bytes += size;
            self.caller(caller).host_bytes += size;
        } else {
            if let Some(old) = self.handles.insert(handle, block) {
                // A live handle made again: its release went by unseen.
                self.created_bytes -= old.size;
                self.remove_device(old);
            }
            self.created_bytes += size;
            self.add_device(block);
        }
    }

    pub(super) fn released(&mut self, handle: u64) {
        self.counts.frees += 1;
        if let Some(block) = self.handles.remove(&handle) {
            self.created_bytes -= block.size;
            self.remove_device(block);
        } else if let Some(block) = self.host.remove(&handle) {
            self.live_host_bytes -= block.size;
            self.caller(block.caller).host_bytes -= block.size;
        } else {
            self.counts.unknown_frees += 1;
        }
    }

    pub(super) fn mapped(&mut self, ptr: u64, size: u64, result: i32) {
        // A second mapping at a mapped start keeps the first, as above.
        if let (0, std::collections::btree_map::Entry::Vacant(slot)) =
            (result, self.mappings.entry(ptr))
        {
            slot.insert(size);
            self.mapped_bytes += size;
        }
    }

    pub(super) fn unmapped(&mut self, ptr: u64, size: u64) {
        let end = ptr.saturating_add(size);
        let inside: Vec<u64> = self
            .mappings
            .range(ptr..end)
            .map(|(&start, _)| start)
            .collect();
        for start in inside {
            if let Some(size) = self.mappings.remove(&start) {
                self.mapped_bytes -= size;
            }
        }
    }
}
