//! [`Line`]: a record being written, on the stack, with no heap: the
//! interposer builds one inside any driver call. The primitives here write
//! one column each; which column a field is, is said by the record table
//! (see [`super::columns`]).

use super::{MAX_LINE_BYTES, MAX_NAME_BYTES};

/// A line being written: fixed capacity, no heap, so the interposer can
/// build one on its stack inside any driver call.
pub struct Line {
    bytes: [u8; MAX_LINE_BYTES],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Self::new()
    }
}

impl Line {
    /// An empty line (`const`, for a thread-local one).
    pub const fn new() -> Self {
        Self {
            bytes: [0; MAX_LINE_BYTES],
            len: 0,
        }
    }

    /// The bytes written so far, the line end included once finished.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
    }

    /// End the line. The line end always fits: fields are bounded, and the
    /// last byte is kept for it.
    pub(super) fn finish(&mut self) {
        self.len = self.len.min(MAX_LINE_BYTES - 1);
        self.push(b'\n');
    }

    /// Append `bytes` whole, or not at all when the line is full (fields
    /// are bounded so that a line always fits). Short runs are copied byte
    /// by byte: a call to `memcpy` per field costs more than the copy.
    fn put(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end > MAX_LINE_BYTES {
            return;
        }
        if bytes.len() <= 16 {
            for (slot, &byte) in self.bytes[self.len..end].iter_mut().zip(bytes) {
                *slot = byte;
            }
        } else {
            self.bytes[self.len..end].copy_from_slice(bytes);
        }
        self.len = end;
    }

    pub(super) fn push(&mut self, byte: u8) {
        if self.len < MAX_LINE_BYTES {
            self.bytes[self.len] = byte;
            self.len += 1;
        }
    }

    pub(super) fn tab(&mut self) {
        self.push(b'\t');
    }

    pub(super) fn word(&mut self, word: &str) {
        self.put(word.as_bytes());
    }

    pub(super) fn dec(&mut self, value: u64) {
        const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
            2021222324252627282930313233343536373839\
            4041424344454647484950515253545556575859\
            6061626364656667686970717273747576777879\
            8081828384858687888990919293949596979899";
        let digits = if value == 0 {
            1
        } else {
            value.ilog10() as usize + 1
        };
        let end = self.len + digits;
        if end > MAX_LINE_BYTES {
            return;
        }
        let out = &mut self.bytes[self.len..end];
        let mut at = digits;
        let mut rest = value;
        while rest >= 100 {
            let pair = (rest % 100) as usize * 2;
            rest /= 100;
            at -= 2;
            out[at] = PAIRS[pair];
            out[at + 1] = PAIRS[pair + 1];
        }
        if rest >= 10 {
            let pair = rest as usize * 2;
            out[at - 2] = PAIRS[pair];
            out[at - 1] = PAIRS[pair + 1];
        } else {
            out[at - 1] = b'0' + rest as u8;
        }
        self.len = end;
    }

    pub(super) fn signed(&mut self, value: i64) {
        if value < 0 {
            self.push(b'-');
        }
        self.dec(value.unsigned_abs());
    }

    pub(super) fn hex(&mut self, value: u64) {
        let nibbles = ((64 - value.leading_zeros()).div_ceil(4)).max(1) as usize;
        let end = self.len + 2 + nibbles;
        if end > MAX_LINE_BYTES {
            return;
        }
        let out = &mut self.bytes[self.len..end];
        out[0] = b'0';
        out[1] = b'x';
        for (index, digit) in out[2..].iter_mut().enumerate() {
            let shift = 4 * (nibbles - 1 - index);
            *digit = b"0123456789abcdef"[((value >> shift) & 15) as usize];
        }
        self.len = end;
    }

    pub(super) fn maybe(&mut self, value: Option<u64>) {
        match value {
            Some(value) => self.dec(value),
            None => self.push(b'-'),
        }
    }

    pub(super) fn text(&mut self, text: &str) {
        let text = cut(text, MAX_NAME_BYTES).as_bytes();
        if !text.iter().any(|&b| matches!(b, b'\\' | b'\t' | b'\n')) {
            self.put(text);
            return;
        }
        for &byte in text {
            match byte {
                b'\\' => self.word("\\\\"),
                b'\t' => self.word("\\t"),
                b'\n' => self.word("\\n"),
                other => self.push(other),
            }
        }
    }
}

/// `text` cut to at most `max` bytes on a character boundary.
pub(super) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
