//! Fuzz-style property tests of the trace readers through the built
//! `cudamem`: random bytes, and random mutations of the real RMM logs in
//! `traces/rmm/` (byte flips, cuts, lines duplicated, deleted or swapped,
//! huge numbers), plain and gzipped. Whatever the input, `cudamem replay`
//! ends with a result (exit 0, JSON) or one short error (exit 1), within a
//! capped address space and a time limit: never a panic, an abort or a hang.

mod support;
use support::{gzip, temp_path};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use flate2::read::GzDecoder;
use proptest::prelude::*;

/// Lines taken from the front of each real log: enough for every kind of
/// row, few enough to keep a case at a few milliseconds.
const PREFIX_LINES: usize = 3000;
/// Address space each run may have, MiB.
const MEMORY_MIB: u64 = 1024;
/// Wall clock each run may take.
const TIME_LIMIT: Duration = Duration::from_secs(30);

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

/// Replay `bytes` as a trace file and check the run ended well.
fn replay_ends_well(bytes: &[u8]) -> Result<(), TestCaseError> {
    let path = temp_path("case");
    std::fs::write(&path, bytes).unwrap();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {} && exec \"$0\" \"$@\"",
            MEMORY_MIB << 10
        ))
        .arg(env!("CARGO_BIN_EXE_cudamem"))
        .args([
            "replay",
            path.to_str().unwrap(),
            "--json",
            "--policy",
            "tlsf",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > TIME_LIMIT {
            child.kill().unwrap();
            let _ = child.wait();
            return Err(TestCaseError::fail(format!(
                "ran past {TIME_LIMIT:?}; input kept at {}",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    match output.status.code() {
        Some(0) => {
            for line in stdout.lines() {
                let json: serde_json::Value = serde_json::from_str(line)
                    .map_err(|err| TestCaseError::fail(format!("{err}: {line}")))?;
                prop_assert!(json["events"].is_u64(), "{line}");
            }
            prop_assert!(!stdout.is_empty(), "exit 0 with no output");
        }
        Some(1) => {
            prop_assert!(stderr.starts_with("cudamem: "), "{stderr}");
            prop_assert!(stderr.lines().count() == 1, "{stderr}");
            // A path, a location and a message cut to a few hundred characters.
            let chars = stderr.chars().count();
            prop_assert!(chars < 800, "{chars} characters of stderr: {stderr}");
            prop_assert!(stdout.is_empty(), "{stdout}");
        }
        code => {
            return Err(TestCaseError::fail(format!(
                "exit {code:?} (a signal, a panic or an abort); input kept at {}:\n{stderr}",
                path.display()
            )));
        }
    }
    std::fs::remove_file(&path).unwrap();
    Ok(())
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
        let bytes = if zipped { gzip(&text) } else { text };
        replay_ends_well(&bytes)?;
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
        let bytes = [head, body].concat();
        let bytes = if zipped { gzip(&bytes) } else { bytes };
        replay_ends_well(&bytes)?;
    }
}
