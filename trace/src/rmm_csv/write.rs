//! The device allocations of an event log as an RMM log
//! (`logging_resource_adaptor`'s CSV: `Thread,Time,Action,Pointer,Size,Stream`),
//! the format `cudamem replay` reads, so every policy can be tried on what a
//! real program asked the driver for.
//!
//! Rows: `allocate` and `free` for `cuMemAlloc*`, managed and
//! stream-ordered allocations, and for VMM mappings (`cuMemMap` allocates
//! its range, `cuMemUnmap` frees every mapping inside its range);
//! `allocate failure` (pointer `0x0`) for each allocation that returned out
//! of memory. Pinned host memory and physical handles are not device
//! address ranges and stay out. A seventh column, `Caller`, names the
//! library that called the driver (readers that look columns up by name,
//! as `cudamem replay` does, pass over it).
//!
//! Every `free` row names a live `allocate` row: a free of a pointer the
//! log never allocated is left out (and counted), and an allocation at a
//! pointer still live (its free went unseen) is preceded by that free.
//!
//! A free the driver refused wrote no row: the interposer records a free
//! before making it, and its `free-failed` after, so a `free` row is held
//! back until the next row is written or the log ends, and a `free-failed`
//! for it drops it. (When another thread's row came between the two, the
//! `free` row is out already, and the block comes back as an `allocate`.)

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use crate::event::{Event, Record};
use crate::process::libraries::file_name;
use ctx::driver::result::OUT_OF_MEMORY;

/// The header line.
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream,Caller";

/// What a conversion wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RmmStats {
    /// Rows written, the header not counted.
    pub rows: u64,
    /// Frees left out: their pointer was not live in the log.
    pub unknown_frees: u64,
    /// Frees written for allocations whose free the log did not show.
    pub implied_frees: u64,
}

/// Writes an RMM log record by record.
pub struct RmmWriter<W: Write> {
    out: W,
    /// A `free` row not written yet: (where, pointer, size).
    held: Option<(Row, u64, u64)>,
    live: HashMap<u64, u64>,
    mappings: BTreeMap<u64, u64>,
    libraries: Vec<String>,
    stats: RmmStats,
}

impl<W: Write> RmmWriter<W> {
    /// A writer that has written the header to `out`.
    pub fn new(mut out: W) -> io::Result<Self> {
        writeln!(out, "{HEADER}")?;
        Ok(Self {
            out,
            held: None,
            live: HashMap::new(),
            mappings: BTreeMap::new(),
            libraries: Vec::new(),
            stats: RmmStats::default(),
        })
    }

    /// Write the rows `record` makes (none for most records).
    pub fn record(&mut self, record: &Record<'_>) -> io::Result<()> {
        let at = Row {
            thread: record.thread,
            time_ns: record.time_ns,
            stream: 0,
            caller: 0,
        };
        match &record.event {
            Event::Library { id, path } => {
                let index = *id as usize;
                if self.libraries.len() <= index {
                    self.libraries.resize(index + 1, String::new());
                }
                self.libraries[index] = file_name(path).replace([',', '\r', '\n'], "_");
            }
            &Event::Alloc {
                call,
                ptr,
                size,
                stream,
                caller,
                result,
            } if !call.is_host() => {
                let row = Row {
                    stream,
                    caller,
                    ..at
                };
                if result == 0 && size > 0 {
                    if let Some(old) = self.live.insert(ptr, size) {
                        self.stats.implied_frees += 1;
                        self.row(&row, "free", ptr, old)?;
                    }
                    self.row(&row, "allocate", ptr, size)?;
                } else if result == OUT_OF_MEMORY {
                    self.row(&row, "allocate failure", 0, size)?;
                }
            }
            &Event::Free {
                call,
                ptr,
                stream,
                caller,
            } if !call.is_host() => match self.live.remove(&ptr) {
                Some(size) => {
                    let row = Row {
                        stream,
                        caller,
                        ..at
                    };
                    self.release_held()?;
                    self.held = Some((row, ptr, size));
                }
                None => self.stats.unknown_frees += 1,
            },
            &Event::FreeFailed { call, ptr, .. }
                if !call.is_host()
                    && self.held.as_ref().is_some_and(|(row, held, _)| {
                        *held == ptr && row.thread == record.thread
                    }) =>
            {
                // The free never happened, and its row was not written.
                if let Some((_, ptr, size)) = self.held.take() {
                    self.live.insert(ptr, size);
                }
            }
            &Event::FreeFailed {
                call,
                ptr,
                size,
                caller,
                ..
            } if !call.is_host() && size > 0 && !self.live.contains_key(&ptr) => {
                // The free did not happen: the block is live again.
                self.live.insert(ptr, size);
                self.row(&Row { caller, ..at }, "allocate", ptr, size)?;
            }
            &Event::Map {
                ptr, size, result, ..
            } if result == 0 && size > 0 && !self.live.contains_key(&ptr) => {
                self.mappings.insert(ptr, size);
                self.live.insert(ptr, size);
                self.row(&at, "allocate", ptr, size)?;
            }
            &Event::Unmap { ptr, size } => {
                let inside: Vec<(u64, u64)> = self
                    .mappings
                    .range(ptr..ptr.saturating_add(size))
                    .map(|(&start, &size)| (start, size))
                    .collect();
                for (start, size) in inside {
                    self.mappings.remove(&start);
                    self.live.remove(&start);
                    self.row(&at, "free", start, size)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Write the `free` row held back, if any.
    fn release_held(&mut self) -> io::Result<()> {
        match self.held.take() {
            Some((row, ptr, size)) => self.write_row(&row, "free", ptr, size),
            None => Ok(()),
        }
    }

    fn row(&mut self, row: &Row, action: &str, ptr: u64, size: u64) -> io::Result<()> {
        self.release_held()?;
        self.write_row(row, action, ptr, size)
    }

    fn write_row(&mut self, row: &Row, action: &str, ptr: u64, size: u64) -> io::Result<()> {
        let caller = self
            .libraries
            .get(row.caller as usize)
            .filter(|name| !name.is_empty())
            .map_or("(unknown)", String::as_str);
        self.stats.rows += 1;
        writeln!(
            self.out,
            "{},{},{action},{ptr:#x},{size},{:#x},{caller}",
            row.thread,
            rmm_time(row.time_ns),
            row.stream
        )
    }

    /// Flush and say what was written.
    pub fn finish(mut self) -> io::Result<RmmStats> {
        self.release_held()?;
        self.out.flush()?;
        Ok(self.stats)
    }
}

#[derive(Clone, Copy)]
struct Row {
    thread: u32,
    time_ns: u64,
    stream: u64,
    caller: u32,
}

/// Nanoseconds as RMM writes times: `HH:MM:SS.ffffff`.
fn rmm_time(ns: u64) -> String {
    let micros = ns / 1_000;
    let seconds = micros / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        micros % 1_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Call;

    /// The Action column of each row below the header.
    fn actions(lines: &[String]) -> Vec<&str> {
        lines[1..]
            .iter()
            .map(|line| line.split(',').nth(2).unwrap())
            .collect()
    }

    fn rows(events: Vec<Event<'static>>) -> (Vec<String>, RmmStats) {
        rows_of_threads(events.into_iter().map(|event| (9, event)))
    }

    /// The RMM log of `events`, each made on its thread, a microsecond
    /// apart: its lines, the header first, and what the writer counted.
    fn rows_of_threads(
        events: impl IntoIterator<Item = (u32, Event<'static>)>,
    ) -> (Vec<String>, RmmStats) {
        let mut out = Vec::new();
        let mut writer = RmmWriter::new(&mut out).unwrap();
        for (index, (thread, event)) in events.into_iter().enumerate() {
            writer
                .record(&Record {
                    time_ns: 3_723_000_001_000 + index as u64 * 1_000,
                    thread,
                    event,
                })
                .unwrap();
        }
        let stats = writer.finish().unwrap();
        let text = String::from_utf8(out).unwrap();
        (text.lines().map(str::to_string).collect(), stats)
    }

    /// A `cuMemFree` of `size` bytes at `ptr` the driver refused.
    fn failed_free(ptr: u64, size: u64) -> Event<'static> {
        Event::FreeFailed {
            call: Call::MemFree,
            ptr,
            size,
            caller: 1,
            result: 700,
        }
    }

    fn alloc(ptr: u64, size: u64, result: i32) -> Event<'static> {
        Event::Alloc {
            call: Call::MemAlloc,
            ptr,
            size,
            stream: 0,
            caller: 1,
            result,
        }
    }

    fn free(ptr: u64) -> Event<'static> {
        Event::Free {
            call: Call::MemFree,
            ptr,
            stream: 0,
            caller: 1,
        }
    }

    #[test]
    fn allocations_frees_and_failures_become_rows() {
        let (lines, stats) = rows(vec![
            Event::Library {
                id: 1,
                path: "/lib/libodd,name.so".into(),
            },
            alloc(0x1000, 512, 0),
            alloc(0, 1 << 40, OUT_OF_MEMORY),
            alloc(0, 0, 1),
            free(0x1000),
            free(0x2000),
        ]);
        assert_eq!(lines[0], HEADER);
        assert_eq!(
            lines[1],
            "9,01:02:03.000002,allocate,0x1000,512,0x0,libodd_name.so"
        );
        assert_eq!(
            lines[2],
            "9,01:02:03.000003,allocate failure,0x0,1099511627776,0x0,libodd_name.so"
        );
        assert_eq!(
            lines[3],
            "9,01:02:03.000005,free,0x1000,512,0x0,libodd_name.so"
        );
        assert_eq!(lines.len(), 4);
        assert_eq!(stats.unknown_frees, 1);
        assert_eq!(stats.rows, 3);
    }

    #[test]
    fn mappings_are_blocks_and_an_unmap_frees_every_one_inside() {
        let map = |ptr| Event::Map {
            ptr,
            size: 2 << 20,
            offset: 0,
            handle: 1,
            result: 0,
        };
        let (lines, _) = rows(vec![
            map(0x20_0000),
            map(0x40_0000),
            map(0x80_0000),
            Event::Unmap {
                ptr: 0x20_0000,
                size: 4 << 20,
            },
        ]);
        let actions = actions(&lines);
        assert_eq!(
            actions,
            ["allocate", "allocate", "allocate", "free", "free"]
        );
        assert!(lines[4].contains("0x200000"));
        assert!(lines[5].contains("0x400000"));
    }

    #[test]
    fn an_unseen_free_is_implied_and_a_failed_free_restores_the_block() {
        let (lines, stats) = rows(vec![
            alloc(0x1000, 512, 0),
            alloc(0x1000, 256, 0),
            free(0x1000),
            failed_free(0x1000, 256),
            free(0x1000),
        ]);
        let actions = actions(&lines);
        // The refused free wrote nothing: no free, no allocation again.
        assert_eq!(actions, ["allocate", "free", "allocate", "free"]);
        assert_eq!(stats.implied_frees, 1);
    }

    #[test]
    fn a_failed_free_after_another_threads_row_restores_the_block() {
        let events = [
            (1, alloc(0x1000, 256, 0)),
            (1, free(0x1000)),
            (2, alloc(0x9000, 64, 0)),
            (1, failed_free(0x1000, 256)),
        ];
        let (lines, _) = rows_of_threads(events);
        assert_eq!(
            actions(&lines),
            ["allocate", "free", "allocate", "allocate"]
        );
    }
}
