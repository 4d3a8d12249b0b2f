//! A kernel tied to the type of its parameter struct.

use core::marker::PhantomData;

use bytemuck::Pod;

use crate::module::{KernelInfo, Module};

/// Threads per block for every launch of this crate's kernels but the copy
/// kernels ([`crate::moves::MOVE_THREADS`], [`crate::moves::SLIDE_THREADS`]).
pub const BLOCK_THREADS: u32 = 256;

/// A kernel whose one parameter is a `P` passed by value.
///
/// Every kernel here is declared `__global__ void name(Params p)`, so the
/// PTX entry has a single `.param .align 8 .b8 name_param_0[size_of::<P>()]`:
/// a launcher passes one pointer, to the bytes of `P`
/// ([`Kernel::param_bytes`]).
#[derive(Debug)]
pub struct Kernel<P> {
    module: &'static Module,
    index: usize,
    params: PhantomData<fn(P)>,
}

// Manual impls: derived ones would require `P: Clone`/`P: Copy`.
impl<P> Clone for Kernel<P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P> Copy for Kernel<P> {}

impl<P: Pod> Kernel<P> {
    /// The kernel described by `module.kernels[index]`.
    pub(crate) const fn new(module: &'static Module, index: usize) -> Self {
        Self {
            module,
            index,
            params: PhantomData,
        }
    }

    /// The module that defines the kernel.
    pub fn module(&self) -> &'static Module {
        self.module
    }

    /// The kernel's description.
    pub fn info(&self) -> &'static KernelInfo {
        &self.module.kernels[self.index]
    }

    /// The unmangled entry name.
    pub fn name(&self) -> &'static str {
        self.info().name
    }

    /// The bytes to pass as the kernel's single parameter.
    ///
    /// ```
    /// use kernels::local::{LocalParams, LOCAL_16K};
    /// let p = LocalParams { out: 0x7f00_0000_0000, threads: 1024, index: 3 };
    /// assert_eq!(LOCAL_16K.param_bytes(&p).len(), LOCAL_16K.info().param_bytes);
    /// ```
    pub fn param_bytes<'a>(&self, params: &'a P) -> &'a [u8] {
        bytemuck::bytes_of(params)
    }
}

/// Grid and block sizes (in threads) of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    /// Blocks in the grid.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
}

impl LaunchShape {
    /// The smallest grid of [`BLOCK_THREADS`]-thread blocks with at least
    /// `threads` threads (at least one block; at most `u32::MAX` blocks).
    ///
    /// ```
    /// use kernels::LaunchShape;
    /// assert_eq!(LaunchShape::covering(1 << 20).grid, 4096);
    /// assert_eq!(LaunchShape::covering(1).grid, 1);
    /// ```
    pub fn covering(threads: u64) -> Self {
        let blocks = threads.div_ceil(u64::from(BLOCK_THREADS)).max(1);
        Self {
            grid: u32::try_from(blocks).unwrap_or(u32::MAX),
            block: BLOCK_THREADS,
        }
    }

    /// Threads in the whole grid.
    pub fn threads(&self) -> u64 {
        u64::from(self.grid) * u64::from(self.block)
    }
}
