//! A snapshot as large as real long runs with stacks make (more than 400 MB
//! once decompressed, some 1.6 million trace entries each with a stack of
//! about 75 frames), built from a real small one by repeating its history
//! at fresh addresses and times, reads and is explained within 2.5 GiB.
//!
//! The file is written by this test (it is too large to keep): the real
//! snapshot's objects are pickled again as `pickle.dump` writes them
//! (protocol 4, APPENDS and SETITEMS in batches of 1000, every str and
//! container memoized), its frame dicts and strings shared by memo
//! reference as PyTorch shares them, and each trace entry, frames list and
//! segment a fresh object in every copy.

mod support;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use flate2::Compression;
use flate2::write::GzEncoder;
use support::alloc_count::{Counting, peak_during};
use support::temp_path;
use trace::snapshot::pickle::{Pickle, Value};

#[global_allocator]
static COUNTING: Counting = Counting;

/// The real snapshot repeated: ViT-B/16 inference with Python and C++
/// frames (PyTorch's defaults), 1,765 entries of some 75 frames each.
const REAL: &str = "pytorch/vit_infer.fixture.default.pickle.gz";
/// Decoded bytes the large snapshot reaches at least.
const DECODED_BYTES: u64 = 400_000_000;
/// Most bytes reading or explaining it may hold at once.
const HELD_BYTES: u64 = 5 << 29;

fn real_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces")
        .join(REAL)
}

/// Where copy `copy` of the real history lies.
#[derive(Clone, Copy)]
struct Shift {
    address: i64,
    time_us: i64,
}

/// A pickle being written, as `pickle.dump` writes it.
struct Writer<W: Write> {
    out: W,
    bytes: u64,
    memo: u32,
    /// Memo indices of the real strings and frame dicts written so far.
    shared: HashMap<(bool, u32), u32>,
}

impl<W: Write> Writer<W> {
    fn raw(&mut self, bytes: &[u8]) {
        self.out.write_all(bytes).unwrap();
        self.bytes += bytes.len() as u64;
    }

    fn memoize(&mut self) -> u32 {
        self.raw(&[0x94]);
        self.memo += 1;
        self.memo - 1
    }

    fn get(&mut self, index: u32) {
        if let Ok(small) = u8::try_from(index) {
            self.raw(&[b'h', small]);
        } else {
            self.raw(b"j");
            self.raw(&index.to_le_bytes());
        }
    }

    fn int(&mut self, value: i64) {
        if let Ok(byte) = u8::try_from(value) {
            self.raw(&[b'K', byte]);
        } else if let Ok(short) = u16::try_from(value) {
            self.raw(b"M");
            self.raw(&short.to_le_bytes());
        } else if let Ok(int) = i32::try_from(value) {
            self.raw(b"J");
            self.raw(&int.to_le_bytes());
        } else {
            self.raw(&[0x8a, 8]);
            self.raw(&value.to_le_bytes());
        }
    }

    fn str(&mut self, text: &str) {
        if let Ok(length) = u8::try_from(text.len()) {
            self.raw(&[0x8c, length]);
        } else {
            self.raw(b"X");
            self.raw(&(text.len() as u32).to_le_bytes());
        }
        self.raw(text.as_bytes());
        self.memoize();
    }

    /// `value` of the real pickle, written again for `shift`; `key` is the
    /// dict key it is under, `frame` whether it is a frame of a stack.
    fn value(&mut self, pickle: &Pickle, value: Value, shift: Shift, key: &str, frame: bool) {
        match value {
            Value::None => self.raw(b"N"),
            Value::Bool(true) => self.raw(&[0x88]),
            Value::Bool(false) => self.raw(&[0x89]),
            Value::Int(int) => self.int(match key {
                "addr" | "address" => int + shift.address,
                "time_us" => int + shift.time_us,
                _ => int,
            }),
            Value::Float(float) => {
                self.raw(b"G");
                self.raw(&float.to_be_bytes());
            }
            Value::Str(index) => match self.shared.get(&(false, index)) {
                Some(&memo) => self.get(memo),
                None => {
                    self.str(pickle.text(value).unwrap());
                    self.shared.insert((false, index), self.memo - 1);
                }
            },
            Value::List(_) | Value::Tuple(_) => {
                let items: Vec<Value> = pickle.items(value).unwrap().iter().collect();
                self.raw(b"]");
                self.memoize();
                for batch in items.chunks(1000) {
                    self.raw(b"(");
                    for &item in batch {
                        self.value(pickle, item, shift, key, key == "frames");
                    }
                    self.raw(b"e");
                }
            }
            Value::Dict(index) => {
                if let Some(&memo) = self.shared.get(&(true, index)) {
                    return self.get(memo);
                }
                let pairs: Vec<(Value, Value)> = pickle.pairs(value).unwrap().collect();
                self.raw(b"}");
                let memo = self.memoize();
                if frame {
                    self.shared.insert((true, index), memo);
                }
                for batch in pairs.chunks(1000) {
                    self.raw(b"(");
                    for &(name, item) in batch {
                        self.value(pickle, name, shift, "", false);
                        let name = pickle.text(name).unwrap_or("");
                        self.value(pickle, item, shift, name, false);
                    }
                    self.raw(b"u");
                }
            }
            other => panic!("the real snapshot holds a {}", Pickle::kind(other)),
        }
    }
}

/// Write the large snapshot at `path`: its decoded bytes, how many copies
/// of the real history it holds, and the real history's entries.
fn write_large(path: &Path) -> (u64, i64, usize) {
    let (pickle, _) = trace::file::load_pickle(&real_path()).unwrap();
    let root = pickle.root();
    let segments: Vec<Value> = pickle
        .items(pickle.get(root, "segments").unwrap())
        .unwrap()
        .iter()
        .collect();
    let traces = pickle
        .items(pickle.get(root, "device_traces").unwrap())
        .unwrap();
    let entries: Vec<Value> = pickle
        .items(traces.get(0).unwrap())
        .unwrap()
        .iter()
        .collect();
    // Copies lie apart in addresses and in time.
    let number = |dict: Value, key: &str| match pickle.get(dict, key) {
        Some(Value::Int(int)) => int,
        _ => 0,
    };
    let mut low = i64::MAX;
    let mut high = 0;
    let (mut first_us, mut last_us) = (i64::MAX, 0);
    for &entry in &entries {
        let addr = number(entry, "addr");
        low = low.min(addr);
        high = high.max(addr + number(entry, "size"));
        first_us = first_us.min(number(entry, "time_us"));
        last_us = last_us.max(number(entry, "time_us"));
    }
    for &segment in &segments {
        let address = number(segment, "address");
        low = low.min(address);
        high = high.max(address + number(segment, "total_size"));
    }
    let span = ((high - low) as u64).next_power_of_two() as i64;
    let shift = |copy: i64| Shift {
        address: copy * span,
        time_us: copy * (last_us - first_us + 1),
    };

    let file = BufWriter::new(File::create(path).unwrap());
    let mut writer = Writer {
        out: BufWriter::with_capacity(1 << 20, GzEncoder::new(file, Compression::fast())),
        bytes: 0,
        memo: 0,
        shared: HashMap::new(),
    };
    writer.raw(&[0x80, 4]);
    writer.raw(b"}");
    writer.memoize();
    writer.raw(b"(");
    writer.str("device_traces");
    writer.raw(b"]");
    writer.memoize();
    writer.raw(b"]");
    writer.memoize();
    let mut copies = 0;
    while writer.bytes < DECODED_BYTES {
        for batch in entries.chunks(1000) {
            writer.raw(b"(");
            for &entry in batch {
                writer.value(&pickle, entry, shift(copies), "", false);
            }
            writer.raw(b"e");
        }
        copies += 1;
    }
    writer.raw(b"a");
    writer.str("segments");
    writer.raw(b"]");
    writer.memoize();
    for copy in 0..copies {
        writer.raw(b"(");
        for &segment in &segments {
            writer.value(&pickle, segment, shift(copy), "", false);
        }
        writer.raw(b"e");
    }
    for key in ["allocator_settings", "external_annotations"] {
        if let Some(value) = pickle.get(root, key) {
            writer.str(key);
            writer.value(&pickle, value, shift(0), key, false);
        }
    }
    writer.raw(b"u.");
    let bytes = writer.bytes;
    let encoder = writer
        .out
        .into_inner()
        .map_err(|err| err.into_error())
        .unwrap();
    encoder.finish().unwrap().flush().unwrap();
    (bytes, copies, entries.len())
}

#[test]
fn a_snapshot_of_400_mb_with_stacks_reads_and_is_explained_within_its_bound() {
    let path = temp_path("large.pickle.gz");
    let started = Instant::now();
    let (decoded, copies, entries) = write_large(&path);
    let compressed = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "wrote {decoded} bytes ({compressed} compressed), {copies} copies of {entries} \
         entries, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(decoded >= DECODED_BYTES);

    let real = trace::file::load(&real_path()).unwrap();
    let started = Instant::now();
    let (traces, peak) = peak_during(|| trace::file::load(&path));
    let traces = traces.unwrap_or_else(|err| panic!("{err}"));
    eprintln!(
        "replay's read: {:.1} s, {peak} bytes held at most",
        started.elapsed().as_secs_f64()
    );
    assert!(peak < HELD_BYTES, "{peak} bytes held reading it");
    assert_eq!(traces.len(), 1);
    let (large, real) = (&traces[0], &real[0]);
    assert_eq!(large.events.len(), real.events.len() * copies as usize);
    assert_eq!(
        large.alloc_stacks.len(),
        real.alloc_stacks.len() * copies as usize
    );
    // The same stacks, each once, however many copies use them.
    assert_eq!(large.stacks, real.stacks);
    drop(traces);

    let started = Instant::now();
    let target = path.to_str().unwrap();
    let (said, peak) =
        peak_during(|| support::run(&["explain", "--snapshot", target, "--at", "peak"]));
    let said = said.unwrap_or_else(|err| panic!("{err:#}"));
    eprintln!(
        "explain --at peak: {:.1} s, {peak} bytes held at most",
        started.elapsed().as_secs_f64()
    );
    assert!(peak < HELD_BYTES, "{peak} bytes held explaining it");
    assert!(said.starts_with("after history entry"), "{said}");
    assert!(said.contains("conclusion:"), "{said}");
    std::fs::remove_file(&path).unwrap();
}
