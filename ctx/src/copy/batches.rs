//! Grouping a compaction's moves into what the device can copy at once.
//!
//! Moves are executed in order, and a move may read bytes an earlier one wrote (a
//! sliding compaction is a chain of such moves). A run of consecutive moves can go to
//! the device together, in one launch of the `move_blocks` kernel, when the order
//! among them cannot matter: no move of the run writes a byte that another move of
//! the run reads or writes, and none overlaps itself. A run that forms a slide
//! (every move goes down, sources and destinations both ascend without overlapping)
//! goes in one launch of the `slide_blocks` kernel, which orders the moves inside the
//! launch, however they depend on each other and even if they overlap themselves.
//! Runs follow each other on one stream, which keeps every dependency between runs.
//! Any other move is copied alone, in the steps [`super::steps`] cuts.
//!
//! Grouping is greedy: from where the last run ended, the longest stretch that may go
//! together and the longest that forms a slide, up to the cap; the longer wins, a tie
//! going to the independent moves (their kernel never waits). Runs are found one at a
//! time, so the caller can queue the first while the next is still being worked out.
//! The relocations of a targeted compaction, whose destinations are free holes, are
//! all independent; a full compaction's slide is a slide, whatever its distances.
//!
//! Whether a stretch may go together is one sort of its byte ranges; the stretch is
//! grown by doubling and then narrowed by bisection (a stretch inside one that may go
//! together may too), so a run of `n` moves costs O(n log^2 n) comparisons and a
//! chain of dependent moves O(1) a move.

use memcore::moves::BlockMove;

/// What the device does for a stretch of the moves, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Batch {
    /// Two or more moves that may run at once.
    Together(Vec<BlockMove>),
    /// Moves that form a slide
    /// ([`is_slide`](memcore::moves::is_slide)): they
    /// depend on each other, and the `slide_blocks` kernel orders them inside
    /// one launch.
    Slide(Vec<BlockMove>),
    /// One move on its own; its ranges may overlap.
    Alone(BlockMove),
}

/// The batches of a list of moves, one at a time: see [`batches`].
#[derive(Debug)]
pub(crate) struct Batches {
    /// The moves left, moves of no bytes or onto themselves already dropped.
    rest: Vec<BlockMove>,
    /// Index of the first move not yet handed out.
    next: usize,
    /// Index of the first move at or after `next` that overlaps itself (or the end),
    /// once worked out; a stretch stops there.
    stop: usize,
    /// Whether the last batch was as long as the cap allows.
    full: bool,
    max_together: usize,
    /// Byte ranges (start, end) of the stretch being checked; kept to reuse its
    /// allocation.
    ranges: Vec<(u64, u64)>,
}

impl Batches {
    /// Whether the moves of `stretch`, none overlapping itself, touch no byte twice.
    /// (Two moves reading the same bytes would be harmless, but blocks of a plan
    /// never share bytes, so treating reads like writes costs nothing.)
    fn independent(ranges: &mut Vec<(u64, u64)>, stretch: &[BlockMove]) -> bool {
        ranges.clear();
        for m in stretch {
            ranges.push((m.src, m.src.saturating_add(m.len)));
            ranges.push((m.dst, m.dst.saturating_add(m.len)));
        }
        ranges.sort_unstable();
        ranges.windows(2).all(|w| w[0].1 <= w[1].0)
    }
}

impl Iterator for Batches {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let first = *self.rest.get(self.next)?;
        let slide = self.slide_len();
        if first.overlaps_itself() {
            self.next += slide.max(1);
            return Some(match slide {
                0 => Batch::Alone(first),
                len => Batch::Slide(self.rest[self.next - len..self.next].to_vec()),
            });
        }
        // The stretch may reach the next self-overlapping move, and the cap.
        if self.stop <= self.next {
            self.stop = self.next
                + self.rest[self.next..]
                    .iter()
                    .position(BlockMove::overlaps_itself)
                    .unwrap_or(self.rest.len() - self.next);
        }
        let tail = &self.rest[self.next..self.stop];
        let limit = tail.len().min(self.max_together.max(1));
        let (mut good, mut bad) = (1, limit + 1);
        // After a full batch the next is likely full too (relocations into holes):
        // one check settles it.
        if self.full && limit > 1 {
            if Self::independent(&mut self.ranges, &tail[..limit]) {
                good = limit;
            } else {
                bad = limit;
            }
        }
        // Double while the stretch may go together, then bisect between the last
        // length that may and the first that may not.
        let mut len = 2;
        while len < bad && good < limit {
            if Self::independent(&mut self.ranges, &tail[..len]) {
                good = len;
                len *= 2;
            } else {
                bad = len;
                break;
            }
        }
        if good < limit && bad == limit + 1 {
            // Doubling jumped over the limit: try it.
            if Self::independent(&mut self.ranges, &tail[..limit]) {
                good = limit;
            } else {
                bad = limit;
            }
        }
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            if Self::independent(&mut self.ranges, &tail[..mid]) {
                good = mid;
            } else {
                bad = mid;
            }
        }
        // A slide takes more moves in one launch than a run of independent
        // ones when the moves depend on each other.
        if slide > good {
            let run = self.rest[self.next..self.next + slide].to_vec();
            self.full = false;
            self.next += slide;
            return Some(Batch::Slide(run));
        }
        let batch = if good == 1 {
            Batch::Alone(first)
        } else {
            Batch::Together(tail[..good].to_vec())
        };
        self.full = good == self.max_together;
        self.next += good;
        Some(batch)
    }
}

impl Batches {
    /// How many moves from `next` on form a slide, at most the cap; 0 if the
    /// first cannot be in one.
    fn slide_len(&self) -> usize {
        let tail = &self.rest[self.next..];
        if !tail.first().is_some_and(BlockMove::may_slide) {
            return 0;
        }
        let cap = self.max_together.max(1).min(tail.len());
        1 + tail[..cap]
            .windows(2)
            .take_while(|w| w[0].slides_on_to(&w[1]))
            .count()
    }
}

/// `moves` as batches of at most `max_together` moves, in an order that copies what
/// executing the moves one by one would. Moves of no bytes, or onto themselves, are
/// dropped.
pub(crate) fn batches(moves: &[BlockMove], max_together: usize) -> Batches {
    Batches {
        rest: moves
            .iter()
            .filter(|m| m.len > 0 && m.src != m.dst)
            .copied()
            .collect(),
        next: 0,
        stop: 0,
        full: true,
        max_together,
        ranges: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use memcore::moves::is_slide;

    use super::*;

    fn mv(src: u64, dst: u64, len: u64) -> BlockMove {
        BlockMove { src, dst, len }
    }

    fn all(moves: &[BlockMove], max: usize) -> Vec<Batch> {
        batches(moves, max).collect()
    }

    /// Executes batches on host memory the way the device would. A `Together` batch
    /// must hold no move that overlaps itself and no two moves touching the same byte
    /// (so any interleaving of them gives one result); it is run reading every source
    /// before writing any destination.
    fn run(memory: &mut [u8], batches: &[Batch]) {
        for batch in batches {
            match batch {
                Batch::Alone(m) => {
                    let (s, d, l) = (m.src as usize, m.dst as usize, m.len as usize);
                    memory.copy_within(s..s + l, d);
                }
                Batch::Slide(moves) => {
                    assert!(is_slide(moves), "{batch:?}");
                    // The kernel's promise: what memmove one by one does.
                    sequential(memory, moves);
                }
                Batch::Together(moves) => {
                    assert!(moves.len() >= 2, "{batch:?}");
                    assert!(moves.iter().all(|m| !m.overlaps_itself()), "{batch:?}");
                    let mut ranges: Vec<(u64, u64)> = moves
                        .iter()
                        .flat_map(|m| [(m.src, m.src + m.len), (m.dst, m.dst + m.len)])
                        .collect();
                    ranges.sort_unstable();
                    assert!(
                        ranges.windows(2).all(|w| w[0].1 <= w[1].0),
                        "moves of one batch share bytes: {batch:?}"
                    );
                    let read: Vec<Vec<u8>> = moves
                        .iter()
                        .map(|m| memory[m.src as usize..(m.src + m.len) as usize].to_vec())
                        .collect();
                    for (m, bytes) in moves.iter().zip(read) {
                        memory[m.dst as usize..(m.dst + m.len) as usize].copy_from_slice(&bytes);
                    }
                }
            }
        }
    }

    /// Every batch is the one the rule asks for: from where the last ended, the
    /// longest stretch of independent moves (up to the cap, up to a move that
    /// overlaps itself) and the longest slide, each found here by brute force; the
    /// slide if it is longer, or if the first move overlaps itself.
    fn assert_runs_are_longest(moves: &[BlockMove], found: &[Batch], max: usize) {
        let kept: Vec<BlockMove> = moves
            .iter()
            .filter(|m| m.len > 0 && m.src != m.dst)
            .copied()
            .collect();
        let mut ranges = Vec::new();
        let mut at = 0;
        for batch in found {
            let rest = &kept[at..];
            let cap = max.min(rest.len());
            let slide = (1..=cap).rev().find(|&n| is_slide(&rest[..n])).unwrap_or(0);
            let together = if rest[0].overlaps_itself() {
                1
            } else {
                (1..=cap)
                    .rev()
                    .find(|&n| {
                        rest[..n].iter().all(|m| !m.overlaps_itself())
                            && Batches::independent(&mut ranges, &rest[..n])
                    })
                    .unwrap_or(1)
            };
            let want_slide = slide > together || (rest[0].overlaps_itself() && slide > 0);
            let (taken, is_slide) = match batch {
                Batch::Together(run) => (run.clone(), false),
                Batch::Slide(run) => (run.clone(), true),
                Batch::Alone(m) => (vec![*m], false),
            };
            assert_eq!(
                is_slide, want_slide,
                "{batch:?} (slide {slide}, together {together})"
            );
            let want_len = if want_slide { slide } else { together };
            assert_eq!(taken.len(), want_len, "{batch:?}");
            assert_eq!(rest[..taken.len()], taken[..], "{found:?}");
            at += taken.len();
        }
        assert_eq!(at, kept.len());
    }

    /// Batches of `moves` (at most `max` a batch) copy on `original` what the
    /// moves copy one by one, and are the ones the rule asks for.
    fn check_case(original: &[u8], moves: &[BlockMove], max: usize, case: u32) {
        let mut expected = original.to_vec();
        sequential(&mut expected, moves);
        let mut actual = original.to_vec();
        let found = all(moves, max);
        run(&mut actual, &found);
        assert_eq!(actual, expected, "case {case}: {moves:?} max {max}");
        assert_runs_are_longest(moves, &found, max);
    }

    fn sequential(memory: &mut [u8], moves: &[BlockMove]) {
        for m in moves {
            let (s, d, l) = (m.src as usize, m.dst as usize, m.len as usize);
            memory.copy_within(s..s + l, d);
        }
    }

    /// A small deterministic generator for move lists.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }
    }

    #[test]
    fn batches_copy_what_the_moves_copy_one_by_one() {
        const SIZE: u64 = 256;
        let original: Vec<u8> = (0..SIZE)
            .map(|b| (b as u8).wrapping_mul(31) ^ 0xa5)
            .collect();
        let mut rng = Lcg(7);
        for case in 0..3000 {
            let count = 1 + rng.below(12);
            let moves: Vec<BlockMove> = (0..count)
                .map(|_| {
                    let len = rng.below(40);
                    mv(rng.below(SIZE - len), rng.below(SIZE - len), len)
                })
                .collect();
            let max = 1 + rng.below(5) as usize;
            check_case(&original, &moves, max, case);
        }
    }

    #[test]
    fn slides_and_mixed_moves_copy_what_the_moves_copy_one_by_one() {
        // Slides of 16-byte-aligned blocks with random lengths and holes, some of
        // their moves replaced by random ones, so runs of every kind meet.
        const SIZE: u64 = 4096;
        let original: Vec<u8> = (0..SIZE)
            .map(|b| (b as u8).wrapping_mul(29) ^ 0x3c)
            .collect();
        let mut rng = Lcg(11);
        for case in 0..2000 {
            let mut moves = Vec::new();
            let (mut src, mut dst) = (16 * (1 + rng.below(8)), 0);
            while moves.len() < 24 {
                let len = 16 * (1 + rng.below(12)) - 8 * rng.below(2);
                if src + len > SIZE {
                    break;
                }
                if rng.below(6) == 0 {
                    let l = rng.below(64);
                    moves.push(mv(rng.below(SIZE - l), rng.below(SIZE - l), l));
                } else {
                    moves.push(mv(src, dst, len));
                }
                dst = (dst + len).next_multiple_of(16);
                src = (src + len).next_multiple_of(16) + 16 * rng.below(4);
            }
            let max = 1 + rng.below(10) as usize;
            check_case(&original, &moves, max, case);
        }
    }

    #[test]
    fn aligned_slides_go_in_one_launch() {
        // Each block slides onto the last one's old place: a chain, one slide.
        let chain: Vec<BlockMove> = (1..6).map(|k| mv(256 * k, 256 * (k - 1), 256)).collect();
        assert_eq!(all(&chain, 128), [Batch::Slide(chain.clone())]);
        assert_eq!(all(&chain, 2).len(), 3);
        // One block sliding over itself is a slide of one.
        assert_eq!(
            all(&[mv(64, 48, 32)], 128),
            [Batch::Slide(vec![mv(64, 48, 32)])]
        );
        // Holes spread over the pool: a slide longer than any independent run.
        let spread: Vec<BlockMove> = (0..64).map(|k| mv(512 * k + 256, 256 * k, 256)).collect();
        assert_eq!(all(&spread, 128), [Batch::Slide(spread.clone())]);
    }

    #[test]
    fn a_spread_slide_gathers_doubling_runs() {
        // 64 blocks of 100 bytes with a 100-byte hole before each: block k moves from
        // 200k + 100 to 100k. Not 16-byte aligned, so no slide.
        let moves: Vec<BlockMove> = (0..64).map(|k| mv(200 * k + 100, 100 * k, 100)).collect();
        let sizes: Vec<usize> = all(&moves, 128)
            .iter()
            .map(|b| match b {
                Batch::Together(m) | Batch::Slide(m) => m.len(),
                Batch::Alone(_) => 1,
            })
            .collect();
        assert_eq!(sizes, [1, 2, 4, 8, 16, 32, 1]);
        let capped = all(&moves, 10);
        assert!(capped.iter().all(|b| match b {
            Batch::Together(m) | Batch::Slide(m) => m.len() <= 10,
            Batch::Alone(_) => true,
        }));
    }

    #[test]
    fn relocations_into_holes_go_together() {
        let moves: Vec<BlockMove> = (0..300)
            .map(|k| mv(1000 * k, 1_000_000 + 1000 * k, 600))
            .collect();
        let b = all(&moves, 128);
        assert_eq!(b.len(), 3);
        assert!(matches!(&b[0], Batch::Together(m) if m.len() == 128));
        assert!(matches!(&b[2], Batch::Together(m) if m.len() == 44));
    }

    #[test]
    fn unaligned_chains_and_self_overlaps_stay_apart() {
        // Each block slides onto the last one's old place: a dependency chain, at
        // offsets the slide kernel does not take.
        let chain: Vec<BlockMove> = (1..6).map(|k| mv(100 * k, 100 * (k - 1), 100)).collect();
        assert!(
            all(&chain, 128)
                .iter()
                .all(|b| matches!(b, Batch::Alone(_)))
        );
        let overlapping = [mv(0, 1000, 10), mv(50, 40, 20), mv(2000, 3000, 10)];
        assert_eq!(
            all(&overlapping, 128),
            [
                Batch::Alone(overlapping[0]),
                Batch::Alone(overlapping[1]),
                Batch::Alone(overlapping[2]),
            ]
        );
        assert!(all(&[mv(5, 5, 10), mv(1, 2, 0)], 128).is_empty());
    }
}
