//! Full compaction plans: the two phases on hand-made layouts, and the
//! plan's promises on random ones.

use super::*;
use crate::compact::planning_align;
use crate::compact::testing::{block, dsts};
use crate::{Handle, align_up};
use alloc::vec;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// `count` blocks of `size` bytes back to back from 0, 256-aligned; block
/// `i` has slot `i`.
fn equal_blocks(count: u32, size: u64) -> Vec<Placed> {
    (0..count)
        .map(|i| block(i, u64::from(i) * size, size, 256, false))
        .collect()
}

#[test]
fn one_hole_at_the_bottom_takes_the_top_block() {
    let mut blocks = equal_blocks(1024, 2 * MIB);
    let region = Extent::new(0, 1024 * 2 * MIB);
    blocks.remove(0);
    let moves = pack(region, &blocks);
    assert_eq!(
        moves,
        [Move::new(blocks[1022].handle, 1023 * 2 * MIB, 0, 2 * MIB)]
    );
    assert!(!moves[0].overlapping);
    // The slide it replaces: 1023 moves, each onto the last one's old place.
    let plain = slide(region, &blocks);
    assert_eq!((plain.len(), bytes(&plain)), (1023, 2046 * MIB));
}

#[test]
fn every_other_block_freed_fills_holes_independently() {
    let blocks: Vec<Placed> = equal_blocks(32, KIB)
        .into_iter()
        .filter(|b| b.handle.slot % 2 == 1)
        .collect();
    let region = Extent::new(0, 32 * KIB);
    let moves = pack(region, &blocks);
    // Hole 2i takes block 31 - 2i while that block lies above it.
    let expected: Vec<(u32, u64)> = (0..8)
        .map(|i| (31 - 2 * i, u64::from(2 * i) * KIB))
        .collect();
    assert_eq!(dsts(&moves), expected);
    for (i, a) in moves.iter().enumerate() {
        for (j, b) in moves.iter().enumerate() {
            let dst = Extent::new(a.dst, a.len);
            assert!(i == j || !dst.overlaps(&Extent::new(b.src, b.len)));
        }
        assert!(!a.overlapping);
    }
    assert_eq!(2 * bytes(&moves), bytes(&slide(region, &blocks)));
}

#[test]
fn hole_that_cannot_be_filled_exactly_leaves_the_slide() {
    let region = Extent::new(0, 1000);
    // The top block fills [0, 100) of the 150-byte hole; the next is too big
    // for the 50 bytes left.
    let too_big = [
        block(0, 150, 100, 1, false),
        block(1, 250, 100, 1, false),
        block(2, 350, 100, 1, false),
    ];
    // Both blocks fit in the 250-byte hole, but leave 50 bytes of it free.
    let too_few = [block(0, 250, 100, 1, false), block(1, 350, 100, 1, false)];
    for blocks in [&too_big[..], &too_few[..]] {
        assert_eq!(fill_from_top(region, blocks), (Vec::new(), 0));
        assert_eq!(pack(region, blocks), slide(region, blocks));
    }
    assert_eq!(dsts(&pack(region, &too_big)), [(0, 0), (1, 100), (2, 200)]);
}

#[test]
fn pinned_blocks_bound_holes_and_stay() {
    let region = Extent::new(0, 2000);
    let blocks = [
        // hole [0, 200)
        block(0, 200, 100, 1, true),
        block(1, 300, 100, 1, false),
        // hole [400, 500)
        block(2, 500, 100, 1, false),
        block(3, 600, 100, 1, true),
        block(4, 700, 100, 1, false),
        block(5, 800, 100, 1, false),
        block(6, 900, 100, 1, false),
    ];
    let moves = pack(region, &blocks);
    // Two top blocks fill the first hole, the next the second; block 2 is
    // not above the trailing hole, which ends phase 1. The rest is packed.
    assert_eq!(dsts(&moves), [(6, 0), (5, 100), (4, 400)]);
    assert!(moves.iter().all(|m| !blocks[m.handle.slot as usize].pinned));
    let plain = slide(region, &blocks);
    assert_eq!(
        dsts(&plain),
        [(1, 0), (2, 100), (4, 300), (5, 400), (6, 500)]
    );
    assert!(slide(region, &moved(&blocks, &moves)).is_empty());
}

#[test]
fn misaligned_fill_is_rolled_back() {
    let region = Extent::new(0, 8 * KIB);
    // The hole [0, 512) takes the top block at 0 and the 4-aligned one at
    // 256, but the next one needs a 256-byte boundary at 356.
    let blocks = [
        block(0, 512, 256, 256, false),
        block(1, 1000, 100, 4, false),
        block(2, 1280, 256, 256, false),
    ];
    assert_eq!(fill_from_top(region, &blocks), (Vec::new(), 0));
    assert_eq!(dsts(&pack(region, &blocks)), [(0, 0), (1, 256), (2, 512)]);
}

#[test]
fn hole_rolled_back_after_a_filled_one_is_slid_into() {
    let region = Extent::new(0, 8 * KIB);
    let blocks = [
        // hole [0, 256): the top block fills it
        block(0, 256, 256, 256, false),
        // hole [512, 1028): blocks 3 and 2 would go to 512 and 768, but
        // block 0 is not above the hole, so the hole keeps nothing
        block(1, 1028, 100, 4, false),
        block(2, 1280, 256, 256, false),
        block(3, 1536, 256, 256, false),
    ];
    let (filled, packed_end) = fill_from_top(region, &blocks);
    assert_eq!((dsts(&filled), packed_end), ([(3, 0)].to_vec(), 256));
    let moves = pack(region, &blocks);
    assert_eq!(dsts(&moves), [(3, 0), (1, 512), (2, 768)]);
    assert!(bytes(&moves) < bytes(&slide(region, &blocks)));
}

#[test]
fn filling_that_costs_more_than_sliding_gives_way_to_the_slide() {
    // The layout of the module doc.
    let region = Extent::new(0, 4 * KIB);
    let blocks = [
        block(0, 768, 1, 256, false),
        block(1, 1024, 1024, 1024, false),
        block(2, 2048, 768, 1024, false),
    ];
    let (filled, _) = fill_from_top(region, &blocks);
    assert_eq!(dsts(&filled), [(2, 0)]);
    let plain = slide(region, &blocks);
    assert_eq!(dsts(&plain), [(0, 0)]);
    assert_eq!(pack(region, &blocks), plain);
}

#[test]
fn unsound_layout_moves_nothing() {
    // Blocks 1 and 2 lie inside block 0, which cannot come from a heap. The
    // hole [0, 50) could take block 2, but the slide finds the layout does
    // not fit the region.
    let region = Extent::new(0, 300);
    let blocks = [
        block(0, 50, 250, 1, false),
        block(1, 200, 50, 1, false),
        block(2, 250, 50, 1, false),
    ];
    assert_eq!(dsts(&fill_from_top(region, &blocks).0), [(2, 0)]);
    assert!(pack(region, &blocks).is_empty());
}

/// xorshift64*: deterministic, and enough to spread layouts about.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn pick(&mut self, from: &[u64]) -> u64 {
        from[self.below(from.len() as u64) as usize]
    }
}

/// A region packed with blocks as an allocator would place them, then with
/// about a third freed and a tenth of the rest pinned. Sizes come mostly
/// from a few round figures, so holes often take exact fills.
fn random_layout(rng: &mut Rng) -> (Extent, Vec<Placed>) {
    let region = Extent::new(0, 32 * KIB);
    let mut blocks = Vec::new();
    let mut cursor = 0;
    for slot in 0.. {
        let align = rng.pick(&[1, 4, 256, 256, 256, 512, 1024]);
        let size = match rng.below(4) {
            0 => 1 + rng.below(700),
            _ => rng.pick(&[256, 256, 512, 768, 1024]),
        };
        let offset = align_up(cursor + rng.pick(&[0, 0, 0, 4, 100]), align).unwrap();
        if offset + size > region.end() {
            break;
        }
        cursor = offset + size;
        if rng.below(3) == 0 {
            continue;
        }
        let align = planning_align(offset, align);
        blocks.push(block(slot, offset, size, align, rng.below(10) == 0));
    }
    (region, blocks)
}

/// Run `moves` on bytes labelled with their block's slot (0 for free),
/// as memmoves in order, checking each copies bytes still its block's, and
/// that every block ends up whole where the plan puts it.
fn execute(region: Extent, blocks: &[Placed], moves: &[Move]) {
    let label = |b: &Placed| b.handle.slot + 1;
    let mut memory = vec![0u32; region.size as usize];
    for b in blocks {
        memory[b.offset as usize..b.extent().end() as usize].fill(label(b));
    }
    for m in moves {
        let src = m.src as usize..(m.src + m.len) as usize;
        assert!(
            memory[src.clone()].iter().all(|&l| l == m.handle.slot + 1),
            "{m:?} copies bytes that are not its block's any more"
        );
        memory.copy_within(src, m.dst as usize);
    }
    for b in moved(blocks, moves) {
        let at = b.offset as usize..b.extent().end() as usize;
        assert!(
            memory[at].iter().all(|&l| l == label(&b)),
            "{b:?} lost bytes"
        );
    }
}

#[test]
fn random_layouts_keep_every_promise() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut fewer_bytes = 0;
    for _ in 0..400 {
        let (region, blocks) = random_layout(&mut rng);
        let moves = pack(region, &blocks);
        let plain = slide(region, &blocks);
        assert!(bytes(&moves) <= bytes(&plain), "{blocks:?}");
        fewer_bytes += usize::from(bytes(&moves) < bytes(&plain));
        let mut handles: Vec<Handle> = moves.iter().map(|m| m.handle).collect();
        handles.sort();
        handles.dedup();
        assert_eq!(handles.len(), moves.len(), "a block moves twice");
        for m in &moves {
            let b = blocks.iter().find(|b| b.handle == m.handle).unwrap();
            assert!(!b.pinned && m.dst % b.align == 0 && m.dst + m.len <= region.end());
        }
        execute(region, &blocks, &moves);
        let after = moved(&blocks, &moves);
        assert!(
            pack(region, &after).is_empty(),
            "not a fixpoint: {blocks:?}"
        );
    }
    // The generator does reach layouts where filling pays.
    assert!(fewer_bytes > 20, "only {fewer_bytes} layouts filled holes");
}
