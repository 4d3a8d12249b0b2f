//! PTX modules, their kernels, and launching them.

use std::{
    ffi::{CString, c_int, c_uint, c_void},
    sync::Arc,
    time::Duration,
};

use cust::sys::{
    CUdeviceptr, CUfunction, CUfunction_attribute, CUjit_option, CUjitInputType, CUlinkState,
    CUmodule,
};

use super::{
    CudaContext, Stream,
    driver::{self, check},
    stream::EventTimer,
};
use crate::error::driver_log;
use crate::{DriverCode, Error, Result};

/// Bytes of JIT error log kept when a module fails to load.
const JIT_LOG_BYTES: usize = 8192;

/// Largest kernel parameter block the driver accepts (32,764 bytes since CUDA 12.1),
/// rounded up. Parameters are copied into a zeroed buffer this big, so the driver can
/// never read past host memory we own even if the kernel expects more than was given.
const PARAM_BUFFER_BYTES: usize = 32 * 1024;

/// `CU_LAUNCH_PARAM_*` markers of `cuLaunchKernel`'s `extra` array (`#define`s in
/// `cuda.h`, so bindgen did not emit them).
const LAUNCH_PARAM_END: usize = 0;
const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// A loaded PTX module; unloaded when the last clone (and every [`Function`] from it)
/// drops.
#[derive(Clone, Debug)]
pub struct Module {
    inner: Arc<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    context: CudaContext,
    raw: CUmodule,
    name: String,
}

// SAFETY: a CUmodule is a driver handle usable from any thread with its context current;
// every use binds the context first.
unsafe impl Send for Loaded {}
// SAFETY: as above; nothing in `Loaded` changes after loading.
unsafe impl Sync for Loaded {}

impl Drop for Loaded {
    fn drop(&mut self) {
        if self.context.bind().is_ok() {
            // SAFETY: `raw` is a module we loaded and nothing refers to it any more
            // (functions hold the module alive). Drop cannot report a failure.
            let _ = unsafe { driver::cuModuleUnload(self.raw) };
        }
    }
}

/// The JIT options that have the driver write its error log into a buffer of
/// [`JIT_LOG_BYTES`], for `cuModuleLoadDataEx` and `cuLinkCreate`. The
/// values point into `buffer`'s heap storage, which stays put when this moves.
struct ErrorLog {
    buffer: Vec<u8>,
    options: [CUjit_option; 2],
    values: [*mut c_void; 2],
}

impl ErrorLog {
    fn new() -> Self {
        let mut buffer = vec![0u8; JIT_LOG_BYTES];
        let values = [
            buffer.as_mut_ptr().cast::<c_void>(),
            // The size option's value is the number itself, in the pointer slot.
            JIT_LOG_BYTES as *mut c_void,
        ];
        Self {
            buffer,
            options: [
                CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
                CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            ],
            values,
        }
    }

    /// What the driver wrote, trimmed.
    fn text(&self) -> String {
        driver_log(&self.buffer)
    }
}

impl CudaContext {
    /// Loads PTX text into this context, JIT-compiled for the device (no JIT target
    /// option: the driver picks the context's architecture, which cust's `JitTarget`
    /// cannot name for sm_90).
    ///
    /// `name` identifies the module in errors. A failure is
    /// [`Error::Driver`] with `op: "cuModuleLoadData"`, the driver's code and a detail
    /// naming the module and holding the JIT log.
    pub fn load_ptx(&self, name: &str, ptx: &str) -> Result<Module> {
        let image = CString::new(ptx).map_err(|_| {
            Error::driver(
                "cuModuleLoadData",
                DriverCode::INVALID_VALUE,
                format!("module `{name}`: the PTX text contains a NUL byte"),
            )
        })?;
        self.bind()?;
        let mut log = ErrorLog::new();
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is NUL-terminated PTX; `log`'s options and values have the
        // same length and, with the buffer they point to (as long as its size option
        // says), outlive the call; `raw` is a valid out-pointer.
        let code = unsafe {
            driver::cuModuleLoadDataEx(
                &mut raw,
                image.as_ptr().cast(),
                log.options.len() as c_uint,
                log.options.as_mut_ptr(),
                log.values.as_mut_ptr(),
            )
        };
        if let Err(error) = check("cuModuleLoadData", code) {
            let log = log.text();
            let detail = if log.is_empty() {
                format!("module `{name}`")
            } else {
                format!("module `{name}`; JIT log: {log}")
            };
            return Err(error.with_detail(detail));
        }
        Ok(Module {
            inner: Arc::new(Loaded {
                context: self.clone(),
                raw,
                name: name.to_owned(),
            }),
        })
    }
}

/// A link in progress; destroyed (with the image it made) when dropped.
struct LinkState(CUlinkState);

impl Drop for LinkState {
    fn drop(&mut self) {
        // SAFETY: the state came from cuLinkCreate and is destroyed once, here; the
        // image it owns is not used after (the module loaded from it is a copy).
        let _ = unsafe { driver::cuLinkDestroy(self.0) };
    }
}

impl CudaContext {
    /// Links PTX modules compiled with relocatable device code (`nvcc -ptx
    /// -rdc=true`), `(name, text)` each, into one module and loads it: how
    /// a user's module that calls `cm_malloc`/`cm_free` (declared extern,
    /// `kernels/cuda/cm_link.cuh`) is loaded with `kernels::cm_link::LIBRARY`.
    ///
    /// A failure is [`Error::Link`] naming the driver call that failed and
    /// carrying the linker's error log (an undefined function is named
    /// there).
    pub fn link_ptx(&self, name: &str, parts: &[(&str, &str)]) -> Result<Module> {
        let fail = |step: &'static str, code: DriverCode, detail: String, log: &[u8]| Error::Link {
            module: name.to_owned(),
            step,
            code,
            detail,
            log: driver_log(log),
        };
        let invalid = DriverCode::INVALID_VALUE;
        if parts.is_empty() {
            return Err(fail("cuLinkAddData", invalid, "no PTX to link".into(), &[]));
        }
        let mut inputs = Vec::with_capacity(parts.len());
        for &(part, ptx) in parts {
            let nul = |what: &str| {
                fail(
                    "cuLinkAddData",
                    invalid,
                    format!("{part}: {what} contains a NUL byte"),
                    &[],
                )
            };
            inputs.push((
                CString::new(part).map_err(|_| nul("the name"))?,
                CString::new(ptx).map_err(|_| nul("the PTX text"))?,
            ));
        }
        self.bind()?;
        let mut log = ErrorLog::new();
        let mut raw_state: CUlinkState = std::ptr::null_mut();
        // SAFETY: `log`'s options and values have the same length and, like the
        // buffer they point to (as long as its size option says), live until after
        // the state is destroyed at the end of this function; `raw_state` is a valid
        // out-pointer.
        let code = unsafe {
            driver::cuLinkCreate_v2(
                log.options.len() as c_uint,
                log.options.as_mut_ptr(),
                log.values.as_mut_ptr(),
                &mut raw_state,
            )
        };
        if code != driver::SUCCESS {
            let code = driver::driver_code(code);
            return Err(fail("cuLinkCreate", code, String::new(), &log.buffer));
        }
        let state = LinkState(raw_state);
        for (part, ptx) in &inputs {
            let text = ptx.as_bytes_with_nul();
            // SAFETY: `state` is a live link state; the driver reads `text` (NUL-
            // terminated PTX, its length given) and `part` (a NUL-terminated name)
            // during the call only and does not write through the data pointer; no
            // per-input options.
            let code = unsafe {
                driver::cuLinkAddData_v2(
                    state.0,
                    CUjitInputType::CU_JIT_INPUT_PTX,
                    text.as_ptr().cast_mut().cast(),
                    text.len(),
                    part.as_ptr(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            if code != driver::SUCCESS {
                let (code, part) = (driver::driver_code(code), part.to_string_lossy());
                return Err(fail("cuLinkAddData", code, part.into_owned(), &log.buffer));
            }
        }
        let mut image: *mut c_void = std::ptr::null_mut();
        let mut image_bytes = 0usize;
        // SAFETY: `state` is live; both out-pointers are valid. The image stays owned by
        // the state, which outlives its use below.
        let code = unsafe { driver::cuLinkComplete(state.0, &mut image, &mut image_bytes) };
        if code != driver::SUCCESS {
            let code = driver::driver_code(code);
            return Err(fail("cuLinkComplete", code, String::new(), &log.buffer));
        }
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is the cubin cuLinkComplete made, alive until `state` drops
        // after this call; no options; `raw` is a valid out-pointer.
        let code = unsafe {
            driver::cuModuleLoadDataEx(
                &mut raw,
                image.cast_const(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        drop(state);
        if code != driver::SUCCESS {
            let code = driver::driver_code(code);
            return Err(fail("cuModuleLoadData", code, String::new(), &log.buffer));
        }
        Ok(Module {
            inner: Arc::new(Loaded {
                context: self.clone(),
                raw,
                name: name.to_owned(),
            }),
        })
    }
}

impl Module {
    /// The name given at load time.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Overwrites the module's `__device__` variable `name` with `value`, which
    /// must be exactly as long as the variable (bytes).
    ///
    /// A missing variable ([`DriverCode::NOT_FOUND`]) or a size that differs
    /// ([`DriverCode::INVALID_VALUE`]) is [`Error::Driver`] naming both.
    pub fn set_global(&self, name: &str, value: &[u8]) -> Result<()> {
        let symbol = CString::new(name).map_err(|_| {
            Error::driver(
                "cuModuleGetGlobal",
                DriverCode::INVALID_VALUE,
                format!("variable name {name:?} contains a NUL byte"),
            )
        })?;
        self.inner.context.bind()?;
        let mut address: CUdeviceptr = 0;
        let mut bytes: usize = 0;
        // SAFETY: the module is loaded; `symbol` is NUL-terminated; both out-pointers are
        // valid.
        let code = unsafe {
            driver::cuModuleGetGlobal_v2(&mut address, &mut bytes, self.inner.raw, symbol.as_ptr())
        };
        check("cuModuleGetGlobal", code).map_err(|error| {
            error.with_detail(format!("variable `{name}` in module `{}`", self.inner.name))
        })?;
        if bytes != value.len() {
            return Err(Error::driver(
                "cuModuleGetGlobal",
                DriverCode::INVALID_VALUE,
                format!(
                    "variable `{name}` in module `{}` is {bytes} bytes, not {}",
                    self.inner.name,
                    value.len()
                ),
            ));
        }
        // SAFETY: `address` is the module's variable of exactly `value.len()` bytes, and
        // `value` a live host slice of that length.
        check("cuMemcpyHtoD", unsafe {
            driver::cuMemcpyHtoD_v2(address, value.as_ptr().cast(), value.len())
        })
    }

    /// The kernel called `name` (its PTX `.entry` name).
    pub fn function(&self, name: &str) -> Result<Function> {
        let entry = CString::new(name).map_err(|_| {
            Error::driver(
                "cuModuleGetFunction",
                DriverCode::INVALID_VALUE,
                format!("kernel name {name:?} contains a NUL byte"),
            )
        })?;
        self.inner.context.bind()?;
        let mut raw: CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; `entry` is NUL-terminated; `raw` a valid out-pointer.
        let code = unsafe { driver::cuModuleGetFunction(&mut raw, self.inner.raw, entry.as_ptr()) };
        check("cuModuleGetFunction", code).map_err(|error| {
            error.with_detail(format!("kernel `{name}` in module `{}`", self.inner.name))
        })?;
        Ok(Function {
            module: self.clone(),
            raw,
            name: name.to_owned(),
        })
    }
}

/// A kernel of a loaded [`Module`]; keeps the module loaded.
#[derive(Clone, Debug)]
pub struct Function {
    module: Module,
    raw: CUfunction,
    name: String,
}

// SAFETY: a CUfunction is a driver handle valid while its module is loaded (we hold the
// module); every use binds the context first.
unsafe impl Send for Function {}
// SAFETY: as above; the handle never changes.
unsafe impl Sync for Function {}

/// What the compiler decided about one kernel (`cuFuncGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FunctionAttributes {
    /// Local memory (stack and spills) per thread, bytes.
    pub local_bytes: u64,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u64,
    /// Constant memory, bytes.
    pub const_bytes: u64,
    /// Registers per thread.
    pub registers: u32,
    /// Most threads per block this kernel can launch with.
    pub max_threads_per_block: u32,
}

/// Grid and block shape of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch: `blocks` blocks of `threads` threads, no dynamic shared
    /// memory.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
        }
    }

    /// Enough blocks of `threads` threads to cover `items` items, one item per thread.
    pub fn covering(items: u64, threads: u32) -> Self {
        let threads = threads.max(1);
        let blocks = items.div_ceil(u64::from(threads)).max(1);
        Self::linear(u32::try_from(blocks).unwrap_or(u32::MAX), threads)
    }
}

/// The kernel parameter block as the driver reads it: 16-byte aligned like any kernel
/// parameter may need, zero beyond what the caller gave.
#[repr(C, align(16))]
struct ParamBuffer([u8; PARAM_BUFFER_BYTES]);

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module the kernel belongs to.
    pub fn module(&self) -> &Module {
        &self.module
    }

    fn attribute(&self, attribute: CUfunction_attribute) -> Result<u64> {
        self.module.inner.context.bind()?;
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid out-pointer; the function's module is loaded.
        check("cuFuncGetAttribute", unsafe {
            driver::cuFuncGetAttribute(&mut value, attribute, self.raw)
        })?;
        Ok(u64::try_from(value).unwrap_or(0))
    }

    /// Local memory per thread, bytes (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`). On driver
    /// 580 reading it can raise the context's stack limit to this size.
    pub fn local_bytes(&self) -> Result<u64> {
        self.attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
    }

    /// All the attributes of [`FunctionAttributes`].
    pub fn attributes(&self) -> Result<FunctionAttributes> {
        use CUfunction_attribute as A;
        Ok(FunctionAttributes {
            local_bytes: self.attribute(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            shared_bytes: self.attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            const_bytes: self.attribute(A::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
            registers: u32::try_from(self.attribute(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?)
                .unwrap_or(u32::MAX),
            max_threads_per_block: u32::try_from(
                self.attribute(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            )
            .unwrap_or(u32::MAX),
        })
    }

    /// Launches the kernel on the legacy default stream between two events, waits
    /// for it, and returns the device time between the events. Errors as
    /// [`Function::launch`], or a fault the kernel hit.
    pub fn launch_timed(&self, config: &LaunchConfig, params: &[u8]) -> Result<Duration> {
        let timer = EventTimer::new(&self.module.inner.context)?;
        timer.start(std::ptr::null_mut())?;
        self.launch(config, params, None)?;
        timer.stop(std::ptr::null_mut())
    }

    /// Queues the kernel on `stream` (`None`: the legacy default stream) with `params`,
    /// the bytes of the kernel's parameter list laid out as in memory (for kernels that
    /// take one `#[repr(C)]` struct by value: `bytemuck::bytes_of(&params)`).
    ///
    /// Returns once the launch is queued; [`CudaContext::synchronize`] (or the stream's)
    /// waits for it, and reports faults the kernel hit. The call is safe for the host:
    /// the parameter block is copied into a zeroed buffer as large as any kernel's
    /// parameters can be, so a kernel expecting more bytes reads zeros, and this crate
    /// maps no host memory into the device, so a wrong device address in `params` faults
    /// on the device (a `CUDA_ERROR_ILLEGAL_ADDRESS` from the next synchronization), never
    /// in the host.
    pub fn launch(
        &self,
        config: &LaunchConfig,
        params: &[u8],
        stream: Option<&Stream>,
    ) -> Result<()> {
        if params.len() > PARAM_BUFFER_BYTES {
            return Err(Error::driver(
                "cuLaunchKernel",
                DriverCode::INVALID_VALUE,
                format!(
                    "kernel `{}`: {} parameter bytes exceed the {PARAM_BUFFER_BYTES}-byte limit",
                    self.name,
                    params.len()
                ),
            ));
        }
        let context = &self.module.inner.context;
        if stream.is_some_and(|stream| !stream.context().is_same(context)) {
            return Err(Error::driver(
                "cuLaunchKernel",
                DriverCode::INVALID_VALUE,
                format!(
                    "kernel `{}`: the stream belongs to another context",
                    self.name
                ),
            ));
        }
        context.bind()?;
        let mut buffer = Box::new(ParamBuffer([0; PARAM_BUFFER_BYTES]));
        buffer.0[..params.len()].copy_from_slice(params);
        let mut size = params.len();
        let mut extra = [
            LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buffer.0.as_mut_ptr().cast::<c_void>(),
            LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast::<c_void>(),
            LAUNCH_PARAM_END as *mut c_void,
        ];
        let raw_stream = stream.map_or(std::ptr::null_mut(), Stream::raw);
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        // SAFETY: the function's module is loaded in the current context; `extra` is a
        // END-terminated marker list whose buffer pointer addresses PARAM_BUFFER_BYTES
        // bytes we own and whose size pointer addresses a live usize, all outliving the
        // call (the driver copies the parameters before returning); kernelParams is null
        // as required when `extra` is used; `raw_stream` is null or a live stream.
        let code = unsafe {
            driver::cuLaunchKernel(
                self.raw,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                config.shared_bytes,
                raw_stream,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        };
        check("cuLaunchKernel", code)
            .map_err(|error| error.with_detail(format!("kernel `{}` ({config:?})", self.name)))
    }
}
