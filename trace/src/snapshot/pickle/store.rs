//! How a read pickle's values are kept: eight bytes a value, and the
//! items of lists, tuples and sets in chunks that lists of equal items
//! share (a snapshot's per-entry frames lists repeat a few hundred stacks
//! millions of times), copied only when one of them changes.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::Value;

/// A value as stored: a 4-bit kind and a 60-bit payload (an integer that
/// fits, a length, or an index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Slot(u64);

const SHIFT: u32 = 60;
const PAYLOAD: u64 = (1 << SHIFT) - 1;

const NONE: u64 = 0;
const FALSE: u64 = 1;
const TRUE: u64 = 2;
/// An integer of 60 signed bits, in the payload.
const INT: u64 = 3;
/// A value kept in `wide` (a wider integer, a float), by index.
const WIDE: u64 = 4;
const STR: u64 = 5;
/// A bytes object: its length.
const BYTES: u64 = 6;
const LIST: u64 = 7;
const TUPLE: u64 = 8;
const SET: u64 = 9;
const DICT: u64 = 10;

impl Slot {
    pub(super) const NONE: Slot = Slot(NONE << SHIFT);

    fn new(kind: u64, payload: u64) -> Slot {
        Slot((kind << SHIFT) | (payload & PAYLOAD))
    }

    fn kind(self) -> u64 {
        self.0 >> SHIFT
    }

    fn payload(self) -> u64 {
        self.0 & PAYLOAD
    }

    fn index(self) -> u32 {
        self.payload() as u32
    }

    pub(super) fn bool(value: bool) -> Slot {
        Slot::new(if value { TRUE } else { FALSE }, 0)
    }

    pub(super) fn bytes(length: u64) -> Slot {
        Slot::new(BYTES, length)
    }

    pub(super) fn string(index: u32) -> Slot {
        Slot::new(STR, u64::from(index))
    }

    pub(super) fn list(index: u32) -> Slot {
        Slot::new(LIST, u64::from(index))
    }

    pub(super) fn tuple(index: u32) -> Slot {
        Slot::new(TUPLE, u64::from(index))
    }

    pub(super) fn set(index: u32) -> Slot {
        Slot::new(SET, u64::from(index))
    }

    pub(super) fn dict(index: u32) -> Slot {
        Slot::new(DICT, u64::from(index))
    }

    /// The list this slot names (a set's items are added the same way).
    pub(super) fn list_or_set(self) -> Option<u32> {
        matches!(self.kind(), LIST | SET).then(|| self.index())
    }

    /// A set.
    pub(super) fn is_set(self) -> bool {
        self.kind() == SET
    }

    /// The dict this slot names.
    pub(super) fn dict_index(self) -> Option<u32> {
        (self.kind() == DICT).then(|| self.index())
    }

    /// The str this slot names.
    pub(super) fn string_index(self) -> Option<u32> {
        (self.kind() == STR).then(|| self.index())
    }
}

/// The values of a pickle, as [`super::Pickle`] holds them.
#[derive(Debug)]
pub(super) struct Store {
    pub(super) wide: Vec<Value>,
    pub(super) strings: Vec<Box<str>>,
    /// Each list, tuple or set: its chunk.
    pub(super) sequences: Vec<u32>,
    pub(super) chunks: Vec<Vec<Slot>>,
    /// Per chunk: whether other sequences may share it (it is interned),
    /// so a change copies it first.
    shared: Vec<bool>,
    /// Interned chunks by the hash of their items.
    interned: HashMap<u64, u32>,
    pub(super) dicts: Vec<Vec<(Slot, Slot)>>,
    /// Bytes held by the chunks', dicts' and strings' own heap blocks.
    inner_bytes: u64,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            wide: Vec::new(),
            strings: Vec::new(),
            sequences: Vec::new(),
            // Chunk 0: no items, shared by every empty sequence.
            chunks: vec![Vec::new()],
            shared: vec![true],
            interned: HashMap::new(),
            dicts: Vec::new(),
            inner_bytes: 0,
        }
    }
}

fn capacity_bytes<T>(vec: &Vec<T>) -> u64 {
    (vec.capacity() * size_of::<T>()) as u64
}

impl Store {
    /// Bytes held: every vector's capacity, its items' heap blocks
    /// included, and the interning table.
    pub(super) fn held_bytes(&self) -> u64 {
        self.inner_bytes
            + capacity_bytes(&self.wide)
            + capacity_bytes(&self.strings)
            + capacity_bytes(&self.sequences)
            + capacity_bytes(&self.chunks)
            + capacity_bytes(&self.shared)
            + capacity_bytes(&self.dicts)
            + (self.interned.capacity() * 16) as u64
    }

    /// Objects (strings and containers) made.
    pub(super) fn objects(&self) -> u64 {
        (self.strings.len() + self.sequences.len() + self.dicts.len()) as u64
    }

    pub(super) fn int(&mut self, value: i64) -> Slot {
        if (-(1i64 << (SHIFT - 1))..(1i64 << (SHIFT - 1))).contains(&value) {
            Slot::new(INT, value as u64)
        } else {
            self.wide(Value::Int(value))
        }
    }

    pub(super) fn wide(&mut self, value: Value) -> Slot {
        self.wide.push(value);
        Slot::new(WIDE, (self.wide.len() - 1) as u64)
    }

    pub(super) fn string(&mut self, text: Box<str>) -> Slot {
        self.inner_bytes += text.len() as u64;
        self.strings.push(text);
        Slot::string((self.strings.len() - 1) as u32)
    }

    pub(super) fn new_dict(&mut self) -> Slot {
        self.dicts.push(Vec::new());
        Slot::dict((self.dicts.len() - 1) as u32)
    }

    pub(super) fn extend_dict(
        &mut self,
        dict: u32,
        pairs: impl ExactSizeIterator<Item = (Slot, Slot)>,
    ) {
        let target = &mut self.dicts[dict as usize];
        let before = capacity_bytes(target);
        target.reserve_exact(pairs.len());
        target.extend(pairs);
        self.inner_bytes += capacity_bytes(target) - before;
    }

    /// A new sequence holding `items`.
    pub(super) fn new_sequence(&mut self, items: Vec<Slot>) -> u32 {
        let chunk = self.intern(items);
        self.sequences.push(chunk);
        (self.sequences.len() - 1) as u32
    }

    /// Add `items` to sequence `index`.
    pub(super) fn extend(&mut self, index: u32, items: Vec<Slot>) {
        let chunk = self.sequences[index as usize];
        if items.is_empty() {
            return;
        }
        if chunk == 0 {
            self.sequences[index as usize] = self.intern(items);
        } else if self.shared[chunk as usize] {
            let mut copy = Vec::with_capacity(self.chunks[chunk as usize].len() + items.len());
            copy.extend_from_slice(&self.chunks[chunk as usize]);
            copy.extend(items);
            self.sequences[index as usize] = self.push_chunk(copy, false);
        } else {
            let target = &mut self.chunks[chunk as usize];
            let before = capacity_bytes(target);
            target.extend(items);
            self.inner_bytes += capacity_bytes(target) - before;
        }
    }

    fn push_chunk(&mut self, mut items: Vec<Slot>, shared: bool) -> u32 {
        items.shrink_to_fit();
        self.inner_bytes += capacity_bytes(&items);
        self.chunks.push(items);
        self.shared.push(shared);
        (self.chunks.len() - 1) as u32
    }

    /// The chunk holding `items`: one already holding equal items, else a
    /// new one others may share.
    fn intern(&mut self, items: Vec<Slot>) -> u32 {
        if items.is_empty() {
            return 0;
        }
        let mut hasher = DefaultHasher::new();
        items.hash(&mut hasher);
        let hash = hasher.finish();
        if let Some(&chunk) = self.interned.get(&hash) {
            if self.chunks[chunk as usize] == items {
                return chunk;
            }
            // Another chunk has the hash: this one is kept unshared.
            return self.push_chunk(items, false);
        }
        let chunk = self.push_chunk(items, true);
        self.interned.insert(hash, chunk);
        chunk
    }

    /// The value a slot holds.
    pub(super) fn value(&self, slot: Slot) -> Value {
        let index = slot.index();
        match slot.kind() {
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            INT => Value::Int(((slot.payload() << (64 - SHIFT)) as i64) >> (64 - SHIFT)),
            WIDE => self
                .wide
                .get(index as usize)
                .copied()
                .unwrap_or(Value::None),
            STR => Value::Str(index),
            BYTES => Value::Bytes(slot.payload()),
            LIST => Value::List(index),
            TUPLE => Value::Tuple(index),
            SET => Value::Set(index),
            DICT => Value::Dict(index),
            _ => Value::None,
        }
    }

    /// The items of a sequence.
    pub(super) fn items(&self, index: u32) -> Option<&[Slot]> {
        let chunk = *self.sequences.get(index as usize)?;
        self.chunks.get(chunk as usize).map(Vec::as_slice)
    }

    /// The chunk of a sequence: sequences of equal items share one.
    pub(super) fn chunk(&self, index: u32) -> Option<u32> {
        self.sequences.get(index as usize).copied()
    }
}

/// A hash of a str, for the dict index.
pub(super) fn text_hash(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_of_60_bits_stay_in_the_slot() {
        let mut store = Store::default();
        for value in [
            0,
            -1,
            1 << 58,
            -(1 << 59),
            (1 << 59) - 1,
            i64::MAX,
            i64::MIN,
        ] {
            let slot = store.int(value);
            assert_eq!(store.value(slot), Value::Int(value));
        }
        assert_eq!(store.wide.len(), 2);
    }

    #[test]
    fn equal_lists_share_a_chunk_until_one_changes() {
        let mut store = Store::default();
        let items = vec![Slot::bool(true), Slot::NONE];
        let a = store.new_sequence(Vec::new());
        let b = store.new_sequence(Vec::new());
        store.extend(a, items.clone());
        store.extend(b, items.clone());
        assert_eq!(store.chunk(a), store.chunk(b));
        store.extend(b, vec![Slot::NONE]);
        assert_ne!(store.chunk(a), store.chunk(b));
        assert_eq!(store.items(a).unwrap(), &items[..]);
        assert_eq!(store.items(b).unwrap().len(), 3);
        store.extend(b, vec![Slot::NONE]);
        assert_eq!(store.items(b).unwrap().len(), 4);
    }
}
