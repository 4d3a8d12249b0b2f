//! `cm_malloc`/`cm_free` for a user's own module: `cuda/cm_link.cu` is the
//! allocator as a library ([`LIBRARY`]: the extern "C" functions and the
//! `cm_heap` variable), `cuda/cm_link.cuh` the declarations a user's CUDA C
//! includes, and `cuda/cm_user.cu` an example of such a module
//! ([`USER_EXAMPLE`]). Both are compiled with relocatable device code
//! (`nvcc -ptx -rdc=true`, the [`LINKED`] modules); the driver links them
//! into one module when it loads them (`ctx::CudaContext::link_ptx`), which
//! a `ctx::DeviceHeap` is then bound to like any other.

use bytemuck::{Pod, Zeroable};

use crate::kernel::Kernel;
use crate::module::{KernelInfo, Module};

/// Parameters of the example's kernels; matches `UserParams` in
/// `cuda/cm_user.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct UserParams {
    /// Device address of `threads` `u64`s: each thread's block (0: NULL).
    pub slots: u64,
    /// Device address of 2 `u64`s the kernels add to: bytes that differed
    /// when checked, requests that got NULL.
    pub counts: u64,
    /// Bytes per block.
    pub size: u64,
    /// Threads that take part; the grid may be larger.
    pub threads: u32,
    /// Mixed into the bytes written.
    pub seed: u32,
}

/// Each thread: `cm_malloc(size)`, its address in its slot, every byte
/// written from the thread index, the byte's index and the seed.
pub const USER_WRITE: Kernel<UserParams> = Kernel::new(&USER_EXAMPLE, 0);
/// Each thread with a block: every byte checked, the block freed, the slot
/// zeroed.
pub const USER_CHECK_FREE: Kernel<UserParams> = Kernel::new(&USER_EXAMPLE, 1);

/// The functions [`LIBRARY`] exports.
pub const EXPORTS: [&str; 2] = ["cm_malloc", "cm_free"];

/// `cm_link.ptx`: the allocator as a library; no kernels.
pub static LIBRARY: Module = Module {
    name: "cm_link",
    ptx: include_str!("../ptx/cm_link.ptx"),
    kernels: &[],
};

const fn user_kernel(name: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        param_bytes: size_of::<UserParams>(),
        local_bytes_per_thread: 0,
        uses_device_heap: false,
    }
}

/// `cm_user.ptx`: a user's module that calls the [`LIBRARY`]'s functions.
pub static USER_EXAMPLE: Module = Module {
    name: "cm_user",
    ptx: include_str!("../ptx/cm_user.ptx"),
    kernels: &[
        user_kernel("cm_user_write"),
        user_kernel("cm_user_check_free"),
    ],
};

/// The modules compiled with relocatable device code, loaded only linked
/// (`xtask`'s list of them must say the same).
pub static LINKED: &[&Module] = &[&LIBRARY, &USER_EXAMPLE];
