//! The CUDA backend (feature `cuda`): the only code in the workspace that calls the
//! driver, and the only `unsafe` code; every unsafe block says why it is sound.
//!
//! - [`CudaContext`]: a device's primary context: what the device is
//!   ([`CudaContext::profile`]), its limits, its memory figures, modules and kernels
//!   ([`CudaContext::load_ptx`], [`Function::launch`]).
//! - [`CudaDevice`]: [`crate::DeviceMemory`] on the GPU, so a [`crate::Pool`] runs on it
//!   (VMM growth when the device has it, `cuMemAlloc` chunks otherwise; a compaction's
//!   copies queued as one batch, independent moves copied by one kernel launch), its
//!   copies counted and timed ([`CopyCalls`]; the pools count the VMM calls,
//!   [`crate::DriverCalls`]).
//! - Measurements ([`CudaContext::measure`] and friends): what a step costs in device
//!   memory, the largest block one allocation can get.
//! - Events on streams other code made ([`Event`], [`ForeignStream`]): how an allocator
//!   behind PyTorch tells when work queued before a free has completed.
//! - Baselines ([`CudaContext::mem_alloc`], [`CudaContext::mem_alloc_async`]): the
//!   driver's own allocators, for benchmarks against the pool.
//!
//! It links `libcuda` through `cust` (its `cust_raw` build script finds the library).
//! Machines without CUDA build and link against the stub library `cargo xtask` makes
//! (`xtask/src/stub.rs`); a binary built that way loads the real driver where there is
//! one.
//!
//! ```no_run
//! use ctx::{CudaContext, CudaDevice};
//! use ctx::{Pool, PoolConfig};
//!
//! let context = CudaContext::new(0)?;
//! println!("{:?}\n{:?}", context.profile()?, context.limits()?);
//! let pool = Pool::new(CudaDevice::new(&context)?, PoolConfig::vmm(64 << 30))?;
//! let block = pool.allocate(1 << 20, 256, None)?;
//! pool.write(block, 0, b"hello")?;
//! println!("block at {:#x}, {:?}", pool.device_ptr(block)?, context.mem_info()?);
//! # Ok::<(), ctx::Error>(())
//! ```

mod baseline;
mod context;
mod copy_queue;
mod device;
mod driver;
mod event;
mod measure;
mod module;
mod stream;

pub use context::{CudaContext, Limit};
pub use copy_queue::CopyCalls;
pub use device::CudaDevice;
pub use event::{Event, ForeignStream};
pub use measure::{LargestAllocation, MemoryDelta};
pub use module::{Function, FunctionAttributes, LaunchConfig, Module};
pub use stream::Stream;

// The binding's numbers are the ones `crate::driver` declares for the code
// that speaks to the driver without it.
const _: () = {
    use cust::sys::{
        CUdevice_attribute as D, CUfunction_attribute as F, CUlimit as L, CUmemPool_attribute as P,
        cudaError_enum as R,
    };

    use crate::driver::{device_attribute, function_attribute, limit, mempool_attribute, result};

    assert!(R::CUDA_SUCCESS as i32 == crate::driver::SUCCESS);
    assert!(R::CUDA_ERROR_OUT_OF_MEMORY as i32 == result::OUT_OF_MEMORY);
    assert!(R::CUDA_ERROR_NOT_FOUND as i32 == result::NOT_FOUND);
    assert!(R::CUDA_ERROR_NOT_SUPPORTED as i32 == result::NOT_SUPPORTED);
    assert!(L::CU_LIMIT_STACK_SIZE as u32 == limit::STACK_SIZE);
    assert!(L::CU_LIMIT_PRINTF_FIFO_SIZE as u32 == limit::PRINTF_FIFO_SIZE);
    assert!(L::CU_LIMIT_MALLOC_HEAP_SIZE as u32 == limit::MALLOC_HEAP_SIZE);
    assert!(
        D::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32
            == device_attribute::MULTIPROCESSOR_COUNT
    );
    assert!(
        D::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR as i32
            == device_attribute::MAX_THREADS_PER_MULTIPROCESSOR
    );
    assert!(
        D::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED as i32
            == device_attribute::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    );
    assert!(F::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES as i32 == function_attribute::LOCAL_SIZE_BYTES);
    assert!(
        P::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT as i32 == mempool_attribute::RESERVED_MEM_CURRENT
    );
};
