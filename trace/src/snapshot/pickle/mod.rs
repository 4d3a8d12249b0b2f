//! A pickle reader for what `torch.cuda.memory._dump_snapshot` writes:
//! protocol 2 to 5, plain data only (dicts, lists, tuples, sets, strings,
//! numbers, bytes), no class instances.
//!
//! It is a loop over opcodes with an explicit stack, so nesting costs no
//! native stack, and every container lives in one arena named by index, so
//! a memo reference to a shared object is one more index to it, a
//! self-referencing list is harmless, and dropping the result never
//! recurses. Integers wider than 64 bits keep only their width; byte
//! strings keep only their length.

mod reader;
mod source;
mod store;

use std::collections::HashMap;
use std::io::BufRead;

use store::{Slot, Store};

use crate::budget::ReadBudget;

/// Why a pickle could not be read, and at which byte of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    /// The data ends inside an opcode or before STOP.
    #[error("truncated at byte {offset} (the pickle ends before its STOP opcode)")]
    Truncated {
        /// Bytes read.
        offset: u64,
    },
    /// The source could not be read or decompressed.
    #[error("cannot read at byte {offset}: {message}")]
    Io {
        /// Bytes read.
        offset: u64,
        /// The reader's message.
        message: String,
    },
    /// A PROTO opcode naming a protocol this reader does not take.
    #[error("pickle protocol {protocol} unsupported (need 2+)")]
    Protocol {
        /// The protocol.
        protocol: u8,
    },
    /// More bytes than the budget's decoded bytes.
    #[error("more than {limit_bytes} bytes of pickle")]
    TooLarge {
        /// The bound, bytes.
        limit_bytes: u64,
    },
    /// An opcode that is not part of pickle protocol 2 to 5.
    #[error("byte {offset}: unknown opcode 0x{opcode:02x}")]
    UnknownOpcode {
        /// Offset of the opcode.
        offset: u64,
        /// The byte.
        opcode: u8,
    },
    /// An opcode for something a memory snapshot never holds (objects,
    /// out-of-band buffers, protocol 0/1 text records).
    #[error(
        "byte {offset}: opcode {name} is not supported (a memory snapshot holds only plain data)"
    )]
    Unsupported {
        /// Offset of the opcode.
        offset: u64,
        /// The opcode's name in Python's pickletools.
        name: &'static str,
    },
    /// An opcode found the stack, the marks or the memo not as it needs.
    #[error("byte {offset}: {opcode}: {why}")]
    Malformed {
        /// Offset of the opcode.
        offset: u64,
        /// The opcode's name.
        opcode: &'static str,
        /// What was wrong.
        why: &'static str,
    },
    /// A bound of the [`ReadBudget`] was passed.
    #[error("byte {offset}: {what} (limit {limit})")]
    Limit {
        /// Bytes read.
        offset: u64,
        /// Which bound.
        what: &'static str,
        /// The bound.
        limit: u64,
        /// The bound is the memory ceiling (the budget's held bytes).
        memory: bool,
    },
}

/// One pickled value. Containers and strings are indices into [`Pickle`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// Python's None.
    None,
    /// A bool.
    Bool(bool),
    /// An int that fits in 64 signed bits.
    Int(i64),
    /// An int in `2^63..2^64`.
    UInt(u64),
    /// An int wider than 64 bits: only its width is kept.
    BigInt {
        /// Width in bytes as pickled.
        bytes: u64,
    },
    /// A float.
    Float(f64),
    /// A str, by index.
    Str(u32),
    /// A bytes or bytearray: only its length (bytes) is kept.
    Bytes(u64),
    /// A list, by index into the sequences.
    List(u32),
    /// A tuple, by index into the sequences.
    Tuple(u32),
    /// A set or frozenset, by index into the sequences.
    Set(u32),
    /// A dict, by index.
    Dict(u32),
}

/// A whole pickle: its root value and the store its values point into.
#[derive(Debug, Default)]
pub struct Pickle {
    root: Option<Slot>,
    store: Store,
    /// Per dict of more than [`INDEXED_PAIRS`] pairs, the positions of its
    /// str-keyed pairs sorted by the hash of the key (among equal hashes
    /// the last pair first), so a look-up costs a binary search and a
    /// comparison of candidates of the key's length, however many pairs a
    /// hostile dict holds, however long its keys and however often it is
    /// referenced.
    key_order: HashMap<u32, Box<[(u64, u32)]>>,
    /// Bytes of pickle read, up to its STOP.
    decoded_bytes: u64,
}

/// Dicts up to this many pairs are searched pair by pair.
const INDEXED_PAIRS: usize = 16;

/// The items of a list, tuple or set.
#[derive(Debug, Clone, Copy)]
pub struct Items<'a> {
    store: &'a Store,
    slots: &'a [Slot],
}

impl<'a> Items<'a> {
    /// How many.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// None at all.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The item at `index`.
    pub fn get(&self, index: usize) -> Option<Value> {
        self.slots.get(index).map(|&slot| self.store.value(slot))
    }

    /// Each item in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Value> + ExactSizeIterator + 'a {
        let store = self.store;
        self.slots.iter().map(move |&slot| store.value(slot))
    }

    /// No items (for a sequence left out).
    pub fn none(pickle: &'a Pickle) -> Items<'a> {
        Items {
            store: &pickle.store,
            slots: &[],
        }
    }
}

impl Pickle {
    /// Bytes of pickle read (after decompression), up to its STOP.
    pub fn decoded_bytes(&self) -> u64 {
        self.decoded_bytes
    }

    /// Bytes the read pickle holds in memory, as the reader counted them.
    pub fn held_bytes(&self) -> u64 {
        self.store.held_bytes()
    }

    /// The object the pickle holds.
    pub fn root(&self) -> Value {
        self.root.map_or(Value::None, |slot| self.store.value(slot))
    }

    /// The items of a list, tuple or set.
    pub fn items(&self, value: Value) -> Option<Items<'_>> {
        match value {
            Value::List(index) | Value::Tuple(index) | Value::Set(index) => {
                self.store.items(index).map(|slots| Items {
                    store: &self.store,
                    slots,
                })
            }
            _ => None,
        }
    }

    /// Which stored items a list, tuple or set has: lists of equal items
    /// may have the same (read a shared stack once by it).
    pub fn items_id(&self, value: Value) -> Option<u32> {
        match value {
            Value::List(index) | Value::Tuple(index) | Value::Set(index) => self.store.chunk(index),
            _ => None,
        }
    }

    /// The (key, value) pairs of a dict, in pickled order.
    pub fn pairs(
        &self,
        value: Value,
    ) -> Option<impl ExactSizeIterator<Item = (Value, Value)> + '_> {
        match value {
            Value::Dict(index) => self.store.dicts.get(index as usize).map(|pairs| {
                pairs
                    .iter()
                    .map(|&(key, value)| (self.store.value(key), self.store.value(value)))
            }),
            _ => None,
        }
    }

    /// Whether a value is a dict.
    pub fn is_dict(&self, value: Value) -> bool {
        matches!(value, Value::Dict(index) if (index as usize) < self.store.dicts.len())
    }

    /// The text of a str.
    pub fn text(&self, value: Value) -> Option<&str> {
        match value {
            Value::Str(index) => self.store.strings.get(index as usize).map(|text| &**text),
            _ => None,
        }
    }

    fn slot_text(&self, slot: Slot) -> Option<&str> {
        let index = slot.string_index()?;
        self.store.strings.get(index as usize).map(|text| &**text)
    }

    /// The value under the str key `key` of a dict (the last one, as Python
    /// keeps the last of repeated keys).
    pub fn get(&self, dict: Value, key: &str) -> Option<Value> {
        let Value::Dict(index) = dict else {
            return None;
        };
        let pairs = self.store.dicts.get(index as usize)?;
        let found = match self.key_order.get(&index) {
            Some(order) => {
                let hash = store::text_hash(key);
                let first = order.partition_point(|&(at_hash, _)| at_hash < hash);
                order[first..]
                    .iter()
                    .take_while(|&&(at_hash, _)| at_hash == hash)
                    .find(|&&(_, at)| self.slot_text(pairs[at as usize].0) == Some(key))
                    .map(|&(_, at)| pairs[at as usize].1)
            }
            None => pairs
                .iter()
                .rev()
                .find(|(name, _)| self.slot_text(*name) == Some(key))
                .map(|&(_, value)| value),
        };
        found.map(|slot| self.store.value(slot))
    }

    /// Index every large dict once the whole pickle is read (dicts may be
    /// filled after they were first shared, so not before). Each key's
    /// text is hashed once however many dicts use it.
    fn index_dicts(&mut self) {
        let mut hashes: HashMap<u32, u64> = HashMap::new();
        let mut key_order = HashMap::new();
        for (index, pairs) in self.store.dicts.iter().enumerate() {
            if pairs.len() <= INDEXED_PAIRS {
                continue;
            }
            let mut order: Vec<(u64, u32)> = (0..pairs.len() as u32)
                .filter_map(|at| {
                    let string = pairs[at as usize].0.string_index()?;
                    let hash = *hashes
                        .entry(string)
                        .or_insert_with(|| store::text_hash(&self.store.strings[string as usize]));
                    Some((hash, at))
                })
                .collect();
            // By hash, and among equal hashes the last pair first.
            order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            key_order.insert(index as u32, order.into_boxed_slice());
        }
        self.key_order = key_order;
    }

    /// The Python type name of a value, for messages.
    pub fn kind(value: Value) -> &'static str {
        match value {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::UInt(_) | Value::BigInt { .. } => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Set(_) => "set",
            Value::Dict(_) => "dict",
        }
    }
}

/// Read one pickle from `input`, within `budget`.
pub fn read(input: impl BufRead, budget: &ReadBudget) -> Result<Pickle, PickleError> {
    let mut pickle = reader::Reader::new(input, budget).run()?;
    pickle.index_dicts();
    Ok(pickle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: ReadBudget = ReadBudget {
        decoded_bytes: 64,
        stack_values: 8,
        marks: 2,
        objects: 16,
        memo_entries: 16,
        container_items: 32,
        ..ReadBudget::CEILING
    };
    const SNAPSHOT: ReadBudget = ReadBudget::CEILING;

    #[test]
    fn a_memoized_list_filled_after_it_was_shared_is_one_object() {
        // d = {}; l = []; d["a"] = l; d["b"] = l; l.append(7)
        let bytes = b"\x80\x04}\x94(\x8c\x01a\x94]\x94\x8c\x01b\x94h\x02uh\x02K\x07a0.";
        let pickle = read(&bytes[..], &SNAPSHOT).unwrap();
        let root = pickle.root();
        let a = pickle.get(root, "a").unwrap();
        assert_eq!(a, pickle.get(root, "b").unwrap());
        assert_eq!(
            pickle.items(a).unwrap().iter().collect::<Vec<_>>(),
            [Value::Int(7)]
        );
    }

    #[test]
    fn every_bound_is_an_error_at_a_byte() {
        let long = [&b"\x80\x04"[..], &b"N0".repeat(40), b"N."].concat();
        assert_eq!(
            read(&long[..], &TINY).unwrap_err(),
            PickleError::TooLarge { limit_bytes: 64 }
        );
        let deep = [&b"\x80\x04"[..], &[b']'; 9]].concat();
        assert!(matches!(
            read(&deep[..], &TINY),
            Err(PickleError::Limit {
                what: "too many values open at once (nesting too deep)",
                ..
            })
        ));
        let marks = b"\x80\x04(((";
        assert!(matches!(
            read(&marks[..], &TINY),
            Err(PickleError::Limit { offset: 4, .. })
        ));
        let objects = [&b"\x80\x04"[..], &b"]0".repeat(17)].concat();
        assert!(matches!(
            read(&objects[..], &TINY),
            Err(PickleError::Limit {
                what: "too many objects",
                ..
            })
        ));
        // A string longer than the data is truncation, found without
        // allocating its claimed length.
        let claims = b"\x80\x04\x8d\xff\xff\xff\x7f\x00\x00\x00\x00ab";
        assert!(matches!(
            read(&claims[..], &SNAPSHOT),
            Err(PickleError::Truncated { offset: 13 })
        ));
        assert_eq!(
            read(&b"\x80\x04h\x05."[..], &SNAPSHOT).unwrap_err(),
            PickleError::Malformed {
                offset: 2,
                opcode: "BINGET",
                why: "memo index never stored"
            }
        );
    }

    #[test]
    fn integers_keep_their_value_or_their_width() {
        let value = |bytes: &[u8]| read(bytes, &SNAPSHOT).unwrap().root();
        assert_eq!(value(b"\x80\x04J\xff\xff\xff\xff."), Value::Int(-1));
        assert_eq!(value(b"\x80\x04M\x00\x02."), Value::Int(512));
        assert_eq!(
            value(b"\x80\x04\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."),
            Value::UInt(u64::MAX)
        );
        assert_eq!(
            value(b"\x80\x04\x8a\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01."),
            Value::BigInt { bytes: 10 }
        );
    }
}
