//! [`CudaDevice`]: the pool's [`DeviceMemory`] on a real GPU.
//!
//! Growth through the virtual memory management API when the device has it (reserve
//! address space once, back it with physical pages as the pool grows, give pages back
//! when it shrinks), plain `cuMemAlloc` chunks otherwise. All work runs on the legacy
//! default stream of the context, so copies are ordered with each other and with host
//! transfers.

use std::collections::BTreeMap;

use cust::sys::{
    CUdevice, CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType,
};

use super::{
    CudaContext,
    copy_plan::{self, CopyStep},
    driver::{self, check},
};
use crate::{DeviceMemory, Error, MemInfo, Result};

/// The page a pool rounds chunks to when the device has no VMM, bytes.
const CHUNK_GRANULARITY: u64 = 2 << 20;

/// The scratch buffer overlapping copies bounce through, bytes (see [`copy_plan`]).
/// At ~3.8 TB/s a piece this size takes about 10 µs, well above a call's overhead.
const SCRATCH_BYTES: u64 = 16 << 20;

/// What backs a range of device addresses this device handed out.
#[derive(Debug)]
struct Backing {
    /// Bytes.
    size: u64,
    /// The physical allocation behind a VMM mapping; `None` for a `cuMemAlloc` chunk.
    handle: Option<CUmemGenericAllocationHandle>,
}

/// Device memory of one CUDA device for a [`crate::Pool`].
///
/// It tracks every reservation, mapping and chunk it made, refuses accesses outside
/// them ([`Error::InvalidAddress`]) and gives everything back on drop.
///
/// Device memory it uses besides what the pool asks for: a 16 MiB scratch buffer,
/// allocated the first time a copy slides a block over itself by a short distance, kept
/// until drop.
#[derive(Debug)]
pub struct CudaDevice {
    context: CudaContext,
    name: String,
    granularity: u64,
    vmm: bool,
    /// Reservation base -> size, bytes.
    reservations: BTreeMap<u64, u64>,
    /// Start address -> mapping or chunk; never overlapping.
    backings: BTreeMap<u64, Backing>,
    /// The bounce buffer for overlapping copies, once allocated.
    scratch: Option<CUdeviceptr>,
}

/// An [`Error::Device`] for a request the driver would refuse, named like the
/// simulated device's so callers see one vocabulary.
fn invalid_value(op: &'static str, detail: String) -> Error {
    Error::Device {
        op,
        detail: format!("CUDA_ERROR_INVALID_VALUE: {detail}"),
    }
}

/// Pinned device memory on `device`, the only kind this backend creates.
fn allocation_prop(device: CUdevice) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: Default::default(),
    }
}

fn to_usize(op: &'static str, bytes: u64) -> Result<usize> {
    usize::try_from(bytes)
        .map_err(|_| invalid_value(op, format!("{bytes} bytes do not fit in size_t")))
}

impl CudaDevice {
    /// Device memory of `context`'s device. Reads whether the device supports VMM and,
    /// if so, its minimum VMM granularity.
    pub fn new(context: &CudaContext) -> Result<Self> {
        context.bind()?;
        let vmm = context.supports_vmm()?;
        let granularity = if vmm {
            let prop = allocation_prop(context.raw_device());
            let mut bytes = 0usize;
            // SAFETY: `bytes` is a valid out-pointer and `prop` a fully initialised
            // allocation description that outlives the call.
            check("cuMemGetAllocationGranularity", unsafe {
                driver::cuMemGetAllocationGranularity(
                    &mut bytes,
                    &prop,
                    CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            })?;
            bytes as u64
        } else {
            CHUNK_GRANULARITY
        };
        let name = format!(
            "{} (CUDA device {})",
            context.device_name()?,
            context.ordinal()
        );
        Ok(CudaDevice {
            context: context.clone(),
            name,
            granularity,
            vmm,
            reservations: BTreeMap::new(),
            backings: BTreeMap::new(),
            scratch: None,
        })
    }

    /// The context this device works in.
    pub fn context(&self) -> &CudaContext {
        &self.context
    }

    /// Whether any backing shares a byte with `[addr, end)`.
    fn overlaps_backing(&self, addr: u64, end: u64) -> bool {
        let before = self
            .backings
            .range(..addr)
            .next_back()
            .is_some_and(|(start, b)| start + b.size > addr);
        before || self.backings.range(addr..end).next().is_some()
    }

    /// `Ok` when every byte of `[addr, addr + len)` lies in mappings or chunks this
    /// device made, so the driver is only ever handed memory we own.
    fn check_backed(&self, addr: u64, len: u64) -> Result<()> {
        let invalid = |why| Error::InvalidAddress { addr, len, why };
        let end = addr
            .checked_add(len)
            .ok_or(invalid("range overflows the address space"))?;
        let mut cursor = addr;
        while cursor < end {
            let (start, backing) = self
                .backings
                .range(..=cursor)
                .next_back()
                .filter(|(start, b)| **start + b.size > cursor)
                .ok_or(invalid("not mapped"))?;
            cursor = start + backing.size;
        }
        Ok(())
    }

    /// The scratch buffer, allocated now if need be; `None` when the device cannot spare
    /// it, in which case overlapping copies go in distance-sized pieces instead.
    fn scratch(&mut self) -> Option<CUdeviceptr> {
        if self.scratch.is_none() {
            let mut address: CUdeviceptr = 0;
            // SAFETY: `address` is a valid out-pointer; the context is current (callers bind).
            let code = unsafe { driver::cuMemAlloc_v2(&mut address, SCRATCH_BYTES as usize) };
            if check("cuMemAlloc", code).is_ok() {
                self.scratch = Some(address);
            }
        }
        self.scratch
    }

    /// One `cuMemcpyDtoD` between ranges that do not overlap.
    fn copy_disjoint(&self, src: u64, dst: u64, len: u64) -> Result<()> {
        let bytes = to_usize("cuMemcpyDtoD", len)?;
        // SAFETY: both ranges were checked to lie in memory this device owns (or are the
        // scratch buffer, which it also owns), and the plan keeps them disjoint.
        check("cuMemcpyDtoD", unsafe {
            driver::cuMemcpyDtoD_v2(dst, src, bytes)
        })
    }

    /// Unmaps and releases one mapping we made, after the device has finished with it.
    fn drop_mapping(address: u64, size: u64, handle: CUmemGenericAllocationHandle) -> Result<()> {
        let bytes = to_usize("cuMemUnmap", size)?;
        // SAFETY: `[address, +size)` is exactly one mapping made by `map`, and the caller
        // synchronized so no queued work still touches it.
        check("cuMemUnmap", unsafe { driver::cuMemUnmap(address, bytes) })?;
        // SAFETY: `handle` came from cuMemCreate and is now mapped nowhere.
        check("cuMemRelease", unsafe { driver::cuMemRelease(handle) })
    }
}

impl DeviceMemory for CudaDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn supports_vmm(&self) -> bool {
        self.vmm
    }

    fn reserve(&mut self, size: u64) -> Result<u64> {
        if !self.vmm {
            return Err(Error::Unsupported(
                "this CUDA device has no virtual memory management",
            ));
        }
        if size == 0 || size % self.granularity != 0 {
            return Err(invalid_value(
                "reserve",
                format!(
                    "size {size} is not a positive multiple of {}",
                    self.granularity
                ),
            ));
        }
        self.context.bind()?;
        let mut base: CUdeviceptr = 0;
        // SAFETY: `base` is a valid out-pointer; alignment 0 and fixed address 0 let the
        // driver choose a granularity-aligned range; flags must be 0.
        check("cuMemAddressReserve", unsafe {
            driver::cuMemAddressReserve(&mut base, to_usize("reserve", size)?, 0, 0, 0)
        })?;
        self.reservations.insert(base, size);
        Ok(base)
    }

    fn release(&mut self, base: u64, size: u64) -> Result<()> {
        if self.reservations.get(&base) != Some(&size) {
            return Err(invalid_value(
                "release",
                format!("no reservation [{base:#x}, +{size})"),
            ));
        }
        if self.overlaps_backing(base, base + size) {
            return Err(invalid_value(
                "release",
                "part of the reservation is still mapped".into(),
            ));
        }
        self.context.bind()?;
        // SAFETY: `[base, +size)` is exactly a reservation we made and nothing in it is
        // mapped any more.
        check("cuMemAddressFree", unsafe {
            driver::cuMemAddressFree(base, to_usize("release", size)?)
        })?;
        self.reservations.remove(&base);
        Ok(())
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<()> {
        let g = self.granularity;
        if size == 0 || size % g != 0 || addr % g != 0 {
            return Err(invalid_value(
                "map",
                format!("[{addr:#x}, +{size}) is not on {g}-byte pages"),
            ));
        }
        let end = addr
            .checked_add(size)
            .ok_or_else(|| invalid_value("map", "range overflows".into()))?;
        let inside = self
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(base, reserved)| end <= base + reserved);
        if !inside {
            return Err(invalid_value(
                "map",
                format!("[{addr:#x}, +{size}) is not inside a reservation"),
            ));
        }
        if self.overlaps_backing(addr, end) {
            return Err(invalid_value(
                "map",
                format!("[{addr:#x}, +{size}) is already mapped"),
            ));
        }
        let bytes = to_usize("map", size)?;
        self.context.bind()?;
        let device = self.context.raw_device();
        let prop = allocation_prop(device);
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer, `prop` a fully initialised description
        // outliving the call, `bytes` a multiple of the granularity; flags must be 0.
        check("cuMemCreate", unsafe {
            driver::cuMemCreate(&mut handle, bytes, &prop, 0)
        })?;
        // SAFETY: `[addr, +bytes)` lies in a reservation of ours and nothing is mapped
        // there (checked above); `handle` is exactly `bytes` long; offset and flags 0.
        let mapped = check("cuMemMap", unsafe {
            driver::cuMemMap(addr, bytes, 0, handle, 0)
        });
        if let Err(error) = mapped {
            // SAFETY: `handle` is ours and mapped nowhere. The map error is the one to report.
            let _ = unsafe { driver::cuMemRelease(handle) };
            return Err(error);
        }
        let access = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `[addr, +bytes)` is fully mapped (just now); one descriptor, which
        // outlives the call.
        let accessible = check("cuMemSetAccess", unsafe {
            driver::cuMemSetAccess(addr, bytes, &access, 1)
        });
        if let Err(error) = accessible {
            // Nothing can have used the range yet, so no synchronization is needed; the
            // access error is the one to report.
            let _ = Self::drop_mapping(addr, size, handle);
            return Err(error);
        }
        self.backings.insert(
            addr,
            Backing {
                size,
                handle: Some(handle),
            },
        );
        Ok(())
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        let end = addr.saturating_add(size);
        let mut cursor = addr;
        let mut run = Vec::new();
        while cursor < end {
            match self.backings.get(&cursor) {
                Some(Backing {
                    size: piece,
                    handle: Some(handle),
                }) if cursor + piece <= end => {
                    run.push((cursor, *piece, *handle));
                    cursor += piece;
                }
                _ => break,
            }
        }
        if size == 0 || cursor != end {
            return Err(invalid_value(
                "unmap",
                format!("[{addr:#x}, +{size}) is not a run of whole mappings"),
            ));
        }
        // Copies into or out of the range may still be queued.
        self.synchronize()?;
        for (start, piece, handle) in run {
            Self::drop_mapping(start, piece, handle)?;
            self.backings.remove(&start);
        }
        Ok(())
    }

    fn alloc_chunk(&mut self, size: u64) -> Result<u64> {
        if size == 0 {
            return Err(invalid_value("alloc_chunk", "zero bytes".into()));
        }
        let bytes = to_usize("alloc_chunk", size)?;
        self.context.bind()?;
        let mut address: CUdeviceptr = 0;
        // SAFETY: `address` is a valid out-pointer; the context is current.
        check("cuMemAlloc", unsafe {
            driver::cuMemAlloc_v2(&mut address, bytes)
        })?;
        self.backings
            .insert(address, Backing { size, handle: None });
        Ok(address)
    }

    fn free_chunk(&mut self, addr: u64, size: u64) -> Result<()> {
        match self.backings.get(&addr) {
            Some(Backing {
                size: chunk,
                handle: None,
            }) if *chunk == size => {}
            _ => {
                return Err(invalid_value(
                    "free_chunk",
                    format!("no chunk [{addr:#x}, +{size})"),
                ));
            }
        }
        // Copies into or out of the chunk may still be queued.
        self.synchronize()?;
        // SAFETY: `addr` is a chunk cuMemAlloc gave us, and no queued work touches it.
        check("cuMemFree", unsafe { driver::cuMemFree_v2(addr) })?;
        self.backings.remove(&addr);
        Ok(())
    }

    fn copy_within(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        self.check_backed(src, len)?;
        self.check_backed(dst, len)?;
        self.context.bind()?;
        let mut steps = copy_plan::plan(src, dst, len, SCRATCH_BYTES);
        let needs_scratch = steps
            .iter()
            .any(|s| matches!(s, CopyStep::ViaScratch { .. }));
        let scratch = if needs_scratch { self.scratch() } else { None };
        if needs_scratch && scratch.is_none() {
            steps = copy_plan::plan(src, dst, len, 0);
        }
        for step in steps {
            match (step, scratch) {
                (CopyStep::Direct { src, dst, len }, _) => self.copy_disjoint(src, dst, len)?,
                (CopyStep::ViaScratch { src, dst, len }, Some(scratch)) => {
                    self.copy_disjoint(src, scratch, len)?;
                    self.copy_disjoint(scratch, dst, len)?;
                }
                (CopyStep::ViaScratch { .. }, None) => {
                    return Err(Error::Device {
                        op: "copy_within",
                        detail: "copy plan bounces through a scratch buffer that does not exist"
                            .into(),
                    });
                }
            }
        }
        Ok(())
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<()> {
        self.check_backed(dst, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.context.bind()?;
        // SAFETY: `data` is a live host slice of `data.len()` bytes and the destination
        // range lies in device memory this device owns.
        check("cuMemcpyHtoD", unsafe {
            driver::cuMemcpyHtoD_v2(dst, data.as_ptr().cast(), data.len())
        })
    }

    fn read(&mut self, src: u64, out: &mut [u8]) -> Result<()> {
        self.check_backed(src, out.len() as u64)?;
        if out.is_empty() {
            return Ok(());
        }
        self.context.bind()?;
        // SAFETY: `out` is a live, exclusively borrowed host slice of `out.len()` bytes
        // and the source range lies in device memory this device owns.
        check("cuMemcpyDtoH", unsafe {
            driver::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, out.len())
        })
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.context.mem_info()
    }

    fn synchronize(&mut self) -> Result<()> {
        self.context.synchronize()
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; each release below is attempted anyway,
        // and the driver reclaims whatever remains when the context goes.
        if self.context.synchronize().is_err() {
            return;
        }
        for (address, backing) in std::mem::take(&mut self.backings) {
            match backing.handle {
                Some(handle) => {
                    let _ = Self::drop_mapping(address, backing.size, handle);
                }
                None => {
                    // SAFETY: a chunk cuMemAlloc gave us; the device is idle.
                    let _ = unsafe { driver::cuMemFree_v2(address) };
                }
            }
        }
        for (base, size) in std::mem::take(&mut self.reservations) {
            // SAFETY: a reservation we made; every mapping in it was just unmapped.
            let _ = unsafe { driver::cuMemAddressFree(base, size as usize) };
        }
        if let Some(scratch) = self.scratch.take() {
            // SAFETY: the scratch buffer cuMemAlloc gave us; the device is idle.
            let _ = unsafe { driver::cuMemFree_v2(scratch) };
        }
    }
}
