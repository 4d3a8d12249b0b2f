//! ctx's [`DeviceMemory`] over the real driver's entry points (never the
//! wrappers: the pool's own calls are neither recorded nor gated), and what
//! a pause does to the physical memory under it.
//!
//! The pool names each physical handle by a number of this module's
//! ([`PhysicalHandle::raw`] is an index into [`DriverDevice::slots`]): a
//! pause releases the driver's handle and a resume creates a new one, both
//! behind the same number, so the pool above never sees the change.

use std::ffi::{c_int, c_uint, c_void};

use ctx::{DeviceMemory, DriverCode, Error, MemInfo, PeerSet, PhysicalHandle, Result};

use crate::driver::{CuResult, SUCCESS, call_driver};

/// The driver entry points the pool calls.
pub mod sym {
    use crate::driver::Sym;

    pub static ADDRESS_RESERVE: Sym = Sym::new(c"cuMemAddressReserve");
    pub static ADDRESS_FREE: Sym = Sym::new(c"cuMemAddressFree");
    pub static CREATE: Sym = Sym::new(c"cuMemCreate");
    pub static MAP: Sym = Sym::new(c"cuMemMap");
    pub static SET_ACCESS: Sym = Sym::new(c"cuMemSetAccess");
    pub static UNMAP: Sym = Sym::new(c"cuMemUnmap");
    pub static RELEASE: Sym = Sym::new(c"cuMemRelease");
    pub static GRANULARITY: Sym = Sym::new(c"cuMemGetAllocationGranularity");
    pub static ALLOC: Sym = Sym::new(c"cuMemAlloc_v2");
    pub static FREE: Sym = Sym::new(c"cuMemFree_v2");
    pub static COPY_DTOD: Sym = Sym::new(c"cuMemcpyDtoD_v2");
    pub static COPY_HTOD: Sym = Sym::new(c"cuMemcpyHtoD_v2");
    pub static COPY_DTOH: Sym = Sym::new(c"cuMemcpyDtoH_v2");
    pub static COPY_HTOD_ASYNC: Sym = Sym::new(c"cuMemcpyHtoDAsync_v2");
    pub static COPY_DTOH_ASYNC: Sym = Sym::new(c"cuMemcpyDtoHAsync_v2");
    pub static SYNCHRONIZE: Sym = Sym::new(c"cuCtxSynchronize");
    pub static STREAM_CREATE: Sym = Sym::new(c"cuStreamCreate");
    pub static STREAM_SYNCHRONIZE: Sym = Sym::new(c"cuStreamSynchronize");
    pub static HOST_ALLOC: Sym = Sym::new(c"cuMemHostAlloc");
    pub static FREE_HOST: Sym = Sym::new(c"cuMemFreeHost");
}

/// `CUmemAllocationProp`, pinned device memory on one device.
#[repr(C)]
struct AllocationProp {
    kind: c_uint,
    handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
    win32: *mut c_void,
    compression: u8,
    rdma: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct AccessDesc {
    location_type: c_uint,
    location_id: c_int,
    flags: c_uint,
}

use ctx::driver::{mem_access_flags, mem_allocation_type, mem_location_type};

const ALLOCATION_TYPE_PINNED: c_uint = mem_allocation_type::PINNED;
const LOCATION_TYPE_DEVICE: c_uint = mem_location_type::DEVICE;
const ACCESS_READ_WRITE: c_uint = mem_access_flags::READWRITE;

/// A driver call's result as ctx's error.
pub fn check(op: &'static str, result: Option<CuResult>) -> Result<()> {
    match result {
        Some(SUCCESS) => Ok(()),
        Some(code) => Err(Error::Driver {
            op,
            code: DriverCode(code as u32),
            detail: String::new(),
        }),
        None => Err(Error::Driver {
            op,
            code: DriverCode::NOT_FOUND,
            detail: "the driver lacks this entry point".into(),
        }),
    }
}

/// Call `$sym` with the given signature and arguments, as a ctx result.
macro_rules! driver {
    ($op:literal, $sym:expr, fn($($ty:ty),*) $(, $arg:expr)*) => {
        check($op, call_driver!($sym, fn($($ty),*) $(, $arg)*))
    };
}
pub(crate) use driver;

/// One physical handle of the pool's.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    /// The driver's handle; 0 while paused.
    pub driver: u64,
    /// Bytes.
    pub size: u64,
    /// Where it is mapped (kept while paused: where it goes back).
    pub mapped_at: Option<u64>,
    /// Access granted there.
    pub granted: bool,
}

/// The device the pool runs on, through the real driver.
#[derive(Debug)]
pub struct DriverDevice {
    ordinal: c_int,
    granularity: u64,
    /// By [`PhysicalHandle::raw`]; `None` for a number given back.
    pub slots: Vec<Option<Slot>>,
    free_numbers: Vec<usize>,
}

impl DriverDevice {
    /// The device `ordinal`, with the current context current.
    pub fn new(ordinal: c_int) -> Result<Self> {
        let prop = Self::prop(ordinal);
        let mut granularity = 0usize;
        driver!(
            "cuMemGetAllocationGranularity",
            sym::GRANULARITY,
            fn(*mut usize, *const AllocationProp, c_int),
            &mut granularity,
            &prop,
            0
        )?;
        Ok(Self {
            ordinal,
            granularity: granularity as u64,
            slots: Vec::new(),
            free_numbers: Vec::new(),
        })
    }

    fn prop(ordinal: c_int) -> AllocationProp {
        AllocationProp {
            kind: ALLOCATION_TYPE_PINNED,
            handle_types: 0,
            location_type: LOCATION_TYPE_DEVICE,
            location_id: ordinal,
            win32: std::ptr::null_mut(),
            compression: 0,
            rdma: 0,
            usage: 0,
            reserved: [0; 4],
        }
    }

    fn slot(&mut self, handle: PhysicalHandle) -> Result<&mut Slot> {
        self.slots
            .get_mut(handle.raw() as usize)
            .and_then(Option::as_mut)
            .ok_or(Error::Driver {
                op: "pool handle",
                code: DriverCode::INVALID_HANDLE,
                detail: String::new(),
            })
    }

    /// `cuMemCreate` of `size` bytes on this device.
    pub fn create_driver_handle(&self, size: u64) -> Result<u64> {
        let prop = Self::prop(self.ordinal);
        let mut handle = 0u64;
        driver!(
            "cuMemCreate",
            sym::CREATE,
            fn(*mut u64, usize, *const AllocationProp, u64),
            &mut handle,
            size as usize,
            &prop,
            0
        )?;
        Ok(handle)
    }

    /// `cuMemMap` of a whole handle at `addr`, then access for this device.
    pub fn map_and_grant(&self, driver: u64, addr: u64, size: u64) -> Result<()> {
        driver!(
            "cuMemMap",
            sym::MAP,
            fn(u64, usize, usize, u64, u64),
            addr,
            size as usize,
            0,
            driver,
            0
        )?;
        if let Err(error) = self.grant(addr, size, self.ordinal) {
            let _ = unmap(addr, size);
            return Err(error);
        }
        Ok(())
    }

    fn grant(&self, addr: u64, size: u64, ordinal: c_int) -> Result<()> {
        let desc = AccessDesc {
            location_type: LOCATION_TYPE_DEVICE,
            location_id: ordinal,
            flags: ACCESS_READ_WRITE,
        };
        driver!(
            "cuMemSetAccess",
            sym::SET_ACCESS,
            fn(u64, usize, *const AccessDesc, usize),
            addr,
            size as usize,
            &desc,
            1
        )
    }

    /// `cuMemUnmap` and `cuMemRelease`.
    pub fn unmap_and_release(&self, driver: u64, addr: u64, size: u64) -> Result<()> {
        unmap(addr, size)?;
        driver!("cuMemRelease", sym::RELEASE, fn(u64), driver)
    }
}

/// `cuMemUnmap` of `[addr, +size)`.
fn unmap(addr: u64, size: u64) -> Result<()> {
    driver!(
        "cuMemUnmap",
        sym::UNMAP,
        fn(u64, usize),
        addr,
        size as usize
    )
}

impl DeviceMemory for DriverDevice {
    fn name(&self) -> String {
        format!("device {}", self.ordinal)
    }

    fn ordinal(&self) -> u32 {
        self.ordinal.max(0) as u32
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn supports_vmm(&self) -> bool {
        true
    }

    fn reserve(&mut self, size: u64) -> Result<u64> {
        let mut base = 0u64;
        driver!(
            "cuMemAddressReserve",
            sym::ADDRESS_RESERVE,
            fn(*mut u64, usize, usize, u64, u64),
            &mut base,
            size as usize,
            0,
            0,
            0
        )?;
        Ok(base)
    }

    fn release(&mut self, base: u64, size: u64) -> Result<()> {
        driver!(
            "cuMemAddressFree",
            sym::ADDRESS_FREE,
            fn(u64, usize),
            base,
            size as usize
        )
    }

    fn create_physical(&mut self, size: u64) -> Result<PhysicalHandle> {
        let driver = self.create_driver_handle(size)?;
        let slot = Slot {
            driver,
            size,
            mapped_at: None,
            granted: false,
        };
        let number = match self.free_numbers.pop() {
            Some(number) => {
                self.slots[number] = Some(slot);
                number
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        Ok(PhysicalHandle::from_raw(number as u64))
    }

    fn map_physical(&mut self, handle: PhysicalHandle, addr: u64) -> Result<()> {
        let slot = *self.slot(handle)?;
        driver!(
            "cuMemMap",
            sym::MAP,
            fn(u64, usize, usize, u64, u64),
            addr,
            slot.size as usize,
            0,
            slot.driver,
            0
        )?;
        let slot = self.slot(handle)?;
        slot.mapped_at = Some(addr);
        slot.granted = false;
        Ok(())
    }

    fn grant_access(&mut self, addr: u64, size: u64, devices: PeerSet) -> Result<()> {
        if devices.is_empty() {
            return check(
                "cuMemSetAccess",
                Some(DriverCode::INVALID_VALUE.0 as CuResult),
            );
        }
        for ordinal in devices.iter() {
            self.grant(addr, size, ordinal as c_int)?;
        }
        for slot in self.slots.iter_mut().flatten() {
            if let Some(at) = slot.mapped_at
                && at >= addr
                && at < addr + size
            {
                slot.granted = true;
            }
        }
        Ok(())
    }

    fn unmap_physical(&mut self, addr: u64, size: u64) -> Result<()> {
        unmap(addr, size)?;
        for slot in self.slots.iter_mut().flatten() {
            if slot.mapped_at == Some(addr) {
                slot.mapped_at = None;
                slot.granted = false;
            }
        }
        Ok(())
    }

    fn release_physical(&mut self, handle: PhysicalHandle) -> Result<()> {
        let slot = *self.slot(handle)?;
        driver!("cuMemRelease", sym::RELEASE, fn(u64), slot.driver)?;
        self.slots[handle.raw() as usize] = None;
        self.free_numbers.push(handle.raw() as usize);
        Ok(())
    }

    fn alloc_chunk(&mut self, size: u64) -> Result<u64> {
        let mut ptr = 0u64;
        driver!(
            "cuMemAlloc_v2",
            sym::ALLOC,
            fn(*mut u64, usize),
            &mut ptr,
            size as usize
        )?;
        Ok(ptr)
    }

    fn free_chunk(&mut self, addr: u64, _size: u64) -> Result<()> {
        driver!("cuMemFree_v2", sym::FREE, fn(u64), addr)
    }

    fn copy_within(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        driver!(
            "cuMemcpyDtoD_v2",
            sym::COPY_DTOD,
            fn(u64, u64, usize),
            dst,
            src,
            len as usize
        )
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<()> {
        driver!(
            "cuMemcpyHtoD_v2",
            sym::COPY_HTOD,
            fn(u64, *const c_void, usize),
            dst,
            data.as_ptr().cast(),
            data.len()
        )
    }

    fn read(&mut self, src: u64, out: &mut [u8]) -> Result<()> {
        driver!(
            "cuMemcpyDtoH_v2",
            sym::COPY_DTOH,
            fn(*mut c_void, u64, usize),
            out.as_mut_ptr().cast(),
            src,
            out.len()
        )
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let (free, total) = crate::driver::read::mem_info().ok_or(Error::Driver {
            op: "cuMemGetInfo",
            code: DriverCode::INVALID_VALUE,
            detail: String::new(),
        })?;
        Ok(MemInfo { free, total })
    }

    fn synchronize(&mut self) -> Result<()> {
        driver!("cuCtxSynchronize", sym::SYNCHRONIZE, fn())
    }
}
