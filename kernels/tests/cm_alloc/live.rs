//! The blocks the lanes hold, by address: a block inserted over one still
//! held is the allocator handing out a byte twice.

use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Default)]
pub struct Live(Mutex<BTreeMap<u64, u64>>);

impl Live {
    /// Records `bytes` held at `address`; an error if they overlap a block
    /// held now.
    pub fn insert(&self, address: u64, bytes: u64) -> Result<(), String> {
        let mut live = self.0.lock().unwrap();
        if let Some((&a, &n)) = live.range(..=address).next_back() {
            if a + n > address {
                return Err(format!("{address:#x}+{bytes} overlaps {a:#x}+{n}"));
            }
        }
        if let Some((&a, _)) = live.range(address..).next() {
            if address + bytes > a {
                return Err(format!("{address:#x}+{bytes} overlaps {a:#x}"));
            }
        }
        live.insert(address, bytes);
        Ok(())
    }

    /// The block at `address` is about to be freed.
    pub fn remove(&self, address: u64) {
        self.0.lock().unwrap().remove(&address);
    }
}
