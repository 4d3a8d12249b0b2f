//! PyTorch's figures, history and snapshots on the simulated device, on both
//! backings: the invariants PyTorch's users rely on through a random workload of
//! several streams and a graph pool, resets, the reserved peak equal to the pool's
//! peak mapped bytes, stacks that live exactly as long as what names them.

mod support;

use std::collections::HashMap;

use ctx::{SimConfig, StreamId};
use cudamem_torch::history::{HistorySettings, RecordContext, TraceAction};
use cudamem_torch::snapshot::BlockState;
use cudamem_torch::{Backing, DeviceStats, PoolId, Request, Stat, StatArray};
use support::{MIB, Make, S1, S2, next};

on_both! {
    the_figures_keep_pytorchs_invariants => invariants_hold;
    peaks_and_counts_reset => resets;
    history_and_snapshots_show_what_happened => history_and_snapshot;
}

fn check_array(name: &str, a: &StatArray) {
    for (pool, s) in [
        ("all", a.aggregate),
        ("small", a.small_pool),
        ("large", a.large_pool),
    ] {
        assert!(s.peak >= s.current, "{name}/{pool}: {s:?}");
        assert!(s.current >= 0, "{name}/{pool}: {s:?}");
    }
}

fn check(stats: &DeviceStats) {
    for (name, array) in [
        ("allocation", &stats.allocation),
        ("segment", &stats.segment),
        ("active", &stats.active),
        ("allocated_bytes", &stats.allocated_bytes),
        ("reserved_bytes", &stats.reserved_bytes),
        ("active_bytes", &stats.active_bytes),
        ("requested_bytes", &stats.requested_bytes),
    ] {
        check_array(name, array);
    }
    for array in [
        &stats.allocation,
        &stats.active,
        &stats.allocated_bytes,
        &stats.active_bytes,
        &stats.requested_bytes,
    ] {
        let sum = array.small_pool.current + array.large_pool.current;
        assert_eq!(array.aggregate.current, sum, "{array:?}");
        assert_eq!(
            array.aggregate.current,
            array.aggregate.allocated - array.aggregate.freed,
            "{array:?}"
        );
    }
    let (allocated, active, reserved) = (
        stats.allocated_bytes.aggregate.current,
        stats.active_bytes.aggregate.current,
        stats.reserved_bytes.aggregate.current,
    );
    assert!(
        allocated <= active && active <= reserved,
        "{allocated} {active} {reserved}"
    );
    assert!(stats.requested_bytes.aggregate.current <= active);
}

fn bytes(n: u64) -> i64 {
    i64::try_from(n).unwrap()
}

fn invariants_hold<B: Backing>(make: Make<B>) {
    let case = make(SimConfig {
        backed: false,
        ..SimConfig::small(1 << 30)
    });
    let graph = PoolId(3, 0);
    let streams = [S1, S2, StreamId(0x300)];
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut rng = 0x1234_5678_9abc_def1_u64;
    for step in 0..4000 {
        if step == 1001 {
            case.alloc.begin_allocate_to_pool(graph).unwrap();
        }
        let stream = streams[(next(&mut rng) % 3) as usize];
        let full = live.values().sum::<u64>() > 300 * MIB;
        match next(&mut rng) % 10 {
            0..=4 if !full => {
                let size = 1 + next(&mut rng) % (4 * MIB);
                let in_graph = step > 1000 && step < 2000 && stream == S2;
                let request = if in_graph {
                    Request::new(size, stream).in_pool(graph).capturing(true)
                } else {
                    Request::new(size, stream)
                };
                let got = case.alloc.allocate(request).unwrap();
                assert!(got.bytes >= size && got.bytes % 512 == 0);
                live.insert(got.ptr, got.bytes);
            }
            0..=8 if !live.is_empty() => {
                let ptr = *live
                    .keys()
                    .nth((next(&mut rng) % live.len() as u64) as usize)
                    .unwrap();
                live.remove(&ptr);
                case.streams.launch(stream);
                case.give(ptr);
            }
            _ => case.streams.complete(stream),
        }
        if step == 2000 {
            case.alloc.end_allocate_to_pool(graph).unwrap();
        }
        let stats = case.alloc.device_stats();
        check(&stats);
        assert_eq!(
            stats.allocated_bytes.aggregate.current,
            bytes(live.values().sum()),
            "step {step}"
        );
        assert_eq!(stats.allocation.aggregate.current, bytes(live.len() as u64));
        let pool = case.alloc.stats();
        assert_eq!(
            stats.reserved_bytes.aggregate.current,
            bytes(pool.mapped_bytes)
        );
        assert_eq!(
            stats.reserved_bytes.aggregate.peak,
            bytes(pool.peak_mapped_bytes)
        );
    }
    let stats = case.alloc.device_stats();
    assert!(stats.num_alloc_retries == 0 && stats.num_ooms == 0);
    assert!(stats.num_device_alloc > 0);
    for ptr in live.into_keys() {
        case.give(ptr);
    }
    case.alloc.empty_cache().unwrap();
    let stats = case.alloc.device_stats();
    check(&stats);
    assert_eq!(stats.active_bytes.aggregate.current, 0);
    assert_eq!(stats.requested_bytes.aggregate.current, 0);
}

fn resets<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(256 * MIB));
    let a = case.take(64 * MIB, S1);
    let b = case.take(MIB, S1);
    case.give(a);
    let before = case.alloc.device_stats();
    assert_eq!(before.allocated_bytes.aggregate.peak, bytes(65 * MIB));
    case.alloc.reset_peak_stats();
    let after = case.alloc.device_stats();
    check(&after);
    assert_eq!(after.allocated_bytes.aggregate.peak, bytes(MIB));
    assert_eq!(
        after.reserved_bytes.aggregate.peak, after.reserved_bytes.aggregate.current,
        "the pool's older peak no longer counts"
    );
    case.alloc.empty_cache().unwrap();
    let emptied = case.alloc.device_stats();
    assert_eq!(
        emptied.reserved_bytes.aggregate.peak,
        after.reserved_bytes.aggregate.current
    );
    case.alloc.reset_accumulated_stats();
    let zeroed = case.alloc.device_stats();
    assert_eq!(zeroed.allocation.aggregate.allocated, 0);
    assert_eq!(zeroed.allocation.aggregate.freed, 0);
    assert_eq!(zeroed.allocation.aggregate.current, 1);
    assert_eq!(zeroed.num_device_alloc, 0);
    assert_eq!(zeroed.oversize_allocations, Stat::default());
    assert_eq!(zeroed.max_split_size, -1);
    case.give(b);
}

fn history_and_snapshot<B: Backing>(make: Make<B>) {
    let case = make(SimConfig::small(256 * MIB));
    case.alloc.record_history(
        HistorySettings {
            enabled: true,
            when: RecordContext::All,
            max_entries: 1000,
            skip: 0,
        },
        false,
    );
    assert_eq!(case.alloc.record_context(), RecordContext::All);
    let a = case
        .alloc
        .allocate(Request::new(1000, S1).with_context(11))
        .unwrap()
        .ptr;
    let b = case
        .alloc
        .allocate(Request::new(5 * MIB, S1).with_context(12))
        .unwrap()
        .ptr;
    let _other = case.take(MIB, S2); // a second stream: frees now wait
    case.streams.launch(S1);
    case.alloc.free(a, 13).unwrap();
    let snapshot = case.alloc.snapshot(PoolId::DEFAULT, true);
    let mapped = case.alloc.stats().mapped_bytes;
    let total: u64 = snapshot.segments.iter().map(|s| s.total_size).sum();
    assert_eq!(total, mapped, "the segments are what the pool maps");
    for segment in &snapshot.segments {
        let tiled: u64 = segment.blocks.iter().map(|b| b.size).sum();
        assert_eq!(tiled, segment.total_size);
    }
    let state_of = |ptr: u64| {
        snapshot
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .find(|blk| blk.address == ptr)
            .map(|blk| (blk.state, blk.context))
    };
    assert_eq!(state_of(a), Some((BlockState::ActivePendingFree, 11)));
    assert_eq!(state_of(b), Some((BlockState::ActiveAllocated, 12)));
    let actions: Vec<TraceAction> = snapshot.trace.iter().map(|e| e.action).collect();
    assert!(actions.contains(&TraceAction::SegmentMap), "{actions:?}");
    assert_eq!(
        actions.iter().filter(|a| **a == TraceAction::Alloc).count(),
        3
    );
    let freed = snapshot
        .trace
        .iter()
        .find(|e| e.action == TraceAction::FreeRequested)
        .unwrap();
    assert_eq!((freed.addr, freed.size, freed.context), (a, 1000, 13));
    assert!(freed.time_us > 0);
    assert!(
        case.alloc.take_dead_contexts(10).is_empty(),
        "all still named"
    );
    case.alloc.record_history(HistorySettings::default(), true);
    case.streams.complete(S1);
    case.give(b);
    case.take(512, S1); // returns `a` once its event completed
    let mut dead = case.alloc.take_dead_contexts(10);
    dead.sort_unstable();
    assert_eq!(dead, [11, 12, 13], "nothing names them any more");
    assert_eq!(case.alloc.record_context(), RecordContext::Never);
}
