//! Splitting a device copy whose ranges overlap into steps the driver can do.
//!
//! `cuMemcpyDtoD` is undefined when source and destination overlap, but a compaction
//! slides blocks over themselves. Copying in pieces no longer than the distance
//! between the ranges, in the direction that reads each byte before it is overwritten
//! (ascending when moving down, descending when moving up), gives memmove semantics.
//! When the distance is small next to the length (a 1 GiB block slid down by 256 bytes)
//! that would take millions of calls, so pieces then bounce through a scratch buffer:
//! two copies per piece, but pieces as large as the scratch.

/// The scratch buffer a backend offers overlapping copies to bounce
/// through, bytes: a piece this large takes far longer to copy than one
/// driver call costs to issue (BENCHMARKS.md, "Compaction bandwidth").
pub(crate) const SCRATCH_BYTES: u64 = 16 << 20;

/// One driver copy (or a pair of them through the scratch buffer). Addresses are
/// absolute device addresses, lengths bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyStep {
    /// `src` to `dst` in one copy; the two ranges do not overlap.
    Direct { src: u64, dst: u64, len: u64 },
    /// `src` to the scratch buffer, then the scratch buffer to `dst`; `len` is at most
    /// the scratch size.
    ViaScratch { src: u64, dst: u64, len: u64 },
}

/// Steps that copy `len` bytes from `src` to `dst` with memmove semantics when issued in
/// order on one stream. `scratch_bytes` is the scratch buffer on offer (0: none).
pub(crate) fn steps(src: u64, dst: u64, len: u64, scratch_bytes: u64) -> Vec<CopyStep> {
    if len == 0 || src == dst {
        return Vec::new();
    }
    let distance = src.abs_diff(dst);
    if distance >= len {
        return vec![CopyStep::Direct { src, dst, len }];
    }
    // Direct pieces of `distance` bytes need no more calls than scratch pieces (two
    // calls each) once the distance reaches half the scratch, and move half the bytes.
    let through_scratch = distance.saturating_mul(2) < scratch_bytes;
    let piece = if through_scratch {
        scratch_bytes
    } else {
        distance
    };
    let step = |offset: u64, piece_len: u64| {
        let (src, dst) = (src + offset, dst + offset);
        if through_scratch {
            CopyStep::ViaScratch {
                src,
                dst,
                len: piece_len,
            }
        } else {
            CopyStep::Direct {
                src,
                dst,
                len: piece_len,
            }
        }
    };
    let mut steps = Vec::with_capacity(usize::try_from(len.div_ceil(piece)).unwrap_or(0));
    if dst < src {
        let mut offset = 0;
        while offset < len {
            let piece_len = piece.min(len - offset);
            steps.push(step(offset, piece_len));
            offset += piece_len;
        }
    } else {
        let mut end = len;
        while end > 0 {
            let piece_len = piece.min(end);
            steps.push(step(end - piece_len, piece_len));
            end -= piece_len;
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `steps` on host memory the way the device would, refusing what the driver
    /// would not do: an overlapping direct copy, or a bounce larger than the scratch.
    fn run(memory: &mut [u8], steps: &[CopyStep], scratch_bytes: u64) {
        for &step in steps {
            match step {
                CopyStep::Direct { src, dst, len } => {
                    assert!(src.abs_diff(dst) >= len, "overlapping direct copy {step:?}");
                    let (src, dst, len) = (src as usize, dst as usize, len as usize);
                    let piece = memory[src..src + len].to_vec();
                    memory[dst..dst + len].copy_from_slice(&piece);
                }
                CopyStep::ViaScratch { src, dst, len } => {
                    assert!(
                        len <= scratch_bytes,
                        "bounce larger than the scratch {step:?}"
                    );
                    let (src, dst, len) = (src as usize, dst as usize, len as usize);
                    let scratch = memory[src..src + len].to_vec();
                    memory[dst..dst + len].copy_from_slice(&scratch);
                }
            }
        }
    }

    #[test]
    fn every_plan_matches_memmove() {
        const SIZE: u64 = 40;
        let original: Vec<u8> = (0..SIZE as u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
        for scratch_bytes in [0, 1, 3, 8, 64] {
            for len in 0..=SIZE {
                for src in 0..=SIZE - len {
                    for dst in 0..=SIZE - len {
                        let mut expected = original.clone();
                        expected.copy_within(src as usize..(src + len) as usize, dst as usize);
                        let mut actual = original.clone();
                        run(
                            &mut actual,
                            &steps(src, dst, len, scratch_bytes),
                            scratch_bytes,
                        );
                        assert_eq!(
                            actual, expected,
                            "src {src} dst {dst} len {len} scratch {scratch_bytes}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn disjoint_ranges_take_one_copy() {
        let found = steps(0, 1 << 20, 1 << 20, 16 << 20);
        assert_eq!(
            found,
            [CopyStep::Direct {
                src: 0,
                dst: 1 << 20,
                len: 1 << 20
            }]
        );
    }

    #[test]
    fn small_slide_of_a_large_block_bounces_through_scratch() {
        let gib = 1u64 << 30;
        let scratch = 16u64 << 20;
        let found = steps(gib + 256, gib, gib, scratch);
        assert_eq!(found.len() as u64, gib / scratch);
        assert!(
            found
                .iter()
                .all(|s| matches!(s, CopyStep::ViaScratch { .. }))
        );
        // Without scratch the same slide still works, one 256-byte piece at a time.
        assert_eq!(steps(gib + 256, gib, 4096, 0).len(), 16);
    }

    #[test]
    fn nothing_to_copy_is_no_steps() {
        assert!(steps(5, 5, 100, 0).is_empty());
        assert!(steps(5, 9, 0, 0).is_empty());
    }
}
