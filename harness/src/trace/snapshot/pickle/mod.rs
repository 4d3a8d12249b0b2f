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

use std::io::BufRead;

/// What the reader accepts before it gives up.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most bytes of pickle read (after decompression).
    pub max_bytes: u64,
    /// Most values on the stack at once: how deep an object may nest.
    pub max_stack: usize,
    /// Most open MARKs at once.
    pub max_marks: usize,
    /// Most containers and strings in the whole pickle.
    pub max_objects: usize,
}

impl Limits {
    /// Bounds well above any snapshot PyTorch writes: 16 GiB of pickle,
    /// 1,000,000 open values, 1,000 open marks, 200,000,000 objects.
    pub const SNAPSHOT: Limits = Limits {
        max_bytes: 16 << 30,
        max_stack: 1_000_000,
        max_marks: 1_000,
        max_objects: 200_000_000,
    };
}

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
    /// A bound of [`Limits`] was passed.
    #[error("byte {offset}: {what} (limit {limit})")]
    Limit {
        /// Bytes read.
        offset: u64,
        /// Which bound.
        what: &'static str,
        /// The bound.
        limit: u64,
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

/// A whole pickle: its root value and the arena its values point into.
#[derive(Debug, Default)]
pub struct Pickle {
    root: Option<Value>,
    strings: Vec<Box<str>>,
    sequences: Vec<Vec<Value>>,
    dicts: Vec<Vec<(Value, Value)>>,
}

impl Pickle {
    /// The object the pickle holds.
    pub fn root(&self) -> Value {
        self.root.unwrap_or(Value::None)
    }

    /// The items of a list, tuple or set.
    pub fn items(&self, value: Value) -> Option<&[Value]> {
        match value {
            Value::List(index) | Value::Tuple(index) | Value::Set(index) => {
                self.sequences.get(index as usize).map(Vec::as_slice)
            }
            _ => None,
        }
    }

    /// The (key, value) pairs of a dict, in pickled order.
    pub fn pairs(&self, value: Value) -> Option<&[(Value, Value)]> {
        match value {
            Value::Dict(index) => self.dicts.get(index as usize).map(Vec::as_slice),
            _ => None,
        }
    }

    /// The text of a str.
    pub fn text(&self, value: Value) -> Option<&str> {
        match value {
            Value::Str(index) => self.strings.get(index as usize).map(|text| &**text),
            _ => None,
        }
    }

    /// The value under the str key `key` of a dict (the last one, as Python
    /// keeps the last of repeated keys).
    pub fn get(&self, dict: Value, key: &str) -> Option<Value> {
        self.pairs(dict)?
            .iter()
            .rev()
            .find(|(name, _)| self.text(*name) == Some(key))
            .map(|&(_, value)| value)
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

/// Read one pickle from `input`, within `limits`.
pub fn read(input: impl BufRead, limits: Limits) -> Result<Pickle, PickleError> {
    reader::Reader::new(input, limits).run()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: Limits = Limits {
        max_bytes: 64,
        max_stack: 8,
        max_marks: 2,
        max_objects: 16,
    };

    #[test]
    fn a_memoized_list_filled_after_it_was_shared_is_one_object() {
        // d = {}; l = []; d["a"] = l; d["b"] = l; l.append(7)
        let bytes = b"\x80\x04}\x94(\x8c\x01a\x94]\x94\x8c\x01b\x94h\x02uh\x02K\x07a0.";
        let pickle = read(&bytes[..], Limits::SNAPSHOT).unwrap();
        let root = pickle.root();
        let a = pickle.get(root, "a").unwrap();
        assert_eq!(a, pickle.get(root, "b").unwrap());
        assert_eq!(pickle.items(a), Some(&[Value::Int(7)][..]));
    }

    #[test]
    fn every_bound_is_an_error_at_a_byte() {
        let long = [&b"\x80\x04"[..], &b"N0".repeat(40), b"N."].concat();
        assert!(matches!(
            read(&long[..], TINY),
            Err(PickleError::Limit {
                what: "the pickle is larger than the reader accepts",
                ..
            })
        ));
        let deep = [&b"\x80\x04"[..], &[b']'; 9]].concat();
        assert!(matches!(
            read(&deep[..], TINY),
            Err(PickleError::Limit {
                what: "too many values open at once (nesting too deep)",
                ..
            })
        ));
        let marks = b"\x80\x04(((";
        assert!(matches!(
            read(&marks[..], TINY),
            Err(PickleError::Limit { offset: 4, .. })
        ));
        let objects = [&b"\x80\x04"[..], &b"]0".repeat(17)].concat();
        assert!(matches!(
            read(&objects[..], TINY),
            Err(PickleError::Limit {
                what: "too many objects",
                ..
            })
        ));
        // A string longer than the data is truncation, found without
        // allocating its claimed length.
        let claims = b"\x80\x04\x8d\xff\xff\xff\xff\x00\x00\x00\x00ab";
        assert!(matches!(
            read(&claims[..], Limits::SNAPSHOT),
            Err(PickleError::Truncated { offset: 13 })
        ));
        assert_eq!(
            read(&b"\x80\x04h\x05."[..], Limits::SNAPSHOT).unwrap_err(),
            PickleError::Malformed {
                offset: 2,
                opcode: "BINGET",
                why: "memo index never stored"
            }
        );
    }

    #[test]
    fn integers_keep_their_value_or_their_width() {
        let value = |bytes: &[u8]| read(bytes, Limits::SNAPSHOT).unwrap().root();
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
