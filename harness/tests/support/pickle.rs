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

    /// EMPTY_DICT, MEMOIZE, MARK: a dict whose pairs follow (SETITEMS ends
    /// them); its memo index.
    pub fn open_dict(&mut self) -> u32 {
        self.raw(b"}");
        let memo = self.memoize();
        self.raw(b"(");
        memo
    }

    /// The start of a snapshot dict: no `segments`, then `device_traces`,
    /// a list (memoized) whose items the caller writes.
    pub fn snapshot_traces_start(&mut self) -> &mut Self {
        self.open_dict();
        self.value(&s("segments")).value(&Py::List(vec![]));
        self.value(&s("device_traces"));
        self.raw(b"]");
        self.memoize();
        self
    }

    /// The start of a snapshot dict: `segments`, a list (memoized) whose
    /// items the caller writes.
    pub fn snapshot_segments_start(&mut self) -> &mut Self {
        self.open_dict();
        self.value(&s("segments"));
        self.raw(b"]");
        self.memoize();
        self
    }

    /// The list of `items`, written the first time (and its memo index kept
    /// in `memo`), a memo reference to it every later time: one list many
    /// records share, as pickle writes it.
    pub fn shared_list(&mut self, memo: &mut Option<u32>, items: &[Py]) -> &mut Self {
        match *memo {
            Some(index) => self.get(index),
            None => {
                self.raw(b"]");
                *memo = Some(self.memoize());
                self.raw(b"(");
                for item in items {
                    self.value(item);
                }
                self.raw(b"e")
            }
        }
    }

    /// STOP, and the bytes.
    pub fn finish(&mut self) -> Vec<u8> {
        self.out.push(b'.');
        std::mem::take(&mut self.out)
    }
}

/// A stack as PyTorch records it: a torch frame, then the user's frame in
/// function `user_function` of /home/me/train.py.
pub fn torch_and_user_frames(user_function: &str) -> Py {
    Py::List(vec![
        dict(vec![
            (
                "filename",
                s("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py"),
            ),
            ("line", Py::Int(134)),
            ("name", s("forward")),
        ]),
        dict(vec![
            ("filename", s("/home/me/train.py")),
            ("line", Py::Int(42)),
            ("name", s(user_function)),
        ]),
    ])
}

/// A block of a segment at the dump, as PyTorch writes it.
pub fn state_block(address: i64, size: i64, state: &str, frames: Py) -> Py {
    dict(vec![
        ("address", Py::Int(address)),
        ("size", Py::Int(size)),
        ("requested_size", Py::Int(size)),
        ("state", s(state)),
        ("frames", frames),
    ])
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
