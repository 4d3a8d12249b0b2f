//! (e) In-kernel malloc/free on the device heap: throughput at a million
//! threads, blocks held across launches, the usable fraction of the heap,
//! fragmentation, and the heap limit freezing after the first malloc launch.

use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use ctx::DeviceMemory as _;
use ctx::{CudaContext, Limit, Module};
use kernels::Kernel;
use kernels::heap::{self, HeapCounters, HeapParams};

use crate::gpu::{Gpu, launch};
use crate::report::Checks;
use memcore::bytes::mib;

const HEAP_BYTES: u64 = 256 << 20;
const THROUGHPUT_THREADS: u32 = 1 << 20;
const THROUGHPUT_SIZES: [u64; 3] = [16, 256, 4096];
const HOLD_THREADS: u32 = 1 << 16;
const HOLD_BYTES: u64 = 1024;
/// Threads of the list kernels; each allocates until NULL or the bound.
const LIST_THREADS: u32 = 4096;
const LIST_BOUND: u32 = 1 << 16;
const EXHAUST_SIZES: [u64; 2] = [4096, 64 << 10];
/// Fragmentation: blocks of 1, 2, 3, 4 KiB; every other one freed; then
/// 8 KiB requests, larger than any single freed block.
const FRAGMENT_UNIT: u64 = 1 << 10;
const FRAGMENT_LARGE: u64 = 8 << 10;

/// Device buffers the heap kernels report into, and the module.
struct HeapRun {
    gpu: Gpu,
    module: Module,
    counters: u64,
    slots: u64,
}

impl HeapRun {
    /// Zeroes the counters, runs `kernel` over `threads` threads, waits, and
    /// returns the counters and the seconds the launch took.
    fn run(
        &mut self,
        kernel: Kernel<HeapParams>,
        threads: u32,
        size: u64,
        max_per_thread: u32,
    ) -> Result<(HeapCounters, f64)> {
        let params = HeapBuffers {
            counters: self.counters,
            slots: self.slots,
        }
        .params(&mut self.gpu, threads, size, max_per_thread, 0x4ea9)?;
        self.gpu.context.synchronize()?;
        let start = Instant::now();
        launch(
            &self.module,
            kernel.name(),
            u64::from(threads),
            kernel.param_bytes(&params),
        )?;
        self.gpu
            .context
            .synchronize()
            .with_context(|| format!("running {}", kernel.name()))?;
        let seconds = start.elapsed().as_secs_f64();
        Ok((read_counters(&mut self.gpu, self.counters)?, seconds))
    }
}

/// Where the heap kernels keep their counters and each thread's blocks.
pub struct HeapBuffers {
    /// A [`HeapCounters`] on the device.
    pub counters: u64,
    /// A slot per thread.
    pub slots: u64,
}

impl HeapBuffers {
    /// Zeroes the counters, and the parameters of a launch of `threads`
    /// threads each asking `size` bytes up to `max_per_thread` times.
    pub fn params(
        &self,
        gpu: &mut Gpu,
        threads: u32,
        size: u64,
        max_per_thread: u32,
        seed: u64,
    ) -> Result<HeapParams> {
        gpu.memory
            .write(self.counters, HeapCounters::default().as_bytes())?;
        Ok(HeapParams {
            counters: self.counters,
            slots: self.slots,
            size,
            threads,
            max_per_thread,
            seed,
        })
    }
}

/// The counters a heap kernel left at `counters`.
pub fn read_counters(gpu: &mut Gpu, counters: u64) -> Result<HeapCounters> {
    let mut bytes = [0u8; HeapCounters::BYTES];
    gpu.memory.read(counters, &mut bytes)?;
    HeapCounters::from_bytes(&bytes).context("counter bytes")
}

fn percent(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

pub fn run(out: &mut Checks) -> Result<()> {
    let context = CudaContext::new(0)?;
    // Before any kernel that calls malloc runs: afterwards it cannot change.
    context.set_limit(Limit::MallocHeapBytes, HEAP_BYTES)?;
    let mut gpu = Gpu::with_context(context)?;
    let module = gpu.load(&heap::MODULE)?;
    let counters = gpu.memory.alloc_chunk(HeapCounters::BYTES as u64)?;
    let slots = gpu.memory.alloc_chunk(u64::from(THROUGHPUT_THREADS) * 8)?;
    let mut run = HeapRun {
        gpu,
        module,
        counters,
        slots,
    };
    out.note(&format!(
        "heap limit {} (read back {})",
        mib(HEAP_BYTES),
        mib(run.gpu.context.limit(Limit::MallocHeapBytes)?)
    ));

    for size in THROUGHPUT_SIZES {
        let (c, seconds) = run.run(heap::MALLOC_FREE, THROUGHPUT_THREADS, size, 1)?;
        out.check(
            &format!("malloc+free {size} B x {THROUGHPUT_THREADS} threads"),
            c.allocations + c.nulls == u64::from(THROUGHPUT_THREADS)
                && c.frees == c.allocations
                && c.mismatches == 0,
            format!(
                "{:.3} s, {:.2} M successful allocations/s, {} NULL ({:.1}%), {} bytes differ",
                seconds,
                c.allocations as f64 / seconds / 1e6,
                c.nulls,
                percent(c.nulls, u64::from(THROUGHPUT_THREADS)),
                c.mismatches
            ),
        );
    }

    let refused = run
        .gpu
        .context
        .set_limit(Limit::MallocHeapBytes, 2 * HEAP_BYTES);
    let named_invalid_value = matches!(
        &refused,
        Err(error) if error.driver_code() == Some(ctx::DriverCode::INVALID_VALUE)
    );
    out.check(
        "heap limit set after a malloc launch is refused",
        named_invalid_value,
        match refused {
            Ok(()) => "accepted".to_string(),
            Err(e) => format!("error: {e}"),
        },
    );

    let (held, _) = run.run(heap::MALLOC_HOLD, HOLD_THREADS, HOLD_BYTES, 1)?;
    let (freed, _) = run.run(heap::CHECK_FREE_HELD, HOLD_THREADS, HOLD_BYTES, 1)?;
    out.check(
        "blocks held across launches keep their contents",
        held.allocations > 0 && freed.frees == held.allocations && freed.mismatches == 0,
        format!(
            "{} of {HOLD_THREADS} x {HOLD_BYTES} B held, {} freed by a later launch, {} bytes differ",
            held.allocations, freed.frees, freed.mismatches
        ),
    );

    for size in EXHAUST_SIZES {
        let (filled, seconds) = run.run(heap::EXHAUST, LIST_THREADS, size, LIST_BOUND)?;
        let (released, _) = run.run(heap::RELEASE_LISTS, LIST_THREADS, size, LIST_BOUND)?;
        out.check(
            &format!("usable heap with {size} B blocks"),
            filled.capped == 0 && released.frees == filled.allocations && released.mismatches == 0,
            format!(
                "{} blocks = {} of the {} heap ({:.1}%) before NULL, in {:.3} s; \
                 {} threads hit the bound; all freed, {} bytes differ",
                filled.allocations,
                mib(filled.bytes),
                mib(HEAP_BYTES),
                percent(filled.bytes, HEAP_BYTES),
                seconds,
                filled.capped,
                released.mismatches
            ),
        );
    }

    let (filled, _) = run.run(heap::FRAGMENT_FILL, LIST_THREADS, FRAGMENT_UNIT, LIST_BOUND)?;
    let (punched, _) = run.run(
        heap::FRAGMENT_PUNCH,
        LIST_THREADS,
        FRAGMENT_UNIT,
        LIST_BOUND,
    )?;
    let (large, _) = run.run(
        heap::FRAGMENT_LARGE,
        LIST_THREADS,
        FRAGMENT_LARGE,
        LIST_BOUND,
    )?;
    let (released, _) = run.run(heap::RELEASE_LISTS, LIST_THREADS, FRAGMENT_UNIT, LIST_BOUND)?;
    ensure!(
        released.frees == filled.allocations - punched.frees + large.allocations,
        "fragmentation lists lost blocks: {} filled, {} punched, {} large, {} released",
        filled.allocations,
        punched.frees,
        large.allocations,
        released.frees
    );
    out.check(
        "fragmented heap: large requests after freeing every other block",
        filled.capped == 0 && punched.mismatches == 0 && released.mismatches == 0,
        format!(
            "filled {} in {} blocks of 1-4 KiB; freed {} in {} blocks; then {} KiB requests got {} \
             ({:.1}% of the freed bytes); {} bytes differ",
            mib(filled.bytes),
            filled.allocations,
            mib(punched.bytes),
            punched.frees,
            FRAGMENT_LARGE >> 10,
            mib(large.bytes),
            percent(large.bytes, punched.bytes),
            punched.mismatches + released.mismatches
        ),
    );
    Ok(())
}
