//! The stitched pool on a simulated device that keeps bytes per physical
//! handle: contents survive other blocks' churn while handles are recycled
//! and moved, a refused creation rolls back to a consistent pool, bad frees
//! change nothing, and eight threads share one pool.

use std::sync::Arc;

use ctx::{
    DeviceMemory, DriverCode, Error, SimConfig, SimDevice, StitchConfig, StitchedConfig,
    StitchedPool,
};

const MIB: u64 = 1 << 20;

/// The bytes block `tag` holds: every 8 bytes name the tag and their place.
fn pattern(tag: u64, len: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len as usize + 8);
    let mut word = 0u64;
    while (bytes.len() as u64) < len {
        bytes.extend_from_slice(&(tag << 32 | word).to_le_bytes());
        word += 1;
    }
    bytes.truncate(len as usize);
    bytes
}

fn pool(capacity: u64, stitch: StitchConfig) -> StitchedPool<SimDevice> {
    StitchedPool::new(
        SimDevice::new(SimConfig::small(capacity)),
        StitchedConfig {
            reservation_bytes: 0,
            stitch,
            peers: ctx::PeerSet::NONE,
        },
    )
    .unwrap()
}

fn write(pool: &StitchedPool<SimDevice>, ptr: u64, tag: u64, len: u64) {
    pool.with_device(|d| d.write(ptr, &pattern(tag, len)))
        .unwrap();
}

fn assert_holds(pool: &StitchedPool<SimDevice>, ptr: u64, tag: u64, len: u64, when: &str) {
    let mut out = vec![0; len as usize];
    pool.with_device(|d| d.read(ptr, &mut out)).unwrap();
    assert!(
        out == pattern(tag, len),
        "{when}: block {tag} at {ptr:#x} (+{len}) lost its contents"
    );
}

/// The device holds exactly the model's physical bytes.
fn assert_in_step(pool: &StitchedPool<SimDevice>) {
    pool.check().unwrap();
    let physical = pool.stats().model.physical_bytes;
    assert_eq!(pool.with_device(|d| d.used_bytes()), physical);
}

#[test]
fn contents_survive_other_blocks_allocate_free_and_trim() {
    // 8 MiB large handles and recycling at once: idle handles are unmapped
    // from freed places and mapped under new blocks all the time.
    let stitch = StitchConfig {
        large_pages: 4,
        keep_idle_bytes: 0,
        ..StitchConfig::default()
    };
    let pool = pool(512 * MIB, stitch);
    let mut rng = fastrand::Rng::with_seed(0x5eed_1234_abcd_0001);
    let mut live: Vec<(u64, u64, u64)> = Vec::new();
    for step in 0..300u64 {
        match rng.u64(..10) {
            0..=4 => {
                let size = match rng.u64(..4) {
                    0 => 1 + rng.u64(..4096),
                    1 | 2 => 1 + rng.u64(..3 * MIB),
                    _ => 8 * MIB + rng.u64(..20 * MIB),
                };
                let ptr = pool.allocate(size).unwrap();
                assert_eq!(ptr % 512, 0);
                write(&pool, ptr, step, size);
                live.push((ptr, step, size));
            }
            5..=8 if !live.is_empty() => {
                let (ptr, tag, size) = live.swap_remove(rng.usize(..live.len()));
                assert_holds(&pool, ptr, tag, size, "before its free");
                pool.free(ptr).unwrap();
            }
            _ => pool.trim().unwrap(),
        }
        assert_in_step(&pool);
        if step % 15 == 0 {
            for &(ptr, tag, size) in &live {
                assert_holds(&pool, ptr, tag, size, &format!("step {step}"));
            }
        }
    }
    for &(ptr, tag, size) in &live {
        assert_holds(&pool, ptr, tag, size, "at the end");
    }
    let counters = pool.with_device(|d| d.counters());
    assert!(
        counters.maps > counters.creates && counters.unmaps > 0,
        "no handle was moved, so the test proved nothing: {counters:?}"
    );
    let stats = pool.stats();
    assert_eq!(stats.calls.create.calls, counters.creates);
    assert_eq!(stats.calls.map.calls, counters.maps);
    assert_eq!(stats.calls.set_access.calls, counters.grants);
    assert_eq!(stats.model.calls.map.calls, counters.maps);
    for (ptr, _, _) in live {
        pool.free(ptr).unwrap();
    }
    pool.trim().unwrap();
    assert_in_step(&pool);
    assert_eq!(pool.stats().model.physical_bytes, 0);
}

#[test]
fn a_refused_creation_releases_idle_handles_and_retries_once() {
    // Idle handles are never recycled here, so a request that needs new
    // pages must create them; the device is full, the pool releases its
    // idle handles and the second attempt fits.
    let stitch = StitchConfig {
        large_pages: 0,
        keep_idle_bytes: u64::MAX,
        ..StitchConfig::default()
    };
    let pool = pool(20 * MIB, stitch);
    let kept = pool.allocate(6 * MIB).unwrap();
    write(&pool, kept, 1, 6 * MIB);
    let idle = pool.allocate(8 * MIB).unwrap();
    let fence = pool.allocate(MIB).unwrap();
    pool.free(idle).unwrap();
    assert_eq!(pool.stats().model.idle_bytes, 8 * MIB);
    // `idle`'s 8 MiB hole is too small, so `big` goes after the fence and
    // needs five new pages; the device has two free.
    let big = pool.allocate(10 * MIB).unwrap();
    assert!(big > fence);
    write(&pool, big, 2, 10 * MIB);
    assert_holds(&pool, kept, 1, 6 * MIB, "after the retry");
    assert_holds(&pool, big, 2, 10 * MIB, "after the retry");
    assert_in_step(&pool);
    assert_eq!(pool.stats().rollbacks, 1);
    assert_eq!(pool.stats().model.idle_bytes, 0, "the idle handles went");
}

#[test]
fn out_of_memory_leaves_a_consistent_pool() {
    let stitch = StitchConfig {
        large_pages: 2,
        ..StitchConfig::default()
    };
    let pool = pool(24 * MIB, stitch);
    let mut live = Vec::new();
    let error = loop {
        match pool.allocate(5 * MIB) {
            Ok(ptr) => {
                write(&pool, ptr, live.len() as u64, 5 * MIB);
                live.push(ptr);
            }
            Err(error) => break error,
        }
        assert!(live.len() < 10, "a 24 MiB device took 50 MiB");
    };
    assert!(
        matches!(
            error,
            Error::StitchedOutOfMemory { requested, driver_code: Some(code), .. }
                if requested == 5 * MIB && code == DriverCode::OUT_OF_MEMORY
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{error}"
    );
    assert_eq!(pool.stats().rollbacks, 2, "the first attempt and the retry");
    assert_in_step(&pool);
    assert_eq!(pool.live_allocations().len(), live.len());
    for (tag, &ptr) in live.iter().enumerate() {
        assert_holds(&pool, ptr, tag as u64, 5 * MIB, "after the refusal");
    }
    // The pool still works: room made by a free is used.
    pool.free(live[1]).unwrap();
    let again = pool.allocate(5 * MIB).unwrap();
    write(&pool, again, 99, 5 * MIB);
    assert_holds(&pool, live[0], 0, 5 * MIB, "after a new allocation");
    assert_in_step(&pool);
}

#[test]
fn a_full_reservation_is_out_of_memory_and_changes_nothing() {
    // Two 32 MiB chunks of address space: the first block takes both.
    let pool = StitchedPool::new(
        SimDevice::new(SimConfig::small(256 * MIB)),
        StitchedConfig {
            reservation_bytes: 64 * MIB,
            stitch: StitchConfig::default(),
            peers: ctx::PeerSet::NONE,
        },
    )
    .unwrap();
    assert_eq!(pool.reservation().1, 64 * MIB);
    let a = pool.allocate(40 * MIB).unwrap();
    let error = pool.allocate(40 * MIB).unwrap_err();
    assert!(
        matches!(
            error,
            Error::StitchedOutOfMemory { driver_code: None, ref why, .. } if why.contains("reservation")
        ),
        "{error}"
    );
    assert_in_step(&pool);
    assert_eq!(pool.live_allocations(), vec![(a, 40 * MIB)]);
    assert!(pool.allocate(MIB).is_ok(), "what fits still fits");
}

#[test]
fn unknown_pointers_and_double_frees_are_refused_and_change_nothing() {
    let pool = pool(64 * MIB, StitchConfig::default());
    let a = pool.allocate(3 * MIB).unwrap();
    let before = pool.stats();
    for bad in [0, a + 512, a - 512, u64::MAX] {
        assert_eq!(pool.free(bad), Err(Error::UnknownPointer { ptr: bad }));
    }
    assert_eq!(pool.stats(), before);
    pool.free(a).unwrap();
    assert_eq!(pool.free(a), Err(Error::UnknownPointer { ptr: a }));
    assert!(matches!(
        pool.allocate(0),
        Err(Error::Memcore(memcore::Error::ZeroSize))
    ));
    assert_in_step(&pool);
}

#[test]
fn a_device_without_vmm_is_refused() {
    let mut config = SimConfig::small(64 * MIB);
    config.vmm = false;
    let made = StitchedPool::new(SimDevice::new(config), StitchedConfig::default());
    assert!(matches!(made, Err(Error::Unsupported(_))));
}

#[test]
fn eight_threads_share_one_pool() {
    let pool = Arc::new(pool(1 << 30, StitchConfig::default()));
    let threads: Vec<_> = (0..8u64)
        .map(|thread| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(0x9e37_79b9 + thread);
                let mut mine = Vec::new();
                for step in 0..150u64 {
                    if mine.len() < 6 && rng.u64(..3) != 0 {
                        let size = 1 + rng.u64(..5 * MIB);
                        let tag = thread << 16 | step;
                        let ptr = pool.allocate(size).unwrap();
                        write(&pool, ptr, tag, size);
                        mine.push((ptr, tag, size));
                    } else if let Some((ptr, tag, size)) = mine.pop() {
                        assert_holds(&pool, ptr, tag, size, "in a thread");
                        pool.free(ptr).unwrap();
                    }
                }
                mine
            })
        })
        .collect();
    let mut left = Vec::new();
    for t in threads {
        left.extend(t.join().unwrap());
    }
    assert_eq!(pool.live_allocations().len(), left.len());
    for &(ptr, tag, size) in &left {
        assert_holds(&pool, ptr, tag, size, "after the threads");
        pool.free(ptr).unwrap();
    }
    pool.trim().unwrap();
    assert_in_step(&pool);
    assert_eq!(pool.with_device(|d| d.used_bytes()), 0);
}
