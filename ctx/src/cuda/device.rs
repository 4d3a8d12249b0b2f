//! [`CudaDevice`]: the pool's [`DeviceMemory`] on a real GPU.
//!
//! The virtual memory management API's steps when the device has it (reserve address
//! space, create physical memory, map it, grant access, unmap, release), one driver call
//! each, and plain `cuMemAlloc` chunks otherwise; putting the steps together, and counting
//! them, is the pools' shared code above. All work runs on the legacy default stream of
//! the context, so copies are ordered with each other and with host transfers; how batches
//! of copies are done is [`super::copy_queue`]'s.

use cust::sys::{
    CUdevice, CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType,
};

use super::{
    CudaContext,
    context::device_handle,
    copy_queue::{CopyCalls, CopyQueue},
    driver::{self, check, size_t},
};
use crate::address_space::{self, AddressSpace, invalid_value};
use crate::{DeviceMemory, Error, MemInfo, PeerSet, PhysicalHandle, Result};
use kernels::moves::BlockMove;
use std::collections::HashMap;

/// What backs a range of device addresses this device handed out.
#[derive(Debug)]
struct Backing {
    /// Bytes.
    size: u64,
    /// The handle mapped there by `map_physical`; `None` for a `cuMemAlloc` chunk.
    handle: Option<CUmemGenericAllocationHandle>,
}

impl address_space::Backing for Backing {
    fn size(&self) -> u64 {
        self.size
    }
}

/// Device memory of one CUDA device for a [`crate::Pool`].
///
/// It tracks every reservation, handle, mapping and chunk it made, refuses ranges that
/// break the driver's rules before calling it ([`crate::DriverCode::INVALID_VALUE`]) and
/// accesses outside its memory ([`Error::InvalidAddress`]), and gives everything back on
/// drop.
///
/// Device memory it uses besides what the pool asks for: a 16 MiB scratch buffer,
/// allocated the first time a copy slides a block over itself by a short distance, kept
/// until drop; and the `move_blocks` kernel's module, loaded the first time a batch of
/// copies can use it (or by [`CudaDevice::load_move_kernel`]).
#[derive(Debug)]
pub struct CudaDevice {
    context: CudaContext,
    name: String,
    granularity: u64,
    vmm: bool,
    space: AddressSpace<Backing>,
    copies: CopyQueue,
    /// Peers `cuDeviceCanAccessPeer` has said reach this device's memory.
    reachable_peers: PeerSet,
    /// Handles made by `create_physical` and not released, with their bytes and whether
    /// they are mapped (then `space` holds the mapping).
    physical: HashMap<CUmemGenericAllocationHandle, (u64, bool)>,
    /// Whether handles are made exportable ([`CudaDevice::shareable`]).
    shareable: bool,
}

/// Pinned device memory on `device`, the only kind this backend creates;
/// `shareable`: each handle can be exported as a POSIX file descriptor (CUDA IPC).
fn allocation_prop(device: CUdevice, shareable: bool) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: if shareable {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        },
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: Default::default(),
    }
}

impl CudaDevice {
    /// Device memory of `context`'s device. Reads whether the device supports VMM and,
    /// if so, its minimum VMM granularity.
    pub fn new(context: &CudaContext) -> Result<Self> {
        Self::open(context, false)
    }

    /// As [`CudaDevice::new`], every physical handle made exportable as a POSIX file
    /// descriptor (`cuMemExportToShareableHandle`), so another process can map it:
    /// what CUDA IPC of the memory needs.
    pub fn shareable(context: &CudaContext) -> Result<Self> {
        Self::open(context, true)
    }

    fn open(context: &CudaContext, shareable: bool) -> Result<Self> {
        context.bind()?;
        let vmm = context.supports_vmm()?;
        let granularity = if vmm {
            let prop = allocation_prop(context.raw_device(), shareable);
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
            // The page a pool rounds chunks to without VMM.
            memcore::PAGE_BYTES
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
            space: AddressSpace::default(),
            copies: CopyQueue::new(context),
            reachable_peers: PeerSet::NONE,
            physical: HashMap::new(),
            shareable,
        })
    }

    /// The context this device works in.
    pub fn context(&self) -> &CudaContext {
        &self.context
    }

    /// The copies made so far: batches, kernel launches, `cuMemcpyDtoDAsync` calls.
    pub fn copy_calls(&self) -> CopyCalls {
        self.copies.calls()
    }

    /// Loads the `move_blocks` kernel now rather than on the first batch that can use
    /// it: loading compiles its PTX, which a timed compaction should not include.
    /// The error says why the kernel cannot be used; copies then go through
    /// `cuMemcpyDtoDAsync` alone.
    pub fn load_move_kernel(&mut self) -> Result<()> {
        self.context.bind()?;
        self.copies.load_kernel()
    }

    /// Why batches of copies do not use the `move_blocks` kernel, if loading or
    /// launching it failed.
    pub fn move_kernel_error(&self) -> Option<&Error> {
        self.copies.kernel_error()
    }

    /// `Ok` when every byte of `[addr, addr + len)` lies in mappings or chunks this
    /// device made, so the driver is only ever handed memory we own.
    fn check_backed(&self, addr: u64, len: u64) -> Result<()> {
        self.space.check_backed(addr, len)
    }
}

impl DeviceMemory for CudaDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn ordinal(&self) -> u32 {
        self.context.ordinal()
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
        let bytes = size_t("cuMemAddressReserve", size)?;
        self.context.bind()?;
        let mut base: CUdeviceptr = 0;
        // SAFETY: `base` is a valid out-pointer; alignment 0 and fixed address 0 let the
        // driver choose a granularity-aligned range; flags must be 0.
        check("cuMemAddressReserve", unsafe {
            driver::cuMemAddressReserve(&mut base, bytes, 0, 0, 0)
        })?;
        self.space.reservations.insert(base, size);
        Ok(base)
    }

    fn release(&mut self, base: u64, size: u64) -> Result<()> {
        self.space.check_release(base, size)?;
        let bytes = size_t("cuMemAddressFree", size)?;
        self.context.bind()?;
        // SAFETY: `[base, +size)` is exactly a reservation we made and nothing in it is
        // mapped any more.
        check("cuMemAddressFree", unsafe {
            driver::cuMemAddressFree(base, bytes)
        })?;
        self.space.reservations.remove(&base);
        Ok(())
    }

    fn create_physical(&mut self, size: u64) -> Result<PhysicalHandle> {
        if !self.vmm {
            return Err(Error::Unsupported(
                "this CUDA device has no virtual memory management",
            ));
        }
        if size == 0 || size % self.granularity != 0 {
            return Err(invalid_value(
                "create_physical",
                format!(
                    "size {size} is not a positive multiple of {}",
                    self.granularity
                ),
            ));
        }
        let bytes = size_t("cuMemCreate", size)?;
        self.context.bind()?;
        let prop = allocation_prop(self.context.raw_device(), self.shareable);
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer, `prop` a fully initialised description
        // outliving the call, `bytes` a multiple of the granularity; flags must be 0.
        check("cuMemCreate", unsafe {
            driver::cuMemCreate(&mut handle, bytes, &prop, 0)
        })?;
        self.physical.insert(handle, (size, false));
        Ok(PhysicalHandle(handle))
    }

    fn map_physical(&mut self, handle: PhysicalHandle, addr: u64) -> Result<()> {
        let Some(&(size, mapped)) = self.physical.get(&handle.0) else {
            return Err(invalid_value("map_physical", "not a handle of this device"));
        };
        if mapped {
            return Err(invalid_value(
                "map_physical",
                "the handle is mapped already",
            ));
        }
        self.space
            .check_map("map_physical", addr, size, self.granularity)?;
        let bytes = size_t("cuMemMap", size)?;
        self.context.bind()?;
        // SAFETY: `[addr, +bytes)` lies in a reservation of ours with nothing mapped there
        // (checked above); the handle is ours, mapped nowhere and exactly `bytes` long;
        // offset and flags 0.
        check("cuMemMap", unsafe {
            driver::cuMemMap(addr, bytes, 0, handle.0, 0)
        })?;
        self.physical.insert(handle.0, (size, true));
        self.space.add_backing(
            addr,
            Backing {
                size,
                handle: Some(handle.0),
            },
        );
        Ok(())
    }

    /// One `cuMemSetAccess` with a descriptor per device; a peer is asked
    /// `cuDeviceCanAccessPeer` first (once per peer, the answer kept).
    fn grant_access(&mut self, addr: u64, size: u64, devices: PeerSet) -> Result<()> {
        if self
            .space
            .whole_run(addr, size, |b| b.handle.is_some())
            .is_none()
        {
            return Err(invalid_value(
                "grant_access",
                format!("[{addr:#x}, +{size}) is not a run of whole handle mappings"),
            ));
        }
        if devices.is_empty() {
            return Err(invalid_value(
                "grant_access",
                "no device to grant access to",
            ));
        }
        let own = self.context.ordinal();
        let mut access = Vec::with_capacity(devices.len() as usize);
        for device in devices.iter() {
            let id = if device == own {
                self.context.raw_device()
            } else {
                self.check_peer(device)?;
                device_handle(device)?
            };
            access.push(read_write_access(id));
        }
        let bytes = size_t("cuMemSetAccess", size)?;
        self.context.bind()?;
        // SAFETY: `[addr, +bytes)` is a run of whole mappings of ours (checked above);
        // `access` holds `access.len()` initialised descriptors and outlives the call.
        check("cuMemSetAccess", unsafe {
            driver::cuMemSetAccess(addr, bytes, access.as_ptr(), access.len())
        })
    }

    fn unmap_physical(&mut self, addr: u64, size: u64) -> Result<()> {
        let handle = match self.space.backings().get(&addr) {
            Some(Backing {
                size: mapped,
                handle: Some(handle),
            }) if *mapped == size => *handle,
            _ => {
                return Err(invalid_value(
                    "unmap_physical",
                    format!("[{addr:#x}, +{size}) is not one handle's mapping"),
                ));
            }
        };
        let bytes = size_t("cuMemUnmap", size)?;
        // Copies into or out of the range may still be queued.
        self.synchronize()?;
        // SAFETY: `[addr, +bytes)` is exactly one mapping made by `map_physical`, and no
        // queued work touches it any more.
        check("cuMemUnmap", unsafe { driver::cuMemUnmap(addr, bytes) })?;
        self.space.remove_backing(addr);
        self.physical.insert(handle, (size, false));
        Ok(())
    }

    fn release_physical(&mut self, handle: PhysicalHandle) -> Result<()> {
        match self.physical.get(&handle.0) {
            Some(&(_, false)) => {}
            Some(_) => {
                return Err(invalid_value(
                    "release_physical",
                    "the handle is still mapped",
                ));
            }
            None => {
                return Err(invalid_value(
                    "release_physical",
                    "not a handle of this device",
                ));
            }
        }
        self.context.bind()?;
        // SAFETY: the handle came from cuMemCreate and is mapped nowhere.
        check("cuMemRelease", unsafe { driver::cuMemRelease(handle.0) })?;
        self.physical.remove(&handle.0);
        Ok(())
    }

    fn alloc_chunk(&mut self, size: u64) -> Result<u64> {
        if size == 0 {
            return Err(invalid_value("alloc_chunk", "zero bytes"));
        }
        let bytes = size_t("cuMemAlloc", size)?;
        self.context.bind()?;
        let mut address: CUdeviceptr = 0;
        // SAFETY: `address` is a valid out-pointer; the context is current.
        check("cuMemAlloc", unsafe {
            driver::cuMemAlloc_v2(&mut address, bytes)
        })?;
        self.space
            .add_backing(address, Backing { size, handle: None });
        Ok(address)
    }

    fn free_chunk(&mut self, addr: u64, size: u64) -> Result<()> {
        match self.space.backings().get(&addr) {
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
        self.space.remove_backing(addr);
        Ok(())
    }

    fn copy_within(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        self.copy_moves(&[BlockMove { src, dst, len }])
    }

    /// Queues every move on the legacy default stream (runs of independent moves as
    /// one `move_blocks` launch each, the rest as `cuMemcpyDtoDAsync`) and waits once,
    /// at the end, until they are done.
    fn copy_moves(&mut self, moves: &[BlockMove]) -> Result<()> {
        let started = std::time::Instant::now();
        for m in moves {
            self.check_backed(m.src, m.len)?;
            self.check_backed(m.dst, m.len)?;
        }
        self.context.bind()?;
        self.copies.copy(moves, started)
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

impl CudaDevice {
    /// `Ok` if `peer` can reach this device's memory, by `cuDeviceCanAccessPeer` (asked
    /// once per peer); else [`Error::PeerAccess`].
    fn check_peer(&mut self, peer: u32) -> Result<()> {
        if self.reachable_peers.contains(peer) {
            return Ok(());
        }
        let own = self.context.ordinal();
        let reachable = CudaContext::can_access_peer(peer, own).map_err(|_| Error::PeerAccess {
            device: own,
            peer,
            why: "the driver knows no such device",
        })?;
        if !reachable {
            return Err(Error::PeerAccess {
                device: own,
                peer,
                why: "cuDeviceCanAccessPeer says no",
            });
        }
        self.reachable_peers = self.reachable_peers.union(PeerSet::of(&[peer])?);
        Ok(())
    }
}

/// Read-write access for `device`, the one kind of access this backend grants.
fn read_write_access(device: CUdevice) -> CUmemAccessDesc {
    CUmemAccessDesc {
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; each release below is attempted anyway,
        // and the driver reclaims whatever remains when the context goes.
        if self.context.synchronize().is_err() {
            return;
        }
        for (address, backing) in self.space.take_backings() {
            match backing.handle {
                Some(_) => {
                    // SAFETY: one mapping made by `map_physical`; the device is idle. Its
                    // handle is released below.
                    let _ = unsafe { driver::cuMemUnmap(address, backing.size as usize) };
                }
                None => {
                    // SAFETY: a chunk cuMemAlloc gave us; the device is idle.
                    let _ = unsafe { driver::cuMemFree_v2(address) };
                }
            }
        }
        for (handle, _) in self.physical.drain() {
            // SAFETY: a handle from cuMemCreate; its mapping, if any, was just unmapped.
            let _ = unsafe { driver::cuMemRelease(handle) };
        }
        for (base, size) in std::mem::take(&mut self.space.reservations) {
            // SAFETY: a reservation we made; every mapping in it was just unmapped.
            let _ = unsafe { driver::cuMemAddressFree(base, size as usize) };
        }
    }
}
