//! The opcode loop: one pass over the pickle with an explicit stack, every
//! container built into the [`Pickle`]'s arena.

use std::collections::HashMap;
use std::io::BufRead;

use super::source::Source;
use super::{Pickle, PickleError, Value};
use crate::budget::{ReadBudget, held_bytes};

/// A pickle being read.
pub(super) struct Reader<R> {
    input: Source<R>,
    budget: ReadBudget,
    /// Items put in containers so far.
    items: u64,
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
    /// A reader of `input` within `limits`, nothing read yet.
    pub(super) fn new(input: R, budget: &ReadBudget) -> Self {
        Self {
            input: Source::new(input, budget.decoded_bytes),
            budget: *budget,
            items: 0,
            pickle: Pickle::default(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Vec::new(),
            sparse_memo: HashMap::new(),
        }
    }

    fn malformed(&self, at: u64, opcode: &'static str, why: &'static str) -> PickleError {
        PickleError::Malformed {
            offset: at,
            opcode,
            why,
        }
    }

    fn push(&mut self, value: Value) -> Result<(), PickleError> {
        if self.stack.len() as u64 >= self.budget.stack_values {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "too many values open at once (nesting too deep)",
                limit: self.budget.stack_values,
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

    /// Refuse once objects, memo entries and items together hold more than
    /// the budget's held bytes.
    fn check_held(&self) -> Result<(), PickleError> {
        let objects =
            self.pickle.strings.len() + self.pickle.sequences.len() + self.pickle.dicts.len();
        let memo = self.memo.len() + self.sparse_memo.len();
        let held = held_bytes(objects as u64, memo as u64, self.items);
        if held > self.budget.held_bytes {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "objects, memo entries and items together hold too many bytes",
                limit: self.budget.held_bytes,
            });
        }
        Ok(())
    }

    fn check_objects(&self) -> Result<(), PickleError> {
        self.check_held()?;
        let count =
            self.pickle.strings.len() + self.pickle.sequences.len() + self.pickle.dicts.len();
        if count as u64 >= self.budget.objects {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "too many objects",
                limit: self.budget.objects,
            });
        }
        Ok(())
    }

    /// Count `count` more container items against the budget.
    fn take_items(&mut self, count: usize) -> Result<(), PickleError> {
        self.items = self.items.saturating_add(count as u64);
        if self.items > self.budget.container_items {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "too many container items",
                limit: self.budget.container_items,
            });
        }
        self.check_held()
    }

    fn new_sequence(&mut self, items: Vec<Value>) -> Result<u32, PickleError> {
        self.check_objects()?;
        self.take_items(items.len())?;
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
        let entries = (self.memo.len() + self.sparse_memo.len()) as u64;
        if slot >= self.memo.len() {
            if entries >= self.budget.memo_entries {
                return Err(PickleError::Limit {
                    offset: at,
                    what: "too many memo entries",
                    limit: self.budget.memo_entries,
                });
            }
            self.check_held()?;
        }
        if slot < self.memo.len() {
            self.memo[slot] = value;
        } else if slot == self.memo.len() {
            self.memo.push(value);
        } else {
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
                self.take_items(items.len())?;
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
        self.take_items(items.len())?;
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

    /// Opcodes up to STOP: the pickle, or the first error, at its byte.
    pub(super) fn run(mut self) -> Result<Pickle, PickleError> {
        loop {
            let at = self.input.offset;
            let opcode = self.input.byte()?;
            match opcode {
                0x80 => {
                    let protocol = self.input.byte()?;
                    if !(2..=5).contains(&protocol) {
                        return Err(PickleError::Protocol { protocol });
                    }
                }
                0x95 => {
                    self.input.array::<8>()?;
                }
                b'.' => {
                    let root = self.pop(at, "STOP")?;
                    self.pickle.root = Some(root);
                    self.pickle.decoded_bytes = self.input.offset;
                    return Ok(self.pickle);
                }
                b'(' => {
                    if self.marks.len() as u64 >= self.budget.marks {
                        return Err(PickleError::Limit {
                            offset: at,
                            what: "too many MARKs open at once (nesting too deep)",
                            limit: self.budget.marks,
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
                b'q' | b'r' | b'h' | b'j' => {
                    // One byte of index for BINPUT and BINGET, four for
                    // their LONG_ forms.
                    let index = match opcode {
                        b'q' | b'h' => u32::from(self.input.byte()?),
                        _ => u32::from_le_bytes(self.input.array()?),
                    };
                    match opcode {
                        b'q' => self.memo_put(index, at, "BINPUT")?,
                        b'r' => self.memo_put(index, at, "LONG_BINPUT")?,
                        b'h' => self.memo_get(index, at, "BINGET")?,
                        _ => self.memo_get(index, at, "LONG_BINGET")?,
                    }
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
