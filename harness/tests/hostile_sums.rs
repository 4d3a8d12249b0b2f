//! Sums that would pass 64 bits are refused with the CSV reader's error,
//! in snapshots as in logs, never wrapped or saturated into a wrong answer.

mod support;

use support::pickle::*;
use support::*;

use trace::file::{load, load_pickle};
use trace::snapshot::state;
use trace::{Problem, TraceError};

fn problem(result: Result<impl std::fmt::Debug, TraceError>) -> Problem {
    match result {
        Ok(value) => panic!("read: {value:?}"),
        Err(err) => err.problem,
    }
}

/// A state whose segments each hold one free block of `size` bytes, each
/// segment on a device of its own.
fn segments(sizes: &[u64], address_of: impl Fn(usize) -> u64) -> Vec<u8> {
    let mut pickler = Pickler::new();
    pickler.snapshot_segments_start();
    pickler.raw(b"(");
    for (index, &size) in sizes.iter().enumerate() {
        let uint = |value: u64| {
            let mut bytes = vec![0x8a, 9];
            bytes.extend(value.to_le_bytes());
            bytes.push(0);
            bytes
        };
        pickler.open_dict();
        // Each on its own device: one device's segments cannot overlap.
        pickler.value(&s("device")).value(&Py::Int(index as i64));
        pickler.value(&s("address")).raw(&uint(address_of(index)));
        pickler.value(&s("total_size")).raw(&uint(size));
        pickler.value(&s("blocks")).raw(b"]}(");
        pickler.value(&s("size")).raw(&uint(size));
        pickler.value(&s("state")).value(&s("inactive"));
        pickler.raw(b"uau");
    }
    pickler.raw(b"e");
    pickler.value(&s("device_traces")).value(&Py::List(vec![]));
    pickler.raw(b"u");
    pickler.finish()
}

fn read_state(bytes: &[u8]) -> Result<state::State, TraceError> {
    let path = write_file("sums.pickle", bytes);
    let (pickle, budget) = load_pickle(&path)?;
    state::read(&path, &pickle, &budget)
}

#[test]
fn segment_sums_past_64_bits_are_refused() {
    let half = 1u64 << 63;
    let bytes = segments(&[half, half], |index| (index as u64) << 62);
    let problem = problem(read_state(&bytes));
    assert!(
        matches!(problem, Problem::LiveBytesOverflow { .. }),
        "{problem}"
    );
    // The same figures one byte short add up exactly.
    let state = read_state(&segments(&[half, half - 1], |index| (index as u64) << 62)).unwrap();
    assert_eq!(state.free_bytes, u64::MAX);
    assert_eq!(state.fragmented_bytes, half - 1);
}

#[test]
fn a_segment_past_the_end_of_the_address_space_is_refused() {
    let bytes = segments(&[1 << 40], |_| u64::MAX - 4096);
    let said = problem(read_state(&bytes)).to_string();
    assert!(said.contains("ends past 2^64"), "{said}");
}

#[test]
fn frees_of_unknown_blocks_past_64_bits_are_refused_as_the_csv_reader_refuses() {
    // 65,537 frees of never-allocated 2^48-byte blocks: 2^64 + 2^48 bytes
    // live from the start.
    let entries: Vec<Py> = (0..65_537)
        .map(|index| entry("free_requested", 0x1000 + index * 4096, 1 << 48))
        .collect();
    let path = write_file("frees.pickle", &snapshot(vec![entries]));
    assert!(matches!(
        problem(load(&path)),
        Problem::LiveBytesOverflow { .. }
    ));
    let mut csv = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for index in 0..65_537u64 {
        csv += &format!(
            "0,0,allocate,0x{:x},281474976710656,0\n",
            0x1000 + index * 4096
        );
    }
    let path = write_file("allocs.csv", csv.as_bytes());
    assert!(matches!(
        problem(load(&path)),
        Problem::LiveBytesOverflow { .. }
    ));
}

#[test]
fn a_time_stamp_past_584_years_is_refused() {
    let stamped = |us: u64| {
        let mut pickler = Pickler::new();
        pickler.open_dict();
        pickler.value(&s("segments")).value(&Py::List(vec![]));
        pickler.value(&s("device_traces")).raw(b"]]}(");
        pickler.value(&s("action")).value(&s("alloc"));
        pickler.value(&s("addr")).value(&Py::Int(0x1000));
        pickler.value(&s("size")).value(&Py::Int(512));
        pickler.value(&s("time_us")).raw(&[0x8a, 9]);
        pickler.raw(&us.to_le_bytes()).raw(&[0]);
        pickler.raw(b"uaau");
        pickler.finish()
    };
    let path = write_file("late.pickle", &stamped(u64::MAX));
    let said = problem(load(&path)).to_string();
    assert!(said.contains("past 2^64 nanoseconds"), "{said}");
    let path = write_file("fine.pickle", &stamped(1_000_000));
    assert_eq!(load(&path).unwrap()[0].events.len(), 1);
}

#[test]
fn signed_pointers_are_refused() {
    let csv = "Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,+10,256,0\n";
    let path = write_file("signed.csv", csv.as_bytes());
    assert_eq!(problem(load(&path)), Problem::BadPointer("+10".into()));
}
