//! (h) cm_malloc (kernels/cuda/cm_alloc.cuh) against CUDA's malloc in the
//! same process: throughput at a million threads per size and for mixed
//! sizes, allocate-all-then-free-all, the usable fraction of the heap,
//! fragmentation (NULL only when no free window of the request's size is
//! left), a heap that grows after a launch ran out, and a user's PTX module
//! linked with ours. Every block is filled and checked on the device;
//! launches are timed with events.

use anyhow::{Context as _, Result};
use ctx::{CudaContext, CudaDevice, DeviceHeap, LaunchConfig, Limit, Module};
use ctx::{DeviceMemory as _, Pool, PoolConfig};
use kernels::cm_heap::{self, CmCounters};
use kernels::heap::{self, HeapCounters, HeapParams};
use kernels::{Kernel, LaunchShape};

use crate::device_heap::{HeapBuffers, read_counters};
use crate::gpu::Gpu;
use crate::report::Checks;
use memcore::bytes::mib;

/// CUDA's heap limit here and in section e, and our first region.
const HEAP_BYTES: u64 = 256 << 20;
const THREADS: u32 = 1 << 20;
const SIZES: [u64; 5] = [16, 64, 256, 1024, 4096];
/// Mixed sizes: log-uniform from 16 B to this.
const MIXED_MAX: u64 = 4096;
/// A heap with 4 KiB blocks for every thread an H200 holds resident
/// (132 SMs x 2048 threads x 4 KiB is 1.03 GiB).
const BIG_HEAP_BYTES: u64 = 1280 << 20;
/// Allocate all then free all: every thread holds one block of this size.
const HOLD_BYTES: u64 = 256;
const LIST_THREADS: u32 = 4096;
const LIST_BOUND: u32 = 1 << 16;
const EXHAUST_SIZES: [u64; 2] = [4096, 64 << 10];
const FRAGMENT_UNIT: u64 = 1 << 10;
const FRAGMENT_LARGE: u64 = 8 << 10;
/// Growth: a heap of this much, then GROW_THREADS x GROW_BYTES asked.
const GROW_FIRST_BYTES: u64 = 16 << 20;
const GROW_THREADS: u32 = 1 << 16;
const GROW_BYTES: u64 = 4096;
/// Address space each of the section's pools reserves.
const POOL_RESERVE: u64 = 64 << 30;

/// The modules, the report buffers, and the launches.
struct Bench {
    gpu: Gpu,
    cuda: Module,
    cm: Module,
    counters: u64,
    slots: u64,
}

/// One launch's counters and device time.
struct Outcome {
    c: HeapCounters,
    seconds: f64,
}

impl Outcome {
    fn rate(&self) -> f64 {
        self.c.allocations as f64 / self.seconds.max(1e-9)
    }

    fn clean(&self) -> bool {
        self.c.mismatches == 0
    }
}

impl Bench {
    fn launch(
        &mut self,
        module_is_cm: bool,
        kernel: Kernel<HeapParams>,
        threads: u32,
        size: u64,
        max_per_thread: u32,
    ) -> Result<Outcome> {
        let params = HeapBuffers {
            counters: self.counters,
            slots: self.slots,
        }
        .params(&mut self.gpu, threads, size, max_per_thread, 0xc3a1)?;
        let module = if module_is_cm { &self.cm } else { &self.cuda };
        let shape = LaunchShape::covering(u64::from(threads));
        let elapsed = module
            .function(kernel.name())?
            .launch_timed(
                &LaunchConfig::linear(shape.grid, shape.block),
                kernel.param_bytes(&params),
            )
            .with_context(|| format!("running {}", kernel.name()))?;
        Ok(Outcome {
            c: read_counters(&mut self.gpu, self.counters)?,
            seconds: elapsed.as_secs_f64(),
        })
    }

    fn clear_slots(&mut self) -> Result<()> {
        let zeros = vec![0u8; THREADS as usize * 8];
        Ok(self.gpu.memory.write(self.slots, &zeros)?)
    }
}

fn new_heap(context: &CudaContext, bytes: u64, module: &Module) -> Result<DeviceHeap<CudaDevice>> {
    let pool = Pool::new(CudaDevice::new(context)?, PoolConfig::vmm(POOL_RESERVE))?;
    let heap = DeviceHeap::new(pool, bytes)?;
    heap.bind(module)?;
    Ok(heap)
}

fn rate(per_second: f64) -> String {
    if per_second >= 1e9 {
        format!("{:.2} G/s", per_second / 1e9)
    } else {
        format!("{:.2} M/s", per_second / 1e6)
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

/// The heap's counters say nothing went wrong and nothing is live.
fn heap_idle(c: &CmCounters) -> bool {
    c.live_bytes == 0 && c.bad_frees == 0 && c.allocations == c.frees
}

pub fn run(out: &mut Checks) -> Result<()> {
    let context = CudaContext::new(0)?;
    // Refused if section e ran first in this process: its limit is the same.
    let _ = context.set_limit(Limit::MallocHeapBytes, HEAP_BYTES);
    let cuda_heap = context.limit(Limit::MallocHeapBytes)?;
    let mut gpu = Gpu::with_context(context.clone())?;
    let cuda = gpu.load(&heap::MODULE)?;
    let cm = gpu.load(&cm_heap::MODULE)?;
    let counters = gpu.memory.alloc_chunk(HeapCounters::BYTES as u64)?;
    let slots = gpu.memory.alloc_chunk(u64::from(THREADS) * 8)?;
    let mut bench = Bench {
        gpu,
        cuda,
        cm,
        counters,
        slots,
    };
    out.note(&format!(
        "CUDA malloc heap {}; cm heap starts at {} of regions and grows",
        mib(cuda_heap),
        mib(cm_heap::region_bytes(cm_heap::chunks_within(HEAP_BYTES)))
    ));

    // Throughput: a cold run (the heap may grow after it), then the measured one.
    let mut heap = new_heap(&context, HEAP_BYTES, &bench.cm)?;
    let shapes: Vec<(String, Kernel<HeapParams>, Kernel<HeapParams>, u64)> = SIZES
        .iter()
        .map(|&s| (format!("{s} B"), heap::MALLOC_FREE, cm_heap::MALLOC_FREE, s))
        .chain([(
            format!("mixed 16 B-{MIXED_MAX} B"),
            heap::MALLOC_FREE_MIXED,
            cm_heap::MALLOC_FREE_MIXED,
            MIXED_MAX,
        )])
        .collect();
    for (name, cuda_kernel, cm_kernel, size) in shapes {
        let theirs = bench.launch(false, cuda_kernel, THREADS, size, 1)?;
        let cold = bench.launch(true, cm_kernel, THREADS, size, 1)?;
        let grown = heap.grow_after_launch()?;
        let ours = bench.launch(true, cm_kernel, THREADS, size, 1)?;
        let hc = heap.counters()?;
        heap.clear_failures()?;
        out.check(
            &format!("cm_malloc+free {name} x {THREADS} threads"),
            ours.c.allocations == u64::from(THREADS)
                && ours.c.frees == ours.c.allocations
                && ours.clean()
                && cold.clean()
                && theirs.clean()
                && heap_idle(&hc),
            format!(
                "ours {} ({:.3} ms, {} NULL; cold run {} NULL, grew {} chunks), \
                 CUDA malloc {} ({:.3} ms, {} NULL): {:.0}x; {} bytes differ",
                rate(ours.rate()),
                ours.seconds * 1e3,
                ours.c.nulls,
                cold.c.nulls,
                grown,
                rate(theirs.rate()),
                theirs.seconds * 1e3,
                theirs.c.nulls,
                ours.rate() / theirs.rate().max(1.0),
                ours.c.mismatches + cold.c.mismatches + theirs.c.mismatches
            ),
        );
    }

    // What limits 4 KiB: a 256 MiB heap holds 4 KiB blocks for about a third
    // of the threads resident at once, the rest wait for frees. The same
    // launch on a heap with room for every resident thread tells that
    // apart from the allocator's own cost.
    {
        let big = new_heap(&context, BIG_HEAP_BYTES, &bench.cm)?;
        let cold = bench.launch(true, cm_heap::MALLOC_FREE, THREADS, 4096, 1)?;
        let ours = bench.launch(true, cm_heap::MALLOC_FREE, THREADS, 4096, 1)?;
        let hc = big.counters()?;
        out.check(
            &format!(
                "cm_malloc+free 4096 B x {THREADS} threads on a {} heap (room for every resident thread)",
                mib(big.region_bytes())
            ),
            ours.c.allocations == u64::from(THREADS)
                && ours.clean()
                && cold.clean()
                && heap_idle(&hc),
            format!(
                "ours {} ({:.3} ms, {} NULL; cold run {} NULL); {} bytes differ",
                rate(ours.rate()),
                ours.seconds * 1e3,
                ours.c.nulls,
                cold.c.nulls,
                ours.c.mismatches + cold.c.mismatches
            ),
        );
        drop(big);
        heap.bind(&bench.cm)?;
    }

    // Allocate all, then free all, in two launches.
    bench.clear_slots()?;
    let mut held = bench.launch(true, cm_heap::MALLOC_HOLD_MISSING, THREADS, HOLD_BYTES, 1)?;
    let grown = heap.grow_after_launch()?;
    if held.c.nulls != 0 {
        let retry = bench.launch(true, cm_heap::MALLOC_HOLD_MISSING, THREADS, HOLD_BYTES, 1)?;
        held.c.allocations += retry.c.allocations;
        held.c.nulls = retry.c.nulls;
        held.seconds += retry.seconds;
    }
    let freed = bench.launch(true, cm_heap::CHECK_FREE_HELD, THREADS, HOLD_BYTES, 1)?;
    let hc = heap.counters()?;
    out.check(
        &format!("cm allocate all then free all, {THREADS} x {HOLD_BYTES} B"),
        held.c.allocations == u64::from(THREADS)
            && freed.c.frees == held.c.allocations
            && freed.clean()
            && heap_idle(&hc),
        format!(
            "allocate {} ({:.3} ms, grew {grown} chunks on the way), free {} ({:.3} ms); \
             peak {} live; {} bytes differ",
            rate(held.rate()),
            held.seconds * 1e3,
            rate(freed.c.frees as f64 / freed.seconds.max(1e-9)),
            freed.seconds * 1e3,
            mib(hc.peak_bytes),
            freed.c.mismatches
        ),
    );
    drop(heap);

    // Usable heap and fragmentation on a heap that does not grow.
    let fixed = new_heap(&context, HEAP_BYTES, &bench.cm)?;
    let region = fixed.region_bytes();
    for size in EXHAUST_SIZES {
        let ours = bench.launch(true, cm_heap::EXHAUST, LIST_THREADS, size, LIST_BOUND)?;
        let ours_freed =
            bench.launch(true, cm_heap::RELEASE_LISTS, LIST_THREADS, size, LIST_BOUND)?;
        let theirs = bench.launch(false, heap::EXHAUST, LIST_THREADS, size, LIST_BOUND)?;
        let theirs_freed =
            bench.launch(false, heap::RELEASE_LISTS, LIST_THREADS, size, LIST_BOUND)?;
        let hc = fixed.counters()?;
        fixed.clear_failures()?;
        out.check(
            &format!("cm usable heap with {size} B blocks"),
            ours.c.capped == 0
                && ours_freed.c.frees == ours.c.allocations
                && ours_freed.clean()
                && theirs_freed.clean()
                && heap_idle(&hc),
            format!(
                "ours {} of {} ({:.1}%), CUDA malloc {} of {} ({:.1}%); all freed, {} bytes differ",
                mib(ours.c.bytes),
                mib(region),
                percent(ours.c.bytes, region),
                mib(theirs.c.bytes),
                mib(cuda_heap),
                percent(theirs.c.bytes, cuda_heap),
                ours_freed.c.mismatches + theirs_freed.c.mismatches
            ),
        );
    }
    let filled = bench.launch(
        true,
        cm_heap::FRAGMENT_FILL,
        LIST_THREADS,
        FRAGMENT_UNIT,
        LIST_BOUND,
    )?;
    let punched = bench.launch(
        true,
        cm_heap::FRAGMENT_PUNCH,
        LIST_THREADS,
        FRAGMENT_UNIT,
        LIST_BOUND,
    )?;
    let large = bench.launch(
        true,
        cm_heap::FRAGMENT_LARGE,
        LIST_THREADS,
        FRAGMENT_LARGE,
        LIST_BOUND,
    )?;
    // Every thread of the last launch met NULL: the rule says no free
    // window of the request's class was left anywhere.
    let at_null = fixed.image()?;
    let window = at_null.free_window(cm_heap::class_of(FRAGMENT_LARGE));
    let free_at_null = at_null.free_bytes();
    let released = bench.launch(
        true,
        cm_heap::RELEASE_LISTS,
        LIST_THREADS,
        FRAGMENT_UNIT,
        LIST_BOUND,
    )?;
    let hc = fixed.counters()?;
    out.check(
        "cm fragmented heap: 8 KiB requests after freeing every other 1-4 KiB block",
        filled.c.capped == 0
            && large.c.capped == 0
            && large.c.nulls == u64::from(LIST_THREADS)
            && window.is_none()
            && released.c.frees == filled.c.allocations - punched.c.frees + large.c.allocations
            && punched.clean()
            && released.clean()
            && heap_idle(&hc),
        format!(
            "filled {} in {} blocks; freed {}; then {} KiB requests got {} ({:.1}% of the freed \
             bytes) and met NULL with {} free ({:.0}x the request) and {}; {} bytes differ",
            mib(filled.c.bytes),
            filled.c.allocations,
            mib(punched.c.bytes),
            FRAGMENT_LARGE >> 10,
            mib(large.c.bytes),
            percent(large.c.bytes, punched.c.bytes),
            mib(free_at_null),
            free_at_null as f64 / FRAGMENT_LARGE as f64,
            match window {
                None => "no free aligned window of the request's size (the rule)".to_string(),
                Some((chunk, offset)) => format!(
                    "VIOLATION: a free {} KiB window at chunk {chunk} offset {offset}",
                    FRAGMENT_LARGE >> 10
                ),
            },
            punched.c.mismatches + released.c.mismatches
        ),
    );
    drop(fixed);

    // A launch runs out; the host grows the heap; the next launch succeeds
    // and the blocks of the first are still there, contents intact.
    let mut growing = new_heap(&context, GROW_FIRST_BYTES, &bench.cm)?;
    bench.clear_slots()?;
    let first = bench.launch(
        true,
        cm_heap::MALLOC_HOLD_MISSING,
        GROW_THREADS,
        GROW_BYTES,
        1,
    )?;
    let failed = growing.counters()?;
    let before = growing.table().chunks;
    let added = growing.grow_after_launch()?;
    let second = bench.launch(
        true,
        cm_heap::MALLOC_HOLD_MISSING,
        GROW_THREADS,
        GROW_BYTES,
        1,
    )?;
    let after = growing.counters()?;
    let freed = bench.launch(true, cm_heap::CHECK_FREE_HELD, GROW_THREADS, GROW_BYTES, 1)?;
    let end = growing.counters()?;
    out.check(
        "cm heap grows after a launch ran out; the next launch succeeds, earlier blocks kept",
        first.c.nulls > 0
            && failed.failed(cm_heap::Reason::Exhausted) == first.c.nulls
            && added > 0
            && second.c.nulls == 0
            && after.failures == 0
            && first.c.allocations + second.c.allocations == u64::from(GROW_THREADS)
            && freed.c.frees == u64::from(GROW_THREADS)
            && freed.clean()
            && heap_idle(&end),
        format!(
            "{GROW_THREADS} x {GROW_BYTES} B on {before} chunks: {} got blocks, {} NULL \
             (exhausted); grew {added} chunks; relaunch: {} more, {} NULL; all {} checked \
             and freed, {} bytes differ",
            first.c.allocations,
            first.c.nulls,
            second.c.allocations,
            second.c.nulls,
            freed.c.frees,
            freed.c.mismatches
        ),
    );
    linked_user_module(&context, &mut bench, out)
}

/// A user's module (kernels/cuda/cm_user.cu) that calls cm_malloc/cm_free
/// declared extern, linked with the library module (cm_link.cu) by the
/// driver, bound to a heap: every thread takes a block and writes it, a
/// second launch checks every byte and frees it. The user module alone
/// must fail to link, with the linker's log naming what is missing.
fn linked_user_module(context: &CudaContext, bench: &mut Bench, out: &mut Checks) -> Result<()> {
    use kernels::cm_link::{self, UserParams};
    const USER_THREADS: u32 = 1 << 16;
    const USER_BYTES: u64 = 200;
    let parts = [
        (cm_link::USER_EXAMPLE.name, cm_link::USER_EXAMPLE.ptx),
        (cm_link::LIBRARY.name, cm_link::LIBRARY.ptx),
    ];
    let module = context.link_ptx("cm_user+cm_link", &parts)?;
    // 65536 blocks of the 256 B class fill 16 chunks; a heap of 32 MiB has
    // room for them beside the chunks' maps.
    let heap = new_heap(context, 32 << 20, &module)?;
    let counts = bench.gpu.memory.alloc_chunk(16)?;
    bench.gpu.memory.write(counts, &[0u8; 16])?;
    bench.clear_slots()?;
    let params = UserParams {
        slots: bench.slots,
        counts,
        size: USER_BYTES,
        threads: USER_THREADS,
        seed: 0x5eed,
    };
    let shape = LaunchShape::covering(u64::from(USER_THREADS));
    for kernel in [cm_link::USER_WRITE, cm_link::USER_CHECK_FREE] {
        module
            .function(kernel.name())?
            .launch_timed(
                &LaunchConfig::linear(shape.grid, shape.block),
                kernel.param_bytes(&params),
            )
            .with_context(|| format!("running {}", kernel.name()))?;
    }
    let mut bytes = [0u8; 16];
    bench.gpu.memory.read(counts, &mut bytes)?;
    let differ = u64::from_le_bytes(bytes[..8].try_into()?);
    let nulls = u64::from_le_bytes(bytes[8..].try_into()?);
    let hc = heap.counters()?;
    let alone = context.link_ptx("cm_user alone", &parts[..1]);
    let refused = match &alone {
        Err(ctx::Error::Link { log, .. }) => log.contains("cm_malloc") || log.contains("cm_free"),
        _ => false,
    };
    out.check(
        "cm_malloc from a user's PTX module linked with ours",
        differ == 0
            && nulls == 0
            && hc.allocations == u64::from(USER_THREADS)
            && heap_idle(&hc)
            && refused,
        format!(
            "{USER_THREADS} x {USER_BYTES} B written by cm_user_write, checked and freed by \
             cm_user_check_free: {differ} bytes differ, {nulls} NULL, heap allocations {} \
             frees {}; the user module alone: {}",
            hc.allocations,
            hc.frees,
            match alone {
                Ok(_) => "linked (it must not)".to_string(),
                Err(e) => e.to_string().chars().take(200).collect(),
            }
        ),
    );
    Ok(())
}
