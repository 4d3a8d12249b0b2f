//! [`ReadBudget`]: what one trace file may cost the readers, stated once.
//!
//! Every bound is a function of the file's size on disk: a reader takes
//! at most one object, memo entry, container item or event per byte it
//! decodes, and it decodes at most [`DECODED_PER_FILE_BYTE`] bytes per byte
//! of the file. A small file built to cost a lot (a gzip of one row
//! repeated, a pickle whose memo references make one list stand for
//! thousands) meets a bound in proportion to what it really holds, and
//! every bound also has a ceiling ([`ReadBudget::CEILING`]) that keeps a
//! reader's memory well inside a workstation's.

use crate::rmm_csv;

/// Bytes a compressed file may decode to per byte of the file: above the
/// ratio of any real log or snapshot, far below a decompression bomb's.
pub const DECODED_PER_FILE_BYTE: u64 = 64;

/// The fewest decoded bytes a budget allows, however small the file (a
/// tiny file's ratio says little).
pub const MIN_DECODED_BYTES: u64 = 1 << 20;

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
    /// Bytes a pickle's objects, memo entries and items may hold together,
    /// as [`held_bytes`] estimates them: the counts' own bounds, each
    /// reached alone, stay within it; all reached at once would not.
    pub held_bytes: u64,
}

/// What a reader holds for `objects` containers and strings, `memo`
/// entries and `items` container items, bytes: a vector header and its
/// smallest heap block per object, one value per entry and item.
pub fn held_bytes(objects: u64, memo: u64, items: u64) -> u64 {
    objects
        .saturating_mul(48)
        .saturating_add(memo.saturating_mul(16))
        .saturating_add(items.saturating_mul(16))
}

impl ReadBudget {
    /// The bounds no file passes, however large: about a gigabyte of
    /// reader memory at most.
    pub const CEILING: ReadBudget = ReadBudget {
        decoded_bytes: 4 << 30,
        line_bytes: rmm_csv::MAX_LINE_BYTES,
        objects: 1 << 24,
        memo_entries: 1 << 24,
        container_items: 1 << 25,
        events: 1 << 25,
        frames: 1 << 25,
        stack_values: 1_000_000,
        marks: 1_000,
        output_bytes: 1 << 30,
        held_bytes: 1 << 30,
    };

    /// The budget of a file of `file_bytes` bytes on disk.
    pub fn for_file(file_bytes: u64) -> ReadBudget {
        let ceiling = Self::CEILING;
        let decoded = file_bytes
            .saturating_mul(DECODED_PER_FILE_BYTE)
            .clamp(MIN_DECODED_BYTES, ceiling.decoded_bytes);
        ReadBudget {
            decoded_bytes: decoded,
            line_bytes: ceiling.line_bytes,
            objects: decoded.min(ceiling.objects),
            memo_entries: decoded.min(ceiling.memo_entries),
            container_items: decoded.min(ceiling.container_items),
            events: decoded.min(ceiling.events),
            frames: decoded.min(ceiling.frames),
            stack_values: ceiling.stack_values,
            marks: ceiling.marks,
            // A line of text per record, with room for the headings.
            output_bytes: decoded
                .saturating_mul(256)
                .clamp(1 << 20, ceiling.output_bytes),
            held_bytes: ceiling.held_bytes,
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
        let small = ReadBudget::for_file(1000);
        assert_eq!(small.decoded_bytes, MIN_DECODED_BYTES);
        let mid = ReadBudget::for_file(10 << 20);
        assert_eq!(mid.decoded_bytes, 640 << 20);
        assert_eq!(mid.events, ReadBudget::CEILING.events);
        assert_eq!(ReadBudget::for_file(u64::MAX), ReadBudget::CEILING);
        let mut counter = Counter::new(2);
        assert!(counter.take(2));
        assert!(!counter.take(1));
    }
}
