//! [`PoolId`]: which memory pool of a device a request is served from.

/// A memory pool of a device, as PyTorch names it (`MempoolId_t`): the device's own
/// pool is [`PoolId::DEFAULT`]; any other id is a private pool, the memory of one or
/// more CUDA graphs (or of a `torch.cuda.MemPool`), never reused outside it until it
/// is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// The device's own pool.
    pub const DEFAULT: PoolId = PoolId(0, 0);

    /// Whether this is a private pool.
    pub fn is_private(self) -> bool {
        self != Self::DEFAULT
    }

    /// The id as a pair, for messages.
    pub fn pair(self) -> (u64, u64) {
        (self.0, self.1)
    }
}
