//! Small files built to cost a lot: every reader stays within the budget of
//! the file's size (memory counted by the counting allocator, records
//! counted against the budget), and formats it does not read are named.

mod support;

use std::path::Path;

use proptest::prelude::*;
use support::alloc_count::{Counting, peak_during};
use support::pickle::*;
use support::*;

use trace::budget::ReadBudget;
use trace::file::{load, load_device, load_pickle};
use trace::snapshot::state;
use trace::{Event, Location, Problem, TraceError};

#[global_allocator]
static COUNTING: Counting = Counting;

/// Most bytes a refused bomb may make a reader hold.
const REFUSAL_BYTES: u64 = 64 << 20;

fn problem(result: Result<impl std::fmt::Debug, TraceError>) -> Problem {
    match result {
        Ok(value) => panic!("read: {value:?}"),
        Err(err) => err.problem,
    }
}

/// `body` after PROTO 4, then STOP.
fn pickle(body: &[u8]) -> Vec<u8> {
    [&[0x80, 4][..], body, b"."].concat()
}

#[test]
fn memo_append_and_list_bombs_stop_at_the_budget_of_their_size() {
    // Each some 8 MiB of opcodes that gzip to a few KiB.
    let bombs = [
        pickle(&[&b"]"[..], &[0x94u8].repeat(8 << 20)].concat()),
        pickle(&[&b"]"[..], &b"Na".repeat(4 << 20)].concat()),
        pickle(&b"]0".repeat(4 << 20)),
    ];
    for body in bombs {
        let compressed = gzip(&body);
        let path = write_file("bomb.pickle.gz", &compressed);
        let (result, peak) = peak_during(|| load(&path));
        let limit = ReadBudget::for_file(compressed.len() as u64).decoded_bytes;
        assert!(limit < body.len() as u64 / 2);
        // Refused at the file's bound, or sooner where the bytes decoded
        // outrun the compressed bytes read.
        assert!(
            matches!(problem(result), Problem::TooLarge { limit_bytes } if limit_bytes <= limit)
        );
        // At most one value (16 bytes) per decoded byte, its vector doubled once.
        assert!(
            peak < 32 * limit + (8 << 20),
            "{peak} bytes held for {limit}"
        );
    }
}

#[test]
fn a_plain_pickle_of_memo_entries_meets_the_memo_bound() {
    let budget = ReadBudget {
        memo_entries: 1000,
        ..ReadBudget::CEILING
    };
    let body = pickle(&[&b"]"[..], &[0x94u8].repeat(1001)].concat());
    let err = trace::snapshot::pickle::read(&body[..], &budget).unwrap_err();
    assert!(
        matches!(
            err,
            trace::snapshot::pickle::PickleError::Limit { limit: 1000, .. }
        ),
        "{err}"
    );
    let items = ReadBudget {
        container_items: 1000,
        ..ReadBudget::CEILING
    };
    let body = pickle(&[&b"]"[..], &b"Na".repeat(1001)].concat());
    assert!(trace::snapshot::pickle::read(&body[..], &items).is_err());
    // Each count within its own bound, but together past the bytes held.
    let held = ReadBudget {
        held_bytes: 1000,
        ..ReadBudget::CEILING
    };
    let body = pickle(&b"]\x94".repeat(64));
    let err = trace::snapshot::pickle::read(&body[..], &held).unwrap_err();
    assert!(
        matches!(
            err,
            trace::snapshot::pickle::PickleError::Limit {
                limit: 1000,
                memory: true,
                ..
            }
        ),
        "{err}"
    );
    let body = pickle(&[&b"]\x94".repeat(8)[..], b"0"].concat());
    assert!(trace::snapshot::pickle::read(&body[..], &held).is_ok());
    // A string's bytes are held too, counted before they are read.
    let long = [&b"X\xd0\x07\x00\x00"[..], &[b'a'; 2000]].concat();
    let err = trace::snapshot::pickle::read(&pickle(&long)[..], &held).unwrap_err();
    assert!(
        matches!(
            err,
            trace::snapshot::pickle::PickleError::Limit { memory: true, .. }
        ),
        "{err}"
    );
}

/// A snapshot whose `segments` is one segment of `blocks` blocks, then
/// `references` memo references to it.
fn shared_segment(blocks: usize, references: usize) -> Vec<u8> {
    let mut pickler = Pickler::new();
    pickler.snapshot_segments_start();
    pickler.raw(b"(");
    let block = dict(vec![
        ("address", Py::Int(0x1000)),
        ("size", Py::Int(512)),
        ("requested_size", Py::Int(512)),
        ("state", s("inactive")),
    ]);
    let memo = pickler.open_dict();
    for (key, value) in [
        ("device", Py::Int(0)),
        ("address", Py::Int(0x1000)),
        ("total_size", Py::Int(512 * blocks as i64)),
        ("segment_type", s("large")),
        ("blocks", Py::List(vec![block; blocks])),
    ] {
        pickler.value(&s(key)).value(&value);
    }
    pickler.raw(b"u");
    for _ in 0..references {
        pickler.get(memo);
    }
    pickler.raw(b"e");
    pickler.value(&s("device_traces")).value(&Py::List(vec![]));
    pickler.raw(b"u");
    pickler.finish()
}

#[test]
fn a_segment_shared_a_thousand_times_is_refused_not_copied() {
    let bytes = shared_segment(2_000, 1_000);
    let path = write_file("shared-segment.pickle", &bytes);
    let (result, peak) = peak_during(|| {
        let (pickle, budget) = load_pickle(&path)?;
        state::read(&path, &pickle, &budget).map(|state| state.segments.len())
    });
    let problem = problem(result);
    assert!(
        matches!(
            problem,
            Problem::OverBudget {
                what: "segments and blocks",
                ..
            }
        ),
        "{problem}"
    );
    assert!(
        peak < 16 * bytes.len() as u64 + (8 << 20),
        "{peak} bytes held"
    );
    // Shared a few times, it is refused as the same bytes listed twice,
    // never counted twice.
    let few = write_file("few.pickle", &shared_segment(20, 3));
    let (pickle, budget) = load_pickle(&few).unwrap();
    let err = state::read(&few, &pickle, &budget).unwrap_err();
    assert_eq!(err.location, Location::Segment { index: 1 });
    assert!(err.to_string().contains("overlaps segment 0x1000"), "{err}");
}

/// A snapshot whose `device_traces` names one list of 2,000 entries as
/// `devices + 1` devices (the list itself, then `devices` references).
fn one_list_as_many_devices(devices: usize) -> Vec<u8> {
    let mut pickler = Pickler::new();
    pickler.snapshot_traces_start();
    pickler.raw(b"(");
    let entries: Vec<Py> = (0..1000)
        .flat_map(|index| {
            let addr = 0x1000 + index * 4096;
            [
                entry("alloc", addr, 4096),
                entry("free_requested", addr, 4096),
            ]
        })
        .collect();
    pickler.raw(b"]");
    let list = pickler.memoize();
    pickler.raw(b"(");
    for item in &entries {
        pickler.value(item);
    }
    pickler.raw(b"e");
    for _ in 0..devices {
        pickler.get(list);
    }
    pickler.raw(b"eu");
    pickler.finish()
}

#[test]
fn one_event_list_shared_by_many_devices_is_refused() {
    let bytes = one_list_as_many_devices(trace::snapshot::MAX_DEVICES - 1);
    let path = write_file("devices.pickle", &bytes);
    let (result, peak) = peak_during(|| load(&path));
    assert!(matches!(
        problem(result),
        Problem::OverBudget {
            what: "trace entries",
            ..
        }
    ));
    assert!(
        peak < 16 * bytes.len() as u64 + (8 << 20),
        "{peak} bytes held"
    );
}

#[test]
fn one_device_of_many_is_read_alone() {
    // The same list named as 128 devices (the most PyTorch numbers): all are past the
    // budget together, one of them is 2,000 entries and is read.
    let bytes = one_list_as_many_devices(trace::snapshot::MAX_DEVICES - 1);
    let path = write_file("one-device.pickle", &bytes);
    let (result, peak) = peak_during(|| load_device(&path, Some(7)));
    let traces = result.expect("one device's entries are within the budget");
    assert_eq!(traces.len(), 1);
    assert_eq!(traces[0].device, Some(7));
    assert_eq!(traces[0].events.len(), 2000);
    assert!(
        peak < 16 * bytes.len() as u64 + (8 << 20),
        "{peak} bytes held"
    );
    // A device past the list is a typed error naming the devices there are.
    let err = load_device(&path, Some(5000)).unwrap_err();
    match err.problem {
        Problem::NoEventsForDevice { device, present } => {
            assert_eq!(device, 5000);
            assert_eq!(present.len(), trace::snapshot::MAX_DEVICES);
        }
        other => panic!("{other:?}"),
    }
    // An RMM log names no device to pick.
    let csv = write_file(
        "one-device.csv",
        b"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,64,0\n",
    );
    let err = load_device(&csv, Some(0)).unwrap_err();
    assert!(matches!(err.problem, Problem::NotSnapshot(_)), "{err}");
}

#[test]
fn a_dict_of_many_keys_referenced_often_is_looked_up_by_index() {
    // One bookkeeping entry of 20,000 junk keys, referenced 20,000 times:
    // 4 * 10^8 key comparisons per field if look-up scanned every pair.
    let mut pairs: Vec<(Py, Py)> = (0..20_000)
        .map(|index| (s(&format!("junk{index}")), Py::Int(index)))
        .collect();
    pairs.push((s("action"), s("snapshot")));
    let mut pickler = Pickler::new();
    pickler.snapshot_traces_start();
    pickler.raw(b"(]");
    pickler.memoize();
    pickler.raw(b"(");
    let junk = pickler.open_dict();
    for (key, value) in &pairs {
        pickler.value(key).value(value);
    }
    pickler.raw(b"u");
    pickler.value(&entry("alloc", 0x1000, 512));
    for _ in 0..20_000 {
        pickler.get(junk);
    }
    pickler.raw(b"eeu");
    let path = write_file("junk.pickle", &pickler.finish());
    let traces = load(&path).unwrap();
    assert_eq!(traces[0].events.len(), 1);
}

#[test]
fn a_frames_list_shared_by_every_block_is_read_once() {
    let frames: Vec<Py> = (0..20_000)
        .map(|index| {
            dict(vec![
                (
                    "filename",
                    s(&format!("/usr/lib/python3/site-packages/x{index}.so")),
                ),
                ("line", Py::Int(index)),
                ("name", s("f")),
            ])
        })
        .collect();
    let mut pickler = Pickler::new();
    pickler.snapshot_segments_start();
    pickler.raw(b"(}");
    pickler.memoize();
    pickler.raw(b"(");
    pickler.value(&s("address")).value(&Py::Int(0x1000));
    pickler
        .value(&s("total_size"))
        .value(&Py::Int(512 * 20_000));
    pickler.value(&s("blocks"));
    pickler.raw(b"]");
    pickler.memoize();
    pickler.raw(b"(");
    let mut frames_memo = None;
    for index in 0..20_000i64 {
        pickler.open_dict();
        pickler
            .value(&s("address"))
            .value(&Py::Int(0x1000 + 512 * index));
        pickler.value(&s("size")).value(&Py::Int(512));
        pickler.value(&s("state")).value(&s("active_allocated"));
        pickler.value(&s("frames"));
        pickler.shared_list(&mut frames_memo, &frames);
        pickler.raw(b"u");
    }
    pickler.raw(b"eue");
    pickler.value(&s("device_traces")).value(&Py::List(vec![]));
    pickler.raw(b"u");
    let path = write_file("frames.pickle", &pickler.finish());
    let (pickle, budget) = load_pickle(&path).unwrap();
    let state = state::read(&path, &pickle, &budget).unwrap();
    let blocks = &state.segments[0].live_blocks;
    assert_eq!(blocks.len(), 20_000);
    assert!(
        blocks
            .iter()
            .all(|block| block.frame.as_ref().unwrap().line == 0)
    );
}

#[test]
fn a_gzip_of_repeated_rows_decodes_within_its_budget() {
    let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    let row = "0,0,allocate,0x1000,256,0\n0,0,free,0x1000,256,0\n";
    text += &row.repeat(200_000);
    let compressed = gzip(text.as_bytes());
    let path = write_file("rows.csv.gz", &compressed);
    let (result, peak) = peak_during(|| load(&path));
    let limit = ReadBudget::for_file(compressed.len() as u64).decoded_bytes;
    assert!(limit < text.len() as u64);
    assert!(matches!(problem(result), Problem::TooLarge { limit_bytes } if limit_bytes <= limit));
    assert!(peak < REFUSAL_BYTES, "{peak} bytes held");
    // An event and where it came from take 32 bytes.
    assert!(std::mem::size_of::<Event>() + std::mem::size_of::<Location>() <= 32);
}

#[test]
fn gzip_padding_is_accepted_and_other_formats_are_named() {
    let text = "Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x1000,256,0\n";
    let padded = [gzip(text.as_bytes()), vec![0; 1024]].concat();
    let traces = load(&write_file("padded.csv.gz", &padded)).unwrap();
    assert_eq!(traces[0].events.len(), 1);
    let garbage = [gzip(text.as_bytes()), b"junk".to_vec()].concat();
    assert!(load(&write_file("garbage.csv.gz", &garbage)).is_err());
    for (magic, format) in [
        (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz"),
        (b"BZh91AY&SY", "bzip2"),
        (&[0x78, 0x9c, 1, 2], "zlib"),
    ] {
        let path = write_file("compressed.gz", magic);
        assert_eq!(problem(load(&path)), Problem::Compressed { format });
    }
    for (bytes, protocol) in [
        (&b"(dp0\nS'segments'\np1\n(lp2\nss."[..], 0),
        (b"}q\x00(U\x08segmentsq\x01]q\x02u.", 1),
    ] {
        let path = write_file("old.pickle", bytes);
        assert_eq!(problem(load(&path)), Problem::PickleProtocol { protocol });
    }
}

/// A random pickle of plain data whose containers refer back to earlier
/// ones by memo, under a snapshot root whose device lists are some of them.
fn random_pickle(choices: &[(u8, u16)]) -> Vec<u8> {
    let mut out = vec![0x80, 4, b'}', 0x94, b'('];
    let key = |out: &mut Vec<u8>, name: &str| {
        out.extend([0x8c, name.len() as u8]);
        out.extend(name.as_bytes());
    };
    key(&mut out, "segments");
    out.extend(b"]");
    key(&mut out, "device_traces");
    out.extend(b"](");
    // Memo 0 is the root; every object after it is memoized too.
    let mut memo = 1u32;
    for &(kind, pick) in choices {
        match kind % 4 {
            0 => {
                // A new list of two entries.
                out.extend(b"](");
                for action in ["alloc", "free_requested"] {
                    out.extend(b"}(");
                    key(&mut out, "action");
                    key(&mut out, action);
                    key(&mut out, "addr");
                    out.extend(b"J");
                    out.extend((0x1000 + i32::from(pick) * 4096).to_le_bytes());
                    key(&mut out, "size");
                    out.extend(b"M\x00\x02u");
                }
                out.extend(b"e\x94");
                memo += 1;
            }
            1 | 2 if memo > 1 => {
                // A reference to an earlier list.
                out.push(b'j');
                out.extend((1 + u32::from(pick) % (memo - 1)).to_le_bytes());
            }
            _ => {
                out.extend(b"]\x94");
                memo += 1;
            }
        }
    }
    out.extend(b"eu.");
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_shared_pickles_cost_memory_and_records_linear_in_their_size(
        choices in proptest::collection::vec((any::<u8>(), any::<u16>()), 1..400)
    ) {
        let bytes = random_pickle(&choices);
        let path = write_file("random.pickle", &bytes);
        let (result, peak) = peak_during(|| load(Path::new(&path)));
        let size = bytes.len() as u64;
        prop_assert!(peak <= 64 * size + (2 << 20), "{peak} bytes held for {size}");
        match result {
            Ok(traces) => {
                let events: u64 = traces.iter().map(|trace| trace.events.len() as u64).sum();
                prop_assert!(events <= size, "{events} events from {size} bytes");
            }
            Err(err) => prop_assert!(
                matches!(
                    err.problem,
                    Problem::OverBudget { .. }
                        | Problem::NotSnapshot(_)
                        | Problem::TooManyDevices { .. }
                        | Problem::LivePointer(_)
                        | Problem::UnknownPointer(_)
                ),
                "{err}"
            ),
        }
    }
}

#[test]
fn odd_but_readable_rows_are_noted_once_per_kind() {
    use trace::Oddity;
    let text = "Thread,Time,Action,Pointer,Size,Stream\n\
                0,0,allocate,0x1000,4096,0\n\
                0,0,allocate,0x1800,4096,0\n\
                0,0,allocate,0x1c00,512,0\n\
                0,0,free,0x1000,100,0\n\
                0,0,free,0x1800,4096,0\n\
                0,0,free,0x1c00,7,0\n";
    let traces = load(&write_file("odd.csv", text.as_bytes())).unwrap();
    let noted: Vec<(Oddity, u64, Location)> = traces[0]
        .noted
        .iter()
        .map(|noted| (noted.oddity, noted.count, noted.first))
        .collect();
    assert_eq!(
        noted,
        [
            (Oddity::OverlapsLive, 2, Location::Line(3)),
            (Oddity::FreeSizeDiffers, 2, Location::Line(5)),
        ]
    );
    assert_eq!(traces[0].events.len(), 6);
}
