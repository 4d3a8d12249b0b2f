//! The pools' shared mapping code under failing driver calls: the simulated
//! device fails a chosen step (create, map, the device's own grant, a peer's
//! grant, unmap, release) and the pool must undo what the step left, keep
//! its figures and contents, and work on afterwards.

use ctx::{
    CompactionPolicy, DeviceMemory, DriverCode, Error, PeerLinks, PeerSet, Pool, PoolConfig,
    SimCall, SimConfig, SimDevice, StitchConfig, StitchedConfig, StitchedPool,
};

const PAGE: u64 = 64 << 10;
const MIB: u64 = 1 << 20;

/// Device 0 of two that reach each other, 64 pages, backed.
fn device() -> SimDevice {
    SimDevice::on_host(SimConfig::small(64 * PAGE), 0, PeerLinks::all(2))
}

fn vmm(peers: &[u32]) -> PoolConfig {
    PoolConfig {
        compaction: CompactionPolicy::Never,
        ..PoolConfig::vmm(64 * PAGE).with_peers(PeerSet::of(peers).unwrap())
    }
}

#[test]
fn a_growth_that_fails_at_any_step_leaves_the_pool_and_the_device_as_they_were() {
    for (call, skip, peers) in [
        (SimCall::Create, 0, &[][..]),
        (SimCall::Map, 0, &[]),
        (SimCall::Grant, 0, &[]),
        // The second grant of a growth is the peer's.
        (SimCall::Grant, 1, &[1]),
    ] {
        let dev = device();
        let faults = dev.faults();
        let pool = Pool::new(dev, vmm(peers)).unwrap();
        let kept = pool.allocate(PAGE, 256, None).unwrap();
        pool.write(kept, 0, b"kept").unwrap();
        let before = pool.stats();
        faults.fail(call, skip, DriverCode::INVALID_VALUE);
        let err = pool.allocate(3 * PAGE, 256, None).unwrap_err();
        // The device reports plenty of free memory: a refusal is an error,
        // passed on with the driver's code.
        assert_eq!(
            err.driver_code(),
            Some(DriverCode::INVALID_VALUE),
            "{call:?}: {err}"
        );
        let after = pool.stats();
        assert_eq!(
            (after.mapped_bytes, after.grows),
            (before.mapped_bytes, before.grows),
            "{call:?}"
        );
        assert_eq!(
            after.heap.managed_bytes, before.heap.managed_bytes,
            "{call:?}"
        );
        // Every handle made for the growth was given back, through counted calls.
        assert_eq!(pool.lock().device().used_bytes(), PAGE, "{call:?}");
        let refused_create = u64::from(call == SimCall::Create);
        assert_eq!(
            after.calls.create.calls - after.calls.release.calls,
            1 + refused_create,
            "{call:?}: the refused create made nothing, the rest was released"
        );
        let mut out = [0; 4];
        pool.read(kept, 0, &mut out).unwrap();
        assert_eq!(&out, b"kept");
        // The range past the top takes the next growth.
        let next = pool.allocate(3 * PAGE, 256, None).unwrap();
        assert_eq!(
            pool.device_ptr(next).unwrap(),
            pool.device_ptr(kept).unwrap() + PAGE
        );
        let dev = pool.into_device();
        assert_eq!(dev.used_bytes(), 0, "{call:?}: everything given back");
        assert_eq!(faults.pending(), 0);
    }
}

#[test]
fn a_step_the_device_refuses_shrinks_to_what_the_request_needs() {
    let config = PoolConfig {
        min_growth_bytes: 16 * PAGE,
        ..vmm(&[])
    };
    // On a device of 12 pages the 16-page step is refused, and the device's
    // figures confirm the shortage: the pool takes the 2 pages it needs.
    let pool = Pool::new(SimDevice::new(SimConfig::small(12 * PAGE)), config).unwrap();
    let block = pool.allocate(2 * PAGE, 256, None).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.mapped_bytes, 2 * PAGE, "the need alone");
    assert_eq!(
        stats.calls.create.calls, 2,
        "the step, refused, then the need"
    );
    assert_eq!(
        stats.calls.release.calls, 0,
        "the refused create made nothing"
    );
    pool.free(block).unwrap();
    // A device that refuses while it reports room enough is an error, not
    // a shortage to work around.
    let dev = device();
    let faults = dev.faults();
    let pool = Pool::new(dev, config).unwrap();
    faults.fail(SimCall::Create, 0, DriverCode::OUT_OF_MEMORY);
    let err = pool.allocate(PAGE, 256, None).unwrap_err();
    assert_eq!(err.driver_code(), Some(DriverCode::OUT_OF_MEMORY), "{err}");
    assert_eq!(pool.stats().calls.create.calls, 1);
}

#[test]
fn a_shrink_whose_unmap_fails_keeps_the_mapping_and_its_contents() {
    let dev = device();
    let faults = dev.faults();
    let pool = Pool::new(dev, vmm(&[])).unwrap();
    let low = pool.allocate(PAGE, 256, None).unwrap();
    let high = pool.allocate(2 * PAGE, 256, None).unwrap();
    pool.write(low, 0, b"low").unwrap();
    pool.free(high).unwrap();
    faults.fail(SimCall::Unmap, 0, DriverCode(999));
    let err = pool.shrink().unwrap_err();
    assert_eq!(err.driver_code(), Some(DriverCode(999)));
    let stats = pool.stats();
    assert_eq!(
        (stats.mapped_bytes, stats.heap.managed_bytes),
        (3 * PAGE, 3 * PAGE)
    );
    // The mapping is whole and usable: its block comes back where it was.
    let again = pool.allocate(2 * PAGE, 256, None).unwrap();
    pool.write(again, 2 * PAGE - 4, b"tail").unwrap();
    pool.free(again).unwrap();
    assert_eq!(pool.shrink().unwrap(), 2 * PAGE);
    let mut out = [0; 3];
    pool.read(low, 0, &mut out).unwrap();
    assert_eq!(&out, b"low");
    assert_eq!(pool.into_device().used_bytes(), 0);
}

#[test]
fn a_shrink_whose_release_fails_leaves_the_range_and_gives_the_handle_back_later() {
    let dev = device();
    let faults = dev.faults();
    let pool = Pool::new(dev, vmm(&[])).unwrap();
    let low = pool.allocate(PAGE, 256, None).unwrap();
    let high = pool.allocate(2 * PAGE, 256, None).unwrap();
    pool.free(high).unwrap();
    faults.fail(SimCall::Release, 0, DriverCode(999));
    assert!(pool.shrink().is_err());
    // Unmapped, the range left the pool (the heap never hands it out), while
    // the device still holds the handle.
    let stats = pool.stats();
    assert_eq!((stats.mapped_bytes, stats.heap.managed_bytes), (PAGE, PAGE));
    assert_eq!(pool.lock().device().used_bytes(), 3 * PAGE);
    // The next growth maps over the same range with a new handle.
    let next = pool.allocate(2 * PAGE, 256, None).unwrap();
    pool.write(next, 0, b"new").unwrap();
    pool.free(next).unwrap();
    pool.free(low).unwrap();
    let (dev, released) = pool.try_into_device();
    released.unwrap();
    assert_eq!(dev.used_bytes(), 0, "the stranded handle went too");
}

/// A stitched pool on a 64 MiB device, 2 MiB pages, 8 MiB large handles.
fn stitched(peers: &[u32]) -> (StitchedPool<SimDevice>, ctx::SimFaults) {
    let mut config = SimConfig::small(64 * MIB);
    config.granularity_bytes = 2 * MIB;
    let dev = SimDevice::on_host(config, 0, PeerLinks::all(2));
    let faults = dev.faults();
    let pool = StitchedPool::new(
        dev,
        StitchedConfig {
            reservation_bytes: 256 * MIB,
            stitch: StitchConfig {
                large_pages: 4,
                ..StitchConfig::default()
            },
            peers: PeerSet::of(peers).unwrap(),
        },
    )
    .unwrap();
    (pool, faults)
}

#[test]
fn a_stitched_allocation_whose_mapping_fails_rolls_back_in_model_and_device() {
    for (call, skip, peers) in [
        (SimCall::Map, 0, &[][..]),
        (SimCall::Grant, 0, &[]),
        (SimCall::Grant, 1, &[1]),
    ] {
        let (pool, faults) = stitched(peers);
        let kept = pool.allocate(3 * MIB).unwrap();
        pool.with_device(|d| d.write(kept, b"kept")).unwrap();
        faults.fail(call, skip, DriverCode::INVALID_VALUE);
        let err = pool.allocate(20 * MIB).unwrap_err();
        assert_eq!(
            err.driver_code(),
            Some(DriverCode::INVALID_VALUE),
            "{call:?}: {err}"
        );
        pool.check().unwrap();
        assert_eq!(pool.stats().rollbacks, 1);
        assert_eq!(pool.live_allocations(), [(kept, 3 * MIB)]);
        let mut out = [0; 4];
        pool.with_device(|d| d.read(kept, &mut out)).unwrap();
        assert_eq!(&out, b"kept");
        let next = pool.allocate(20 * MIB).unwrap();
        pool.with_device(|d| d.write(next + 20 * MIB - 4, b"next"))
            .unwrap();
        pool.check().unwrap();
    }
}

#[test]
fn a_stitched_creation_refused_for_memory_is_retried_once() {
    let (pool, faults) = stitched(&[]);
    faults.fail(SimCall::Create, 0, DriverCode::OUT_OF_MEMORY);
    let ptr = pool.allocate(5 * MIB).unwrap();
    assert_eq!(pool.stats().rollbacks, 1, "the first attempt rolled back");
    pool.check().unwrap();
    // Every creation refused, in the first attempt and the retry: out of
    // memory, with the driver's code.
    for _ in 0..16 {
        faults.fail(SimCall::Create, 0, DriverCode::OUT_OF_MEMORY);
    }
    let err = pool.allocate(20 * MIB).unwrap_err();
    faults.clear();
    assert!(
        matches!(err, Error::StitchedOutOfMemory { driver_code: Some(code), .. } if code.is_out_of_memory()),
        "{err}"
    );
    pool.check().unwrap();
    pool.free(ptr).unwrap();
}

#[test]
fn a_trim_whose_unmap_fails_still_gives_the_handle_back() {
    let (pool, faults) = stitched(&[]);
    let ptr = pool.allocate(3 * MIB).unwrap();
    pool.free(ptr).unwrap();
    faults.fail(SimCall::Unmap, 0, DriverCode(999));
    let err = pool.trim().unwrap_err();
    assert_eq!(err.driver_code(), Some(DriverCode(999)));
    // The release after it unmapped the handle on the way: model and device agree.
    pool.check().unwrap();
    assert_eq!(pool.stats().model.physical_bytes, 0);
    assert_eq!(pool.with_device(|d| d.used_bytes()), 0);
}
