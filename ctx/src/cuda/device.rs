//! [`CudaDevice`]: the pool's [`DeviceMemory`] on a real GPU.
//!
//! Growth through the virtual memory management API when the device has it (reserve
//! address space once, back it with physical pages as the pool grows, give pages back
//! when it shrinks), plain `cuMemAlloc` chunks otherwise. All work runs on the legacy
//! default stream of the context, so copies are ordered with each other and with host
//! transfers; how batches of copies are done is [`super::copy_queue`]'s.
//!
//! Every VMM driver call is counted and timed ([`CudaDevice::vmm_calls`]), so a
//! benchmark can tell where the time of a growth goes.

use cust::sys::{
    CUdevice, CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType,
};

use super::{
    CudaContext,
    context::device_handle,
    copy_queue::{CopyCalls, CopyQueue},
    driver::{self, check},
};
use crate::address_space::{self, AddressSpace, invalid_value};
use crate::{DeviceMemory, Error, MemInfo, PeerSet, PhysicalHandle, Result, VmmCalls};
use kernels::moves::BlockMove;
use std::collections::HashMap;

/// The page a pool rounds chunks to when the device has no VMM, bytes.
const CHUNK_GRANULARITY: u64 = 2 << 20;

/// What backs a range of device addresses this device handed out.
#[derive(Debug)]
struct Backing {
    /// Bytes.
    size: u64,
    /// The physical allocation behind a VMM mapping; `None` for a `cuMemAlloc` chunk.
    handle: Option<CUmemGenericAllocationHandle>,
    /// Whether the handle is one of `create_physical`'s, mapped by `map_physical`:
    /// unmapping such a mapping keeps the handle.
    stitched: bool,
}

impl address_space::Backing for Backing {
    fn size(&self) -> u64 {
        self.size
    }
}

/// Device memory of one CUDA device for a [`crate::Pool`].
///
/// It tracks every reservation, mapping and chunk it made, refuses accesses outside
/// them ([`Error::InvalidAddress`]) and gives everything back on drop.
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
    vmm_calls: VmmCalls,
    /// Peers `cuDeviceCanAccessPeer` has said reach this device's memory.
    reachable_peers: PeerSet,
    /// Handles made by `create_physical`, with their bytes and whether they are mapped.
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

fn to_usize(op: &'static str, bytes: u64) -> Result<usize> {
    usize::try_from(bytes)
        .map_err(|_| invalid_value(op, format!("{bytes} bytes do not fit in size_t")))
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
            space: AddressSpace::default(),
            copies: CopyQueue::new(context),
            vmm_calls: VmmCalls::default(),
            reachable_peers: PeerSet::NONE,
            physical: HashMap::new(),
            shareable,
        })
    }

    /// The context this device works in.
    pub fn context(&self) -> &CudaContext {
        &self.context
    }

    /// The VMM driver calls made so far, with their host time.
    pub fn vmm_calls(&self) -> VmmCalls {
        self.vmm_calls
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
    pub fn move_kernel_error(&self) -> Option<&str> {
        self.copies.kernel_error()
    }

    /// `Ok` when every byte of `[addr, addr + len)` lies in mappings or chunks this
    /// device made, so the driver is only ever handed memory we own.
    fn check_backed(&self, addr: u64, len: u64) -> Result<()> {
        self.space.check_backed(addr, len)
    }

    /// `Ok` if `[addr, +size)` is a run of whole `map_physical` mappings.
    fn check_stitched_run(&self, op: &'static str, addr: u64, size: u64) -> Result<()> {
        let end = addr.saturating_add(size);
        let mut cursor = addr;
        while cursor < end {
            match self.space.backings().get(&cursor) {
                Some(b) if b.stitched && cursor + b.size <= end => cursor += b.size,
                _ => break,
            }
        }
        if size == 0 || cursor != end {
            return Err(invalid_value(
                op,
                format!("[{addr:#x}, +{size}) is not a run of whole handle mappings"),
            ));
        }
        Ok(())
    }

    /// Unmaps and releases one mapping we made, after the device has finished with it.
    fn drop_mapping(
        calls: &mut VmmCalls,
        address: u64,
        size: u64,
        handle: CUmemGenericAllocationHandle,
    ) -> Result<()> {
        let bytes = to_usize("cuMemUnmap", size)?;
        let code = calls.unmap.record(size, || {
            // SAFETY: `[address, +size)` is exactly one mapping made by `map`, and the
            // caller synchronized so no queued work still touches it.
            unsafe { driver::cuMemUnmap(address, bytes) }
        });
        check("cuMemUnmap", code)?;
        let code = calls.release.record(size, || {
            // SAFETY: `handle` came from cuMemCreate and is now mapped nowhere.
            unsafe { driver::cuMemRelease(handle) }
        });
        check("cuMemRelease", code)
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
        self.context.bind()?;
        let mut base: CUdeviceptr = 0;
        let bytes = to_usize("reserve", size)?;
        let code = self.vmm_calls.reserve.record(size, || {
            // SAFETY: `base` is a valid out-pointer; alignment 0 and fixed address 0 let
            // the driver choose a granularity-aligned range; flags must be 0.
            unsafe { driver::cuMemAddressReserve(&mut base, bytes, 0, 0, 0) }
        });
        check("cuMemAddressReserve", code)?;
        self.space.reservations.insert(base, size);
        Ok(base)
    }

    fn release(&mut self, base: u64, size: u64) -> Result<()> {
        self.space.check_release(base, size)?;
        self.context.bind()?;
        // SAFETY: `[base, +size)` is exactly a reservation we made and nothing in it is
        // mapped any more.
        check("cuMemAddressFree", unsafe {
            driver::cuMemAddressFree(base, to_usize("release", size)?)
        })?;
        self.space.reservations.remove(&base);
        Ok(())
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<()> {
        self.space.check_map(addr, size, self.granularity)?;
        let bytes = to_usize("map", size)?;
        self.context.bind()?;
        let device = self.context.raw_device();
        let prop = allocation_prop(device, self.shareable);
        let mut handle: CUmemGenericAllocationHandle = 0;
        let code = self.vmm_calls.create.record(size, || {
            // SAFETY: `handle` is a valid out-pointer, `prop` a fully initialised
            // description outliving the call, `bytes` a multiple of the granularity;
            // flags must be 0.
            unsafe { driver::cuMemCreate(&mut handle, bytes, &prop, 0) }
        });
        check("cuMemCreate", code)?;
        let code = self.vmm_calls.map.record(size, || {
            // SAFETY: `[addr, +bytes)` lies in a reservation of ours and nothing is
            // mapped there (checked above); `handle` is exactly `bytes` long; offset and
            // flags 0.
            unsafe { driver::cuMemMap(addr, bytes, 0, handle, 0) }
        });
        let mapped = check("cuMemMap", code);
        if let Err(error) = mapped {
            // SAFETY: `handle` is ours and mapped nowhere. The map error is the one to report.
            let _ = unsafe { driver::cuMemRelease(handle) };
            return Err(error);
        }
        let access = read_write_access(device);
        let code = self.vmm_calls.set_access.record(size, || {
            // SAFETY: `[addr, +bytes)` is fully mapped (just now); one descriptor, which
            // outlives the call.
            unsafe { driver::cuMemSetAccess(addr, bytes, &access, 1) }
        });
        let accessible = check("cuMemSetAccess", code);
        if let Err(error) = accessible {
            // Nothing can have used the range yet, so no synchronization is needed; the
            // access error is the one to report.
            let _ = Self::drop_mapping(&mut self.vmm_calls, addr, size, handle);
            return Err(error);
        }
        self.space.add_backing(
            addr,
            Backing {
                size,
                handle: Some(handle),
                stitched: false,
            },
        );
        Ok(())
    }

    /// One `cuMemSetAccess` with a descriptor per peer, counted in
    /// [`VmmCalls::set_access`] with the device's own grants.
    fn set_access(&mut self, addr: u64, size: u64, peers: PeerSet) -> Result<()> {
        if self
            .space
            .whole_run(addr, size, |b| b.handle.is_some())
            .is_none()
        {
            return Err(invalid_value(
                "set_access",
                format!("[{addr:#x}, +{size}) is not a run of whole mappings"),
            ));
        }
        let own = self.context.ordinal();
        let mut access = Vec::new();
        for peer in peers.without(own).iter() {
            if !self.reachable_peers.contains(peer) {
                let reachable =
                    CudaContext::can_access_peer(peer, own).map_err(|_| Error::PeerAccess {
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
            }
            access.push(CUmemAccessDesc {
                location: CUmemLocation {
                    type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: device_handle(peer)?,
                },
                flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            });
        }
        if access.is_empty() {
            return Ok(());
        }
        let bytes = to_usize("set_access", size)?;
        self.context.bind()?;
        let code = self.vmm_calls.set_access.record(size, || {
            // SAFETY: `[addr, +bytes)` is a run of whole mappings of ours (checked
            // above); `access` holds `access.len()` initialised descriptors and outlives
            // the call.
            unsafe { driver::cuMemSetAccess(addr, bytes, access.as_ptr(), access.len()) }
        });
        check("cuMemSetAccess", code)
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        let end = addr.saturating_add(size);
        let mut cursor = addr;
        let mut run = Vec::new();
        while cursor < end {
            match self.space.backings().get(&cursor) {
                Some(Backing {
                    size: piece,
                    handle: Some(handle),
                    stitched: false,
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
            Self::drop_mapping(&mut self.vmm_calls, start, piece, handle)?;
            self.space.remove_backing(start);
        }
        Ok(())
    }

    fn alloc_chunk(&mut self, size: u64) -> Result<u64> {
        if size == 0 {
            return Err(invalid_value("alloc_chunk", "zero bytes"));
        }
        let bytes = to_usize("alloc_chunk", size)?;
        self.context.bind()?;
        let mut address: CUdeviceptr = 0;
        // SAFETY: `address` is a valid out-pointer; the context is current.
        check("cuMemAlloc", unsafe {
            driver::cuMemAlloc_v2(&mut address, bytes)
        })?;
        self.space.add_backing(
            address,
            Backing {
                size,
                handle: None,
                stitched: false,
            },
        );
        Ok(address)
    }

    fn free_chunk(&mut self, addr: u64, size: u64) -> Result<()> {
        match self.space.backings().get(&addr) {
            Some(Backing {
                size: chunk,
                handle: None,
                ..
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
        let bytes = to_usize("create_physical", size)?;
        self.context.bind()?;
        let prop = allocation_prop(self.context.raw_device(), self.shareable);
        let mut handle: CUmemGenericAllocationHandle = 0;
        let code = self.vmm_calls.create.record(size, || {
            // SAFETY: `handle` is a valid out-pointer, `prop` a fully initialised
            // description outliving the call, `bytes` a multiple of the granularity;
            // flags must be 0.
            unsafe { driver::cuMemCreate(&mut handle, bytes, &prop, 0) }
        });
        check("cuMemCreate", code)?;
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
        self.space.check_map(addr, size, self.granularity)?;
        let bytes = to_usize("map_physical", size)?;
        self.context.bind()?;
        let code = self.vmm_calls.map.record(size, || {
            // SAFETY: `[addr, +bytes)` lies in a reservation of ours with nothing mapped
            // there (checked above); the handle is ours, mapped nowhere and exactly
            // `bytes` long; offset and flags 0.
            unsafe { driver::cuMemMap(addr, bytes, 0, handle.0, 0) }
        });
        check("cuMemMap", code)?;
        self.physical.insert(handle.0, (size, true));
        self.space.add_backing(
            addr,
            Backing {
                size,
                handle: Some(handle.0),
                stitched: true,
            },
        );
        Ok(())
    }

    fn grant_access(&mut self, addr: u64, size: u64) -> Result<()> {
        self.check_stitched_run("grant_access", addr, size)?;
        let bytes = to_usize("grant_access", size)?;
        self.context.bind()?;
        let access = read_write_access(self.context.raw_device());
        let code = self.vmm_calls.set_access.record(size, || {
            // SAFETY: `[addr, +bytes)` is a run of whole mappings of ours (checked
            // above); one descriptor, which outlives the call.
            unsafe { driver::cuMemSetAccess(addr, bytes, &access, 1) }
        });
        check("cuMemSetAccess", code)
    }

    fn unmap_physical(&mut self, addr: u64, size: u64) -> Result<()> {
        let handle = match self.space.backings().get(&addr) {
            Some(Backing {
                size: mapped,
                handle: Some(handle),
                stitched: true,
            }) if *mapped == size => *handle,
            _ => {
                return Err(invalid_value(
                    "unmap_physical",
                    format!("[{addr:#x}, +{size}) is not one handle's mapping"),
                ));
            }
        };
        // Copies into or out of the range may still be queued.
        self.synchronize()?;
        let bytes = to_usize("unmap_physical", size)?;
        let code = self.vmm_calls.unmap.record(size, || {
            // SAFETY: `[addr, +bytes)` is exactly one mapping made by `map_physical`,
            // and no queued work touches it any more.
            unsafe { driver::cuMemUnmap(addr, bytes) }
        });
        check("cuMemUnmap", code)?;
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
        let size = self.physical[&handle.0].0;
        let code = self.vmm_calls.release.record(size, || {
            // SAFETY: the handle came from cuMemCreate and is mapped nowhere.
            unsafe { driver::cuMemRelease(handle.0) }
        });
        check("cuMemRelease", code)?;
        self.physical.remove(&handle.0);
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
                Some(_) if backing.stitched => {
                    // SAFETY: one mapping made by `map_physical`; the device is idle. Its
                    // handle is released below.
                    let _ = unsafe { driver::cuMemUnmap(address, backing.size as usize) };
                }
                Some(handle) => {
                    let _ = Self::drop_mapping(&mut self.vmm_calls, address, backing.size, handle);
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
