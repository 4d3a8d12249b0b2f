//! What the memcore benches share: the sizes they ask for, from a tiny
//! deterministic generator, so every run measures the same heap.

/// The smallest request, bytes.
pub const MIN_SIZE: u64 = 256;
/// The largest request, bytes.
pub const MAX_SIZE: u64 = 64 << 10;
/// Requests are whole multiples of this many bytes.
pub const GRANULE: u64 = 256;

/// An xorshift generator of request sizes.
pub struct XorShift(pub u64);

impl XorShift {
    /// The next size: `MIN_SIZE..=MAX_SIZE` in steps of `GRANULE`.
    pub fn size(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let steps = (MAX_SIZE - MIN_SIZE) / GRANULE + 1;
        MIN_SIZE + self.0 % steps * GRANULE
    }
}
