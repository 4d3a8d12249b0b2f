//! The event format's unit tests: each kind reads back as written, and
//! lines of the previous encoder read unchanged.

use super::*;

fn every_kind() -> Vec<Event<'static>> {
    let window = Window {
        free_before: Some(100),
        free_after: None,
        live_change: -7,
    };
    vec![
        Event::Process {
            version: FORMAT_VERSION,
            pid: 42,
            ppid: 1,
            exe: "/bin/with\ttab\\and\nline".into(),
        },
        Event::Library {
            id: 3,
            path: "/usr/lib/libtorch_cuda.so".into(),
        },
        Event::Alloc {
            call: Call::MemAllocAsync,
            ptr: 0x7f00_0000_0000,
            size: 1 << 20,
            stream: 0xdead,
            caller: 3,
            result: 0,
        },
        Event::Free {
            call: Call::MemFree,
            ptr: 0x10,
            stream: 0,
            caller: 1,
        },
        Event::FreeFailed {
            call: Call::MemFree,
            ptr: 0x10,
            size: 512,
            caller: 1,
            result: 700,
        },
        Event::Reserve {
            ptr: 0x1000,
            size: 1 << 40,
            result: 0,
        },
        Event::AddressFree {
            ptr: 0x1000,
            size: 1 << 40,
        },
        Event::Create {
            handle: 5,
            size: 2 << 20,
            device: -1,
            caller: 2,
            result: 2,
        },
        Event::Release { handle: 5 },
        Event::Map {
            ptr: 0x1000,
            size: 2 << 20,
            offset: 0,
            handle: 5,
            result: 0,
        },
        Event::Unmap {
            ptr: 0x1000,
            size: 2 << 20,
        },
        Event::Context {
            how: ContextHow::Primary,
            device: 0,
            ctx: 0xabc,
            result: 0,
            sm_count: Some(132),
            threads_per_sm: Some(2048),
            total: Some(150_109_880_320),
            free: Some(149_000_000_000),
            stack: Some(1024),
            heap: None,
            fifo: Some(8_650_752),
        },
        Event::Limit {
            which: LimitKind::Stack,
            requested: 16384,
            result: 0,
            value: Some(16384),
            window,
        },
        Event::Image {
            call: Call::ModuleLoadData,
            format: crate::image::ImageFormat::Fatbin,
            bytes: Some(4096),
            malloc: crate::image::Answer::Yes,
            printf: crate::image::Answer::Unknown,
            note: "fatbin: 1 compressed entries not read".into(),
        },
        Event::Module {
            call: Call::LibraryLoadData,
            result: 0,
            window,
        },
        Event::Launch {
            call: Call::LaunchKernel,
            handle: 0x55,
            local_bytes: Some(16384),
            stack_before: Some(1024),
            stack_after: Some(16384),
            window,
            result: 0,
            name: "_Z9big_framePi".into(),
        },
        Event::MemInfo {
            why: MemInfoWhy::OutOfMemory,
            device: 0,
            free: 1,
            total: 2,
            pool_reserved: Some(0),
        },
        Event::Resolve {
            name: "cuMemAlloc".into(),
            version: 13000,
            flags: 0,
            how: ResolveHow::Export,
        },
        Event::DriverMissing {
            name: "libcuda.so.1".into(),
        },
        Event::Signal { number: 11 },
        Event::Exit { dropped: 0 },
    ]
}

#[test]
fn every_kind_reads_back_as_written() {
    for (index, event) in every_kind().into_iter().enumerate() {
        let record = Record {
            time_ns: 1_000 + index as u64,
            thread: 4242,
            event,
        };
        let mut line = Line::default();
        line.encode(&record);
        let text = std::str::from_utf8(line.as_bytes()).unwrap();
        assert!(text.ends_with('\n'), "{text:?}");
        assert_eq!(text.matches('\n').count(), 1, "{text:?}");
        let back = parse_line(text.trim_end_matches('\n')).unwrap();
        assert_eq!(back, record, "{text:?}");
    }
}

#[test]
fn numbers_of_every_width_read_back() {
    let mut values = vec![0, 1, 9, 10, 99, 100, 101, 999, 1000, u64::MAX, u64::MAX - 1];
    values.extend((0..64).map(|shift| 1u64 << shift));
    values.extend((1..20).map(|digits| 10u64.pow(digits) - 1));
    let mut line = Line::default();
    for value in values {
        let record = Record {
            time_ns: value,
            thread: 1,
            event: Event::Map {
                ptr: value,
                size: value,
                offset: value / 3,
                handle: value,
                result: -1,
            },
        };
        line.encode(&record);
        let text = std::str::from_utf8(line.as_bytes()).unwrap();
        assert_eq!(parse_line(text.trim_end()).unwrap(), record, "{text}");
    }
}

#[test]
fn long_names_are_cut_and_the_line_stays_whole() {
    let name = "é".repeat(MAX_NAME_BYTES);
    let record = Record {
        time_ns: 1,
        thread: 1,
        event: Event::Library {
            id: 1,
            path: name.as_str().into(),
        },
    };
    let mut line = Line::default();
    line.encode(&record);
    let text = std::str::from_utf8(line.as_bytes()).unwrap();
    let Event::Library { path, .. } = parse_line(text.trim_end()).unwrap().event else {
        panic!("not a library record: {text}");
    };
    assert!(path.len() <= MAX_NAME_BYTES && path.len() >= MAX_NAME_BYTES - 1);
    assert!(name.starts_with(path.as_ref()));
    // A name made of escaped bytes doubles, and still fits.
    let tabs = "\t".repeat(5 * MAX_NAME_BYTES);
    let record = Record {
        time_ns: 1,
        thread: 1,
        event: Event::Library {
            id: 1,
            path: tabs.as_str().into(),
        },
    };
    line.encode(&record);
    assert!(line.as_bytes().ends_with(b"\n"));
    assert!(parse_line(std::str::from_utf8(line.as_bytes()).unwrap().trim_end()).is_ok());
}

#[test]
fn bad_lines_say_what_is_wrong() {
    assert_eq!(
        parse_line("bogus\t1\t2"),
        Err(LineError::UnknownKind("bogus".into()))
    );
    assert!(matches!(
        parse_line("exit\t1\t2"),
        Err(LineError::FieldCount {
            kind: "exit",
            found: 3,
            expected: 4,
            column: 9,
        })
    ));
    assert!(matches!(
        parse_line("exit\t1\t2\t0\t5"),
        Err(LineError::FieldCount {
            kind: "exit",
            found: 5,
            expected: 4,
            column: 12,
        })
    ));
    assert!(matches!(
        parse_line("alloc\t1\t2\tcuMemAlloc\t12\t1\t0x0\t0\t0"),
        Err(LineError::BadField {
            index: 4,
            column: 22,
            ..
        })
    ));
    assert!(matches!(
        parse_line("alloc\t1\t2\tcuMemBogus\t0x12\t1\t0x0\t0\t0"),
        Err(LineError::BadField {
            index: 3,
            column: 11,
            ..
        })
    ));
    // A window's bad column is the column itself, not the window's first.
    let error = parse_line("module\t1\t2\tcuModuleLoad\t0\t5\t-\tx").unwrap_err();
    assert!(
        matches!(
            error,
            LineError::BadField {
                index: 7,
                column: 31,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "column 31: field 7 (\"x\") is not a signed decimal number"
    );
}

#[test]
fn a_window_subtracts_what_allocations_took_meanwhile() {
    let window = Window {
        free_before: Some(1000),
        free_after: Some(400),
        live_change: 100,
    };
    assert_eq!(window.taken_bytes(), Some(500));
    let freed = Window {
        free_before: Some(400),
        free_after: Some(1000),
        live_change: 0,
    };
    assert_eq!(freed.taken_bytes(), Some(0));
    assert_eq!(Window::default().taken_bytes(), None);
}

/// Lines the previous hand-written encoder wrote (one of each kind, and
/// extremes): they parse, and the encoder writes them again byte for byte.
#[test]
fn lines_of_the_previous_encoder_read_unchanged() {
    let old = include_str!("previous_encoder.events");
    let mut kinds = std::collections::BTreeSet::new();
    let mut line = Line::default();
    for text in old.lines() {
        let record = parse_line(text).unwrap_or_else(|error| panic!("{text:?}: {error}"));
        kinds.insert(record.event.kind());
        line.encode(&record);
        assert_eq!(
            std::str::from_utf8(line.as_bytes()).unwrap(),
            format!("{text}\n")
        );
    }
    // Every kind of that format (all but the image and driver-missing
    // records, added since).
    assert_eq!(kinds.len(), 19);
    assert_eq!(kinds.len() + 2, KINDS.len());
}

mod properties {
    use proptest::prelude::*;

    use super::super::*;

    fn record() -> impl Strategy<Value = Record<'static>> {
        (any::<u64>(), any::<u32>(), any_event()).prop_map(|(time_ns, thread, event)| Record {
            time_ns,
            thread,
            event,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Every kind, with arbitrary field values, reads back as written.
        #[test]
        fn every_record_round_trips(record in record()) {
            let mut line = Line::default();
            line.encode(&record);
            let text = std::str::from_utf8(line.as_bytes()).unwrap();
            prop_assert!(text.ends_with('\n'));
            prop_assert_eq!(text.matches('\n').count(), 1);
            prop_assert_eq!(parse_line(text.strip_suffix('\n').unwrap()), Ok(record));
        }

        /// Arbitrary text never panics the parser; an error names a column
        /// within the line.
        #[test]
        fn arbitrary_lines_are_refused_with_a_column(text in "[a-z0-9x\\t\\-\\\\ ]{0,120}|\\PC{0,200}") {
            check_refusal(&text)?;
        }

        /// A good line with a stretch replaced by arbitrary text: parsed,
        /// or refused with a column, never a panic.
        #[test]
        fn damaged_lines_are_refused_with_a_column(
            record in record(),
            at in any::<prop::sample::Index>(),
            cut in 0usize..12,
            patch in "[\\t0-9a-fx\\-]{0,6}|\\PC{0,4}",
        ) {
            let mut line = Line::default();
            line.encode(&record);
            let text = std::str::from_utf8(line.as_bytes()).unwrap().trim_end_matches('\n');
            let mut start = at.index(text.len() + 1);
            while !text.is_char_boundary(start) {
                start -= 1;
            }
            let mut end = (start + cut).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            let damaged = format!("{}{patch}{}", &text[..start], &text[end..]);
            check_refusal(&damaged)?;
        }
    }

    fn check_refusal(text: &str) -> Result<(), TestCaseError> {
        let limit = text.len() + 1;
        match parse_line(text) {
            Ok(record) => {
                // What parses is a record the encoder can write again.
                let mut line = Line::default();
                line.encode(&record);
                let again = std::str::from_utf8(line.as_bytes()).unwrap();
                prop_assert!(parse_line(again.trim_end_matches('\n')).is_ok());
            }
            Err(LineError::UnknownKind(kind)) => prop_assert!(kind.len() <= 40),
            Err(LineError::FieldCount { column, .. }) => {
                prop_assert!((1..=limit).contains(&column), "{column} of {limit}")
            }
            Err(LineError::BadField { column, index, .. }) => {
                prop_assert!((1..=limit).contains(&column), "{column} of {limit}");
                let start = text
                    .split('\t')
                    .take(index)
                    .map(|part| part.len() + 1)
                    .sum::<usize>();
                prop_assert_eq!(column, start + 1);
            }
        }
        Ok(())
    }
}
