//! A host buffer standing in for device memory, so that plans are executed on
//! real bytes and a wrong move order shows up as corrupted contents.

use memcore::{Extent, Move};

/// Bytes of address space the device buffer covers; every region the tests
/// add lies below this.
pub const DEVICE_BYTES: u64 = 48 << 20;

/// The byte a block filled from `seed` holds at `index` (bytes from its
/// start). Depends on both, so a block copied to a shifted place, or a
/// neighbour's bytes, do not pass for it.
pub fn pattern(seed: u64, index: u64) -> u8 {
    ((seed ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56)
        as u8
}

/// The device's memory, byte for byte. Pages never touched stay unbacked,
/// so a large buffer is cheap.
pub struct Device {
    bytes: Vec<u8>,
}

impl Device {
    pub fn new() -> Self {
        Self {
            bytes: vec![0; DEVICE_BYTES as usize],
        }
    }

    fn range(extent: Extent) -> core::ops::Range<usize> {
        extent.offset as usize..extent.end() as usize
    }

    /// Write block contents for `seed` over `extent`.
    pub fn fill(&mut self, extent: Extent, seed: u64) {
        for (i, byte) in self.bytes[Self::range(extent)].iter_mut().enumerate() {
            *byte = pattern(seed, i as u64);
        }
    }

    /// The first byte of `extent`, from its start, that does not hold the
    /// contents for `seed`.
    pub fn first_mismatch(&self, extent: Extent, seed: u64) -> Option<u64> {
        self.bytes[Self::range(extent)]
            .iter()
            .enumerate()
            .find(|&(i, &b)| b != pattern(seed, i as u64))
            .map(|(i, _)| i as u64)
    }

    /// Execute one move the way a device copy would: memmove semantics.
    pub fn copy(&mut self, m: &Move) {
        let src = Self::range(Extent::new(m.src, m.len));
        self.bytes.copy_within(src, m.dst as usize);
    }
}
