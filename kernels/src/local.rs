//! Kernels with a known amount of local memory per thread (`local.cu`), for
//! measuring what the driver reserves for local memory at load and launch.
//!
//! Each keeps a volatile array of its size, indexed by a run-time value, so
//! the compiler can neither remove it nor keep it in registers.

use bytemuck::{Pod, Zeroable};

use crate::kernel::Kernel;
use crate::module::{KernelInfo, Module};

/// Parameters of the local-memory kernels; matches `LocalParams` in
/// `local.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct LocalParams {
    /// Device address of `threads` `u64` results.
    pub out: u64,
    /// Threads that take part; the grid may be larger.
    pub threads: u32,
    /// Any value; the array index starts from it.
    pub index: u32,
}

/// No local memory.
pub const LOCAL_0: Kernel<LocalParams> = Kernel::new(&MODULE, 0);
/// 1 KiB of local memory per thread.
pub const LOCAL_1K: Kernel<LocalParams> = Kernel::new(&MODULE, 1);
/// 4 KiB of local memory per thread.
pub const LOCAL_4K: Kernel<LocalParams> = Kernel::new(&MODULE, 2);
/// 16 KiB of local memory per thread.
pub const LOCAL_16K: Kernel<LocalParams> = Kernel::new(&MODULE, 3);

/// The local-memory kernels, smallest first.
pub const ALL: [Kernel<LocalParams>; 4] = [LOCAL_0, LOCAL_1K, LOCAL_4K, LOCAL_16K];

const fn local_kernel(name: &'static str, local_bytes_per_thread: u64) -> KernelInfo {
    KernelInfo {
        name,
        param_bytes: size_of::<LocalParams>(),
        local_bytes_per_thread,
        uses_device_heap: false,
    }
}

/// `local.ptx`.
pub static MODULE: Module = Module {
    name: "local",
    ptx: include_str!("../ptx/local.ptx"),
    kernels: &[
        local_kernel("local_0", 0),
        local_kernel("local_1k", 1024),
        local_kernel("local_4k", 4096),
        local_kernel("local_16k", 16384),
    ],
};
