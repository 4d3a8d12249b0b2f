//! A pickle writer that emits the opcodes PyTorch's `pickle.dump` does
//! (protocol 4, memoized containers, shared objects by memo reference), and
//! snapshots made with it.

/// A Python value to pickle.
#[derive(Debug, Clone)]
pub enum Py {
    None,
    Bool(bool),
    Int(i64),
    Str(String),
    List(Vec<Py>),
    Dict(Vec<(Py, Py)>),
    /// An object written earlier, by memo index.
    Memo(u32),
}

/// A str.
pub fn s(text: &str) -> Py {
    Py::Str(text.into())
}

/// A dict with str keys.
pub fn dict(pairs: Vec<(&str, Py)>) -> Py {
    Py::Dict(
        pairs
            .into_iter()
            .map(|(key, value)| (s(key), value))
            .collect(),
    )
}

/// Opcodes written one by one.
#[derive(Debug)]
pub struct Pickler {
    pub out: Vec<u8>,
    memo: u32,
}

impl Default for Pickler {
    fn default() -> Self {
        Self::new()
    }
}

impl Pickler {
    /// PROTO 4.
    pub fn new() -> Self {
        Self {
            out: vec![0x80, 4],
            memo: 0,
        }
    }

    /// Raw bytes.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.out.extend_from_slice(bytes);
        self
    }

    /// MEMOIZE the top of the stack; its memo index.
    pub fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }

    /// LONG_BINGET.
    pub fn get(&mut self, index: u32) -> &mut Self {
        self.out.push(b'j');
        self.out.extend_from_slice(&index.to_le_bytes());
        self
    }

    /// Write `value`, memoizing every container and str as pickle does.
    pub fn value(&mut self, value: &Py) -> &mut Self {
        match value {
            Py::None => self.raw(b"N"),
            Py::Bool(true) => self.raw(&[0x88]),
            Py::Bool(false) => self.raw(&[0x89]),
            Py::Int(value) => {
                if let Ok(small) = i32::try_from(*value) {
                    self.raw(b"J").raw(&small.to_le_bytes())
                } else {
                    self.raw(&[0x8a, 8]).raw(&value.to_le_bytes())
                }
            }
            Py::Str(text) => {
                if text.len() < 256 {
                    self.raw(&[0x8c, text.len() as u8]);
                } else {
                    self.raw(b"X").raw(&(text.len() as u32).to_le_bytes());
                }
                self.raw(text.as_bytes());
                self.memoize();
                self
            }
            Py::List(items) => {
                self.raw(b"]");
                self.memoize();
                if !items.is_empty() {
                    self.raw(b"(");
                    for item in items {
                        self.value(item);
                    }
                    self.raw(b"e");
                }
                self
            }
            Py::Dict(pairs) => {
                self.raw(b"}");
                self.memoize();
                if !pairs.is_empty() {
                    self.raw(b"(");
                    for (key, value) in pairs {
                        self.value(key);
                        self.value(value);
                    }
                    self.raw(b"u");
                }
                self
            }
            Py::Memo(index) => self.get(*index),
        }
    }

    /// STOP, and the bytes.
    pub fn finish(&mut self) -> Vec<u8> {
        self.out.push(b'.');
        std::mem::take(&mut self.out)
    }
}

/// One trace entry as PyTorch writes it (no frames).
pub fn entry(action: &str, addr: i64, size: i64) -> Py {
    dict(vec![
        ("action", s(action)),
        ("addr", Py::Int(addr)),
        ("size", Py::Int(size)),
        ("stream", Py::Int(0)),
    ])
}

/// A snapshot dict holding `device_traces` and no segments.
pub fn snapshot(device_traces: Vec<Vec<Py>>) -> Vec<u8> {
    Pickler::new()
        .value(&dict(vec![
            ("segments", Py::List(vec![])),
            (
                "device_traces",
                Py::List(device_traces.into_iter().map(Py::List).collect()),
            ),
        ]))
        .finish()
}
