//! The driver's own allocators, as baselines the pool is measured against.
//!
//! `cuMemAlloc`/`cuMemFree` (what `cudaMalloc` does) and the stream-ordered
//! `cuMemAllocAsync`/`cuMemFreeAsync` on the device's default memory pool (what
//! `cudaMallocAsync` does). Addresses are plain `u64`s: the benchmarks time the calls
//! themselves, and a wrong address is refused by the driver, not dereferenced here.

use std::ffi::c_void;

use cust::sys::{CUdeviceptr, CUmemPool_attribute, CUmemoryPool};

use super::{
    CudaContext, Stream,
    driver::{self, check, size_t},
};
use crate::Result;

impl CudaContext {
    /// `cuMemAlloc`: `bytes` of device memory; returns its address.
    pub fn mem_alloc(&self, bytes: u64) -> Result<u64> {
        let size = size_t("cuMemAlloc", bytes)?;
        self.bind()?;
        let mut address: CUdeviceptr = 0;
        // SAFETY: `address` is a valid out-pointer; the context is current.
        check("cuMemAlloc", unsafe {
            driver::cuMemAlloc_v2(&mut address, size)
        })?;
        Ok(address)
    }

    /// `cuMemFree` of an address [`mem_alloc`](Self::mem_alloc) returned.
    pub fn mem_free(&self, address: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: the driver validates the address and refuses one it did not hand out;
        // nothing on the host refers to device memory.
        check("cuMemFree", unsafe { driver::cuMemFree_v2(address) })
    }

    /// Keeps the device's default memory pool from returning memory to the device when
    /// streams synchronize (release threshold `u64::MAX`), so
    /// [`mem_alloc_async`](Self::mem_alloc_async) is measured warm, as a long-running
    /// program would see it.
    pub fn keep_default_pool_warm(&self) -> Result<()> {
        self.bind()?;
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer; the device handle is valid.
        check("cuDeviceGetDefaultMemPool", unsafe {
            driver::cuDeviceGetDefaultMemPool(&mut pool, self.raw_device())
        })?;
        let mut threshold: u64 = u64::MAX;
        // SAFETY: `pool` is the device's live default pool; the release threshold
        // attribute takes a pointer to a cuuint64_t, which `threshold` is.
        check("cuMemPoolSetAttribute", unsafe {
            driver::cuMemPoolSetAttribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast::<c_void>(),
            )
        })
    }

    /// `cuMemAllocAsync`: `bytes` from the default memory pool, ordered on `stream`.
    pub fn mem_alloc_async(&self, bytes: u64, stream: &Stream) -> Result<u64> {
        let size = size_t("cuMemAllocAsync", bytes)?;
        self.bind()?;
        let mut address: CUdeviceptr = 0;
        // SAFETY: `address` is a valid out-pointer; `stream` is a live stream (the
        // driver refuses one of another context).
        check("cuMemAllocAsync", unsafe {
            driver::cuMemAllocAsync(&mut address, size, stream.raw())
        })?;
        Ok(address)
    }

    /// `cuMemFreeAsync` of an address [`mem_alloc_async`](Self::mem_alloc_async)
    /// returned, ordered on `stream`.
    pub fn mem_free_async(&self, address: u64, stream: &Stream) -> Result<()> {
        self.bind()?;
        // SAFETY: the driver validates the address; `stream` is a live stream.
        check("cuMemFreeAsync", unsafe {
            driver::cuMemFreeAsync(address, stream.raw())
        })
    }
}
