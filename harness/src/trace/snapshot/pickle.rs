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

use std::collections::HashMap;
use std::io::{self, BufRead, Read};

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
    Reader {
        input: Source {
            inner: input,
            offset: 0,
            max_bytes: limits.max_bytes,
        },
        limits,
        pickle: Pickle::default(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        sparse_memo: HashMap::new(),
    }
    .run()
}

/// The bytes being read, counted against the size bound.
struct Source<R> {
    inner: R,
    offset: u64,
    max_bytes: u64,
}

impl<R: BufRead> Source<R> {
    fn io_error(&self, err: &io::Error) -> PickleError {
        if err.kind() == io::ErrorKind::UnexpectedEof {
            PickleError::Truncated {
                offset: self.offset,
            }
        } else {
            PickleError::Io {
                offset: self.offset,
                message: err.to_string(),
            }
        }
    }

    fn reserve(&mut self, bytes: u64) -> Result<(), PickleError> {
        match self.offset.checked_add(bytes) {
            Some(end) if end <= self.max_bytes => Ok(()),
            _ => Err(PickleError::Limit {
                offset: self.offset,
                what: "the pickle is larger than the reader accepts",
                limit: self.max_bytes,
            }),
        }
    }

    fn byte(&mut self) -> Result<u8, PickleError> {
        self.reserve(1)?;
        let buffer = match self.inner.fill_buf() {
            Ok(buffer) => buffer,
            Err(err) => return Err(self.io_error(&err)),
        };
        let Some(&byte) = buffer.first() else {
            return Err(PickleError::Truncated {
                offset: self.offset,
            });
        };
        self.inner.consume(1);
        self.offset += 1;
        Ok(byte)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        self.reserve(N as u64)?;
        let mut bytes = [0u8; N];
        if let Err(err) = self.inner.read_exact(&mut bytes) {
            return Err(self.io_error(&err));
        }
        self.offset += N as u64;
        Ok(bytes)
    }

    /// `length` bytes, never allocating ahead of what the input really holds.
    fn bytes(&mut self, length: u64) -> Result<Vec<u8>, PickleError> {
        self.reserve(length)?;
        let mut bytes = Vec::with_capacity(length.min(1 << 16) as usize);
        let read = (&mut self.inner).take(length).read_to_end(&mut bytes);
        self.offset += bytes.len() as u64;
        match read {
            Err(err) => Err(self.io_error(&err)),
            Ok(_) if (bytes.len() as u64) < length => Err(PickleError::Truncated {
                offset: self.offset,
            }),
            Ok(_) => Ok(bytes),
        }
    }

    fn skip(&mut self, length: u64) -> Result<(), PickleError> {
        self.reserve(length)?;
        let copied = io::copy(&mut (&mut self.inner).take(length), &mut io::sink());
        match copied {
            Err(err) => Err(self.io_error(&err)),
            Ok(copied) => {
                self.offset += copied;
                if copied < length {
                    Err(PickleError::Truncated {
                        offset: self.offset,
                    })
                } else {
                    Ok(())
                }
            }
        }
    }
}

struct Reader<R> {
    input: Source<R>,
    limits: Limits,
    pickle: Pickle,
    stack: Vec<Value>,
    marks: Vec<usize>,
    /// Memo slots written in order (MEMOIZE, or BINPUT at the next index).
    memo: Vec<Value>,
    /// Memo slots written out of order, so a hostile index costs no more
    /// than one entry.
    sparse_memo: HashMap<u32, Value>,
}

/// Python's `pickletools` name of an opcode this reader refuses.
fn unsupported_name(opcode: u8) -> Option<&'static str> {
    Some(match opcode {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x82..=0x84 => "EXT",
        b'P' | b'Q' => "PERSID",
        0x97 | 0x98 => "out-of-band buffer",
        b'I' | b'L' | b'F' | b'S' | b'V' | b'p' | b'g' => "protocol 0 text record",
        _ => return None,
    })
}

impl<R: BufRead> Reader<R> {
    fn malformed(&self, at: u64, opcode: &'static str, why: &'static str) -> PickleError {
        PickleError::Malformed {
            offset: at,
            opcode,
            why,
        }
    }

    fn push(&mut self, value: Value) -> Result<(), PickleError> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "too many values open at once (nesting too deep)",
                limit: self.limits.max_stack as u64,
            });
        }
        self.stack.push(value);
        Ok(())
    }

    fn pop(&mut self, at: u64, opcode: &'static str) -> Result<Value, PickleError> {
        self.stack
            .pop()
            .ok_or_else(|| self.malformed(at, opcode, "the stack is empty"))
    }

    fn check_objects(&self) -> Result<(), PickleError> {
        let count =
            self.pickle.strings.len() + self.pickle.sequences.len() + self.pickle.dicts.len();
        if count >= self.limits.max_objects {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "too many objects",
                limit: self.limits.max_objects as u64,
            });
        }
        Ok(())
    }

    fn new_sequence(&mut self, items: Vec<Value>) -> Result<u32, PickleError> {
        self.check_objects()?;
        self.pickle.sequences.push(items);
        Ok((self.pickle.sequences.len() - 1) as u32)
    }

    fn new_dict(&mut self, pairs: Vec<(Value, Value)>) -> Result<u32, PickleError> {
        self.check_objects()?;
        self.pickle.dicts.push(pairs);
        Ok((self.pickle.dicts.len() - 1) as u32)
    }

    fn string(&mut self, length: u64) -> Result<Value, PickleError> {
        self.check_objects()?;
        let bytes = self.input.bytes(length)?;
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        };
        self.pickle.strings.push(text.into_boxed_str());
        Ok(Value::Str((self.pickle.strings.len() - 1) as u32))
    }

    /// The values above the last MARK, removing the mark.
    fn pop_mark(&mut self, at: u64, opcode: &'static str) -> Result<Vec<Value>, PickleError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.malformed(at, opcode, "no MARK is open"))?;
        if mark > self.stack.len() {
            return Err(self.malformed(at, opcode, "a MARK lies above the stack"));
        }
        Ok(self.stack.split_off(mark))
    }

    fn memo_put(&mut self, index: u32, at: u64, opcode: &'static str) -> Result<(), PickleError> {
        let value = *self
            .stack
            .last()
            .ok_or_else(|| self.malformed(at, opcode, "the stack is empty"))?;
        let slot = index as usize;
        if slot < self.memo.len() {
            self.memo[slot] = value;
        } else if slot == self.memo.len() {
            self.memo.push(value);
        } else {
            if self.sparse_memo.len() >= self.limits.max_objects {
                return Err(PickleError::Limit {
                    offset: at,
                    what: "too many memo entries",
                    limit: self.limits.max_objects as u64,
                });
            }
            self.sparse_memo.insert(index, value);
        }
        Ok(())
    }

    fn memo_get(&mut self, index: u32, at: u64, opcode: &'static str) -> Result<(), PickleError> {
        let value = self
            .memo
            .get(index as usize)
            .or_else(|| self.sparse_memo.get(&index))
            .copied()
            .ok_or_else(|| self.malformed(at, opcode, "memo index never stored"))?;
        self.push(value)
    }

    fn append(
        &mut self,
        target: Value,
        items: Vec<Value>,
        at: u64,
        opcode: &'static str,
    ) -> Result<(), PickleError> {
        match target {
            Value::List(index) => {
                self.pickle.sequences[index as usize].extend(items);
                Ok(())
            }
            _ => Err(self.malformed(at, opcode, "the target is not a list")),
        }
    }

    fn set_items(
        &mut self,
        target: Value,
        items: Vec<Value>,
        at: u64,
        opcode: &'static str,
    ) -> Result<(), PickleError> {
        let Value::Dict(index) = target else {
            return Err(self.malformed(at, opcode, "the target is not a dict"));
        };
        if items.len() % 2 != 0 {
            return Err(self.malformed(at, opcode, "an odd number of keys and values"));
        }
        let pairs = &mut self.pickle.dicts[index as usize];
        pairs.reserve_exact(items.len() / 2);
        let mut items = items.into_iter();
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            pairs.push((key, value));
        }
        Ok(())
    }

    fn long(&mut self, length: u64) -> Result<Value, PickleError> {
        if length > 9 {
            self.input.skip(length)?;
            return Ok(Value::BigInt { bytes: length });
        }
        let bytes = self.input.bytes(length)?;
        let negative = bytes.last().is_some_and(|&top| top & 0x80 != 0);
        let mut wide = [if negative { 0xff } else { 0 }; 16];
        wide[..bytes.len()].copy_from_slice(&bytes);
        let value = i128::from_le_bytes(wide);
        Ok(if let Ok(small) = i64::try_from(value) {
            Value::Int(small)
        } else if let Ok(unsigned) = u64::try_from(value) {
            Value::UInt(unsigned)
        } else {
            Value::BigInt { bytes: length }
        })
    }

    fn run(mut self) -> Result<Pickle, PickleError> {
        loop {
            let at = self.input.offset;
            let opcode = self.input.byte()?;
            match opcode {
                0x80 => {
                    let protocol = self.input.byte()?;
                    if !(2..=5).contains(&protocol) {
                        return Err(self.malformed(at, "PROTO", "protocol is not 2 to 5"));
                    }
                }
                0x95 => {
                    self.input.array::<8>()?;
                }
                b'.' => {
                    let root = self.pop(at, "STOP")?;
                    self.pickle.root = Some(root);
                    return Ok(self.pickle);
                }
                b'(' => {
                    if self.marks.len() >= self.limits.max_marks {
                        return Err(PickleError::Limit {
                            offset: at,
                            what: "too many MARKs open at once (nesting too deep)",
                            limit: self.limits.max_marks as u64,
                        });
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    self.pop(at, "POP")?;
                }
                b'1' => {
                    self.pop_mark(at, "POP_MARK")?;
                }
                b'2' => {
                    let top = *self
                        .stack
                        .last()
                        .ok_or_else(|| self.malformed(at, "DUP", "the stack is empty"))?;
                    self.push(top)?;
                }
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'J' => {
                    let value = i32::from_le_bytes(self.input.array()?);
                    self.push(Value::Int(i64::from(value)))?;
                }
                b'K' => {
                    let value = self.input.byte()?;
                    self.push(Value::Int(i64::from(value)))?;
                }
                b'M' => {
                    let value = u16::from_le_bytes(self.input.array()?);
                    self.push(Value::Int(i64::from(value)))?;
                }
                0x8a => {
                    let length = u64::from(self.input.byte()?);
                    let value = self.long(length)?;
                    self.push(value)?;
                }
                0x8b => {
                    let length = i32::from_le_bytes(self.input.array()?);
                    if length < 0 {
                        return Err(self.malformed(at, "LONG4", "negative length"));
                    }
                    let value = self.long(length as u64)?;
                    self.push(value)?;
                }
                b'G' => {
                    let value = f64::from_be_bytes(self.input.array()?);
                    self.push(Value::Float(value))?;
                }
                0x8c => {
                    let length = u64::from(self.input.byte()?);
                    let value = self.string(length)?;
                    self.push(value)?;
                }
                b'X' => {
                    let length = u64::from(u32::from_le_bytes(self.input.array()?));
                    let value = self.string(length)?;
                    self.push(value)?;
                }
                0x8d => {
                    let length = u64::from_le_bytes(self.input.array()?);
                    let value = self.string(length)?;
                    self.push(value)?;
                }
                b'C' | b'U' => {
                    let length = u64::from(self.input.byte()?);
                    self.input.skip(length)?;
                    self.push(Value::Bytes(length))?;
                }
                b'B' | b'T' => {
                    let length = u64::from(u32::from_le_bytes(self.input.array()?));
                    self.input.skip(length)?;
                    self.push(Value::Bytes(length))?;
                }
                0x8e | 0x96 => {
                    let length = u64::from_le_bytes(self.input.array()?);
                    self.input.skip(length)?;
                    self.push(Value::Bytes(length))?;
                }
                b']' => {
                    let index = self.new_sequence(Vec::new())?;
                    self.push(Value::List(index))?;
                }
                b')' => {
                    let index = self.new_sequence(Vec::new())?;
                    self.push(Value::Tuple(index))?;
                }
                b'}' => {
                    let index = self.new_dict(Vec::new())?;
                    self.push(Value::Dict(index))?;
                }
                0x8f => {
                    let index = self.new_sequence(Vec::new())?;
                    self.push(Value::Set(index))?;
                }
                b'l' | b't' | 0x91 => {
                    let name = match opcode {
                        b'l' => "LIST",
                        b't' => "TUPLE",
                        _ => "FROZENSET",
                    };
                    let items = self.pop_mark(at, name)?;
                    let index = self.new_sequence(items)?;
                    self.push(match opcode {
                        b'l' => Value::List(index),
                        b't' => Value::Tuple(index),
                        _ => Value::Set(index),
                    })?;
                }
                0x85..=0x87 => {
                    let count = usize::from(opcode - 0x84);
                    if self.stack.len() < count {
                        return Err(self.malformed(at, "TUPLEn", "too few values on the stack"));
                    }
                    let items = self.stack.split_off(self.stack.len() - count);
                    let index = self.new_sequence(items)?;
                    self.push(Value::Tuple(index))?;
                }
                b'd' => {
                    let items = self.pop_mark(at, "DICT")?;
                    let index = self.new_dict(Vec::new())?;
                    self.set_items(Value::Dict(index), items, at, "DICT")?;
                    self.push(Value::Dict(index))?;
                }
                b'a' => {
                    let item = self.pop(at, "APPEND")?;
                    let target = *self
                        .stack
                        .last()
                        .ok_or_else(|| self.malformed(at, "APPEND", "no list below the item"))?;
                    self.append(target, vec![item], at, "APPEND")?;
                }
                b'e' | 0x90 => {
                    let name = if opcode == b'e' {
                        "APPENDS"
                    } else {
                        "ADDITEMS"
                    };
                    let items = self.pop_mark(at, name)?;
                    let target = *self
                        .stack
                        .last()
                        .ok_or_else(|| self.malformed(at, name, "no container below the MARK"))?;
                    let target = match target {
                        Value::Set(index) if opcode == 0x90 => Value::List(index),
                        other if opcode == 0x90 => {
                            let _ = other;
                            return Err(self.malformed(at, name, "the target is not a set"));
                        }
                        other => other,
                    };
                    self.append(target, items, at, name)?;
                }
                b's' => {
                    let value = self.pop(at, "SETITEM")?;
                    let key = self.pop(at, "SETITEM")?;
                    let target = *self
                        .stack
                        .last()
                        .ok_or_else(|| self.malformed(at, "SETITEM", "no dict below the pair"))?;
                    self.set_items(target, vec![key, value], at, "SETITEM")?;
                }
                b'u' => {
                    let items = self.pop_mark(at, "SETITEMS")?;
                    let target = *self
                        .stack
                        .last()
                        .ok_or_else(|| self.malformed(at, "SETITEMS", "no dict below the MARK"))?;
                    self.set_items(target, items, at, "SETITEMS")?;
                }
                0x94 => {
                    let index = u32::try_from(self.memo.len())
                        .map_err(|_| self.malformed(at, "MEMOIZE", "the memo is full"))?;
                    self.memo_put(index, at, "MEMOIZE")?;
                }
                b'q' => {
                    let index = u32::from(self.input.byte()?);
                    self.memo_put(index, at, "BINPUT")?;
                }
                b'r' => {
                    let index = u32::from_le_bytes(self.input.array()?);
                    self.memo_put(index, at, "LONG_BINPUT")?;
                }
                b'h' => {
                    let index = u32::from(self.input.byte()?);
                    self.memo_get(index, at, "BINGET")?;
                }
                b'j' => {
                    let index = u32::from_le_bytes(self.input.array()?);
                    self.memo_get(index, at, "LONG_BINGET")?;
                }
                other => {
                    return Err(match unsupported_name(other) {
                        Some(name) => PickleError::Unsupported { offset: at, name },
                        None => PickleError::UnknownOpcode {
                            offset: at,
                            opcode: other,
                        },
                    });
                }
            }
        }
    }
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
