use super::*;

const PAGE: u64 = 64 << 10;

/// Create, map and grant the device itself `size` bytes at `addr`: a
/// mapping ready for use, as a pool makes one.
fn map(dev: &mut SimDevice, addr: u64, size: u64) -> Result<PhysicalHandle> {
    let handle = dev.create_physical(size)?;
    dev.map_physical(handle, addr)?;
    dev.grant_access(addr, size, PeerSet::of(&[dev.ordinal()])?)?;
    Ok(handle)
}

#[test]
fn addresses_start_high_and_are_page_aligned() {
    let mut dev = SimDevice::new(SimConfig::small(1 << 20));
    let base = dev.reserve(4 * PAGE).unwrap();
    assert!(base >= SIM_BASE_ADDRESS);
    assert_eq!(base % PAGE, 0);
    let chunk = dev.alloc_chunk(1000).unwrap();
    assert!(
        chunk >= base + 4 * PAGE,
        "chunk must not fall inside the reservation"
    );
}

#[test]
fn capacity_counts_mappings_chunks_and_context() {
    let mut config = SimConfig::small(8 * PAGE);
    config.context_reserved_bytes = 2 * PAGE;
    let mut dev = SimDevice::new(config);
    let base = dev.reserve(8 * PAGE).unwrap();
    map(&mut dev, base, 4 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, 2 * PAGE);
    let chunk = dev.alloc_chunk(2 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, 0);
    let err = map(&mut dev, base + 4 * PAGE, PAGE).unwrap_err();
    assert!(
        matches!(err, Error::Driver { op: "create_physical", code, .. } if code.is_out_of_memory()),
        "{err}"
    );
    let err = dev.alloc_chunk(1).unwrap_err();
    assert_eq!(err.driver_code(), Some(DriverCode::OUT_OF_MEMORY));
    dev.free_chunk(chunk, 2 * PAGE).unwrap();
    map(&mut dev, base + 4 * PAGE, PAGE).unwrap();
    assert_eq!(dev.used_bytes(), 5 * PAGE);
}

#[test]
fn unmap_takes_one_whole_mapping_only() {
    let mut dev = SimDevice::new(SimConfig::small(1 << 20));
    let base = dev.reserve(4 * PAGE).unwrap();
    let a = map(&mut dev, base, 2 * PAGE).unwrap();
    let b = map(&mut dev, base + 2 * PAGE, PAGE).unwrap();
    let invalid = |result: Result<()>| result.unwrap_err().driver_code();
    let refused = Some(DriverCode::INVALID_VALUE);
    assert_eq!(
        invalid(dev.unmap_physical(base, PAGE)),
        refused,
        "half a mapping"
    );
    assert_eq!(
        invalid(dev.unmap_physical(base, 3 * PAGE)),
        refused,
        "two mappings"
    );
    assert_eq!(
        invalid(dev.release(base, 4 * PAGE)),
        refused,
        "still mapped"
    );
    dev.unmap_physical(base, 2 * PAGE).unwrap();
    dev.unmap_physical(base + 2 * PAGE, PAGE).unwrap();
    dev.release_physical(a).unwrap();
    dev.release_physical(b).unwrap();
    assert_eq!(dev.used_bytes(), 0);
    dev.release(base, 4 * PAGE).unwrap();
}

#[test]
fn map_rejects_ranges_outside_reservations_or_overlapping() {
    let mut dev = SimDevice::new(SimConfig::small(1 << 20));
    let base = dev.reserve(2 * PAGE).unwrap();
    let two = dev.create_physical(2 * PAGE).unwrap();
    let one = dev.create_physical(PAGE).unwrap();
    assert!(dev.map_physical(two, base + PAGE).is_err(), "past the end");
    assert!(dev.map_physical(one, base + 1).is_err(), "off a page");
    dev.map_physical(two, base).unwrap();
    assert!(dev.map_physical(one, base + PAGE).is_err(), "over another");
    let chunk = dev.alloc_chunk(PAGE).unwrap();
    let own = PeerSet::of(&[0]).unwrap();
    assert!(dev.grant_access(chunk, PAGE, own).is_err(), "a chunk");
    assert!(dev.grant_access(base, PAGE, own).is_err(), "half a mapping");
    assert!(
        dev.grant_access(base, 2 * PAGE, PeerSet::NONE).is_err(),
        "nobody"
    );
    dev.grant_access(base, 2 * PAGE, own).unwrap();
    assert_eq!(dev.counters().grants, 1);
}

#[test]
fn data_crosses_mapping_boundaries_and_copies_overlap() {
    let mut dev = SimDevice::new(SimConfig::small(1 << 20));
    let base = dev.reserve(2 * PAGE).unwrap();
    map(&mut dev, base, PAGE).unwrap();
    map(&mut dev, base + PAGE, PAGE).unwrap();
    let pattern: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
    let at = base + PAGE - 100;
    dev.write(at, &pattern).unwrap();
    dev.copy_within(at, at + 50, 200).unwrap();
    let mut out = vec![0; 200];
    dev.read(at + 50, &mut out).unwrap();
    assert_eq!(out, pattern);
    let err = dev.read(base + 2 * PAGE - 10, &mut out).unwrap_err();
    assert!(matches!(err, Error::InvalidAddress { .. }));
}

#[test]
fn a_batch_of_moves_runs_in_order() {
    use crate::BlockMove;
    let mut dev = SimDevice::new(SimConfig::small(1 << 20));
    let base = dev.reserve(PAGE).unwrap();
    map(&mut dev, base, PAGE).unwrap();
    dev.write(base, b"abcdefgh").unwrap();
    // The second move reads what the first wrote; the third overlaps itself.
    let moves = [
        BlockMove {
            src: base,
            dst: base + 100,
            len: 4,
        },
        BlockMove {
            src: base + 100,
            dst: base + 200,
            len: 4,
        },
        BlockMove {
            src: base + 200,
            dst: base + 202,
            len: 4,
        },
    ];
    dev.copy_moves(&moves).unwrap();
    let mut out = [0; 6];
    dev.read(base + 200, &mut out).unwrap();
    assert_eq!(&out, b"ababcd");
    assert_eq!(dev.counters().copies, 3);
}

#[test]
fn batched_moves_copy_what_memmove_one_by_one_copies() {
    let mut dev = SimDevice::new(SimConfig::small(1 << 20));
    let base = dev.reserve(PAGE).unwrap();
    map(&mut dev, base, PAGE).unwrap();
    let original: Vec<u8> = (0..PAGE)
        .map(|i| (i as u8).wrapping_mul(37) ^ 0x5a)
        .collect();
    dev.write(base, &original).unwrap();
    let mv = |src: u64, dst: u64, len: u64| BlockMove {
        src: base + src,
        dst: base + dst,
        len,
    };
    // A slide of aligned blocks, relocations into far holes (independent),
    // an unaligned chain and a move over itself.
    let mut moves: Vec<BlockMove> = (1..20).map(|k| mv(512 * k, 512 * k - 256, 480)).collect();
    moves.extend((0..10).map(|k| mv(20_000 + 300 * k, 40_000 + 300 * k, 200)));
    moves.extend((1..5).map(|k| mv(50_000 + 100 * k, 50_000 + 100 * (k - 1), 100)));
    moves.push(mv(60_000, 60_003, 1000));
    let mut expected = original.clone();
    for m in &moves {
        let (s, d) = ((m.src - base) as usize, (m.dst - base) as usize);
        expected.copy_within(s..s + m.len as usize, d);
    }
    dev.copy_moves(&moves).unwrap();
    let mut out = vec![0; PAGE as usize];
    dev.read(base, &mut out).unwrap();
    assert!(
        out == expected,
        "batched copies differ from memmove one by one"
    );
    assert_eq!(dev.counters().copies, moves.len() as u64);
    // A bad range anywhere in the list is refused before any byte moves.
    let before = out.clone();
    let err = dev
        .copy_moves(&[mv(0, 256, 16), mv(PAGE - 8, 0, 16)])
        .unwrap_err();
    assert!(matches!(err, Error::InvalidAddress { .. }), "{err:?}");
    dev.read(base, &mut out).unwrap();
    assert!(out == before, "a refused batch changed memory");
}

#[test]
fn unbacked_device_keeps_bookkeeping_only() {
    let mut dev = SimDevice::new(SimConfig::h200_like());
    let info = dev.mem_info().unwrap();
    assert_eq!(info.total - info.free, 552_402_944);
    let base = dev.reserve(64 << 30).unwrap();
    map(&mut dev, base, 64 << 30).unwrap();
    dev.write(base, &[1, 2, 3]).unwrap();
    let mut out = [9; 3];
    dev.read(base, &mut out).unwrap();
    assert_eq!(out, [0; 3]);
    assert!(dev.read(base + (64 << 30), &mut out).is_err());
}

#[test]
fn vmm_off_refuses_reservations() {
    let mut config = SimConfig::small(1 << 20);
    config.vmm = false;
    let mut dev = SimDevice::new(config);
    assert!(matches!(dev.reserve(PAGE), Err(Error::Unsupported(_))));
    assert!(matches!(
        dev.create_physical(PAGE),
        Err(Error::Unsupported(_))
    ));
    assert!(dev.alloc_chunk(PAGE).is_ok());
}

#[test]
fn a_planned_failure_changes_nothing_and_comes_once() {
    let mut dev = SimDevice::new(SimConfig::small(1 << 20));
    let faults = dev.faults();
    faults.fail(SimCall::Reserve, 0, DriverCode(999));
    faults.fail(SimCall::AllocChunk, 0, DriverCode::OUT_OF_MEMORY);
    faults.fail(SimCall::FreeChunk, 0, DriverCode(999));
    let err = dev.reserve(PAGE).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Driver {
                op: "reserve",
                code: DriverCode(999),
                ..
            }
        ),
        "{err}"
    );
    let base = dev.reserve(PAGE).unwrap();
    assert!(dev.alloc_chunk(PAGE).is_err());
    assert_eq!(dev.used_bytes(), 0);
    let chunk = dev.alloc_chunk(PAGE).unwrap();
    assert!(dev.free_chunk(chunk, PAGE).is_err());
    dev.write(chunk, b"still here").unwrap();
    dev.free_chunk(chunk, PAGE).unwrap();
    dev.release(base, PAGE).unwrap();
    assert_eq!(faults.pending(), 0);
}
