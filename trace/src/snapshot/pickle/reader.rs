//! The opcode loop: one pass over the pickle with an explicit stack, every
//! container built into the [`Pickle`]'s arena.

use std::collections::HashMap;
use std::io::BufRead;

use super::source::Source;
use super::store::Slot;
use super::{Pickle, PickleError, Value};
use crate::budget::ReadBudget;

/// A pickle being read.
pub(super) struct Reader<R> {
    input: Source<R>,
    budget: ReadBudget,
    /// Items put in containers so far.
    items: u64,
    pickle: Pickle,
    stack: Vec<Slot>,
    marks: Vec<usize>,
    /// Memo slots written in order (MEMOIZE, or BINPUT at the next index).
    memo: Vec<Slot>,
    /// Memo slots written out of order, so a hostile index costs no more
    /// than one entry.
    sparse_memo: HashMap<u32, Slot>,
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

    fn push(&mut self, value: Slot) -> Result<(), PickleError> {
        if self.stack.len() as u64 >= self.budget.stack_values {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "too many values open at once (nesting too deep)",
                limit: self.budget.stack_values,
                memory: false,
            });
        }
        self.stack.push(value);
        Ok(())
    }

    fn pop(&mut self, at: u64, opcode: &'static str) -> Result<Slot, PickleError> {
        self.stack
            .pop()
            .ok_or_else(|| self.malformed(at, opcode, "the stack is empty"))
    }

    /// Bytes held: the store, the memo, the stack, and `more` about to be.
    fn held(&self, more: u64) -> u64 {
        let vec_bytes = |capacity: usize| (capacity * size_of::<Slot>()) as u64;
        self.pickle.store.held_bytes()
            + vec_bytes(self.memo.capacity())
            + vec_bytes(self.stack.capacity())
            + (self.sparse_memo.capacity() * 24) as u64
            + more
    }

    /// Refuse once the store, the memo and the stack, with `more` bytes
    /// about to be taken, hold more than the budget's held bytes.
    fn check_held(&self, more: u64) -> Result<(), PickleError> {
        if self.held(more) > self.budget.held_bytes {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "its objects, strings, memo entries and items would hold too many bytes",
                limit: self.budget.held_bytes,
                memory: true,
            });
        }
        Ok(())
    }

    fn check_objects(&self) -> Result<(), PickleError> {
        self.check_held(0)?;
        if self.pickle.store.objects() >= self.budget.objects {
            return Err(PickleError::Limit {
                offset: self.input.offset,
                what: "too many objects",
                limit: self.budget.objects,
                memory: false,
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
                memory: false,
            });
        }
        self.check_held(0)
    }

    fn new_sequence(&mut self, items: Vec<Slot>) -> Result<u32, PickleError> {
        self.check_objects()?;
        self.take_items(items.len())?;
        Ok(self.pickle.store.new_sequence(items))
    }

    fn new_dict(&mut self) -> Result<Slot, PickleError> {
        self.check_objects()?;
        Ok(self.pickle.store.new_dict())
    }

    fn string(&mut self, length: u64) -> Result<Slot, PickleError> {
        self.check_objects()?;
        // The string's bytes count before they are read: one past the
        // bound is skipped (a claim longer than the data is truncation)
        // and refused without being held.
        if let Err(err) = self.check_held(length) {
            self.input.skip(length)?;
            return Err(err);
        }
        let bytes = self.input.bytes(length)?;
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        };
        Ok(self.pickle.store.string(text.into_boxed_str()))
    }

    /// The values above the last MARK, removing the mark.
    fn pop_mark(&mut self, at: u64, opcode: &'static str) -> Result<Vec<Slot>, PickleError> {
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
                    memory: false,
                });
            }
            self.check_held(0)?;
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
        target: Slot,
        items: Vec<Slot>,
        at: u64,
        opcode: &'static str,
    ) -> Result<(), PickleError> {
        match target.list_or_set() {
            Some(index) if target.is_set() == (opcode == "ADDITEMS") => {
                self.take_items(items.len())?;
                self.pickle.store.extend(index, items);
                Ok(())
            }
            _ => Err(self.malformed(at, opcode, "the target is not a list")),
        }
    }

    fn set_items(
        &mut self,
        target: Slot,
        items: Vec<Slot>,
        at: u64,
        opcode: &'static str,
    ) -> Result<(), PickleError> {
        let Some(index) = target.dict_index() else {
            return Err(self.malformed(at, opcode, "the target is not a dict"));
        };
        if items.len() % 2 != 0 {
            return Err(self.malformed(at, opcode, "an odd number of keys and values"));
        }
        self.take_items(items.len())?;
        let pairs = items.chunks_exact(2).map(|pair| (pair[0], pair[1]));
        self.pickle.store.extend_dict(index, pairs);
        Ok(())
    }

    fn long(&mut self, length: u64) -> Result<Slot, PickleError> {
        if length > 9 {
            self.input.skip(length)?;
            return Ok(self.pickle.store.wide(Value::BigInt { bytes: length }));
        }
        let bytes = self.input.bytes(length)?;
        let negative = bytes.last().is_some_and(|&top| top & 0x80 != 0);
        let mut wide = [if negative { 0xff } else { 0 }; 16];
        wide[..bytes.len()].copy_from_slice(&bytes);
        let value = i128::from_le_bytes(wide);
        let store = &mut self.pickle.store;
        Ok(if let Ok(small) = i64::try_from(value) {
            store.int(small)
        } else if let Ok(unsigned) = u64::try_from(value) {
            store.wide(Value::UInt(unsigned))
        } else {
            store.wide(Value::BigInt { bytes: length })
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
                            memory: false,
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
                b'N' => self.push(Slot::NONE)?,
                0x88 => self.push(Slot::bool(true))?,
                0x89 => self.push(Slot::bool(false))?,
                b'J' => {
                    let value = i32::from_le_bytes(self.input.array()?);
                    let slot = self.pickle.store.int(i64::from(value));
                    self.push(slot)?;
                }
                b'K' => {
                    let value = self.input.byte()?;
                    let slot = self.pickle.store.int(i64::from(value));
                    self.push(slot)?;
                }
                b'M' => {
                    let value = u16::from_le_bytes(self.input.array()?);
                    let slot = self.pickle.store.int(i64::from(value));
                    self.push(slot)?;
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
                    let slot = self.pickle.store.wide(Value::Float(value));
                    self.push(slot)?;
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
                    self.push(Slot::bytes(length))?;
                }
                b'B' | b'T' => {
                    let length = u64::from(u32::from_le_bytes(self.input.array()?));
                    self.input.skip(length)?;
                    self.push(Slot::bytes(length))?;
                }
                0x8e | 0x96 => {
                    let length = u64::from_le_bytes(self.input.array()?);
                    self.input.skip(length)?;
                    self.push(Slot::bytes(length))?;
                }
                b']' => {
                    let index = self.new_sequence(Vec::new())?;
                    self.push(Slot::list(index))?;
                }
                b')' => {
                    let index = self.new_sequence(Vec::new())?;
                    self.push(Slot::tuple(index))?;
                }
                b'}' => {
                    let dict = self.new_dict()?;
                    self.push(dict)?;
                }
                0x8f => {
                    let index = self.new_sequence(Vec::new())?;
                    self.push(Slot::set(index))?;
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
                        b'l' => Slot::list(index),
                        b't' => Slot::tuple(index),
                        _ => Slot::set(index),
                    })?;
                }
                0x85..=0x87 => {
                    let count = usize::from(opcode - 0x84);
                    if self.stack.len() < count {
                        return Err(self.malformed(at, "TUPLEn", "too few values on the stack"));
                    }
                    let items = self.stack.split_off(self.stack.len() - count);
                    let index = self.new_sequence(items)?;
                    self.push(Slot::tuple(index))?;
                }
                b'd' => {
                    let items = self.pop_mark(at, "DICT")?;
                    let dict = self.new_dict()?;
                    self.set_items(dict, items, at, "DICT")?;
                    self.push(dict)?;
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
                    if opcode == 0x90 && !target.is_set() {
                        return Err(self.malformed(at, name, "the target is not a set"));
                    }
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
