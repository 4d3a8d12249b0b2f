//! The seeded byte pattern, on the host and on the device.
//!
//! Byte `i` of the pattern for seed `s` is byte `i % 8` (little-endian) of
//! the `i / 8`-th output of SplitMix64 started at state `s`. The device side
//! is `kernels/cuda/pattern.cuh`; both must produce the same bytes.

use bytemuck::{Pod, Zeroable};

use crate::kernel::{Kernel, LaunchShape};
use crate::module::{KernelInfo, Module};

/// The `word`-th (0-based) SplitMix64 output for initial state `seed`.
///
/// ```
/// // The first output of SplitMix64 from state 0.
/// assert_eq!(kernels::pattern::word(0, 0), 0xe220_a839_7b1d_cdaf);
/// ```
pub fn word(seed: u64, word: u64) -> u64 {
    let mut z = seed.wrapping_add(word.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Byte `index` of the pattern for `seed`.
pub fn byte(seed: u64, index: u64) -> u8 {
    word(seed, index / 8).to_le_bytes()[(index % 8) as usize]
}

/// Writes pattern bytes `first..first + out.len()` into `out`.
pub fn fill(seed: u64, first: u64, out: &mut [u8]) {
    for (index, b) in (first..).zip(out.iter_mut()) {
        *b = byte(seed, index);
    }
}

/// Counts the bytes of `data` that differ from pattern bytes
/// `first..first + data.len()`.
pub fn mismatches(seed: u64, first: u64, data: &[u8]) -> u64 {
    (first..)
        .zip(data)
        .map(|(index, &b)| u64::from(b != byte(seed, index)))
        .sum()
}

/// Parameters of [`FILL`] and [`VERIFY`]; matches `PatternParams` in
/// `pattern.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct PatternParams {
    /// Device address of the buffer.
    pub dst: u64,
    /// Buffer length in bytes.
    pub len: u64,
    /// Pattern seed.
    pub seed: u64,
    /// Device address of a `u64` that [`VERIFY`] adds the count of differing
    /// bytes to (zero it first); unused by [`FILL`].
    pub mismatches: u64,
    /// Must be zero; keeps the struct's size a multiple of 16 bytes on both
    /// sides.
    pub unused: u64,
}

/// Most threads a [`FILL`] or [`VERIFY`] launch needs: enough to keep an
/// H200 (132 multiprocessors of 2048 threads) busy several times over; the
/// kernels stride over longer buffers.
const MAX_PATTERN_THREADS: u64 = 1 << 20;

/// The launch shape for [`FILL`] or [`VERIFY`] over `len` bytes: one thread
/// per 8-byte word, at most 2^20 threads.
///
/// ```
/// use kernels::pattern::launch_shape;
/// assert_eq!(launch_shape(0).threads(), 256);
/// assert_eq!(launch_shape(1 << 30).threads(), 1 << 20);
/// ```
pub fn launch_shape(len: u64) -> LaunchShape {
    LaunchShape::covering(len.div_ceil(8).min(MAX_PATTERN_THREADS))
}

/// Grid-stride fill of `len` bytes at `dst` with the pattern.
pub const FILL: Kernel<PatternParams> = Kernel::new(&MODULE, 0);
/// Grid-stride count of the bytes at `dst` that differ from the pattern.
pub const VERIFY: Kernel<PatternParams> = Kernel::new(&MODULE, 1);

/// `pattern.ptx`.
pub static MODULE: Module = Module {
    name: "pattern",
    ptx: include_str!("../ptx/pattern.ptx"),
    kernels: &[
        KernelInfo {
            name: "pattern_fill",
            param_bytes: size_of::<PatternParams>(),
            local_bytes_per_thread: 0,
            uses_device_heap: false,
        },
        KernelInfo {
            name: "pattern_verify",
            param_bytes: size_of::<PatternParams>(),
            local_bytes_per_thread: 0,
            uses_device_heap: false,
        },
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_outputs() {
        // SplitMix64 from state 1234567 (the reference implementation's
        // published test vector).
        let expected = [
            6_457_827_717_110_365_317,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
            4_593_380_528_125_082_431,
            16_408_922_859_458_223_821,
        ];
        for (i, e) in expected.into_iter().enumerate() {
            assert_eq!(word(1_234_567, i as u64), e);
        }
    }

    #[test]
    fn fill_then_check_finds_every_flipped_byte() {
        let mut buf = vec![0u8; 1000];
        fill(42, 13, &mut buf);
        assert_eq!(mismatches(42, 13, &buf), 0);
        assert_eq!(buf[0], byte(42, 13));
        buf[7] ^= 1;
        buf[999] ^= 0x80;
        assert_eq!(mismatches(42, 13, &buf), 2);
        assert_ne!(mismatches(43, 13, &buf), 0);
    }

    #[test]
    fn bytes_are_little_endian_words() {
        let w = word(7, 3).to_le_bytes();
        for (i, b) in w.into_iter().enumerate() {
            assert_eq!(byte(7, 24 + i as u64), b);
        }
    }
}
