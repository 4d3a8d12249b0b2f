//! CUDA graphs on the simulated device, on both backings: private pools whose memory
//! no one outside uses until they are released, no event recorded or asked for while
//! a capture is underway, torch.compile's live-block check, checkpoints.

mod support;

use ctx::SimConfig;
use cudamem_torch::snapshot::BlockState;
use cudamem_torch::{Backing, Error, PoolId, Request};
use support::{Case, MIB, Make, S1, S2};

const GRAPH: PoolId = PoolId(1, 0);

on_both! {
    a_graph_pool_keeps_its_memory_until_released => pool_memory_is_kept;
    no_event_is_touched_while_a_capture_is_underway => no_events_in_capture;
    frees_during_a_capture_wait_for_their_streams_after_it => deferred_frees_fenced;
    the_live_check_and_checkpoints_follow_the_pool => live_check_and_checkpoints;
    pool_calls_out_of_order_are_refused => pool_errors;
}

/// A request on the capture stream, diverted to the graph's pool.
fn captured(size: u64) -> Request<ctx::StreamId> {
    Request::new(size, S2).in_pool(GRAPH).capturing(true)
}

fn take_captured<B: Backing>(case: &Case<B>, size: u64) -> u64 {
    case.alloc.allocate(captured(size)).unwrap().ptr
}

/// The address ranges of `pool`'s segments.
fn segments_of<B: Backing>(case: &Case<B>, pool: PoolId) -> Vec<(u64, u64)> {
    case.alloc
        .snapshot(pool, false)
        .segments
        .iter()
        .filter(|s| s.pool == pool)
        .map(|s| (s.address, s.address + s.total_size))
        .collect()
}

fn pool_memory_is_kept<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let before = case.take(MIB, S1);
    case.alloc.begin_allocate_to_pool(GRAPH).unwrap();
    let g1 = take_captured(&case, MIB);
    let g2 = take_captured(&case, 3 * MIB);
    case.give(g1);
    assert_eq!(
        take_captured(&case, MIB),
        g1,
        "reused inside the pool, same stream"
    );
    case.alloc.end_allocate_to_pool(GRAPH).unwrap();
    let graph = segments_of(&case, GRAPH);
    assert!(!graph.is_empty());
    let inside = |p: u64| graph.iter().any(|(s, e)| p >= *s && p < *e);
    assert!(inside(g1) && inside(g2));
    case.give(g2);
    case.give(g1);
    case.give(before);
    // The graph's blocks are free, but only inside its pool.
    let outside: Vec<u64> = (0..24).map(|_| case.take(MIB, S1)).collect();
    assert!(
        outside.iter().all(|p| !inside(*p)),
        "{outside:x?} vs {graph:x?}"
    );
    assert!(case.alloc.stats().private_pool_bytes > 0);
    assert_eq!(case.alloc.pool_use_count(GRAPH), 1);
    case.alloc.release_pool(GRAPH).unwrap();
    assert_eq!(case.alloc.pool_use_count(GRAPH), 0);
    assert!(
        !segments_of(&case, GRAPH).is_empty(),
        "kept until memory is reclaimed"
    );
    case.alloc.empty_cache().unwrap();
    assert!(
        segments_of(&case, GRAPH).is_empty(),
        "released: its segments went back"
    );
    assert_eq!(case.alloc.stats().private_pool_bytes, 0);
    for ptr in outside {
        case.give(ptr);
    }
}

fn no_events_in_capture<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let warm = case.take(MIB, S2);
    let old = case.take(2 * MIB, S1);
    case.alloc.begin_allocate_to_pool(GRAPH).unwrap();
    let calls = case.event_calls();
    let a = take_captured(&case, 4096);
    let b = take_captured(&case, 2 * MIB);
    case.give(a);
    case.give(warm); // a block of the device's pool, freed during the capture
    let c = case.take(MIB, S1); // another thread, not capturing
    case.give(old);
    let d = case
        .alloc
        .allocate(Request::new(8192, S1).capturing(true))
        .unwrap()
        .ptr; // a capturing stream outside any pool
    assert_eq!(case.event_calls(), calls, "no event recorded or asked for");
    case.alloc.end_allocate_to_pool(GRAPH).unwrap();
    assert!(
        case.event_calls() > calls,
        "the frees are fenced after the capture"
    );
    for ptr in [b, c, d] {
        case.give(ptr);
    }
}

fn deferred_frees_fenced<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let x = case.take(4 * MIB, S1);
    let _y = case.take(MIB, S2);
    case.alloc.begin_allocate_to_pool(GRAPH).unwrap();
    case.streams.launch(S1);
    case.give(x);
    assert_eq!(
        case.take(4 * MIB, S1),
        x,
        "its own stream may take it at once"
    );
    case.give(x);
    case.alloc.end_allocate_to_pool(GRAPH).unwrap();
    assert_eq!(case.alloc.stats().pending_bytes, 4 * MIB);
    for _ in 0..3 {
        assert_ne!(case.take(4 * MIB, S2), x, "S1's work may still use it");
    }
    case.streams.complete(S1);
    let later: Vec<u64> = (0..3).map(|_| case.take(4 * MIB, S2)).collect();
    assert!(later.contains(&x), "{x:#x} {later:x?}");
}

fn live_check_and_checkpoints<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    case.alloc.begin_allocate_to_pool(GRAPH).unwrap();
    let a = take_captured(&case, 1000);
    let b = take_captured(&case, MIB);
    let c = take_captured(&case, 3 * MIB);
    case.alloc.end_allocate_to_pool(GRAPH).unwrap();
    assert!(case.alloc.check_pool_live(GRAPH, &[c, a, b]).unwrap());
    assert!(!case.alloc.check_pool_live(GRAPH, &[a, b]).unwrap());
    let checkpoint = case.alloc.checkpoint_pool(GRAPH).unwrap();
    let allocated = case.alloc.device_stats().allocated_bytes.aggregate.current;
    case.give(b);
    let d = case
        .alloc
        .allocate(Request::new(2 * MIB, S2).in_pool(GRAPH))
        .unwrap()
        .ptr;
    assert!(case.alloc.check_pool_live(GRAPH, &[a, c, d]).unwrap());
    let restored = case.alloc.restore_checkpoint(checkpoint).unwrap();
    let mut freed = restored.freed.clone();
    freed.sort_unstable();
    let mut expected = vec![a, c, d];
    expected.sort_unstable();
    assert_eq!(freed, expected);
    let mut again = restored.allocated.clone();
    again.sort_unstable();
    let mut expected = vec![a, b, c];
    expected.sort_unstable();
    assert_eq!(again, expected);
    assert!(case.alloc.check_pool_live(GRAPH, &[a, b, c]).unwrap());
    assert_eq!(
        case.alloc.device_stats().allocated_bytes.aggregate.current,
        allocated
    );
    let snapshot = case.alloc.snapshot(GRAPH, false);
    let live: usize = snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .count();
    assert_eq!(live, 3);
    for ptr in [a, b, c] {
        case.give(ptr);
    }
    let e = case
        .alloc
        .allocate(Request::new(MIB, S2).in_pool(GRAPH))
        .unwrap()
        .ptr;
    assert!(
        e == b || e == a || e == c,
        "the pool's memory is whole again"
    );
    case.alloc.drop_checkpoint(checkpoint).unwrap();
    assert!(matches!(
        case.alloc.restore_checkpoint(checkpoint),
        Err(Error::UnknownCheckpoint { .. })
    ));
}

fn pool_errors<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(64 * MIB));
    let other = PoolId(0, 7);
    assert!(matches!(
        case.alloc.end_allocate_to_pool(other),
        Err(Error::UnknownPool { .. })
    ));
    assert!(matches!(
        case.alloc.allocate(Request::new(64, S1).in_pool(other)),
        Err(Error::UnknownPool { .. })
    ));
    case.alloc.begin_allocate_to_pool(other).unwrap();
    assert!(matches!(
        case.alloc.begin_allocate_to_pool(other),
        Err(Error::PoolState { .. })
    ));
    case.alloc.end_allocate_to_pool(other).unwrap();
    assert!(matches!(
        case.alloc.end_allocate_to_pool(other),
        Err(Error::PoolState { .. })
    ));
    case.alloc.incref_pool(other).unwrap();
    assert_eq!(case.alloc.pool_use_count(other), 2);
    case.alloc.release_pool(other).unwrap();
    case.alloc.release_pool(other).unwrap();
    assert!(matches!(
        case.alloc.release_pool(other),
        Err(Error::PoolState { .. })
    ));
    assert!(matches!(
        case.alloc.begin_allocate_to_pool(other),
        Err(Error::PoolState { .. })
    ));
    assert!(case.alloc.stats().errors >= 1);
}
