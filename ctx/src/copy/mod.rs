//! How a list of moves becomes device work, whatever the backend: the rules
//! both [`crate::SimDevice`] and the CUDA backend follow, so CPU tests check
//! the grouping the GPU runs.
//!
//! - [`batches`]: consecutive moves grouped into runs the device may copy at
//!   once (independent moves, or a slide), and moves left to copy alone.
//! - [`steps`](mod@steps): a move whose ranges overlap, cut into copies that do not.

mod batches;
mod steps;

pub(crate) use batches::{Batch, batches};
pub(crate) use steps::{CopyStep, SCRATCH_BYTES, steps};
