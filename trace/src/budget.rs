//! [`ReadBudget`]: what one trace file may cost the readers, stated once.
//!
//! Every count grows with the bytes a reader really decodes: a reader takes
//! at most one object, memo entry, container item, record or frame per
//! byte it decodes, and each of them holds a bounded number of bytes, so a
//! file costs at most a fixed multiple of its own decoded bytes. A
//! compressed file may decode to at most [`DECODED_PER_FILE_BYTE`] bytes
//! per byte of it really read (so a small gzip followed by a hole of zeros
//! decodes no further than the small gzip allows). Above that, one ceiling
//! bounds what a reader holds in memory, whatever the file:
//! [`MEMORY_ENV`] (`CUDAMEM_READ_MEMORY`, default
//! [`DEFAULT_MEMORY_BYTES`]) raises it, and every refusal at a bound says
//! so.

use crate::rmm_csv;

/// Bytes a compressed file may decode to per byte of the file read: above
/// the ratio of any real log or snapshot, far below a decompression bomb's.
pub const DECODED_PER_FILE_BYTE: u64 = 64;

/// The fewest decoded bytes a budget allows, however small the file (a
/// tiny file's ratio says little).
pub const MIN_DECODED_BYTES: u64 = 1 << 20;

/// The environment variable that sets the memory a reader may hold
/// (`8G`, `4096MiB`, bytes); its decoded bytes may be
/// [`DECODED_PER_MEMORY_BYTE`] times that.
pub const MEMORY_ENV: &str = "CUDAMEM_READ_MEMORY";

/// The memory a reader may hold when [`MEMORY_ENV`] is not set: a
/// snapshot of 400 MB decoded with a stack per entry takes well under it.
pub const DEFAULT_MEMORY_BYTES: u64 = 1 << 30;

/// Decoded bytes read per byte of memory allowed: the most a reader reads
/// of one file is this many times its memory ceiling.
pub const DECODED_PER_MEMORY_BYTE: u64 = 4;

/// Bytes a trace's record costs once read (the event, where it came from,
/// its time and stack): what a record counts against the memory ceiling.
pub const BYTES_PER_EVENT: u64 = 96;

/// What a reader may take from one trace file before it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadBudget {
    /// The file's contents once decompressed, bytes.
    pub decoded_bytes: u64,
    /// One line of a CSV log, bytes.
    pub line_bytes: u64,
    /// Containers and strings of a pickle.
    pub objects: u64,
    /// Memo entries of a pickle (each names one object; a reference to it
    /// shares, never copies).
    pub memo_entries: u64,
    /// Items of all a pickle's lists, tuples, sets and dicts together.
    pub container_items: u64,
    /// Records a reader visits: CSV rows, snapshot trace entries and
    /// segment blocks, each reference to a shared list counted again.
    pub events: u64,
    /// Frames read to find where blocks were allocated (a frames list
    /// shared by many blocks is read once).
    pub frames: u64,
    /// Values open on a pickle's stack at once: how deep it may nest.
    pub stack_values: u64,
    /// MARKs open at once.
    pub marks: u64,
    /// Bytes a command may print about the file.
    pub output_bytes: u64,
    /// Bytes a pickle's objects, strings, memo entries and items may hold
    /// together, as the reader counts them (the memory ceiling).
    pub held_bytes: u64,
}

/// What a reader holds for `objects` containers and strings, `memo`
/// entries and `items` container items, bytes, at the least: a vector
/// header per object, one stored value per entry and item.
pub fn held_bytes(objects: u64, memo: u64, items: u64) -> u64 {
    objects
        .saturating_mul(24)
        .saturating_add(memo.saturating_mul(8))
        .saturating_add(items.saturating_mul(8))
}

/// The memory a reader may hold: [`MEMORY_ENV`] where it is set to a byte
/// count, else [`DEFAULT_MEMORY_BYTES`].
pub fn memory_bytes() -> u64 {
    std::env::var(MEMORY_ENV)
        .ok()
        .and_then(|text| memcore::bytes::parse(&text).ok())
        .filter(|&bytes| bytes > 0)
        .unwrap_or(DEFAULT_MEMORY_BYTES)
}

impl ReadBudget {
    /// The bounds of the default memory ceiling, however large the file.
    pub const CEILING: ReadBudget = ReadBudget::with_memory(DEFAULT_MEMORY_BYTES);

    /// The bounds no file passes when a reader may hold `memory` bytes.
    pub const fn with_memory(memory: u64) -> ReadBudget {
        let decoded = memory.saturating_mul(DECODED_PER_MEMORY_BYTE);
        ReadBudget {
            decoded_bytes: decoded,
            line_bytes: rmm_csv::MAX_LINE_BYTES,
            objects: decoded,
            memo_entries: decoded,
            container_items: decoded,
            events: memory / BYTES_PER_EVENT,
            frames: decoded,
            stack_values: 1_000_000,
            marks: 1_000,
            output_bytes: if memory < 1 << 30 { memory } else { 1 << 30 },
            held_bytes: memory,
        }
    }

    /// The budget of a file of `file_bytes` bytes on disk, under the
    /// memory ceiling [`memory_bytes`] says.
    pub fn for_file(file_bytes: u64) -> ReadBudget {
        Self::for_file_within(file_bytes, &ReadBudget::with_memory(memory_bytes()))
    }

    /// The budget of a file of `file_bytes` bytes on disk within `ceiling`.
    pub fn for_file_within(file_bytes: u64, ceiling: &ReadBudget) -> ReadBudget {
        let decoded = file_bytes.saturating_mul(DECODED_PER_FILE_BYTE).clamp(
            MIN_DECODED_BYTES,
            ceiling.decoded_bytes.max(MIN_DECODED_BYTES),
        );
        ReadBudget {
            decoded_bytes: decoded,
            objects: decoded.min(ceiling.objects),
            memo_entries: decoded.min(ceiling.memo_entries),
            container_items: decoded.min(ceiling.container_items),
            events: decoded.min(ceiling.events),
            frames: decoded.min(ceiling.frames),
            // A line of text per record, with room for the headings.
            output_bytes: decoded
                .saturating_mul(256)
                .clamp(1 << 20, ceiling.output_bytes.max(1 << 20)),
            ..*ceiling
        }
    }
}

impl ReadBudget {
    /// This budget with the bounds on what a reader visits (records,
    /// frames, output) lowered to what `decoded_bytes`, the bytes really
    /// decoded, can honestly hold: one record or frame per byte. A record
    /// reached again through a shared reference costs a few bytes of
    /// pickle, so a file that shares to multiply its records meets this.
    pub fn for_decoded(&self, decoded_bytes: u64) -> ReadBudget {
        ReadBudget {
            events: self.events.min(decoded_bytes),
            frames: self.frames.min(decoded_bytes),
            output_bytes: self
                .output_bytes
                .min(decoded_bytes.saturating_mul(256).max(1 << 20)),
            ..*self
        }
    }

    /// This budget's records lowered to what is left of the memory ceiling
    /// once `held` bytes are taken (the pickle a trace is built from).
    pub fn after_holding(&self, held: u64) -> ReadBudget {
        ReadBudget {
            events: self
                .events
                .min(self.held_bytes.saturating_sub(held) / BYTES_PER_EVENT),
            ..*self
        }
    }
}

/// A count against one bound of a [`ReadBudget`].
#[derive(Debug, Clone, Copy)]
pub struct Counter {
    used: u64,
    limit: u64,
}

impl Counter {
    /// A count of nothing yet, against `limit`.
    pub fn new(limit: u64) -> Self {
        Self { used: 0, limit }
    }

    /// Count `amount` more; `false` once the count passes the limit.
    pub fn take(&mut self, amount: u64) -> bool {
        self.used = self.used.saturating_add(amount);
        self.used <= self.limit
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bound_grows_with_the_file_up_to_its_ceiling() {
        let ceiling = ReadBudget::CEILING;
        let small = ReadBudget::for_file_within(1000, &ceiling);
        assert_eq!(small.decoded_bytes, MIN_DECODED_BYTES);
        let mid = ReadBudget::for_file_within(10 << 20, &ceiling);
        assert_eq!(mid.decoded_bytes, 640 << 20);
        assert_eq!(mid.container_items, 640 << 20);
        assert_eq!(mid.events, ceiling.events);
        assert_eq!(ReadBudget::for_file_within(u64::MAX, &ceiling), ceiling);
        // A larger ceiling lifts every count with it.
        let more = ReadBudget::with_memory(8 << 30);
        assert_eq!(more.decoded_bytes, 32 << 30);
        assert!(more.events > ceiling.events);
        let mut counter = Counter::new(2);
        assert!(counter.take(2));
        assert!(!counter.take(1));
    }
}
