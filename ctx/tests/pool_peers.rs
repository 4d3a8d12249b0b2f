//! Pools that grant other devices access to their memory (`PoolConfig::peers`),
//! on simulated devices of one host.

use ctx::{
    DeviceMemory, Error, Growth, PeerLinks, PeerSet, Pool, PoolConfig, SimConfig, SimDevice,
};

const PAGE: u64 = 64 << 10;

fn device(ordinal: u32, links: PeerLinks) -> SimDevice {
    SimDevice::on_host(SimConfig::small(64 * PAGE), ordinal, links)
}

fn peers(ordinals: &[u32]) -> PeerSet {
    PeerSet::of(ordinals).unwrap()
}

#[test]
fn every_growth_is_granted_to_every_peer_and_counted() {
    let config = PoolConfig::vmm(64 * PAGE).with_peers(peers(&[0, 2]));
    let pool = Pool::new(device(1, PeerLinks::all(3)), config).unwrap();
    let a = pool.allocate(3 * PAGE, 256, None).unwrap();
    let b = pool.allocate(5 * PAGE, 256, None).unwrap();
    pool.write(a, 0, b"first growth").unwrap();
    pool.write(b, 5 * PAGE - 4, b"last").unwrap();
    let stats = pool.stats();
    assert_eq!(stats.grows, 2);
    // One grant per mapping (device 1 is the pool's own, never granted).
    assert_eq!(stats.peer_access.calls, 2);
    assert_eq!(stats.peer_access.bytes, stats.mapped_bytes);
    let (a_at, b_at) = (pool.device_ptr(a).unwrap(), pool.device_ptr(b).unwrap());
    // Each growth: the device's own grant, then one for both peers.
    assert_eq!(stats.calls.set_access.calls, 2);
    let guard = pool.lock();
    let dev = guard.device();
    assert_eq!(dev.counters().grants, 4);
    for peer in [0, 2] {
        let mut out = [0; 12];
        dev.read_as(peer, a_at, &mut out).unwrap();
        assert_eq!(&out, b"first growth");
        let mut out = [0; 4];
        dev.read_as(peer, b_at + 5 * PAGE - 4, &mut out).unwrap();
        assert_eq!(&out, b"last");
    }
    let mut out = [0; 4];
    let err = dev.read_as(3, a_at, &mut out).unwrap_err();
    assert!(matches!(err, Error::InvalidAddress { .. }), "{err}");
}

#[test]
fn a_mapping_made_after_a_shrink_is_granted_too() {
    let config = PoolConfig::vmm(64 * PAGE).with_peers(peers(&[1]));
    let pool = Pool::new(device(0, PeerLinks::all(2)), config).unwrap();
    let a = pool.allocate(PAGE, 256, None).unwrap();
    let b = pool.allocate(2 * PAGE, 256, None).unwrap();
    pool.free(b).unwrap();
    assert_eq!(pool.shrink().unwrap(), 2 * PAGE);
    let c = pool.allocate(4 * PAGE, 256, None).unwrap();
    pool.write(c, 4 * PAGE - 3, b"top").unwrap();
    let stats = pool.stats();
    assert_eq!(stats.peer_access.calls, 3);
    assert_eq!(stats.peer_access.bytes, 7 * PAGE);
    let at = pool.device_ptr(c).unwrap();
    let mut out = [0; 3];
    pool.lock()
        .device()
        .read_as(1, at + 4 * PAGE - 3, &mut out)
        .unwrap();
    assert_eq!(&out, b"top");
    pool.free(a).unwrap();
}

#[test]
fn a_peer_that_cannot_reach_the_device_is_refused_and_nothing_stays_mapped() {
    // Device 1 cannot reach device 0's memory (the other way round it can).
    let links = PeerLinks::all(2).without(1, 0);
    let config = PoolConfig::vmm(64 * PAGE).with_peers(peers(&[1]));
    let pool = Pool::new(device(0, links), config).unwrap();
    let err = pool.allocate(PAGE, 256, None).unwrap_err();
    assert_eq!(
        err,
        Error::PeerAccess {
            device: 0,
            peer: 1,
            why: "the host's links do not connect them"
        }
    );
    assert!(
        err.to_string()
            .contains("device 1 cannot access memory of device 0")
    );
    let stats = pool.stats();
    assert_eq!((stats.mapped_bytes, stats.grows), (0, 0));
    assert_eq!(stats.peer_access.calls, 1, "the refused call is counted");
    assert_eq!(pool.into_device().used_bytes(), 0);

    // A device the host does not have.
    let config = PoolConfig::vmm(64 * PAGE).with_peers(peers(&[5]));
    let pool = Pool::new(device(0, PeerLinks::all(2)), config).unwrap();
    let err = pool.allocate(PAGE, 256, None).unwrap_err();
    assert!(
        matches!(err, Error::PeerAccess { peer: 5, why, .. } if why.contains("no such device")),
        "{err}"
    );
}

#[test]
fn a_pool_without_peers_makes_no_grant() {
    for config in [
        PoolConfig::vmm(64 * PAGE),
        // Its own device alone is no peer.
        PoolConfig::vmm(64 * PAGE).with_peers(peers(&[0])),
    ] {
        let pool = Pool::new(device(0, PeerLinks::all(2)), config).unwrap();
        pool.allocate(3 * PAGE, 256, None).unwrap();
        pool.allocate(3 * PAGE, 256, None).unwrap();
        let stats = pool.stats();
        assert_eq!(stats.grows, 2);
        assert_eq!(stats.peer_access, ctx::CallTally::default());
        let dev = pool.into_device();
        assert_eq!(dev.counters().grants, 2, "the device's own grants alone");
        assert_eq!(dev.counters().maps, 2);
        assert_eq!(dev.used_bytes(), 0, "given back");
    }
}

#[test]
fn a_chunk_pool_refuses_peers_and_says_why() {
    let config = PoolConfig::chunks(4 * PAGE).with_peers(peers(&[1]));
    let err = Pool::new(device(0, PeerLinks::all(2)), config).unwrap_err();
    assert_eq!(err, Error::PeersNeedVmm);
    assert!(err.to_string().contains("cuCtxEnablePeerAccess"), "{err}");
    // Naming only its own device asks for nothing.
    let config = PoolConfig::chunks(4 * PAGE).with_peers(peers(&[0]));
    let pool = Pool::new(device(0, PeerLinks::all(2)), config).unwrap();
    pool.allocate(PAGE, 256, None).unwrap();
    assert_eq!(pool.config().growth, Growth::Chunks);
}

#[test]
fn a_grant_takes_whole_mappings_only() {
    let mut dev = device(0, PeerLinks::all(2));
    let base = dev.reserve(8 * PAGE).unwrap();
    for at in [base, base + 2 * PAGE] {
        let handle = dev.create_physical(2 * PAGE).unwrap();
        dev.map_physical(handle, at).unwrap();
    }
    let one = peers(&[1]);
    assert!(dev.grant_access(base, PAGE, one).is_err(), "half a mapping");
    assert!(
        dev.grant_access(base, 6 * PAGE, one).is_err(),
        "past the mappings"
    );
    assert!(dev.grant_access(base, 0, one).is_err(), "nothing");
    let chunk = dev.alloc_chunk(PAGE).unwrap();
    assert!(dev.grant_access(chunk, PAGE, one).is_err(), "a chunk");
    dev.grant_access(base, 4 * PAGE, peers(&[0, 1])).unwrap();
    let mut out = [0; 8];
    dev.read_as(1, base + 2 * PAGE - 4, &mut out).unwrap();
    assert_eq!(dev.counters().grants, 1);
}

#[test]
fn a_stitched_pool_grants_every_mapped_handle_to_its_peers() {
    use ctx::{StitchConfig, StitchedConfig, StitchedPool};
    const MIB: u64 = 1 << 20;
    let host = |peers| {
        StitchedPool::new(
            SimDevice::on_host(SimConfig::small(256 * MIB), 0, PeerLinks::all(2)),
            StitchedConfig {
                reservation_bytes: 128 * MIB,
                stitch: StitchConfig::default(),
                peers,
            },
        )
        .unwrap()
    };
    let pool = host(peers(&[1]));
    let a = pool.allocate(40 * MIB).unwrap();
    let b = pool.allocate(3 * MIB).unwrap();
    let stats = pool.stats();
    // Every handle mapped is granted once, over its whole mapping.
    assert!(stats.calls.map.calls >= 2, "{stats:?}");
    assert_eq!(stats.peer_access.calls, stats.calls.map.calls);
    assert_eq!(stats.peer_access.bytes, stats.calls.map.bytes);
    pool.with_device(|dev| {
        dev.write(a + 40 * MIB - 4, b"tail").unwrap();
        dev.write(b, b"head").unwrap();
        let mut out = [0; 4];
        dev.read_as(1, a + 40 * MIB - 4, &mut out).unwrap();
        assert_eq!(&out, b"tail");
        dev.read_as(1, b, &mut out).unwrap();
        assert_eq!(&out, b"head");
    });
    // Without peers: no grant, and the other device is refused.
    let alone = host(PeerSet::NONE);
    let c = alone.allocate(MIB).unwrap();
    assert_eq!(alone.stats().peer_access.calls, 0);
    alone.with_device(|dev| {
        let mut out = [0; 4];
        assert!(dev.read_as(1, c, &mut out).is_err());
    });
}
