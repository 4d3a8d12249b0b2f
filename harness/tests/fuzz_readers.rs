//! Fuzz-style property tests of the trace readers, in process: random
//! bytes, and random mutations of the real RMM logs in `traces/rmm/` (byte
//! flips, cuts, lines duplicated, deleted or swapped, huge numbers), plain
//! and gzipped. Whatever the input, reading it ends with traces that replay
//! or one short error naming the input, never a panic, with no more events
//! than the input has lines and no more memory held than a bound on its
//! size.

mod support;
use support::alloc_count::{Counting, peak_during};
use support::gzip;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::OnceLock;

use cudamem::replay::{self, Settings};
use flate2::read::GzDecoder;
use proptest::prelude::*;
use trace::budget::ReadBudget;
use trace::file::read_limited;

#[global_allocator]
static COUNTING: Counting = Counting;

/// Lines taken from the front of each real log: enough for every kind of
/// row, few enough to keep a case at a few milliseconds.
const PREFIX_LINES: usize = 3000;
/// Bytes a case may hold at once beyond [`BYTES_PER_INPUT_BYTE`] times its
/// input: the readers' buffers (a line, a decompression window).
const FIXED_BYTES: u64 = 1 << 20;
/// Bytes a case may hold at once per byte of input (decompressed): the
/// trace's events and locations, the replay's blocks.
const BYTES_PER_INPUT_BYTE: u64 = 8;

/// The first [`PREFIX_LINES`] lines of each real RMM log.
fn real_prefixes() -> &'static [Vec<String>] {
    static PREFIXES: OnceLock<Vec<Vec<String>>> = OnceLock::new();
    PREFIXES.get_or_init(|| {
        ["resnet50_train.csv.gz", "llama_generate.csv.gz"]
            .iter()
            .map(|name| {
                let path = format!("{}/../traces/rmm/{name}", env!("CARGO_MANIFEST_DIR"));
                let file = std::fs::File::open(&path).unwrap();
                BufReader::new(GzDecoder::new(file))
                    .lines()
                    .take(PREFIX_LINES)
                    .map(Result::unwrap)
                    .collect()
            })
            .collect()
    })
}

/// One change to a log.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR one byte (position as a fraction of the length, in 1/65536).
    FlipByte {
        at: u16,
        mask: u8,
    },
    /// Cut the text there.
    Truncate {
        at: u16,
    },
    DuplicateLine {
        line: u16,
    },
    DeleteLine {
        line: u16,
    },
    SwapLines {
        a: u16,
        b: u16,
    },
    /// Replace one comma-separated field with `text`.
    ReplaceField {
        line: u16,
        field: u8,
        text: String,
    },
    /// Insert a line of arbitrary bytes.
    InsertLine {
        line: u16,
        bytes: Vec<u8>,
    },
}

fn huge_number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("18446744073709551615".to_string()),
        Just("18446744073709551616".to_string()),
        Just("281474976710656".to_string()),
        Just("281474976710657".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("0xffffffffffffffff".to_string()),
        Just("allocate failure".to_string()),
        Just("Action".to_string()),
        "[0-9]{1,400}",
        "[ -~]{0,100}",
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<u16>(), 1..=255u8).prop_map(|(at, mask)| Mutation::FlipByte { at, mask }),
        any::<u16>().prop_map(|at| Mutation::Truncate { at }),
        any::<u16>().prop_map(|line| Mutation::DuplicateLine { line }),
        any::<u16>().prop_map(|line| Mutation::DeleteLine { line }),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Mutation::SwapLines { a, b }),
        (any::<u16>(), 0..7u8, huge_number())
            .prop_map(|(line, field, text)| Mutation::ReplaceField { line, field, text }),
        (any::<u16>(), prop::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(line, bytes)| Mutation::InsertLine { line, bytes }),
    ]
}

/// Index `at` (out of 65536) scaled to `0..len`.
fn scaled(at: u16, len: usize) -> usize {
    (at as usize * len) >> 16
}

fn apply(lines: &[String], mutations: &[Mutation]) -> Vec<u8> {
    let mut lines: Vec<Vec<u8>> = lines.iter().map(|line| line.clone().into_bytes()).collect();
    let mut cut_at = None;
    let mut flips = Vec::new();
    for mutation in mutations {
        let count = lines.len().max(1);
        match mutation {
            Mutation::DuplicateLine { line } if !lines.is_empty() => {
                let line = scaled(*line, count);
                lines.insert(line, lines[line].clone());
            }
            Mutation::DeleteLine { line } if !lines.is_empty() => {
                lines.remove(scaled(*line, count));
            }
            Mutation::SwapLines { a, b } if !lines.is_empty() => {
                lines.swap(scaled(*a, count), scaled(*b, count));
            }
            Mutation::ReplaceField { line, field, text } if !lines.is_empty() => {
                let line = &mut lines[scaled(*line, count)];
                let mut fields: Vec<Vec<u8>> = line
                    .split(|&byte| byte == b',')
                    .map(<[u8]>::to_vec)
                    .collect();
                let field = usize::from(*field).min(fields.len().saturating_sub(1));
                if let Some(slot) = fields.get_mut(field) {
                    *slot = text.clone().into_bytes();
                }
                *line = fields.join(&b","[..]);
            }
            Mutation::InsertLine { line, bytes } => {
                lines.insert(scaled(*line, count + 1).min(lines.len()), bytes.clone());
            }
            Mutation::FlipByte { at, mask } => flips.push((*at, *mask)),
            Mutation::Truncate { at } => cut_at = Some(*at),
            _ => {}
        }
    }
    let mut text = lines.join(&b"\n"[..]);
    text.push(b'\n');
    for (at, mask) in flips {
        let index = scaled(at, text.len());
        text[index] ^= mask;
    }
    if let Some(at) = cut_at {
        text.truncate(scaled(at, text.len()));
    }
    text
}

/// Read `bytes` (whose text, decompressed, is `text_bytes` long) as a
/// trace file, replay what it holds, and check it ended well.
fn replay_ends_well(bytes: &[u8], text_bytes: usize) -> Result<(), TestCaseError> {
    let path = Path::new("case");
    let tlsf = replay::spec::named("tlsf").unwrap();
    let hidden = indicatif::ProgressBar::hidden();
    let (outcome, peak) = peak_during(|| {
        read_limited(path, "case", bytes, &ReadBudget::CEILING).map(|traces| {
            traces
                .iter()
                .map(|trace| {
                    let replayed = replay::run(tlsf, trace, &Settings::default(), &hidden, false);
                    (trace.events.len(), replayed)
                })
                .collect::<Vec<_>>()
        })
    });
    match outcome {
        Ok(replays) => {
            prop_assert!(!replays.is_empty(), "a file read as no trace at all");
            let lines = bytes_lines(text_bytes);
            for (events, replayed) in replays {
                prop_assert!(
                    events <= lines,
                    "{events} events from at most {lines} lines"
                );
                let (outcome, _) =
                    replayed.map_err(|err| TestCaseError::fail(format!("{err:#}")))?;
                prop_assert_eq!(outcome.events, events);
                prop_assert_eq!(outcome.failed_allocations, 0);
            }
        }
        Err(err) => {
            prop_assert_eq!(err.path.as_path(), path);
            // A path, a location and a message cut to a few hundred characters.
            let said = err.to_string();
            prop_assert!(said.starts_with("case: "), "{}", said);
            prop_assert!(!said.contains('\n'), "{}", said);
            prop_assert!(
                said.chars().count() < 800,
                "{} characters: {}",
                said.chars().count(),
                said
            );
        }
    }
    let bound = FIXED_BYTES + BYTES_PER_INPUT_BYTE * text_bytes.max(bytes.len()) as u64;
    prop_assert!(peak <= bound, "{} bytes held at once, over {}", peak, bound);
    Ok(())
}

/// The most lines a text of `bytes` bytes can hold.
fn bytes_lines(bytes: usize) -> usize {
    bytes + 1
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_real_logs_replay_or_fail_cleanly(
        log in 0..2usize,
        mutations in prop::collection::vec(mutation(), 1..6),
        zipped in any::<bool>(),
    ) {
        let text = apply(&real_prefixes()[log], &mutations);
        let bytes = if zipped { gzip(&text) } else { text.clone() };
        replay_ends_well(&bytes, text.len())?;
    }

    #[test]
    fn random_bytes_replay_or_fail_cleanly(
        head in prop_oneof![
            Just(Vec::new()),
            Just(vec![0x1f, 0x8b]),
            Just(vec![0x80]),
            Just(vec![0x80, 0x02]),
            Just(b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec()),
        ],
        body in prop::collection::vec(any::<u8>(), 0..4096),
        zipped in any::<bool>(),
    ) {
        let text = [head, body].concat();
        let bytes = if zipped { gzip(&text) } else { text.clone() };
        replay_ends_well(&bytes, text.len())?;
    }
}
