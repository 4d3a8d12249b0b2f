//! A device's primary CUDA context: what the device is, its limits, its memory figures.

use std::{
    ffi::{CStr, c_char, c_int},
    sync::{Arc, Mutex},
};

use cust::sys::{CUcontext, CUdevice, CUdevice_attribute, CUlimit};

use super::driver::{self, check};
use crate::{DeviceProfile, Limits, MemInfo, PeerLinks, Result, profile::LOCAL_MEMORY_GRANULE};

/// The primary context of one CUDA device, retained for as long as any clone lives.
///
/// It is the runtime API's context too, so work done here and by libraries on the
/// runtime API shares one context (and one context reservation). Clones are cheap
/// handles to the same context. Every method makes the context current on the calling
/// thread first, so any thread may use it.
#[derive(Clone, Debug)]
pub struct CudaContext {
    inner: Arc<Retained>,
}

/// The retained primary context; released when the last [`CudaContext`] clone drops.
#[derive(Debug)]
struct Retained {
    ordinal: u32,
    device: CUdevice,
    raw: CUcontext,
    /// Memory figures right after the context was retained and made current.
    at_open: MemInfo,
}

// SAFETY: a CUcontext is a driver handle, not memory we dereference; the driver API is
// thread-safe and a context may be current on several threads at once.
unsafe impl Send for Retained {}
// SAFETY: as above; nothing in `Retained` changes after construction.
unsafe impl Sync for Retained {}

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: we retained this device's primary context once in `CudaContext::new`;
        // this is the matching release. A failure cannot be reported from drop, and the
        // driver reclaims the context at process exit regardless.
        let _ = unsafe { driver::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// A context limit that costs device memory, read and set with
/// [`CudaContext::limit`] and [`CudaContext::set_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Stack per thread, bytes (`CU_LIMIT_STACK_SIZE`). The context reserves it for
    /// every thread that can be resident on the device.
    StackBytes,
    /// The in-kernel `malloc` heap, bytes (`CU_LIMIT_MALLOC_HEAP_SIZE`).
    MallocHeapBytes,
    /// The in-kernel `printf` buffer, bytes (`CU_LIMIT_PRINTF_FIFO_SIZE`).
    PrintfFifoBytes,
}

impl Limit {
    fn raw(self) -> CUlimit {
        match self {
            Limit::StackBytes => CUlimit::CU_LIMIT_STACK_SIZE,
            Limit::MallocHeapBytes => CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE,
            Limit::PrintfFifoBytes => CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE,
        }
    }
}

impl CudaContext {
    /// Initializes the driver and retains the primary context of device `ordinal`.
    ///
    /// Fails with [`crate::Error::Driver`] (`op: "cuInit"`) when there is no usable driver
    /// (on a machine built against the stub `libcuda`, every call fails this way).
    pub fn new(ordinal: u32) -> Result<Self> {
        // SAFETY: cuInit takes only flags, which must be 0.
        check("cuInit", unsafe { driver::cuInit(0) })?;
        let device = device_handle(ordinal)?;
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer and `device` a handle the driver gave us.
        check("cuDevicePrimaryCtxRetain", unsafe {
            driver::cuDevicePrimaryCtxRetain(&mut raw, device)
        })?;
        let mut context = CudaContext {
            inner: Arc::new(Retained {
                ordinal,
                device,
                raw,
                at_open: MemInfo::default(),
            }),
        };
        let at_open = context.mem_info()?;
        if let Some(retained) = Arc::get_mut(&mut context.inner) {
            retained.at_open = at_open;
        }
        Ok(context)
    }

    /// How many CUDA devices the driver sees.
    pub fn device_count() -> Result<u32> {
        // SAFETY: cuInit takes only flags, which must be 0.
        check("cuInit", unsafe { driver::cuInit(0) })?;
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            driver::cuDeviceGetCount(&mut count)
        })?;
        Ok(u32::try_from(count).unwrap_or(0))
    }

    /// The driver's CUDA version, e.g. `13000` for CUDA 13.0.
    pub fn driver_version() -> Result<u32> {
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out-pointer; this call needs no cuInit.
        check("cuDriverGetVersion", unsafe {
            driver::cuDriverGetVersion(&mut version)
        })?;
        Ok(u32::try_from(version).unwrap_or(0))
    }

    /// Makes this context current on the calling thread. Every method calls it, so a
    /// context (and what holds one) can move between threads.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: `raw` is a primary context we hold retained, so it is alive.
        check("cuCtxSetCurrent", unsafe {
            driver::cuCtxSetCurrent(self.inner.raw)
        })
    }

    /// Runs `work` and then makes current again whatever context was current on the
    /// calling thread before (none included), if `work` changed it.
    ///
    /// Every method of this backend makes its own context current and leaves it so. A
    /// library called by other code (PyTorch's allocator frees a tensor of device 1
    /// while device 0 is current) must not change that code's current device.
    pub fn keeping_current<T>(work: impl FnOnce() -> T) -> Result<T> {
        let before = current()?;
        let result = work();
        if current()? != before {
            // SAFETY: `before` was current on this thread a moment ago (or is null,
            // which unbinds); a context current on a thread is alive.
            check("cuCtxSetCurrent", unsafe {
                driver::cuCtxSetCurrent(before)
            })?;
        }
        Ok(result)
    }

    /// Whether `other` is the same driver context (two `CudaContext::new` calls for one
    /// device retain the same primary context).
    pub(crate) fn is_same(&self, other: &CudaContext) -> bool {
        self.inner.raw == other.inner.raw
    }

    /// Free and total device memory right after [`new`](Self::new) retained the context,
    /// bytes. When nothing else in the process had the primary context active,
    /// `total - free` is what the driver and a fresh context take.
    pub fn mem_info_at_open(&self) -> MemInfo {
        self.inner.at_open
    }

    /// The device ordinal this context belongs to.
    pub fn ordinal(&self) -> u32 {
        self.inner.ordinal
    }

    /// Whether device `from` can read and write memory of device `to` directly
    /// (`cuDeviceCanAccessPeer`); a device reaches its own memory. Creates no context.
    pub fn can_access_peer(from: u32, to: u32) -> Result<bool> {
        // SAFETY: cuInit takes only flags, which must be 0.
        check("cuInit", unsafe { driver::cuInit(0) })?;
        let from_device = device_handle(from)?;
        let to_device = device_handle(to)?;
        if from == to {
            return Ok(true);
        }
        let mut can: c_int = 0;
        // SAFETY: `can` is a valid out-pointer; both handles came from the driver.
        check("cuDeviceCanAccessPeer", unsafe {
            driver::cuDeviceCanAccessPeer(&mut can, from_device, to_device)
        })?;
        Ok(can != 0)
    }

    /// `cuDeviceCanAccessPeer` for every ordered pair of the host's devices (at most
    /// 64). Creates no context.
    pub fn peer_links() -> Result<PeerLinks> {
        let count = Self::device_count()?;
        let mut links = PeerLinks::none(count);
        for from in 0..links.device_count() {
            for to in 0..links.device_count() {
                if from != to && Self::can_access_peer(from, to)? {
                    links = links.with(from, to);
                }
            }
        }
        Ok(links)
    }

    /// Lets this context read and write every `cuMemAlloc` allocation of `peer`'s
    /// context, present and future (`cuCtxEnablePeerAccess`): what peers need to reach
    /// memory that is not VMM-mapped. Enabled already counts as success.
    pub fn enable_peer_access(&self, peer: &CudaContext) -> Result<()> {
        self.bind()?;
        // SAFETY: `peer.inner.raw` is a primary context held retained by `peer`; flags
        // must be 0.
        let code = unsafe { driver::cuCtxEnablePeerAccess(peer.inner.raw, 0) };
        if code == PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check("cuCtxEnablePeerAccess", code)
    }

    /// The raw device handle, for the other parts of this backend.
    pub(crate) fn raw_device(&self) -> CUdevice {
        self.inner.device
    }

    /// The device's marketing name, e.g. `"NVIDIA H200"`.
    pub fn device_name(&self) -> Result<String> {
        let mut buffer = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into `buffer`.
        check("cuDeviceGetName", unsafe {
            driver::cuDeviceGetName(
                buffer.as_mut_ptr(),
                buffer.len() as c_int,
                self.inner.device,
            )
        })?;
        // The driver NUL-terminates within `len`; the last byte stays 0 regardless.
        buffer[buffer.len() - 1] = 0;
        // SAFETY: `buffer` holds a NUL terminator at the latest in its last byte.
        let name = unsafe { CStr::from_ptr(buffer.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    /// Device memory in all, bytes (`cuDeviceTotalMem`).
    pub fn total_bytes(&self) -> Result<u64> {
        let mut bytes = 0usize;
        // SAFETY: `bytes` is a valid out-pointer; the device handle is valid.
        check("cuDeviceTotalMem", unsafe {
            driver::cuDeviceTotalMem_v2(&mut bytes, self.inner.device)
        })?;
        Ok(bytes as u64)
    }

    /// One integer device attribute.
    pub(crate) fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32> {
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid out-pointer; `attribute` is a declared enum value.
        check("cuDeviceGetAttribute", unsafe {
            driver::cuDeviceGetAttribute(&mut value, attribute, self.inner.device)
        })?;
        Ok(value)
    }

    fn attribute_u32(&self, attribute: CUdevice_attribute) -> Result<u32> {
        Ok(u32::try_from(self.attribute(attribute)?).unwrap_or(0))
    }

    /// Compute capability as (major, minor), e.g. (9, 0) for an H200.
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        Ok((
            self.attribute_u32(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute_u32(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> Result<u32> {
        self.attribute_u32(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    }

    /// Most threads resident on one multiprocessor at once.
    pub fn max_threads_per_sm(&self) -> Result<u32> {
        self.attribute_u32(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
    }

    /// Whether the device supports virtual memory management (`cuMemCreate`/`cuMemMap`).
    pub fn supports_vmm(&self) -> Result<bool> {
        Ok(self.attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        )? != 0)
    }

    /// The device as the ledger models it, read from the device.
    ///
    /// SM count, threads per SM, compute capability and total memory (as
    /// `cuMemGetInfo` reports it) come from the device. When the device's name matches
    /// a built-in profile ("NVIDIA H200" is `h200`), its short name, measured context
    /// and module costs and local-memory granule are kept; otherwise the short name is
    /// made from the device name and those costs are `None`.
    pub fn profile(&self) -> Result<DeviceProfile> {
        let full_name = self.device_name()?;
        let builtin = DeviceProfile::all()
            .iter()
            .find(|builtin| builtin.full_name.eq_ignore_ascii_case(&full_name));
        let base = match builtin {
            Some(builtin) => DeviceProfile {
                source: "read from the device with the driver; context and first-module \
                         costs from the built-in profile of the same name",
                ..*builtin
            },
            None => DeviceProfile {
                name: interned(&short_name(&full_name)),
                full_name: interned(&full_name),
                context_baseline_bytes: None,
                first_module_bytes: None,
                local_memory_granule_bytes: LOCAL_MEMORY_GRANULE,
                source: "read from the device with the driver",
                ..DeviceProfile::all()[0]
            },
        };
        Ok(DeviceProfile {
            sm_count: self.sm_count()?,
            max_threads_per_sm: self.max_threads_per_sm()?,
            total_bytes: self.mem_info()?.total,
            compute_capability: self.compute_capability()?,
            ..base
        })
    }

    /// A context limit now, bytes.
    pub fn limit(&self, limit: Limit) -> Result<u64> {
        self.bind()?;
        let mut value = 0usize;
        // SAFETY: `value` is a valid out-pointer; the context is current.
        check("cuCtxGetLimit", unsafe {
            driver::cuCtxGetLimit(&mut value, limit.raw())
        })?;
        Ok(value as u64)
    }

    /// Sets a context limit, bytes. Raising the stack limit reserves device memory at
    /// once; the malloc heap cannot change after a kernel that uses it has run
    /// (`CUDA_ERROR_INVALID_VALUE`).
    pub fn set_limit(&self, limit: Limit, bytes: u64) -> Result<()> {
        self.bind()?;
        let value = driver::size_t("cuCtxSetLimit", bytes)?;
        // SAFETY: the context is current; the driver validates the value.
        check("cuCtxSetLimit", unsafe {
            driver::cuCtxSetLimit(limit.raw(), value)
        })
    }

    /// All three memory-costing limits now.
    pub fn limits(&self) -> Result<Limits> {
        Ok(Limits {
            stack_bytes: self.limit(Limit::StackBytes)?,
            malloc_heap_bytes: self.limit(Limit::MallocHeapBytes)?,
            printf_fifo_bytes: self.limit(Limit::PrintfFifoBytes)?,
        })
    }

    /// Free and total device memory now (`cuMemGetInfo`), bytes.
    pub fn mem_info(&self) -> Result<MemInfo> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers; the context is current.
        check("cuMemGetInfo", unsafe {
            driver::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    /// Waits for all work in the context, on every stream.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current; the call has no arguments.
        check("cuCtxSynchronize", unsafe { driver::cuCtxSynchronize() })
    }
}

/// The context current on the calling thread (null if none).
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
const PEER_ACCESS_ALREADY_ENABLED: driver::RawResult = 704;

/// The driver's handle of device `ordinal`.
pub(crate) fn device_handle(ordinal: u32) -> Result<CUdevice> {
    let ordinal_c = c_int::try_from(ordinal).map_err(|_| {
        crate::Error::driver(
            "cuDeviceGet",
            crate::DriverCode::INVALID_DEVICE,
            format!("device ordinal {ordinal} is out of range"),
        )
    })?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer; the driver checks the ordinal.
    check("cuDeviceGet", unsafe {
        driver::cuDeviceGet(&mut device, ordinal_c)
    })?;
    Ok(device)
}

fn current() -> Result<CUcontext> {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a valid out-pointer.
    check("cuCtxGetCurrent", unsafe {
        driver::cuCtxGetCurrent(&mut context)
    })?;
    Ok(context)
}

/// A profile's short name made from a device name: lowercase, vendor words dropped,
/// spaces as dashes ("NVIDIA GeForce RTX 3090" is `rtx-3090`).
fn short_name(full_name: &str) -> String {
    let words: Vec<String> = full_name
        .split_whitespace()
        .map(str::to_lowercase)
        .filter(|word| word != "nvidia" && word != "geforce")
        .collect();
    if words.is_empty() {
        "device".to_owned()
    } else {
        words.join("-")
    }
}

/// `text` as a `&'static str`, leaked once per distinct text: profiles hold static names,
/// and a process sees only a handful of device names.
fn interned(text: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(name) = names.iter().find(|name| **name == text) {
        return name;
    }
    let name: &'static str = Box::leak(text.to_owned().into_boxed_str());
    names.push(name);
    name
}
