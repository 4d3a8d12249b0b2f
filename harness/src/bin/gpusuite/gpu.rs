//! The GPU as the sections use it: a context, device buffers for counters,
//! and the pattern kernels that fill memory and count the bytes that changed.

use anyhow::{Context as _, Result};
use ctx::DeviceMemory as _;
use ctx::{CudaContext, CudaDevice, LaunchConfig, Module};
use kernels::LaunchShape;
use kernels::pattern::{self, PatternParams};

/// One device's context with the pattern module loaded.
pub struct Gpu {
    pub context: CudaContext,
    /// Buffers the suite itself needs (counters, copy targets), as
    /// `cuMemAlloc` chunks.
    pub memory: CudaDevice,
    pattern: Module,
    /// A `u64` on the device that [`pattern::VERIFY`] adds to.
    mismatch_counter: u64,
}

/// Launches `name` from `module` with one thread per `threads`, passing
/// `params` (the bytes of the kernel's parameter struct).
pub fn launch(module: &Module, name: &str, threads: u64, params: &[u8]) -> Result<()> {
    let shape = LaunchShape::covering(threads);
    module
        .function(name)?
        .launch(&LaunchConfig::linear(shape.grid, shape.block), params, None)
        .with_context(|| format!("launching {name}"))
}

impl Gpu {
    /// Retains device 0's primary context (a fresh one if no other handle
    /// to it is alive) and loads the pattern module.
    pub fn open() -> Result<Self> {
        let context = CudaContext::new(0).context("opening CUDA device 0")?;
        Self::with_context(context)
    }

    /// The same on a context the caller already holds (for sections that
    /// measure memory before anything is loaded).
    pub fn with_context(context: CudaContext) -> Result<Self> {
        let mut memory = CudaDevice::new(&context)?;
        let pattern = context.load_ptx(pattern::MODULE.name, pattern::MODULE.ptx)?;
        let mismatch_counter = memory.alloc_chunk(8)?;
        Ok(Self {
            context,
            memory,
            pattern,
            mismatch_counter,
        })
    }

    /// Loads one of the kernels crate's modules.
    pub fn load(&self, module: &kernels::Module) -> Result<Module> {
        Ok(self.context.load_ptx(module.name, module.ptx)?)
    }

    /// Queues a fill of `len` bytes at `dst` with the pattern of `seed`.
    pub fn fill(&self, dst: u64, len: u64, seed: u64) -> Result<()> {
        let params = PatternParams {
            dst,
            len,
            seed,
            ..PatternParams::default()
        };
        let threads = pattern::launch_shape(len).threads();
        launch(
            &self.pattern,
            pattern::FILL.name(),
            threads,
            pattern::FILL.param_bytes(&params),
        )
    }

    /// Bytes of the ranges `(address, len, seed)` that differ from their
    /// patterns, counted on the device; waits for the device.
    pub fn mismatches(&mut self, ranges: &[(u64, u64, u64)]) -> Result<u64> {
        self.memory
            .write(self.mismatch_counter, &0u64.to_le_bytes())?;
        for &(dst, len, seed) in ranges {
            let params = PatternParams {
                dst,
                len,
                seed,
                mismatches: self.mismatch_counter,
                unused: 0,
            };
            let threads = pattern::launch_shape(len).threads();
            launch(
                &self.pattern,
                pattern::VERIFY.name(),
                threads,
                pattern::VERIFY.param_bytes(&params),
            )?;
        }
        self.context.synchronize()?;
        let mut bytes = [0u8; 8];
        self.memory.read(self.mismatch_counter, &mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    /// Free device memory now, bytes.
    pub fn free_bytes(&self) -> Result<u64> {
        Ok(self.context.mem_info()?.free)
    }
}

/// A deterministic pseudo-random sequence (SplitMix64, the pattern's own
/// generator), so a failing run can be repeated exactly.
pub struct Rng {
    seed: u64,
    next: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self { seed, next: 0 }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.next += 1;
        pattern::word(self.seed, self.next - 1)
    }

    /// Uniform in `0..n` (n > 0), up to a negligible bias.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Log-uniform in `[1, max]` bytes: small sizes as likely per octave as
    /// large ones.
    pub fn size(&mut self, max: u64) -> u64 {
        let octaves = u64::from(64 - max.leading_zeros());
        let top = 1u64 << self.below(octaves);
        (top + self.below(top)).clamp(1, max)
    }
}
