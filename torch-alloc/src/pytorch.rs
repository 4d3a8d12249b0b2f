//! PyTorch's caching-allocator rules that its users' figures depend on, in one place:
//! how a request is rounded, and which requests count as small.

/// Every block is aligned to this and every request rounded up to it, bytes
/// (`kMinBlockSize` of PyTorch's allocator).
pub const BLOCK_ALIGN: u64 = 512;

/// The largest request PyTorch counts in its small pool, bytes (`kSmallSize`): the
/// `small_pool` rows of `torch.cuda.memory_stats()` hold blocks up to this size.
pub const SMALL_BLOCK_BYTES: u64 = 1 << 20;

/// The bytes a request of `size` bytes occupies: at least one block, rounded up to
/// [`BLOCK_ALIGN`]; `u64::MAX` when that overflows (no device has room for it).
///
/// ```
/// use cudamem_torch::pytorch::block_bytes;
/// assert_eq!(block_bytes(0), 512);
/// assert_eq!(block_bytes(513), 1024);
/// assert_eq!(block_bytes(u64::MAX), u64::MAX);
/// ```
pub fn block_bytes(size: u64) -> u64 {
    size.max(1)
        .checked_next_multiple_of(BLOCK_ALIGN)
        .unwrap_or(u64::MAX)
}

/// Whether a block of `bytes` counts in PyTorch's small pool.
pub fn is_small(bytes: u64) -> bool {
    bytes <= SMALL_BLOCK_BYTES
}
