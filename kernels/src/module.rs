//! PTX modules and the untyped description of the kernels they define.

/// One PTX module: the text the driver loads, and what it defines.
#[derive(Debug)]
pub struct Module {
    /// Short name; the PTX lives in `kernels/ptx/<name>.ptx`, generated from
    /// `kernels/cuda/<name>.cu`.
    pub name: &'static str,
    /// The PTX text (`.version 9.0`, `.target sm_90`), embedded at build time.
    pub ptx: &'static str,
    /// Every `.entry` of the module.
    pub kernels: &'static [KernelInfo],
}

/// What a launcher or a ledger needs to know about one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// The unmangled entry name (the sources declare each `extern "C"`).
    pub name: &'static str,
    /// Bytes of the kernel's single by-value parameter struct.
    pub param_bytes: usize,
    /// Local memory per thread in bytes: the stack frame `ptxas -v` reports
    /// for sm_90, and the `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` the driver is
    /// expected to report after loading the module.
    pub local_bytes_per_thread: u64,
    /// Whether the kernel calls in-kernel `malloc`/`free`, so that its first
    /// launch commits the device heap (`CU_LIMIT_MALLOC_HEAP_SIZE`).
    pub uses_device_heap: bool,
}

impl Module {
    /// The description of the kernel called `name`, if this module defines it.
    ///
    /// ```
    /// let info = kernels::local::MODULE.kernel("local_4k").unwrap();
    /// assert_eq!(info.local_bytes_per_thread, 4096);
    /// ```
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// Every module of this crate.
pub static MODULES: &[&Module] = &[
    &crate::pattern::MODULE,
    &crate::heap::MODULE,
    &crate::cm_heap::MODULE,
    &crate::local::MODULE,
    &crate::moves::MODULE,
];
