//! Hand-built pool scenarios on a backed simulated device: fragmentation
//! that only compaction can fix, growth and shrink figures, pins, streams,
//! errors, and sharing between threads.

use ctx::{
    CompactionPolicy, DeviceMemory, Error, Growth, HeapError, Pool, PoolConfig, SimConfig,
    SimDevice, StreamId,
};

const PAGE: u64 = 64 << 10;
const BLOCK: u64 = 4 * PAGE;

fn pool(growth: Growth, compaction: CompactionPolicy, max_bytes: u64) -> Pool<SimDevice> {
    let config = PoolConfig {
        growth,
        compaction,
        reserve_bytes: 64 * PAGE,
        max_bytes,
        // One chunk holds the whole cap, so chunk pools fragment like VMM ones;
        // VMM pools grow by what each request needs.
        min_growth_bytes: if growth == Growth::Chunks {
            max_bytes
        } else {
            0
        },
        growth_divisor: 0,
        peers: ctx::PeerSet::NONE,
    };
    Pool::new(SimDevice::new(SimConfig::small(64 * PAGE)), config).unwrap()
}

/// Fill a pool capped at 4 blocks, free blocks 0 and 2, write a marker into
/// block 3; then ask for 2 blocks' worth, which fits only after a move.
fn fragmented_request(
    growth: Growth,
    compaction: CompactionPolicy,
) -> (Pool<SimDevice>, Result<ctx::Handle, Error>) {
    let pool = pool(growth, compaction, 4 * BLOCK);
    let blocks: Vec<_> = (0..4)
        .map(|_| pool.allocate(BLOCK, 256, None).unwrap())
        .collect();
    for (i, b) in blocks.iter().enumerate() {
        pool.write(*b, 0, &[i as u8; 64]).unwrap();
    }
    pool.free(blocks[0]).unwrap();
    pool.free(blocks[2]).unwrap();
    let result = pool.allocate(2 * BLOCK, 256, None);
    let mut marker = [0; 64];
    pool.read(blocks[1], 0, &mut marker).unwrap();
    assert_eq!(marker, [1; 64]);
    pool.read(blocks[3], 0, &mut marker).unwrap();
    assert_eq!(marker, [3; 64]);
    (pool, result)
}

#[test]
fn fragmentation_at_the_cap_needs_compaction() {
    for growth in [Growth::Vmm, Growth::Chunks] {
        let (pool, result) = fragmented_request(growth, CompactionPolicy::Never);
        match result {
            Err(Error::OutOfMemory {
                requested,
                free_bytes,
                largest_free,
                pool_bytes,
                ..
            }) => {
                assert_eq!(requested, 2 * BLOCK);
                assert_eq!(free_bytes, 2 * BLOCK);
                assert_eq!(largest_free, BLOCK);
                assert_eq!(pool_bytes, 4 * BLOCK);
            }
            other => panic!("{growth:?}: expected out of memory, got {other:?}"),
        }
        assert_eq!(pool.stats().bytes_moved, 0);

        for policy in [
            CompactionPolicy::BeforeGrow,
            CompactionPolicy::WhenGrowFails,
        ] {
            let (pool, result) = fragmented_request(growth, policy);
            let big = result.unwrap_or_else(|e| panic!("{growth:?} {policy:?}: {e}"));
            let stats = pool.stats();
            assert!(
                stats.bytes_moved >= BLOCK,
                "{growth:?} {policy:?}: {stats:?}"
            );
            assert_eq!(stats.compactions, 1);
            assert_eq!(stats.peak_mapped_bytes, 4 * BLOCK);
            pool.write(big, 2 * BLOCK - 1, &[7]).unwrap();
        }
    }
}

#[test]
fn before_grow_compacts_where_when_grow_fails_grows() {
    // Same fragmentation, but room to grow: the policies differ in footprint.
    let fragment = |policy| {
        let pool = pool(Growth::Vmm, policy, 16 * BLOCK);
        let blocks: Vec<_> = (0..4)
            .map(|_| pool.allocate(BLOCK, 256, None).unwrap())
            .collect();
        pool.free(blocks[0]).unwrap();
        pool.free(blocks[2]).unwrap();
        pool.allocate(2 * BLOCK, 256, None).unwrap();
        pool.stats()
    };
    let compacting = fragment(CompactionPolicy::BeforeGrow);
    assert_eq!(compacting.peak_mapped_bytes, 4 * BLOCK);
    assert!(compacting.bytes_moved > 0);
    let growing = fragment(CompactionPolicy::WhenGrowFails);
    assert_eq!(growing.peak_mapped_bytes, 6 * BLOCK);
    assert_eq!(growing.bytes_moved, 0);
}

#[test]
fn vmm_growth_maps_whole_pages_at_the_top_and_shrink_unmaps_them() {
    let pool = pool(Growth::Vmm, CompactionPolicy::BeforeGrow, 64 * PAGE);
    let a = pool.allocate(1000, 256, None).unwrap();
    assert_eq!(pool.stats().mapped_bytes, PAGE);
    // The first block starts the reservation, which the pool names.
    assert_eq!(pool.reservation_start(), Some(pool.device_ptr(a).unwrap()));
    let b = pool.allocate(PAGE, 256, None).unwrap();
    // The tail after `a` is reused: one more page is enough.
    assert_eq!(pool.stats().mapped_bytes, 2 * PAGE);
    assert_eq!(
        pool.device_ptr(b).unwrap(),
        pool.device_ptr(a).unwrap() + 1024
    );
    let c = pool.allocate(3 * PAGE, 256, None).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.mapped_bytes, 5 * PAGE);
    assert_eq!(stats.grows, 3);
    assert_eq!(stats.reserved_va_bytes, 64 * PAGE);

    pool.free(c).unwrap();
    // b ends 1024 bytes into page 1; pages 2..5 (one mapping) go back.
    assert_eq!(pool.shrink().unwrap(), 3 * PAGE);
    assert_eq!(pool.stats().mapped_bytes, 2 * PAGE);
    assert_eq!(pool.lock().device().used_bytes(), 2 * PAGE);
    pool.free(a).unwrap();
    // b straddles pages 0 and 1: nothing whole is free at the top.
    assert_eq!(pool.shrink().unwrap(), 0);
    // Slid to the start, b fits in page 0 and page 1 goes back.
    pool.compact().unwrap();
    assert_eq!(pool.shrink().unwrap(), PAGE);
    pool.free(b).unwrap();
    assert_eq!(pool.shrink().unwrap(), PAGE);
    let stats = pool.stats();
    assert_eq!(
        (stats.mapped_bytes, stats.peak_mapped_bytes, stats.shrinks),
        (0, 5 * PAGE, 3)
    );
    let counters = pool.into_device().counters();
    assert_eq!(counters.maps, counters.unmaps);
}

#[test]
fn vmm_growth_takes_whole_steps_where_there_is_room() {
    // Steps of 8 pages, 20 pages of reservation, a device of 64 pages.
    let config = PoolConfig {
        reserve_bytes: 20 * PAGE,
        min_growth_bytes: 8 * PAGE - 1,
        growth_divisor: 0,
        ..PoolConfig::vmm(0)
    };
    let pool = Pool::new(SimDevice::new(SimConfig::small(64 * PAGE)), config).unwrap();
    let first = pool.allocate(100, 256, None).unwrap();
    assert_eq!(
        pool.stats().mapped_bytes,
        8 * PAGE,
        "a step, rounded to pages"
    );
    let small: Vec<_> = (0..8)
        .map(|_| pool.allocate(PAGE, 256, None).unwrap())
        .collect();
    assert_eq!(
        (pool.stats().mapped_bytes, pool.stats().grows),
        (16 * PAGE, 2),
        "eight pages more than the first step held: one more step"
    );
    // Nine pages need two more (the tail holds a little under eight); a
    // step of 8 does not fit under the reservation, so the growth takes the
    // 4 pages left.
    let large = pool.allocate(9 * PAGE, 256, None).unwrap();
    assert_eq!(
        (pool.stats().mapped_bytes, pool.stats().grows),
        (20 * PAGE, 3)
    );
    assert!(matches!(
        pool.allocate(3 * PAGE, 256, None),
        Err(Error::OutOfMemory { .. })
    ));
    pool.free(large).unwrap();
    for handle in small {
        pool.free(handle).unwrap();
    }
    pool.free(first).unwrap();
    // The mappings are the steps: 8 + 8 + 4 pages, all free, all given back.
    assert_eq!(pool.shrink().unwrap(), 20 * PAGE);
    let counters = pool.into_device().counters();
    assert_eq!((counters.maps, counters.unmaps), (3, 3));
}

#[test]
fn a_vmm_step_shrinks_to_what_is_left() {
    // Room for 5 pages under max_bytes and 3 on the device (64 pages less 61
    // the context takes): steps of 8 shrink to what fits, then to what the
    // request needs.
    let capped = PoolConfig {
        reserve_bytes: 64 * PAGE,
        max_bytes: 5 * PAGE,
        min_growth_bytes: 8 * PAGE,
        growth_divisor: 0,
        ..PoolConfig::vmm(0)
    };
    let pool = Pool::new(SimDevice::new(SimConfig::small(64 * PAGE)), capped).unwrap();
    pool.allocate(100, 256, None).unwrap();
    assert_eq!(pool.stats().mapped_bytes, 5 * PAGE, "capped by max_bytes");

    let device_full = SimConfig {
        context_reserved_bytes: 61 * PAGE,
        ..SimConfig::small(64 * PAGE)
    };
    let config = PoolConfig {
        reserve_bytes: 64 * PAGE,
        min_growth_bytes: 8 * PAGE,
        growth_divisor: 0,
        ..PoolConfig::vmm(0)
    };
    let pool = Pool::new(SimDevice::new(device_full), config).unwrap();
    pool.allocate(PAGE, 256, None).unwrap();
    assert_eq!(
        pool.stats().mapped_bytes,
        PAGE,
        "the device refused the step, the request's page was granted"
    );
}

#[test]
fn an_over_large_step_shrinks_alike_for_both_growths() {
    for growth in [Growth::Vmm, Growth::Chunks] {
        let config = |max_bytes| PoolConfig {
            growth,
            compaction: CompactionPolicy::BeforeGrow,
            reserve_bytes: 64 * PAGE,
            max_bytes,
            min_growth_bytes: 32 * PAGE,
            growth_divisor: 0,
            peers: ctx::PeerSet::NONE,
        };
        // A 16-page device refuses a 32-page step: each growth takes what
        // its request needs instead, until the device is full.
        let pool = Pool::new(
            SimDevice::new(SimConfig::small(16 * PAGE)),
            config(u64::MAX),
        )
        .unwrap();
        let first = pool.allocate(100, 256, None).unwrap();
        assert_eq!(pool.stats().mapped_bytes, PAGE, "{growth:?}");
        let big = pool.allocate(10 * PAGE, 256, None).unwrap();
        assert_eq!(
            (pool.stats().mapped_bytes, pool.stats().grows),
            (11 * PAGE, 2),
            "{growth:?}"
        );
        assert!(
            matches!(
                pool.allocate(6 * PAGE, 256, None),
                Err(Error::OutOfMemory { .. })
            ),
            "{growth:?}: 5 pages left on the device"
        );
        pool.free(big).unwrap();
        pool.free(first).unwrap();

        // Capped at 5 pages under max_bytes: the step shrinks to the room left.
        let pool = Pool::new(
            SimDevice::new(SimConfig::small(16 * PAGE)),
            config(5 * PAGE),
        )
        .unwrap();
        pool.allocate(100, 256, None).unwrap();
        assert_eq!(pool.stats().mapped_bytes, 5 * PAGE, "{growth:?}");
        pool.allocate(4 * PAGE, 256, None).unwrap();
        assert_eq!(pool.stats().grows, 1, "{growth:?}: the step held it");
    }
}

#[test]
fn chunk_growth_takes_at_least_a_chunk_and_gives_whole_chunks_back() {
    let config = PoolConfig {
        max_bytes: 32 * PAGE,
        ..PoolConfig::chunks(2 * PAGE)
    };
    let pool = Pool::new(SimDevice::new(SimConfig::small(64 * PAGE)), config).unwrap();
    let a = pool.allocate(100, 256, None).unwrap();
    assert_eq!(pool.stats().mapped_bytes, 2 * PAGE);
    assert_eq!(pool.reservation_start(), None, "chunks have no reservation");
    let big = pool.allocate(5 * PAGE, 256, None).unwrap();
    assert_eq!(pool.stats().mapped_bytes, 7 * PAGE);
    pool.free(big).unwrap();
    assert_eq!(pool.shrink().unwrap(), 5 * PAGE);
    pool.free(a).unwrap();
    assert_eq!(pool.shrink().unwrap(), 2 * PAGE);
    let device = pool.into_device();
    assert_eq!(device.used_bytes(), 0);
    assert_eq!(device.counters().chunk_allocs, 2);
    assert_eq!(device.counters().chunk_frees, 2);
}

#[test]
fn pinned_blocks_stay_put() {
    let pool = pool(Growth::Vmm, CompactionPolicy::BeforeGrow, 16 * BLOCK);
    let a = pool.allocate(BLOCK, 256, None).unwrap();
    let b = pool.allocate(BLOCK, 256, None).unwrap();
    let c = pool.allocate(BLOCK, 256, None).unwrap();
    pool.free(a).unwrap();
    let pinned = pool.pin(b).unwrap();
    let b_at = pinned.ptr();
    let base = b_at - BLOCK;
    assert_eq!(pool.device_ptr(b).unwrap(), b_at);
    assert!(matches!(pool.pin(b), Err(Error::AlreadyPinned(h)) if h == b));
    pool.compact().unwrap();
    assert_eq!(pool.device_ptr(b).unwrap(), b_at);
    drop(pinned);
    pool.compact().unwrap();
    let mut at = [pool.device_ptr(b).unwrap(), pool.device_ptr(c).unwrap()];
    at.sort_unstable();
    assert_eq!(
        at,
        [base, base + BLOCK],
        "unpinned, both slide to the start"
    );
}

#[test]
fn a_pin_guard_outliving_its_block_unpins_nothing() {
    let pool = pool(Growth::Vmm, CompactionPolicy::BeforeGrow, 16 * BLOCK);
    let a = pool.allocate(BLOCK, 256, None).unwrap();
    let pinned = pool.pin(a).unwrap();
    pool.free(a).unwrap();
    // The slot is reused by a new block, pinned by its own guard.
    let b = pool.allocate(BLOCK, 256, None).unwrap();
    assert_eq!(b.slot(), a.slot());
    let kept = pool.pin(b).unwrap();
    drop(pinned);
    assert!(
        matches!(pool.pin(b), Err(Error::AlreadyPinned(_))),
        "the stale guard unpinned the slot's new block"
    );
    drop(kept);
    drop(pool.pin(b).unwrap());
}

#[test]
fn compaction_synchronizes_the_device_first() {
    let pool = pool(Growth::Vmm, CompactionPolicy::BeforeGrow, 16 * BLOCK);
    let a = pool.allocate(BLOCK, 256, None).unwrap();
    let _b = pool.allocate(BLOCK, 256, None).unwrap();
    pool.free(a).unwrap();
    let before = pool.lock().device().counters();
    pool.compact().unwrap();
    let after = pool.lock().device().counters();
    assert_eq!(after.synchronizes, before.synchronizes + 1);
    assert_eq!(after.copies, before.copies + 1);
    assert_eq!(after.bytes_copied, BLOCK);
}

#[test]
fn streams_are_recorded_per_block() {
    let pool = pool(Growth::Vmm, CompactionPolicy::BeforeGrow, 16 * BLOCK);
    let a = pool.allocate(100, 256, Some(StreamId(7))).unwrap();
    let b = pool.allocate(100, 256, None).unwrap();
    assert_eq!(pool.stream(a).unwrap(), Some(StreamId(7)));
    assert_eq!(pool.stream(b).unwrap(), None);
    pool.free(a).unwrap();
    assert!(pool.stream(a).is_err());
    let c = pool.allocate(100, 256, None).unwrap();
    assert_eq!(
        pool.stream(c).unwrap(),
        None,
        "a reused slot must not inherit a stream"
    );
}

#[test]
fn another_pools_handle_is_refused_and_frees_nothing() {
    for growth in [Growth::Vmm, Growth::Chunks] {
        let mine = pool(growth, CompactionPolicy::BeforeGrow, 16 * BLOCK);
        let theirs = pool(growth, CompactionPolicy::BeforeGrow, 16 * BLOCK);
        let kept = mine.allocate(BLOCK, 256, None).unwrap();
        mine.write(kept, 0, b"kept").unwrap();
        // Same slot and generation as `kept`, from the other pool.
        let foreign = theirs.allocate(BLOCK, 256, None).unwrap();
        assert_eq!(foreign.slot(), kept.slot());
        for refused in [
            mine.free(foreign),
            mine.pin(foreign).map(drop),
            mine.write(foreign, 0, b"lost"),
            mine.device_ptr(foreign).map(drop),
        ] {
            assert!(
                matches!(
                    refused,
                    Err(Error::Memcore(HeapError::ForeignHandle(h))) if h == foreign
                ),
                "{growth:?}: {refused:?}"
            );
        }
        let mut out = [0; 4];
        mine.read(kept, 0, &mut out).unwrap();
        assert_eq!(&out, b"kept", "{growth:?}");
        assert_eq!(mine.stats().heap.live_bytes, BLOCK, "{growth:?}");
        theirs.free(foreign).unwrap();
        mine.free(kept).unwrap();
    }
}

#[test]
fn bad_requests_are_errors() {
    let pool = pool(Growth::Vmm, CompactionPolicy::BeforeGrow, 16 * BLOCK);
    assert!(matches!(
        pool.allocate(0, 256, None),
        Err(Error::Memcore(HeapError::ZeroSize))
    ));
    assert!(matches!(
        pool.allocate(10, 3, None),
        Err(Error::Memcore(HeapError::InvalidAlignment { .. }))
    ));
    let a = pool.allocate(10, 256, None).unwrap();
    assert!(matches!(
        pool.write(a, 8, &[0; 3]),
        Err(Error::InvalidAddress { .. })
    ));
    assert!(matches!(
        pool.read(a, u64::MAX, &mut [0; 1]),
        Err(Error::InvalidAddress { .. })
    ));
    pool.free(a).unwrap();
    assert!(matches!(
        pool.free(a),
        Err(Error::Memcore(HeapError::StaleHandle(_)))
    ));
    assert!(matches!(
        pool.device_ptr(a),
        Err(Error::Memcore(HeapError::StaleHandle(_)))
    ));

    let mut no_vmm = SimConfig::small(16 * PAGE);
    no_vmm.vmm = false;
    let refused = Pool::new(SimDevice::new(no_vmm), PoolConfig::vmm(PAGE));
    assert!(matches!(refused, Err(Error::Unsupported(_))));
    let refused = Pool::new(SimDevice::new(SimConfig::small(PAGE)), PoolConfig::vmm(0));
    assert!(matches!(refused, Err(Error::InvalidConfig(_))));
}

#[test]
fn a_full_device_is_out_of_memory_with_the_context_share_named() {
    let mut config = SimConfig::small(16 * PAGE);
    config.context_reserved_bytes = 4 * PAGE;
    let pool = Pool::new(SimDevice::new(config), PoolConfig::vmm(64 * PAGE)).unwrap();
    let _a = pool.allocate(10 * PAGE, 256, None).unwrap();
    match pool.allocate(4 * PAGE, 256, None) {
        Err(Error::OutOfMemory {
            pool_bytes,
            context_reserved_bytes,
            ..
        }) => {
            assert_eq!(pool_bytes, 10 * PAGE);
            assert_eq!(context_reserved_bytes, 4 * PAGE);
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    // What is left still serves a request that fits.
    pool.allocate(2 * PAGE, 256, None).unwrap();
    let info = pool.lock().device().mem_info().unwrap();
    assert_eq!(info.free, 0);
}

#[test]
fn threads_share_one_pool() {
    let pool = pool(Growth::Vmm, CompactionPolicy::BeforeGrow, 64 * PAGE);
    std::thread::scope(|scope| {
        for t in 0..4u8 {
            let pool = &pool;
            scope.spawn(move || {
                for i in 0..200u32 {
                    let size = 256 + u64::from(i % 7) * 512;
                    let h = pool
                        .allocate(size, 256, Some(StreamId(u64::from(t))))
                        .unwrap();
                    pool.write(h, 0, &[t; 16]).unwrap();
                    if i % 50 == 0 {
                        pool.compact().unwrap();
                    }
                    let mut out = [0; 16];
                    pool.read(h, 0, &mut out).unwrap();
                    assert_eq!(out, [t; 16]);
                    pool.free(h).unwrap();
                }
            });
        }
    });
    assert_eq!(pool.stats().heap.live_blocks, 0);
}

#[test]
fn an_unbacked_h200_replays_gigabytes_without_host_memory() {
    const GIB: u64 = 1 << 30;
    let device = SimDevice::new(SimConfig::h200_like());
    let pool = Pool::new(device, PoolConfig::vmm(160 * GIB)).unwrap();
    let blocks: Vec<_> = (0..10)
        .map(|_| pool.allocate(10 * GIB, 256, None).unwrap())
        .collect();
    for b in blocks.iter().step_by(2) {
        pool.free(*b).unwrap();
    }
    // 50 GiB free in 10 GiB holes; 20 GiB fit after moving one block.
    let big = pool.allocate(20 * GIB, 2 << 20, None).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.bytes_moved, 10 * GIB);
    assert_eq!(stats.peak_mapped_bytes, 100 * GIB);
    // 100 GiB cannot fit even after compaction: 50 GiB are free in the pool
    // and the device has about 39 GiB left to map.
    pool.free(big).unwrap();
    let refused = pool.allocate(100 * GIB, 256, None);
    assert!(
        matches!(refused, Err(Error::OutOfMemory { .. })),
        "{refused:?}"
    );
    let mut out = [1u8; 8];
    pool.read(blocks[1], 0, &mut out).unwrap();
    assert_eq!(out, [0; 8], "unbacked reads are zeros");
}

/// A hole below a live block that no move can turn into room for the
/// request: `SlideBeforeGrow` slides the block into the hole and grows by
/// what is still missing, `BeforeGrow` grows by the whole request.
#[test]
fn slide_before_grow_grows_the_least() {
    let mut figures = Vec::new();
    for compaction in [
        CompactionPolicy::BeforeGrow,
        CompactionPolicy::SlideBeforeGrow,
    ] {
        let pool = pool(Growth::Vmm, compaction, 64 * PAGE);
        let hole = pool.allocate(BLOCK, 256, None).unwrap();
        let kept = pool.allocate(BLOCK, 256, None).unwrap();
        pool.write(kept, 0, &[7; 64]).unwrap();
        pool.free(hole).unwrap();
        pool.allocate(2 * BLOCK, 256, None).unwrap();
        let mut marker = [0; 64];
        pool.read(kept, 0, &mut marker).unwrap();
        assert_eq!(marker, [7; 64], "{compaction:?}");
        let stats = pool.stats();
        figures.push((stats.peak_mapped_bytes, stats.bytes_moved));
    }
    assert_eq!(figures, [(4 * BLOCK, 0), (3 * BLOCK, BLOCK)]);
}

#[test]
fn vmm_growth_takes_a_share_of_the_mapped_bytes_up_to_a_full_bandwidth_handle() {
    const MIB: u64 = 1 << 20;
    let full = memcore::FULL_BANDWIDTH_HANDLE_BYTES;
    let reserve = 4096 * MIB;
    let pool = |growth_divisor| {
        let config = PoolConfig {
            reserve_bytes: reserve,
            growth_divisor,
            ..PoolConfig::vmm(0)
        };
        Pool::new(SimDevice::new(SimConfig::h200_like()), config).unwrap()
    };
    let shared = pool(16);
    // Empty: the first growth is what the request needs.
    let mut held = vec![shared.allocate(64 * MIB, 256, None).unwrap()];
    assert_eq!(shared.stats().mapped_bytes, 64 * MIB);
    // 64 MiB mapped: a one-byte request grows by 64 / 16 = 4 MiB.
    held.push(shared.allocate(1, 256, None).unwrap());
    assert_eq!(shared.stats().mapped_bytes, 68 * MIB);
    // Past 16 x 32 MiB mapped, a growth is one full-bandwidth handle, no more.
    held.push(shared.allocate(1024 * MIB, 256, None).unwrap());
    let before = shared.stats().mapped_bytes;
    assert!(before >= 16 * full, "{before}");
    // The 1 GiB growth took what it needed (more than the share), so less
    // than a page is left at the top: 8 MiB more needs a growth, which
    // takes a whole 32 MiB handle.
    held.push(shared.allocate(8 * MIB, 256, None).unwrap());
    assert_eq!(shared.stats().mapped_bytes, before + full);
    for handle in held {
        shared.free(handle).unwrap();
    }
    // Off (0): a one-byte request past 1 GiB grows by one page.
    let plain = pool(0);
    let big = plain.allocate(1024 * MIB, 256, None).unwrap();
    let one = plain.allocate(1, 256, None).unwrap();
    assert_eq!(plain.stats().mapped_bytes, 1026 * MIB);
    plain.free(one).unwrap();
    plain.free(big).unwrap();
}
