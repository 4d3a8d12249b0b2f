//! Grouping a compaction's moves into what the device can copy at once.
//!
//! Moves are executed in order, and a move may read bytes an earlier one wrote (a
//! sliding compaction is a chain of such moves). A run of consecutive moves can go to
//! the device together, in one launch of the `move_blocks` kernel, when the order
//! among them cannot matter: no move of the run writes a byte that another move of
//! the run reads or writes, and none overlaps itself. Runs follow each other on one
//! stream, which keeps every dependency between runs. A move that overlaps itself is
//! copied alone, in the pieces [`super::copy_plan`] cuts.
//!
//! Grouping is greedy: a run grows until the next move conflicts with it or the run
//! is full. In a full slide with holes spread over the pool this still gathers long
//! runs (a block's destination overlaps the source of a block about half as far into
//! the pool, so run lengths double), and the relocations of a targeted compaction,
//! whose destinations are free holes, are all independent.

use std::collections::BTreeMap;

use crate::device::CopyMove;

/// What the device does for a stretch of the moves, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Batch {
    /// Two or more moves that may run at once.
    Together(Vec<CopyMove>),
    /// One move on its own; its ranges may overlap.
    Alone(CopyMove),
}

/// Whether a move's source and destination share a byte.
fn overlaps_itself(m: &CopyMove) -> bool {
    m.src.abs_diff(m.dst) < m.len
}

/// Byte ranges the moves of a run read or write, start -> end; disjoint.
#[derive(Debug, Default)]
struct Touched(BTreeMap<u64, u64>);

impl Touched {
    fn hits(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        self.0
            .range(..end)
            .next_back()
            .is_some_and(|(_, &touched_end)| touched_end > start)
    }

    /// Whether `m` may join the run: neither of its ranges meets a range of the run.
    /// (Two moves reading the same bytes would be harmless, but blocks of a plan never
    /// share bytes, so treating reads like writes costs nothing.)
    fn admits(&self, m: &CopyMove) -> bool {
        !self.hits(m.src, m.len) && !self.hits(m.dst, m.len)
    }

    fn add(&mut self, m: &CopyMove) {
        self.0.insert(m.src, m.src.saturating_add(m.len));
        self.0.insert(m.dst, m.dst.saturating_add(m.len));
    }
}

/// `moves` as batches of at most `max_together` moves, in an order that copies what
/// executing the moves one by one would. Moves of no bytes, or onto themselves, are
/// dropped.
pub(crate) fn batches(moves: &[CopyMove], max_together: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut run: Vec<CopyMove> = Vec::new();
    let mut touched = Touched::default();
    let flush = |run: &mut Vec<CopyMove>, touched: &mut Touched, out: &mut Vec<Batch>| {
        match run.len() {
            0 => {}
            1 => out.push(Batch::Alone(run[0])),
            _ => out.push(Batch::Together(std::mem::take(run))),
        }
        run.clear();
        touched.0.clear();
    };
    for m in moves.iter().filter(|m| m.len > 0 && m.src != m.dst) {
        if overlaps_itself(m) {
            flush(&mut run, &mut touched, &mut out);
            out.push(Batch::Alone(*m));
            continue;
        }
        if run.len() >= max_together.max(1) || !touched.admits(m) {
            flush(&mut run, &mut touched, &mut out);
        }
        touched.add(m);
        run.push(*m);
    }
    flush(&mut run, &mut touched, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(src: u64, dst: u64, len: u64) -> CopyMove {
        CopyMove { src, dst, len }
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
                Batch::Together(moves) => {
                    assert!(moves.len() >= 2, "{batch:?}");
                    assert!(moves.iter().all(|m| !overlaps_itself(m)), "{batch:?}");
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

    fn sequential(memory: &mut [u8], moves: &[CopyMove]) {
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
            let moves: Vec<CopyMove> = (0..count)
                .map(|_| {
                    let len = rng.below(40);
                    mv(rng.below(SIZE - len), rng.below(SIZE - len), len)
                })
                .collect();
            let max = 1 + rng.below(5) as usize;
            let mut expected = original.clone();
            sequential(&mut expected, &moves);
            let mut actual = original.clone();
            run(&mut actual, &batches(&moves, max));
            assert_eq!(actual, expected, "case {case}: {moves:?} max {max}");
        }
    }

    #[test]
    fn a_spread_slide_gathers_doubling_runs() {
        // 64 blocks of 100 bytes with a 100-byte hole before each: block k moves from
        // 200k + 100 to 100k.
        let moves: Vec<CopyMove> = (0..64).map(|k| mv(200 * k + 100, 100 * k, 100)).collect();
        let sizes: Vec<usize> = batches(&moves, 128)
            .iter()
            .map(|b| match b {
                Batch::Together(m) => m.len(),
                Batch::Alone(_) => 1,
            })
            .collect();
        assert_eq!(sizes, [1, 2, 4, 8, 16, 32, 1]);
        let capped = batches(&moves, 10);
        assert!(capped.iter().all(|b| match b {
            Batch::Together(m) => m.len() <= 10,
            Batch::Alone(_) => true,
        }));
    }

    #[test]
    fn relocations_into_holes_go_together() {
        let moves: Vec<CopyMove> = (0..300)
            .map(|k| mv(1000 * k, 1_000_000 + 1000 * k, 600))
            .collect();
        let b = batches(&moves, 128);
        assert_eq!(b.len(), 3);
        assert!(matches!(&b[0], Batch::Together(m) if m.len() == 128));
        assert!(matches!(&b[2], Batch::Together(m) if m.len() == 44));
    }

    #[test]
    fn a_chain_and_self_overlaps_stay_apart() {
        // Each block slides onto the last one's old place: a dependency chain.
        let chain: Vec<CopyMove> = (1..6).map(|k| mv(100 * k, 100 * (k - 1), 100)).collect();
        assert!(
            batches(&chain, 128)
                .iter()
                .all(|b| matches!(b, Batch::Alone(_)))
        );
        let overlapping = [mv(0, 1000, 10), mv(50, 40, 20), mv(2000, 3000, 10)];
        assert_eq!(
            batches(&overlapping, 128),
            [
                Batch::Alone(overlapping[0]),
                Batch::Alone(overlapping[1]),
                Batch::Alone(overlapping[2]),
            ]
        );
        assert!(batches(&[mv(5, 5, 10), mv(1, 2, 0)], 128).is_empty());
    }
}
