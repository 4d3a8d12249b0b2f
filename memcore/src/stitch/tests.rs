//! Unit tests of the stitching model: growth in large handles, the
//! stitched tail, the idle cache and the budget, huge requests, refusals.

use super::*;

const MIB: u64 = 1 << 20;

#[test]
fn permille_of_agrees_with_wide_arithmetic() {
    for (bytes, permille) in [
        (0, 20),
        (999, 1),
        (1 << 40, 20),
        (u64::MAX, 20),
        (u64::MAX, 1000),
        (u64::MAX / 3, 7),
    ] {
        let wide = u128::from(bytes) * u128::from(permille) / 1000;
        assert_eq!(
            u128::from(permille_of(bytes, permille)),
            wide.min(u128::from(u64::MAX))
        );
    }
}

#[test]
fn the_frontier_grows_in_whole_large_handles() {
    let mut pool = Stitch::new(StitchConfig::default());
    // 70 MiB touches three 32 MiB chunks; each gets one large handle,
    // the last overshooting the 2% budget by part of itself.
    let block = pool.allocate(70 * MIB).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.large_handles, stats.small_handles), (3, 0));
    assert_eq!(stats.physical_bytes, 96 * MIB);
    assert_eq!(stats.peak_live_in_full_bandwidth_handles, 70 * MIB);
    assert_eq!(
        (stats.calls.create.calls, stats.calls.set_access.calls),
        (3, 3)
    );
    // The rest of the last chunk serves the next request for free.
    let next = pool.allocate(20 * MIB).unwrap();
    assert_eq!(next.offset, block.offset + 70 * MIB);
    assert_eq!(pool.stats().calls.create.calls, 3);
    pool.check().unwrap();
}

#[test]
fn the_tail_is_stitched_from_pages_where_a_large_handle_would_not_fit() {
    let config = StitchConfig {
        capacity_bytes: 70 * MIB,
        ..StitchConfig::default()
    };
    let mut pool = Stitch::new(config);
    pool.allocate(70 * MIB).unwrap();
    let stats = pool.stats();
    // Two chunks in large handles; the last 6 MiB are three pages.
    assert_eq!((stats.large_handles, stats.small_handles), (2, 3));
    assert_eq!(stats.physical_bytes, 70 * MIB);
    assert_eq!(stats.peak_live_in_full_bandwidth_handles, 64 * MIB);
    pool.check().unwrap();
}

#[test]
fn with_nothing_idle_growth_takes_a_whole_large_handle_unless_told_not_to() {
    let config = StitchConfig {
        slack_permille: 0,
        overshoot_permille: 0,
        ..StitchConfig::default()
    };
    let mut pool = Stitch::new(config);
    // Past the budget, but no handle to recycle: one large handle
    // rather than three pages.
    pool.allocate(70 * MIB).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.large_handles, stats.small_handles), (3, 0));
    assert_eq!(stats.peak_live_in_full_bandwidth_handles, 70 * MIB);
    pool.check().unwrap();
    // Without: the budget (70 MiB) holds two chunks, the tail is pages.
    let mut pool = Stitch::new(StitchConfig {
        grow_in_large: false,
        ..config
    });
    pool.allocate(70 * MIB).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.large_handles, stats.small_handles), (2, 3));
    assert_eq!(stats.physical_bytes, 70 * MIB);
    pool.check().unwrap();
}

#[test]
fn repeating_sizes_map_once() {
    let mut pool = Stitch::new(StitchConfig::default());
    for _ in 0..10 {
        let a = pool.allocate(5 * MIB).unwrap();
        let b = pool.allocate(9 * MIB + 100).unwrap();
        pool.free(a).unwrap();
        pool.free(b).unwrap();
    }
    let stats = pool.stats();
    assert_eq!((stats.calls.create.calls, stats.calls.map.calls), (1, 1));
    assert_eq!(stats.calls.unmap.calls, 0);
    assert_eq!(stats.peak_physical_bytes, 32 * MIB);
    pool.trim();
    assert_eq!(pool.stats().physical_bytes, 0);
    assert_eq!(pool.handles().count(), 0);
    pool.check().unwrap();
}

#[test]
fn past_the_budget_an_idle_handle_moves_instead_of_a_new_one() {
    let config = StitchConfig {
        slack_permille: 0,
        overshoot_permille: 0,
        ..StitchConfig::default()
    };
    let mut pool = Stitch::new(config);
    let a = pool.allocate(32 * MIB).unwrap();
    let b = pool.allocate(32 * MIB).unwrap();
    pool.free(a).unwrap();
    // 64 MiB does not fit a's hole: chunks 2 and 3. The budget (96 MiB
    // live) admits one new handle; the other is a's, moved.
    let c = pool.allocate(64 * MIB).unwrap();
    assert_eq!(c.offset, 64 * MIB);
    let stats = pool.stats();
    assert_eq!((stats.calls.create.calls, stats.calls.unmap.calls), (3, 1));
    assert_eq!(stats.peak_physical_bytes, 96 * MIB);
    assert_eq!(stats.idle_bytes, 0);
    assert_eq!(pool.physical(0), None);
    pool.check().unwrap();
    pool.free(b).unwrap();
    pool.free(c).unwrap();
    pool.check().unwrap();
}

#[test]
fn a_handle_back_in_use_is_never_released_from_the_idle_cache() {
    let mut pool = Stitch::new(StitchConfig::default());
    let a = pool.allocate(32 * MIB).unwrap();
    let b = pool.allocate(32 * MIB).unwrap();
    pool.free(a).unwrap();
    pool.free(b).unwrap();
    // Both handles idle; a's place is used again, so its handle leaves
    // the cache (its entry stays behind, stale).
    let again = pool.allocate(32 * MIB).unwrap();
    assert_eq!(again.offset, 0);
    pool.check().unwrap();
    pool.trim();
    let stats = pool.stats();
    assert_eq!((stats.physical_bytes, stats.idle_bytes), (32 * MIB, 0));
    assert_eq!(pool.stats().calls.release.calls, 1);
    assert!(pool.physical(0).is_some());
    pool.check().unwrap();
    // Idle again, it is cached again and the next trim releases it.
    pool.free(again).unwrap();
    assert_eq!(pool.stats().idle_bytes, 32 * MIB);
    pool.trim();
    assert_eq!(pool.stats().physical_bytes, 0);
    pool.check().unwrap();
}

#[test]
fn past_its_page_steps_a_model_refuses_and_changes_nothing() {
    // Room for two 64 MiB requests' 32 pages, touched and let go.
    let mut pool = Stitch::new(StitchConfig {
        page_steps: 2 * 2 * 32,
        ..StitchConfig::default()
    });
    let a = pool.allocate(64 * MIB).unwrap();
    pool.free(a).unwrap();
    let b = pool.allocate(64 * MIB).unwrap();
    let before = pool.stats();
    let refused = pool.allocate(2 * MIB).unwrap_err();
    assert_eq!(
        refused,
        Error::StepBudget {
            steps: 2 * 2 * 32 + 2,
            limit: 2 * 2 * 32
        }
    );
    assert_eq!(pool.stats(), before);
    pool.free(b).unwrap();
    assert_eq!(pool.stats().live_bytes, 0);
}

#[test]
fn a_full_device_gets_pages_then_refuses_and_stays_whole() {
    let config = StitchConfig {
        capacity_bytes: 16 * MIB,
        ..StitchConfig::default()
    };
    let mut pool = Stitch::new(config);
    // A 32 MiB handle does not fit: two pages.
    let a = pool.allocate(3 * MIB).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.large_handles, stats.small_handles), (0, 2));
    assert!(matches!(
        pool.allocate(20 * MIB),
        Err(Error::OutOfMemory { .. })
    ));
    let stats = pool.stats();
    assert!(stats.physical_bytes <= 16 * MIB);
    assert_eq!((stats.live_blocks, stats.live_bytes), (1, 3 * MIB));
    pool.check().unwrap();
    // What fits still does, next to a.
    let b = pool.allocate(10 * MIB).unwrap();
    assert_eq!(b.offset, a.offset + 3 * MIB);
    pool.check().unwrap();
}

#[test]
fn a_foreign_or_double_free_is_refused() {
    let mut pool = Stitch::new(StitchConfig::default());
    let a = pool.allocate(1000).unwrap();
    pool.free(a).unwrap();
    assert!(matches!(pool.free(a), Err(Error::UnknownAllocation { .. })));
    let forged = StitchBlock { size: 5000, ..a };
    assert!(matches!(
        pool.free(forged),
        Err(Error::UnknownAllocation { .. })
    ));
    assert_eq!(pool.allocate(0), Err(Error::ZeroSize));
    pool.check().unwrap();
}

const GIB: u64 = 1 << 30;

#[test]
fn a_huge_request_gets_one_handle_of_its_own_released_at_its_free() {
    let mut pool = Stitch::new(StitchConfig::default());
    let small = pool.allocate(MIB).unwrap();
    for size in [HUGE_REQUEST_BYTES, 100 << 40] {
        let block = pool.allocate(size).unwrap();
        // At a chunk's start past the small block's chunk.
        assert_eq!(block.offset % (32 * MIB), 0);
        assert!(block.offset >= 32 * MIB);
        let stats = pool.stats();
        assert_eq!((stats.large_handles, stats.small_handles), (2, 0));
        assert_eq!(stats.physical_bytes, 32 * MIB + size);
        assert_eq!(stats.peak_live_in_full_bandwidth_handles, MIB + size);
        assert_eq!(pool.physical(block.offset + size - 1).unwrap().1, size - 1);
        pool.check().unwrap();
        pool.free(block).unwrap();
        assert_eq!(pool.stats().physical_bytes, 32 * MIB);
        assert_eq!(pool.physical(block.offset), None);
        pool.check().unwrap();
    }
    let calls = pool.stats().calls;
    assert_eq!((calls.create.calls, calls.map.calls), (3, 3));
    assert_eq!((calls.unmap.calls, calls.release.calls), (2, 2));
    assert_eq!(calls.set_access.calls, 3);
    pool.free(small).unwrap();
}

#[test]
fn a_huge_block_over_idle_handles_releases_them_first() {
    let mut pool = Stitch::new(StitchConfig {
        large_pages: 0,
        ..StitchConfig::default()
    });
    let blocks: alloc::vec::Vec<_> = (0..3).map(|_| pool.allocate(2 * MIB).unwrap()).collect();
    for block in blocks {
        pool.free(block).unwrap();
    }
    assert_eq!(pool.stats().idle_bytes, 6 * MIB);
    // The lowest free place is where the idle pages are mapped.
    let huge = pool.allocate(HUGE_REQUEST_BYTES).unwrap();
    assert_eq!(huge.offset, 0);
    let stats = pool.stats();
    assert_eq!(
        (stats.idle_bytes, stats.physical_bytes),
        (0, HUGE_REQUEST_BYTES)
    );
    assert_eq!(stats.calls.release.calls, 3);
    pool.check().unwrap();
}

#[test]
fn past_the_budget_a_huge_request_releases_idle_handles_highest_first() {
    for (slack, released) in [(0, 2), (20, 0)] {
        let mut pool = Stitch::new(StitchConfig {
            slack_permille: slack,
            ..StitchConfig::default()
        });
        let a = pool.allocate(64 * MIB).unwrap();
        let b = pool.allocate(1024).unwrap();
        pool.free(a).unwrap();
        // a's two chunks idle, b's in use; the huge block goes past b.
        let huge = pool.allocate(HUGE_REQUEST_BYTES).unwrap();
        assert_eq!(huge.offset, 96 * MIB);
        let stats = pool.stats();
        assert_eq!(stats.calls.release.calls, released, "slack {slack}");
        assert_eq!(
            stats.physical_bytes,
            HUGE_REQUEST_BYTES + 96 * MIB - released * 32 * MIB
        );
        pool.check().unwrap();
        pool.free(b).unwrap();
        pool.free(huge).unwrap();
        pool.check().unwrap();
    }
}

#[test]
fn a_huge_request_past_the_capacity_is_refused_and_changes_no_block() {
    let mut pool = Stitch::new(StitchConfig {
        capacity_bytes: 40 * GIB,
        ..StitchConfig::default()
    });
    let small = pool.allocate(10 * GIB).unwrap();
    let before = pool.stats().physical_bytes;
    assert!(matches!(
        pool.allocate(HUGE_REQUEST_BYTES),
        Err(Error::OutOfMemory { .. })
    ));
    let stats = pool.stats();
    assert_eq!((stats.live_blocks, stats.physical_bytes), (1, before));
    pool.check().unwrap();
    pool.free(small).unwrap();
    pool.trim();
    // With the room given back, it fits.
    let huge = pool.allocate(HUGE_REQUEST_BYTES).unwrap();
    pool.free(huge).unwrap();
    assert_eq!(pool.stats().physical_bytes, 0);
}

#[test]
fn a_chunk_past_the_largest_handle_is_refused() {
    let mut pool = Stitch::new(StitchConfig {
        large_pages: MAX_LARGE_PAGES as u32 + 1,
        ..StitchConfig::default()
    });
    assert!(matches!(pool.allocate(512), Err(Error::StepBudget { .. })));
    assert_eq!(pool.stats(), StitchStats::default());
    // Chunks of three pages cannot hold huge blocks: those are refused,
    // the largest request in pages is not.
    let mut pool = Stitch::new(StitchConfig {
        large_pages: 3,
        ..StitchConfig::default()
    });
    assert!(matches!(
        pool.allocate(HUGE_REQUEST_BYTES),
        Err(Error::StepBudget { .. })
    ));
    let block = pool.allocate(HUGE_REQUEST_BYTES - STITCH_ALIGN).unwrap();
    pool.check().unwrap();
    pool.free(block).unwrap();
}

#[test]
fn idle_bytes_above_the_limit_are_released() {
    let config = StitchConfig {
        large_pages: 0,
        max_idle_bytes: 4 * MIB,
        ..StitchConfig::default()
    };
    let mut pool = Stitch::new(config);
    let blocks: alloc::vec::Vec<_> = (0..6).map(|_| pool.allocate(2 * MIB).unwrap()).collect();
    for block in blocks {
        pool.free(block).unwrap();
    }
    let stats = pool.stats();
    assert_eq!(stats.idle_bytes, 4 * MIB);
    assert_eq!(stats.calls.release.calls, 4);
    pool.check().unwrap();
}
