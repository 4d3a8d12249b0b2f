//! The transitions a heap goes through, and the strategies that generate
//! them. Blocks are picked by index into whatever is live when the step
//! runs, so a shrunk sequence still names real blocks.

use proptest::prelude::*;
use proptest::sample::Index;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// How the first region is laid.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// Start of the first region, bytes (deliberately not always aligned).
    pub base: u64,
    /// Its length in bytes.
    pub size: u64,
}

/// A bad request the heap must refuse without changing.
#[derive(Debug, Clone, Copy)]
pub enum BadRequest {
    ZeroSize,
    AlignNotPowerOfTwo,
    AlignTooLarge,
}

#[derive(Debug, Clone)]
pub enum Step {
    Allocate {
        size: u64,
        align: u64,
        pinned: bool,
        seed: u64,
    },
    AllocateBad(BadRequest),
    Free(Index),
    /// Free a handle freed before: must be refused and change nothing.
    FreeStale(Index),
    /// Free a live block, then free it again at once.
    DoubleFree(Index),
    SetPinned(Index, bool),
    CompactFull,
    /// Make room for a request, then allocate it.
    CompactRoom {
        size: u64,
        align: u64,
        seed: u64,
    },
    /// Make room for a request sized to need compaction: between the
    /// largest free range and all free bytes, `permille` of the way.
    CompactRoomFragmented {
        permille: u64,
        align: u64,
        seed: u64,
    },
    /// Add a region `gap` bytes above the highest one (0: contiguous, so it
    /// extends it), or below the lowest one when `below`.
    Grow {
        size: u64,
        gap: u64,
        below: bool,
    },
    /// Add a region overlapping the picked one: must be refused.
    GrowOverlapping(Index, u64),
    Shrink {
        min_bytes: u64,
    },
}

pub fn setup() -> impl Strategy<Value = Setup> {
    (0..MIB, 64 * KIB..=8 * MIB).prop_map(|(base, size)| Setup { base, size })
}

/// Request sizes in bytes: mostly small, sometimes up to 1 MiB.
pub fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1..=512u64,
        3 => 513..=8 * KIB,
        2 => 8 * KIB + 1..=64 * KIB,
        1 => 64 * KIB + 1..=MIB,
    ]
}

/// Alignments in bytes: powers of two from 1 to 2 MiB, mostly 256.
pub fn align() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => Just(256u64),
        3 => (0u32..=12).prop_map(|s| 1u64 << s),
        1 => (13u32..=21).prop_map(|s| 1u64 << s),
    ]
}

pub fn step() -> impl Strategy<Value = Step> {
    let bad = prop_oneof![
        Just(BadRequest::ZeroSize),
        Just(BadRequest::AlignNotPowerOfTwo),
        Just(BadRequest::AlignTooLarge),
    ];
    prop_oneof![
        10 => (size(), align(), proptest::bool::weighted(0.15), any::<u64>())
            .prop_map(|(size, align, pinned, seed)| Step::Allocate { size, align, pinned, seed }),
        1 => bad.prop_map(Step::AllocateBad),
        5 => any::<Index>().prop_map(Step::Free),
        1 => any::<Index>().prop_map(Step::FreeStale),
        1 => any::<Index>().prop_map(Step::DoubleFree),
        2 => (any::<Index>(), any::<bool>()).prop_map(|(i, p)| Step::SetPinned(i, p)),
        2 => Just(Step::CompactFull),
        3 => (size(), align(), any::<u64>())
            .prop_map(|(size, align, seed)| Step::CompactRoom { size, align, seed }),
        3 => (prop_oneof![0..=50u64, 0..=1000u64], align(), any::<u64>()).prop_map(|(permille, align, seed)| {
            Step::CompactRoomFragmented { permille, align, seed }
        }),
        1 => (4 * KIB..=4 * MIB, prop_oneof![Just(0u64), 1..=MIB], proptest::bool::weighted(0.2))
            .prop_map(|(size, gap, below)| Step::Grow { size, gap, below }),
        1 => (any::<Index>(), 1..=64 * KIB).prop_map(|(i, len)| Step::GrowOverlapping(i, len)),
        1 => prop_oneof![Just(0u64), 1..=4 * MIB].prop_map(|min_bytes| Step::Shrink { min_bytes }),
    ]
}

pub fn steps(max: usize) -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(step(), 1..=max)
}
