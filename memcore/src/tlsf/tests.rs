use alloc::vec::Vec;

use super::*;
use crate::{Fit, FreeList};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn tlsf(offset: u64, size: u64) -> Tlsf {
    let mut t = Tlsf::new();
    t.add_region(offset, size).unwrap();
    t
}

/// The counters agree with the extents reported, and the deep check passes.
fn assert_sound(t: &Tlsf) {
    t.check().unwrap();
    let s = t.stats();
    assert_eq!(
        s.live_bytes + s.padding_bytes + s.free_bytes,
        s.managed_bytes
    );
    let free = t.free_extents();
    assert_eq!(free.iter().map(|e| e.size).sum::<u64>(), s.free_bytes);
    assert_eq!(free.len() as u64, s.free_blocks);
    assert_eq!(
        free.iter().map(|e| e.size).max().unwrap_or(0),
        s.largest_free
    );
    assert!(free.windows(2).all(|w| w[0].end() < w[1].offset));
}

#[test]
fn sizes_round_to_the_granule_and_tails_split() {
    let mut t = tlsf(0, MIB);
    let a = t.allocate(1, 1).unwrap();
    let b = t.allocate(257, 1).unwrap();
    assert_eq!(a.extent(), Extent::new(0, 1));
    assert_eq!(b.offset, 256);
    let s = t.stats();
    assert_eq!(s.padding_bytes, 255 + 255);
    assert_eq!(t.free_extents(), [Extent::new(768, MIB - 768)]);
    assert_sound(&t);
}

#[test]
fn large_alignments_split_off_the_leading_gap() {
    for align in [4 * KIB, 2 * MIB, GIB] {
        let mut t = tlsf(0, 4 * GIB);
        let small = t.allocate(100, 1).unwrap();
        let big = t.allocate(MIB, align).unwrap();
        assert_eq!(big.offset, align, "align {align}");
        assert_eq!(
            t.free_extents(),
            [
                Extent::new(256, align - 256),
                Extent::new(align + MIB, 4 * GIB - align - MIB)
            ]
        );
        assert_sound(&t);
        t.free(small).unwrap();
        t.free(big).unwrap();
        assert_eq!(t.free_extents(), [Extent::new(0, 4 * GIB)]);
        assert_sound(&t);
    }
}

#[test]
fn an_unaligned_region_keeps_slivers_as_padding() {
    let mut t = tlsf(100, 10 * KIB);
    let a = t.allocate(1000, 256).unwrap();
    assert_eq!(a.offset, 256);
    // [100, 256) is too small to be a block of its own.
    assert_eq!(t.stats().padding_bytes, 156 + 24);
    // The region's end is not granule-aligned: the request still fills it.
    let b = t.allocate(100 + 10 * KIB - 1280, 1).unwrap();
    assert_eq!(b.offset, 1280);
    assert_eq!(t.stats().free_bytes, 0);
    assert_sound(&t);
    t.free(a).unwrap();
    t.free(b).unwrap();
    assert_eq!(t.free_extents(), [Extent::new(100, 10 * KIB)]);
    assert_sound(&t);
}

#[test]
fn the_widest_paddings_are_kept_exactly() {
    // A block is never left with a lead of a granule or more, nor a trail of
    // two: the node keeps them in small fields. Here both are as wide as
    // they get: 255 bytes before the allocation and 255 + 255 after it.
    let mut t = tlsf(1, 255 + 512 + 255);
    let a = t.allocate(257, 256).unwrap();
    assert_eq!(a.extent(), Extent::new(256, 257));
    let s = t.stats();
    assert_eq!((s.padding_bytes, s.free_bytes, s.top), (255 + 510, 0, 513));
    assert_sound(&t);
    let before = t.stats();
    assert!(t.free(Allocation { size: 256, ..a }).is_err());
    assert!(t.free(Allocation { offset: 1, ..a }).is_err());
    assert_eq!(t.stats(), before);
    t.free(a).unwrap();
    assert_eq!(t.free_extents(), [Extent::new(1, 1022)]);
    assert_sound(&t);
    // Rebuilt, a block keeps a sub-granule gap below it at the region's
    // start and one above it before the next block.
    let ids = t
        .rebuild(&[Extent::new(200, 100), Extent::new(500, 100)])
        .unwrap();
    assert_eq!(ids[0].extent(), Extent::new(200, 100));
    assert_eq!(t.stats().padding_bytes, 199 + 200);
    assert_eq!(t.free_extents(), [Extent::new(600, 423)]);
    assert_sound(&t);
    for id in ids {
        t.free(id).unwrap();
    }
    assert_eq!(t.free_extents(), [Extent::new(1, 1022)]);
    assert_sound(&t);
}

#[test]
fn free_coalesces_with_both_neighbours() {
    let mut t = tlsf(0, 4 * KIB);
    let a = t.allocate(KIB, 256).unwrap();
    let b = t.allocate(KIB, 256).unwrap();
    let c = t.allocate(KIB, 256).unwrap();
    let d = t.allocate(KIB, 256).unwrap();
    t.free(a).unwrap();
    t.free(c).unwrap();
    assert_eq!(t.stats().free_blocks, 2);
    t.free(b).unwrap();
    assert_eq!(t.free_extents(), [Extent::new(0, 3 * KIB)]);
    t.free(d).unwrap();
    assert_eq!(t.free_extents(), [Extent::new(0, 4 * KIB)]);
    assert_sound(&t);
}

#[test]
fn stale_double_and_forged_frees_change_nothing() {
    let mut t = tlsf(0, MIB);
    let a = t.allocate(KIB, 256).unwrap();
    let keep = t.allocate(KIB, 256).unwrap();
    t.free(a).unwrap();
    let unknown = Err(Error::UnknownAllocation { offset: a.offset });
    assert_eq!(t.free(a), unknown);
    // Same place and size, probably the same node: the old id is stale.
    let b = t.allocate(KIB, 256).unwrap();
    assert_eq!(b.extent(), a.extent());
    assert_eq!(t.free(a), unknown);
    let before = t.stats();
    for forged in [
        Allocation { size: 2 * KIB, ..b },
        Allocation { offset: 256, ..b },
        Allocation { id: b.id ^ 1, ..b },
        Allocation {
            id: u64::from(u32::MAX - 1),
            ..b
        },
    ] {
        assert!(t.free(forged).is_err(), "{forged:?}");
    }
    assert_eq!(t.stats(), before);
    t.free(b).unwrap();
    t.free(keep).unwrap();
    assert_sound(&t);
}

#[test]
fn a_node_whose_generations_run_out_is_retired_not_wrapped() {
    let mut t = tlsf(0, MIB);
    let keep = t.allocate(KIB, 256).unwrap();
    let first = t.allocate(KIB, 256).unwrap();
    t.free(first).unwrap();
    // The freed block's node is used again at the same place and size.
    let stale = t.allocate(KIB, 256).unwrap();
    let node = stale.id as u32;
    assert_eq!((first.id as u32, stale.extent()), (node, first.extent()));
    t.free(stale).unwrap();
    // Skip ahead 2^32 - 3 frees: the node's next generation is the last.
    t.nodes[node].generation = u32::MAX;
    let last = t.allocate(KIB, 256).unwrap();
    assert_eq!(last.id, u64::from(u32::MAX) << 32 | u64::from(node));
    t.free(last).unwrap();
    assert_sound(&t);
    // Cycle the same place and size through as many generations as `stale`
    // had: with wrapping generations its id would name a live block again.
    let mut live = t.allocate(KIB, 256).unwrap();
    for _ in 0..4 {
        assert_eq!(live.extent(), stale.extent());
        assert_ne!(live.id as u32, node, "the retired node came back");
        t.free(live).unwrap();
        live = t.allocate(KIB, 256).unwrap();
    }
    let before = t.stats();
    for old in [stale, last, first] {
        assert_eq!(
            t.free(old),
            Err(Error::UnknownAllocation { offset: old.offset })
        );
    }
    assert_eq!(t.stats(), before);
    assert_eq!(t.nodes[node].state, State::Retired);
    assert_sound(&t);
    t.free(live).unwrap();
    t.free(keep).unwrap();
    // A rebuild keeps the retired node out of use too.
    t.rebuild(&[Extent::new(0, KIB)]).unwrap();
    assert_eq!(t.nodes[node].state, State::Retired);
    assert_sound(&t);
}

#[test]
fn bad_requests_are_errors() {
    let mut t = tlsf(0, 64 * KIB);
    assert_eq!(t.allocate(0, 256), Err(Error::ZeroSize));
    assert!(matches!(
        t.allocate(1, 3),
        Err(Error::InvalidAlignment { .. })
    ));
    assert!(matches!(
        t.allocate(1, 2 * GIB),
        Err(Error::InvalidAlignment { .. })
    ));
    assert!(matches!(
        t.allocate(u64::MAX, 1),
        Err(Error::OutOfMemory { .. })
    ));
    let mut empty = Tlsf::new();
    assert_eq!(
        empty.allocate(1, 1),
        Err(Error::OutOfMemory {
            requested: 1,
            align: 1,
            free_bytes: 0,
            largest_free: 0
        })
    );
}

#[test]
fn out_of_memory_reports_free_bytes_and_largest_block() {
    let mut t = tlsf(0, 8 * KIB);
    let a = t.allocate(KIB, 256).unwrap();
    let _b = t.allocate(KIB, 256).unwrap();
    t.free(a).unwrap();
    assert_eq!(
        t.allocate(7 * KIB, 256),
        Err(Error::OutOfMemory {
            requested: 7 * KIB,
            align: 256,
            free_bytes: 7 * KIB,
            largest_free: 6 * KIB,
        })
    );
    assert_sound(&t);
}

#[test]
fn a_request_that_fits_only_a_lower_class_block_is_found() {
    // 17152 bytes is class (2, 1), whose blocks start at 16896 bytes; the
    // good-fit search rounds 17000 up to class (2, 2) and finds nothing.
    let mut t = tlsf(0, 17152);
    let a = t.allocate(17000, 256).unwrap();
    assert_eq!(a.offset, 0);
    t.free(a).unwrap();
    // Same for an alignment the block happens to satisfy.
    let mut t = tlsf(2 * MIB, 2 * MIB);
    let b = t.allocate(2 * MIB, 2 * MIB).unwrap();
    assert_eq!(b.offset, 2 * MIB);
    assert_sound(&t);
}

#[test]
fn regions_up_to_2_pow_48_bytes() {
    let size = 1u64 << 48;
    let mut t = tlsf(1 << 50, size);
    let a = t.allocate(size / 2, GIB).unwrap();
    let b = t.allocate(size / 2, GIB).unwrap();
    assert_eq!(b.offset, (1 << 50) + size / 2);
    assert!(t.allocate(1, 1).is_err());
    t.free(a).unwrap();
    t.free(b).unwrap();
    assert_eq!(t.stats().largest_free, size);
    assert_sound(&t);
}

#[test]
fn add_region_merges_across_seams_on_both_sides() {
    let mut t = tlsf(4 * KIB, 4 * KIB);
    let a = t.allocate(3 * KIB, 256).unwrap();
    // Above, touching: the free tail [7K, 8K) and the new space merge.
    t.add_region(8 * KIB, 4 * KIB).unwrap();
    assert_eq!(t.regions(), [Extent::new(4 * KIB, 8 * KIB)]);
    assert_eq!(t.free_extents(), [Extent::new(7 * KIB, 5 * KIB)]);
    // Below, touching a live block: stays its own free block.
    t.add_region(0, 4 * KIB).unwrap();
    assert_eq!(t.free_extents()[0], Extent::new(0, 4 * KIB));
    // Filling a hole between two regions merges all three.
    t.add_region(16 * KIB, 4 * KIB).unwrap();
    assert_eq!(t.regions().len(), 2);
    t.add_region(12 * KIB, 4 * KIB).unwrap();
    assert_eq!(t.regions(), [Extent::new(0, 20 * KIB)]);
    assert_eq!(
        t.free_extents(),
        [Extent::new(0, 4 * KIB), Extent::new(7 * KIB, 13 * KIB)]
    );
    assert_sound(&t);
    t.free(a).unwrap();
    assert_eq!(t.free_extents(), [Extent::new(0, 20 * KIB)]);
    // A separate region stays separate, and nothing links across the gap.
    t.add_region(64 * KIB, 4 * KIB).unwrap();
    assert_eq!(t.stats().free_blocks, 2);
    assert_eq!(
        t.add_region(KIB, KIB),
        Err(Error::RegionOverlap {
            offset: KIB,
            size: KIB
        })
    );
    assert_eq!(
        t.add_region(60 * KIB, 8 * KIB),
        Err(Error::RegionOverlap {
            offset: 60 * KIB,
            size: 8 * KIB
        })
    );
    assert_eq!(t.add_region(100 * KIB, 0), Err(Error::ZeroSize));
    assert_eq!(
        t.add_region(u64::MAX, 2),
        Err(Error::Overflow {
            offset: u64::MAX,
            size: 2
        })
    );
    assert_eq!(t.stats().managed_bytes, 24 * KIB);
    assert_sound(&t);
}

#[test]
fn release_tail_gives_back_the_free_end_of_the_highest_region() {
    let mut t = tlsf(0, 8 * KIB);
    t.add_region(64 * KIB, 8 * KIB).unwrap();
    // Equal blocks: the one listed last (the higher region's) goes first.
    let a = t.allocate(8 * KIB, 256).unwrap();
    let b = t.allocate(2 * KIB, 256).unwrap();
    assert_eq!((a.offset, b.offset), (64 * KIB, 0));
    assert_eq!(t.release_tail(0), None, "the top block is live");
    t.free(a).unwrap();
    assert_eq!(t.release_tail(0), Some(Extent::new(64 * KIB, 8 * KIB)));
    assert_eq!(t.regions(), [Extent::new(0, 8 * KIB)]);
    assert_sound(&t);
    assert_eq!(t.release_tail(7 * KIB), None);
    assert_eq!(t.release_tail(6 * KIB), Some(Extent::new(2 * KIB, 6 * KIB)));
    assert_eq!(t.regions(), [Extent::new(0, 2 * KIB)]);
    assert_sound(&t);
    t.free(b).unwrap();
    assert_eq!(t.release_tail(0), Some(Extent::new(0, 2 * KIB)));
    assert!(t.regions().is_empty());
    let s = t.stats();
    assert_eq!(
        s,
        Stats {
            high_water: 72 * KIB,
            ..Stats::default()
        }
    );
    assert_sound(&t);
    // Space can be added back afterwards.
    t.add_region(0, 4 * KIB).unwrap();
    assert_eq!(t.allocate(4 * KIB, 256).unwrap().offset, 0);
    assert_sound(&t);
}

#[test]
fn rebuild_lays_out_the_used_extents_and_invalidates_old_ids() {
    let mut t = tlsf(0, 16 * KIB);
    t.add_region(32 * KIB, 4 * KIB).unwrap();
    let old = t.allocate(KIB, 256).unwrap();
    let used = [
        Extent::new(100, 900),      // leading sliver [0, 100) is padding
        Extent::new(KIB, KIB),      // gap [1000, 1024) stays with the block below
        Extent::new(4 * KIB, 512),  // [2K, 4K) is free
        Extent::new(33 * KIB, 100), // second region
    ];
    let allocations = t.rebuild(&used).unwrap();
    assert_eq!(
        allocations.iter().map(|a| a.extent()).collect::<Vec<_>>(),
        used
    );
    assert_eq!(
        t.free_extents(),
        [
            Extent::new(2 * KIB, 2 * KIB),
            Extent::new(4 * KIB + 512, 12 * KIB - 512),
            Extent::new(32 * KIB, KIB),
            Extent::new(33 * KIB + 100, 3 * KIB - 100),
        ]
    );
    assert_eq!(t.stats().padding_bytes, 100 + 24);
    assert_eq!(t.stats().top, 33 * KIB + 100);
    assert_sound(&t);
    assert!(t.free(old).is_err(), "rebuild forgets old allocations");
    for a in allocations {
        t.free(a).unwrap();
    }
    assert_eq!(t.stats().free_blocks, 2);
    assert_sound(&t);
}

#[test]
fn rebuild_rejects_bad_layouts_and_changes_nothing() {
    let mut t = tlsf(0, 16 * KIB);
    let a = t.allocate(KIB, 256).unwrap();
    let before = t.stats();
    let bad: [&[Extent]; 5] = [
        &[Extent::new(0, 0)],
        &[Extent::new(2 * KIB, KIB), Extent::new(0, KIB)],
        &[Extent::new(0, KIB), Extent::new(KIB - 1, KIB)],
        &[Extent::new(15 * KIB, 2 * KIB)],
        &[Extent::new(u64::MAX, 2)],
    ];
    for used in bad {
        assert!(
            matches!(t.rebuild(used), Err(Error::InvalidLayout { .. })),
            "{used:?}"
        );
    }
    assert_eq!(t.stats(), before);
    t.free(a).unwrap();
    assert_sound(&t);
}

#[test]
fn stats_track_high_water_and_top() {
    let mut t = tlsf(0, MIB);
    let a = t.allocate(KIB, 256).unwrap();
    let b = t.allocate(KIB, 256).unwrap();
    t.free(b).unwrap();
    let s = t.stats();
    assert_eq!((s.high_water, s.top), (2 * KIB, KIB));
    t.free(a).unwrap();
    let s = t.stats();
    assert_eq!((s.high_water, s.top, s.live_blocks), (2 * KIB, 0, 0));
}

#[test]
fn node_table_is_reused_once_warm() {
    let mut t = Tlsf::with_capacity(64);
    t.add_region(0, MIB).unwrap();
    for _ in 0..1000 {
        let a = t.allocate(3 * KIB, 256).unwrap();
        let b = t.allocate(5 * KIB, 4 * KIB).unwrap();
        t.free(a).unwrap();
        t.free(b).unwrap();
    }
    assert!(t.nodes.len() <= 4, "node table grew to {}", t.nodes.len());
    assert_sound(&t);
}

/// A tiny deterministic generator; memcore has no test dependencies.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn align(&mut self) -> u64 {
        [1, 256, 256, 256, 4 * KIB, 64 * KIB, 2 * MIB][self.below(7) as usize]
    }
}

/// Whether some free extent holds `size` bytes at a multiple of `align`
/// (at least the granule, as TLSF places everything).
fn some_extent_holds(free: &[Extent], size: u64, align: u64) -> bool {
    let align = align.max(GRANULE);
    free.iter()
        .any(|e| align_up(e.offset, align).is_some_and(|at| at + size <= e.end()))
}

/// Tlsf never reports out-of-memory while one free block could hold the
/// request; and where Tlsf and FreeList have the same single free range,
/// they agree on whether a request fits.
#[test]
fn random_workload_agrees_with_the_free_list() {
    let mut agreements = 0;
    for seed in 1..=16u64 {
        let mut rng = XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let region = 4 * MIB;
        let mut tlsf = tlsf(0, region);
        let mut list = FreeList::new(Fit::First);
        list.add_region(0, region).unwrap();
        let mut live: Vec<(Allocation, Allocation)> = Vec::new();
        for step in 0..3000 {
            // Granule-multiple sizes hold the same bytes in both.
            let size = (1 + rng.below(256)) * GRANULE;
            let align = rng.align();
            if rng.below(100) < 55 {
                let got = (tlsf.allocate(size, align), list.allocate(size, align));
                match got {
                    (Ok(t), Ok(l)) => live.push((t, l)),
                    (Ok(t), Err(_)) => tlsf.free(t).unwrap(),
                    (Err(_), Ok(l)) => list.free(l).unwrap(),
                    (Err(_), Err(_)) => {}
                }
            } else if !live.is_empty() {
                // Mostly LIFO, so free space often becomes one range again.
                let k = if rng.below(4) == 0 {
                    rng.below(live.len() as u64) as usize
                } else {
                    live.len() - 1
                };
                let (t, l) = live.swap_remove(k);
                tlsf.free(t).unwrap();
                list.free(l).unwrap();
            }
            if step % 16 == 0 {
                assert_sound(&tlsf);
            }
            let probe = (1 + rng.below(4 * MIB / GRANULE)) * GRANULE - rng.below(GRANULE);
            let probe_align = rng.align();
            let free = tlsf.free_extents();
            let expected = some_extent_holds(&free, probe, probe_align);
            let got = tlsf.allocate(probe, probe_align);
            assert_eq!(
                got.is_ok(),
                expected,
                "seed {seed} step {step}: {probe} @ {probe_align} in {free:?}"
            );
            if let Ok(a) = got {
                tlsf.free(a).unwrap();
            }
            if free.len() == 1 && list.free_extents() == free {
                agreements += 1;
                let got = list.allocate(probe, probe_align.max(GRANULE));
                assert_eq!(got.is_ok(), expected, "free list disagrees");
                if let Ok(a) = got {
                    list.free(a).unwrap();
                }
            }
        }
        for (t, l) in live {
            tlsf.free(t).unwrap();
            list.free(l).unwrap();
        }
        assert_eq!(tlsf.free_extents(), [Extent::new(0, region)]);
        assert_sound(&tlsf);
    }
    assert!(
        agreements > 100,
        "only {agreements} single-range states compared"
    );
}

/// Arbitrary sizes and a second region: the structures stay sound.
#[test]
fn random_workload_keeps_the_structures_sound() {
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let mut t = tlsf(100, 3 * MIB);
    let mut live: Vec<Allocation> = Vec::new();
    for step in 0..4000 {
        if step == 1000 {
            t.add_region(100 + 3 * MIB, MIB).unwrap();
        }
        if step == 2000 {
            t.add_region(64 * MIB, MIB + 77).unwrap();
        }
        if step == 3000 {
            let mut used: Vec<Extent> = live.iter().map(|a| a.extent()).collect();
            used.sort();
            live = t.rebuild(&used).unwrap();
        }
        if rng.below(100) < 60 {
            let size = 1 + rng.below(64 * KIB);
            if let Ok(a) = t.allocate(size, rng.align()) {
                assert_eq!(a.offset % GRANULE, 0);
                live.push(a);
            }
        } else if !live.is_empty() {
            let k = rng.below(live.len() as u64) as usize;
            t.free(live.swap_remove(k)).unwrap();
        }
        if step % 8 == 0 {
            assert_sound(&t);
            let mut extents: Vec<Extent> = live.iter().map(|a| a.extent()).collect();
            extents.sort();
            assert!(extents.windows(2).all(|w| !w[0].overlaps(&w[1])));
        }
        if step % 500 == 499 {
            let _ = t.release_tail(0);
            assert_sound(&t);
        }
    }
}

#[test]
fn preferring_low_addresses_takes_the_lowest_of_equal_holes() {
    // Three equal holes between live separators, freed low to high, so the
    // most recently freed (the list's head) is the highest. The same holes
    // serve a good-fit request too (one from a class below theirs).
    for (request, default_pick) in [(4 * KIB, 2), (3 * KIB, 2)] {
        let mut placed = Vec::new();
        for mut t in [Tlsf::new(), Tlsf::preferring_low_addresses()] {
            t.add_region(0, MIB).unwrap();
            let mut holes = Vec::new();
            for _ in 0..3 {
                holes.push(t.allocate(4 * KIB, 256).unwrap());
                t.allocate(256, 256).unwrap();
            }
            let offsets: Vec<u64> = holes.iter().map(|hole| hole.offset).collect();
            for hole in holes {
                t.free(hole).unwrap();
            }
            placed.push((offsets, t.allocate(request, 256).unwrap().offset));
            assert_sound(&t);
        }
        let [(offsets, by_default), (_, low_first)] = [placed[0].clone(), placed[1].clone()];
        assert_eq!(by_default, offsets[default_pick], "request {request}");
        assert_eq!(low_first, offsets[0], "request {request}");
    }
}
