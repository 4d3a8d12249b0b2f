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
