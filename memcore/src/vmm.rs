//! What the policies know of the hardware they plan for: the VMM page and
//! the handle size that copies at full bandwidth. Each is stated here once;
//! the stitching policy, the growth rule and ctx's pools read them.

/// The VMM page of NVIDIA GPUs with virtual memory management (the
/// allocation granularity `cuMemGetAllocationGranularity` reports, minimum
/// and recommended alike), bytes: 2 MiB. The smallest physical handle, and
/// the unit memory is mapped in.
pub const PAGE_BYTES: u64 = 2 << 20;

/// Handles of at least this many bytes (32 MiB) copy at (nearly) the
/// bandwidth of `cuMemAlloc` memory (BENCHMARKS.md, "Stitching", has the
/// measurement); smaller ones are slower. The
/// stitching policy's large handle is this size
/// ([`StitchConfig::large_pages`](crate::StitchConfig::large_pages)
/// defaults to [`FULL_BANDWIDTH_HANDLE_PAGES`]), and a growing pool's step
/// need never exceed it ([`GrowthRule`](crate::GrowthRule)).
pub const FULL_BANDWIDTH_HANDLE_BYTES: u64 = 32 << 20;

/// [`FULL_BANDWIDTH_HANDLE_BYTES`] in [`PAGE_BYTES`] pages (16).
pub const FULL_BANDWIDTH_HANDLE_PAGES: u32 = (FULL_BANDWIDTH_HANDLE_BYTES / PAGE_BYTES) as u32;

const _: () = assert!(FULL_BANDWIDTH_HANDLE_BYTES % PAGE_BYTES == 0);
