//! Property tests of the pool over a backed simulated device: random
//! allocate / free / write / pin / compact / shrink sequences, checked
//! against a plain model of what each live block must hold.

use ctx::Handle;
use ctx::{CompactionPolicy, Error, Growth, Pool, PoolConfig, SimConfig, SimDevice};
use proptest::prelude::*;

const PAGE: u64 = 64 << 10;
const CAPACITY: u64 = 4 << 20;

#[derive(Debug, Clone)]
enum Op {
    Allocate { size: u64, align_log2: u32 },
    Free { pick: usize },
    Write { pick: usize, seed: u8 },
    Pin { pick: usize },
    Compact,
    Shrink,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..=96 << 10, 0u32..=16).prop_map(|(size, align_log2)| Op::Allocate { size, align_log2 }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(pick, seed)| Op::Write { pick, seed }),
        1 => any::<usize>().prop_map(|pick| Op::Pin { pick }),
        1 => Just(Op::Compact),
        1 => Just(Op::Shrink),
    ]
}

fn config() -> impl Strategy<Value = PoolConfig> {
    let growth = prop_oneof![Just(Growth::Vmm), Just(Growth::Chunks)];
    let policy = prop_oneof![
        Just(CompactionPolicy::Never),
        Just(CompactionPolicy::BeforeGrow),
        Just(CompactionPolicy::WhenGrowFails),
    ];
    (growth, policy, 8u64..=24, 1u64..=4).prop_map(
        |(growth, compaction, max_pages, chunk_pages)| PoolConfig {
            growth,
            compaction,
            reserve_bytes: 32 * PAGE,
            max_bytes: max_pages * PAGE,
            min_growth_bytes: chunk_pages * PAGE,
            growth_divisor: 0,
            peers: ctx::PeerSet::NONE,
        },
    )
}

/// What a live block must hold.
#[derive(Debug, Clone, Copy)]
struct Block {
    handle: Handle,
    size: u64,
    align: u64,
    seed: u8,
    pinned: bool,
}

/// The bytes a block written with `seed` holds; position-dependent, so a
/// block copied to the wrong offset or half-copied shows.
fn pattern(seed: u8, size: u64) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31) ^ ((i >> 8) as u8) ^ seed)
        .collect()
}

fn check_contents(pool: &Pool<SimDevice>, live: &[Block]) -> Result<(), TestCaseError> {
    let mut guard = pool.lock();
    for b in live {
        let mut out = vec![0; b.size as usize];
        guard
            .read(b.handle, 0, &mut out)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(
            out == pattern(b.seed, b.size),
            "block {:?} lost its contents",
            b
        );
    }
    Ok(())
}

fn check_layout(
    pool: &Pool<SimDevice>,
    live: &[Block],
    config: &PoolConfig,
) -> Result<(), TestCaseError> {
    let guard = pool.lock();
    let mut ranges = Vec::new();
    for b in live {
        let ptr = guard
            .device_ptr(b.handle)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(ptr != 0);
        prop_assert_eq!(ptr % b.align, 0, "block {:?} misaligned at {:#x}", b, ptr);
        ranges.push((ptr, ptr + b.size));
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        prop_assert!(pair[0].1 <= pair[1].0, "blocks overlap: {:x?}", pair);
    }
    let stats = guard.stats();
    let device = guard.device();
    prop_assert_eq!(stats.heap.live_blocks, live.len() as u64);
    prop_assert_eq!(
        stats.mapped_bytes,
        device.used_bytes(),
        "pool and device disagree"
    );
    prop_assert_eq!(stats.mapped_bytes % PAGE, 0);
    prop_assert!(stats.mapped_bytes <= config.max_bytes);
    prop_assert!(stats.peak_mapped_bytes >= stats.mapped_bytes);
    prop_assert_eq!(stats.heap.managed_bytes, stats.mapped_bytes);
    Ok(())
}

/// A request that a full slide plus all remaining headroom must satisfy:
/// every live block then sits at most `align - 1` bytes after the previous,
/// and the allocator places the new block 256-aligned in whole 256 bytes.
fn surely_fits(config: &PoolConfig, live: &[Block], size: u64, align: u64) -> bool {
    let packed: u64 = live.iter().map(|b| b.size + b.align - 1).sum();
    config.max_bytes >= packed + size.next_multiple_of(256) + align.max(256) - 1
}

fn run(config: PoolConfig, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let pool = Pool::new(SimDevice::new(SimConfig::small(CAPACITY)), config)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut live: Vec<Block> = Vec::new();
    // The guards of the pinned blocks; dropping one unpins its block.
    let mut pins = Vec::new();
    for op in ops {
        let before = pool.stats();
        match op {
            Op::Allocate { size, align_log2 } => {
                let align = 1u64 << align_log2;
                match pool.allocate(size, align, None) {
                    Ok(handle) => {
                        let seed = live.len() as u8;
                        pool.write(handle, 0, &pattern(seed, size))
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        live.push(Block {
                            handle,
                            size,
                            align,
                            seed,
                            pinned: false,
                        });
                        let after = pool.stats();
                        prop_assert!(after.mapped_bytes <= config.max_bytes);
                        if after.bytes_moved != before.bytes_moved {
                            check_contents(&pool, &live)?;
                        }
                    }
                    Err(Error::OutOfMemory {
                        requested,
                        free_bytes,
                        pool_bytes,
                        ..
                    }) => {
                        prop_assert_eq!(requested, size);
                        let stats = pool.stats();
                        prop_assert_eq!(free_bytes, stats.heap.free_bytes);
                        prop_assert_eq!(pool_bytes, stats.mapped_bytes);
                        let compacting = config.compaction != CompactionPolicy::Never;
                        let pinned = live.iter().any(|b| b.pinned);
                        if compacting && !pinned && config.growth == Growth::Vmm {
                            prop_assert!(
                                !surely_fits(&config, &live, size, align),
                                "{} bytes aligned {} refused with room: {:?}",
                                size,
                                align,
                                stats
                            );
                        }
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("allocate: {e}"))),
                }
            }
            Op::Free { pick } if !live.is_empty() => {
                let b = live.swap_remove(pick % live.len());
                pool.free(b.handle)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(pool.free(b.handle).is_err(), "double free accepted");
                // A guard outliving its freed block unpins nothing.
                pins.retain(|pin: &ctx::PinGuard<'_, SimDevice>| pin.handle() != b.handle);
            }
            Op::Write { pick, seed } if !live.is_empty() => {
                let i = pick % live.len();
                live[i].seed = seed;
                let b = live[i];
                pool.write(b.handle, 0, &pattern(seed, b.size))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(
                    pool.write(b.handle, b.size, &[0]).is_err(),
                    "write past the end accepted"
                );
            }
            Op::Pin { pick } if !live.is_empty() => {
                let i = pick % live.len();
                live[i].pinned = !live[i].pinned;
                let b = live[i];
                if b.pinned {
                    let pin = pool
                        .pin(b.handle)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(Some(pin.ptr()), pool.device_ptr(b.handle).ok());
                    prop_assert!(
                        matches!(pool.pin(b.handle), Err(Error::AlreadyPinned(h)) if h == b.handle),
                        "a second pin of one block accepted"
                    );
                    pins.push(pin);
                } else {
                    pins.retain(|pin| pin.handle() != b.handle);
                }
            }
            Op::Compact => {
                let pinned: Vec<_> = live
                    .iter()
                    .filter(|b| b.pinned)
                    .map(|b| pool.device_ptr(b.handle).unwrap_or(0))
                    .collect();
                let report = pool
                    .compact()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                // A slide can scatter free space into alignment gaps, so
                // neither the largest free block nor (with the allocator's
                // minimum block size) the free bytes must grow.
                let after = pool.stats();
                prop_assert_eq!(report.free_bytes, after.heap.free_bytes);
                prop_assert_eq!(after.bytes_moved, before.bytes_moved + report.bytes_moved);
                let still: Vec<_> = live
                    .iter()
                    .filter(|b| b.pinned)
                    .map(|b| pool.device_ptr(b.handle).unwrap_or(1))
                    .collect();
                prop_assert_eq!(&pinned, &still, "a pinned block moved");
                let mut guarded: Vec<u64> = pins.iter().map(|pin| pin.ptr()).collect();
                let mut still = still;
                guarded.sort_unstable();
                still.sort_unstable();
                prop_assert_eq!(guarded, still, "a guard's pointer is stale");
                check_contents(&pool, &live)?;
            }
            Op::Shrink => {
                let released = pool
                    .shrink()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let after = pool.stats();
                prop_assert_eq!(after.mapped_bytes, before.mapped_bytes - released);
                prop_assert_eq!(
                    pool.shrink()
                        .map_err(|e| TestCaseError::fail(e.to_string()))?,
                    0
                );
                check_contents(&pool, &live)?;
            }
            _ => {}
        }
        check_layout(&pool, &live, &config)?;
    }
    check_contents(&pool, &live)?;

    // Everything freed, the pool gives every byte back.
    for b in live.drain(..) {
        pool.free(b.handle)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    pool.shrink()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(pool.stats().mapped_bytes, 0);
    drop(pins);
    let device = pool.into_device();
    prop_assert_eq!(device.used_bytes(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn pool_keeps_contents_and_layout(config in config(), ops in prop::collection::vec(op(), 1..80)) {
        run(config, ops)?;
    }
}
