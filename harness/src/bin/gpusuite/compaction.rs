//! (b) Compaction on the device keeps every byte, and how fast it moves them.
//!
//! Three compactions, each checked byte for byte on the device afterwards:
//! (i) a full slide (`Pool::compact`) of a pool with every other block freed;
//! (ii) a targeted compaction: the same kind of pool asked for one large block
//! with `CompactionPolicy::BeforeGrow`, which relocates the blocks in the way
//! into holes elsewhere; (iii) a dependency chain: one hole at the bottom and
//! everything above sliding down by it, each move landing where the previous
//! block was, the worst case for batching.
//!
//! Each is timed as the pool times it (host clock from handing the moves to
//! the device until the device reported them done; planning apart) and set
//! against a plain copy of the same bytes in the same run, timed the same way
//! through the same call (`DeviceMemory::copy_moves` of one move between two
//! `cuMemAlloc` buffers). GB/s count bytes moved once.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use ctx::cuda::{CopyCalls, CudaDevice};
use ctx::device::CopyMove;
use ctx::{CompactionPolicy, DeviceMemory as _, Pool, PoolConfig};
use memcore::Handle;

use crate::gpu::{Gpu, Rng};
use crate::report::{Checks, mib};

const RESERVE_BYTES: u64 = 64 << 30;
/// (i): blocks allocated; sizes uniform in [1, 3) MiB, about 4 GiB in all.
const SPREAD_BLOCKS: usize = 2048;
const MIN_BLOCK: u64 = 1 << 20;
/// (ii) and (iii): blocks of one size.
const UNIFORM_BLOCK: u64 = 2 << 20;
/// (ii): blocks allocated (4 GiB), and the request that needs room (1 GiB).
const ROOM_BLOCKS: usize = 2048;
const ROOM_REQUEST: u64 = 1 << 30;
/// Fresh pools the targeted compaction runs on; the best is reported.
const ROOM_ROUNDS: usize = 4;
/// (iii): blocks allocated (2 GiB).
const CHAIN_BLOCKS: usize = 1024;
/// Plain copies timed (after one untimed).
const PLAIN_REPEATS: u32 = 3;
/// What the compaction's copy rate should reach against a plain copy.
const GOAL_RATIO: f64 = 0.8;

fn gb_per_s(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64().max(1e-9) / 1e9
}

fn ms(time: Duration) -> f64 {
    time.as_secs_f64() * 1e3
}

/// A live block: its handle, bytes and pattern seed.
struct Block {
    handle: Handle,
    size: u64,
    seed: u64,
}

/// A VMM pool whose device has the `move_blocks` kernel loaded already, so no
/// timed compaction includes compiling it. Returns the load error, if any,
/// for the report (copies then go through cuMemcpyDtoDAsync alone).
fn pool(gpu: &Gpu) -> Result<(Pool<CudaDevice>, Option<String>)> {
    let mut device = CudaDevice::new(&gpu.context)?;
    let loaded = device.load_move_kernel().err().map(|e| e.to_string());
    Ok((Pool::new(device, PoolConfig::vmm(RESERVE_BYTES))?, loaded))
}

fn copy_calls(pool: &Pool<CudaDevice>) -> CopyCalls {
    pool.lock().device().copy_calls()
}

/// Allocates one block of each size, filled with its own pattern.
fn fill(gpu: &Gpu, pool: &Pool<CudaDevice>, sizes: &[u64], salt: u64) -> Result<Vec<Block>> {
    let mut blocks = Vec::with_capacity(sizes.len());
    for (i, &size) in sizes.iter().enumerate() {
        let handle = pool.allocate(size, 256, None)?;
        let seed = i as u64 ^ salt;
        gpu.fill(pool.device_ptr(handle)?, size, seed)?;
        blocks.push(Block { handle, size, seed });
    }
    gpu.context.synchronize()?;
    Ok(blocks)
}

/// Bytes of `blocks` that differ from their patterns now.
fn mismatches(gpu: &mut Gpu, pool: &Pool<CudaDevice>, blocks: &[Block]) -> Result<u64> {
    let mut ranges = Vec::with_capacity(blocks.len());
    for b in blocks {
        ranges.push((pool.device_ptr(b.handle)?, b.size, b.seed));
    }
    gpu.mismatches(&ranges)
}

/// A plain copy of `bytes` between two fresh buffers: host time of one
/// `copy_moves` call (queue + wait), best of [`PLAIN_REPEATS`] after a warm-up,
/// and the event-timed rate of `cuMemcpyDtoD` for reference, GB/s.
fn plain_copy(gpu: &mut Gpu, bytes: u64) -> Result<(Duration, f64)> {
    let src = gpu.memory.alloc_chunk(bytes)?;
    let dst = gpu.memory.alloc_chunk(bytes)?;
    let copy = [CopyMove {
        src,
        dst,
        len: bytes,
    }];
    gpu.memory.copy_moves(&copy)?;
    let mut best = Duration::MAX;
    for _ in 0..PLAIN_REPEATS {
        let start = Instant::now();
        gpu.memory.copy_moves(&copy)?;
        best = best.min(start.elapsed());
    }
    gpu.memory.free_chunk(dst, bytes)?;
    gpu.memory.free_chunk(src, bytes)?;
    let event = gpu.context.copy_bandwidth(bytes, 5)?;
    Ok((best, event.copy_bytes_per_second() / 1e9))
}

/// What one timed compaction did, for its report line.
struct Timed {
    moves: u64,
    bytes: u64,
    plan: Duration,
    copy: Duration,
    calls: CopyCalls,
}

/// Logs the bandwidth check of one compaction against a plain copy.
fn report(out: &mut Checks, gpu: &mut Gpu, name: &str, timed: &Timed) -> Result<()> {
    let (plain, event_rate) = plain_copy(gpu, timed.bytes.max(1))?;
    let rate = gb_per_s(timed.bytes, timed.copy);
    let plain_rate = gb_per_s(timed.bytes, plain);
    let ratio = rate / plain_rate;
    let c = &timed.calls;
    out.check(
        name,
        true,
        format!(
            "{} in {} moves: copies {:.3} ms = {rate:.0} GB/s ({} move_blocks launches \
             carrying {} moves, {} cuMemcpyDtoDAsync, {} scratch bounces, one wait); \
             planning {:.3} ms apart; plain copy of the same bytes {:.3} ms = \
             {plain_rate:.0} GB/s host-timed ({event_rate:.0} GB/s event-timed); \
             ratio {ratio:.2} (goal {GOAL_RATIO}: {})",
            mib(timed.bytes),
            timed.moves,
            ms(timed.copy),
            c.launches,
            c.launched_moves,
            c.memcpys,
            c.bounces,
            ms(timed.plan),
            ms(plain),
            if ratio >= GOAL_RATIO {
                "met"
            } else {
                "not met"
            },
        ),
    );
    Ok(())
}

/// (i) Every other block of a spread pool freed, then a full slide.
fn full_slide(out: &mut Checks, gpu: &mut Gpu) -> Result<()> {
    let (pool, kernel_error) = pool(gpu)?;
    let load_us = copy_calls(&pool).kernel_load_micros;
    out.note(&match &kernel_error {
        None => format!("move_blocks loaded in {load_us} us (PTX compiled by the driver)"),
        Some(e) => format!("move_blocks not usable, copies go through memcpy: {e}"),
    });
    let mut rng = Rng::new(0xc0_4ac7);
    let sizes: Vec<u64> = (0..SPREAD_BLOCKS)
        .map(|_| MIN_BLOCK + rng.below(2 * MIN_BLOCK))
        .collect();
    let blocks = fill(gpu, &pool, &sizes, 0xb10c)?;
    let mut kept = Vec::with_capacity(SPREAD_BLOCKS / 2);
    for (i, block) in blocks.into_iter().enumerate() {
        if i % 2 == 0 {
            pool.free(block.handle)?;
        } else {
            kept.push(block);
        }
    }
    let before = copy_calls(&pool);
    let start = Instant::now();
    let report_i = pool.compact()?;
    let total = start.elapsed();
    let calls = copy_calls(&pool).since(&before);
    let bad = mismatches(gpu, &pool, &kept)?;
    out.check(
        "full slide keeps every byte",
        bad == 0 && report_i.moves > 0,
        format!(
            "{} blocks ({}) checked after {} moves of {}: {bad} bytes differ",
            kept.len(),
            mib(kept.iter().map(|b| b.size).sum()),
            report_i.moves,
            mib(report_i.bytes_moved)
        ),
    );
    let timed = Timed {
        moves: report_i.moves as u64,
        bytes: report_i.bytes_moved,
        plan: report_i.plan_time,
        copy: report_i.copy_time,
        calls,
    };
    report(
        out,
        gpu,
        "full slide bandwidth against a plain copy",
        &timed,
    )?;
    out.note(&format!(
        "Pool::compact took {:.3} ms in all (planning, device synchronization, copies, \
         commit); largest free block {} before, {} after",
        ms(total),
        mib(report_i.largest_free_before),
        mib(report_i.largest_free_after)
    ));
    for block in kept {
        pool.free(block.handle)?;
    }
    Ok(())
}

/// (ii) A pool of equal blocks with every other one freed, asked for one
/// block larger than any hole: compaction before growth relocates the blocks
/// in its way.
fn targeted(out: &mut Checks, gpu: &mut Gpu) -> Result<()> {
    // The same compaction on fresh pools, ROOM_ROUNDS times: the first round
    // pays first-use costs (kernel's first launch, cold caches and TLBs), the
    // best is the steady state a long-running pool sees.
    let mut rounds = Vec::with_capacity(ROOM_ROUNDS);
    for round in 0..ROOM_ROUNDS {
        rounds.push(targeted_round(out, gpu, round == 0)?);
    }
    let first = gb_per_s(rounds[0].bytes, rounds[0].copy);
    let best = rounds
        .into_iter()
        .min_by_key(|timed| timed.copy)
        .context("no targeted round ran")?;
    out.note(&format!(
        "targeted rounds: first {first:.0} GB/s, best of {ROOM_ROUNDS} {:.0} GB/s",
        gb_per_s(best.bytes, best.copy)
    ));
    report(
        out,
        gpu,
        "targeted compaction bandwidth against a plain copy (best round)",
        &best,
    )
}

/// One round of (ii); logs its content check when `log` is set, and always
/// fails the suite if contents or growth are wrong.
fn targeted_round(out: &mut Checks, gpu: &mut Gpu, log: bool) -> Result<Timed> {
    let (pool, _) = pool(gpu)?;
    ensure!(
        pool.config().compaction == CompactionPolicy::BeforeGrow,
        "the targeted case needs a pool that compacts before it grows"
    );
    let blocks = fill(gpu, &pool, &[UNIFORM_BLOCK; ROOM_BLOCKS], 0x7a26)?;
    let mut kept = Vec::with_capacity(ROOM_BLOCKS / 2);
    for (i, block) in blocks.into_iter().enumerate() {
        if i % 2 == 0 {
            pool.free(block.handle)?;
        } else {
            kept.push(block);
        }
    }
    let stats_before = pool.stats();
    let calls_before = copy_calls(&pool);
    let start = Instant::now();
    let big = pool.allocate(ROOM_REQUEST, 256, None)?;
    let total = start.elapsed();
    let stats = pool.stats();
    let calls = copy_calls(&pool).since(&calls_before);
    let bad = mismatches(gpu, &pool, &kept)?;
    let moved = stats.bytes_moved - stats_before.bytes_moved;
    let intact = bad == 0
        && stats.compactions == stats_before.compactions + 1
        && stats.mapped_bytes == stats_before.mapped_bytes;
    if log || !intact {
        out.check(
            "targeted compaction keeps every byte and does not grow",
            intact,
            format!(
                "{} for a {} request: {} moves ({}), pool {} mapped before and {} after; \
                 {} blocks checked, {bad} bytes differ",
                mib(ROOM_REQUEST),
                mib(ROOM_REQUEST),
                calls.moves,
                mib(moved),
                mib(stats_before.mapped_bytes),
                mib(stats.mapped_bytes),
                kept.len()
            ),
        );
        out.note(&format!(
            "the allocation took {:.3} ms in all (failed fit, planning, synchronization, \
             copies, commit, fit)",
            ms(total)
        ));
    }
    pool.free(big)?;
    for block in kept {
        pool.free(block.handle)?;
    }
    Ok(Timed {
        moves: calls.moves,
        bytes: moved,
        plan: stats.compaction_plan_time - stats_before.compaction_plan_time,
        copy: stats.compaction_copy_time - stats_before.compaction_copy_time,
        calls,
    })
}

/// (iii) Equal blocks with only the first freed: every block slides onto the
/// previous one's place, a chain no batch can shorten.
fn chain(out: &mut Checks, gpu: &mut Gpu) -> Result<()> {
    let (pool, _) = pool(gpu)?;
    let mut blocks = fill(gpu, &pool, &[UNIFORM_BLOCK; CHAIN_BLOCKS], 0xc4a1)?;
    pool.free(blocks.remove(0).handle)?;
    let before = copy_calls(&pool);
    let report_iii = pool.compact()?;
    let calls = copy_calls(&pool).since(&before);
    let bad = mismatches(gpu, &pool, &blocks)?;
    out.check(
        "dependency chain keeps every byte",
        bad == 0 && report_iii.moves == CHAIN_BLOCKS - 1,
        format!(
            "{} moves of {} each down by one block: {bad} bytes differ",
            report_iii.moves,
            mib(UNIFORM_BLOCK)
        ),
    );
    let timed = Timed {
        moves: report_iii.moves as u64,
        bytes: report_iii.bytes_moved,
        plan: report_iii.plan_time,
        copy: report_iii.copy_time,
        calls,
    };
    report(
        out,
        gpu,
        "dependency chain bandwidth against a plain copy",
        &timed,
    )?;
    for block in blocks {
        pool.free(block.handle)?;
    }
    Ok(())
}

pub fn run(out: &mut Checks) -> Result<()> {
    let mut gpu = Gpu::open()?;
    full_slide(out, &mut gpu)?;
    targeted(out, &mut gpu)?;
    chain(out, &mut gpu)?;
    memory_kinds(out, &gpu)
}

/// Host time of the first run of `moves` (nothing has touched those bytes
/// since they were mapped and filled), and the best of [`PLAIN_REPEATS`]
/// runs after it.
fn first_and_best(device: &mut CudaDevice, moves: &[CopyMove]) -> Result<(Duration, Duration)> {
    let start = Instant::now();
    device.copy_moves(moves)?;
    let first = start.elapsed();
    let mut best = Duration::MAX;
    for _ in 0..PLAIN_REPEATS {
        let start = Instant::now();
        device.copy_moves(moves)?;
        best = best.min(start.elapsed());
    }
    Ok((first, best))
}

/// Where the compaction copies lose against one memcpy: the same 256
/// independent 2 MiB moves (one kernel batch) and one memcpy of the same
/// bytes, in VMM-mapped memory (what the pool uses) and in `cuMemAlloc`
/// chunks.
fn memory_kinds(out: &mut Checks, gpu: &Gpu) -> Result<()> {
    const HALF: u64 = 1 << 30;
    let mut device = CudaDevice::new(&gpu.context)?;
    device.load_move_kernel()?;
    let base = device.reserve(2 * HALF)?;
    device.map(base, HALF)?;
    device.map(base + HALF, HALF)?;
    let chunk_a = device.alloc_chunk(HALF)?;
    let chunk_b = device.alloc_chunk(HALF)?;
    let mut line = String::new();
    for (kind, src, dst) in [("VMM", base, base + HALF), ("cuMemAlloc", chunk_a, chunk_b)] {
        // Every other 2 MiB block of the source to every other block of
        // the destination: independent moves, as a targeted compaction's.
        let moves: Vec<CopyMove> = (0..ROOM_BLOCKS as u64 / 8)
            .map(|i| CopyMove {
                src: src + 2 * i * UNIFORM_BLOCK,
                dst: dst + 2 * i * UNIFORM_BLOCK,
                len: UNIFORM_BLOCK,
            })
            .collect();
        let bytes: u64 = moves.iter().map(|m| m.len).sum();
        // Fill both sides first, so the first runs below copy touched pages
        // as a compaction does.
        gpu.fill(src, HALF, 0x5eed)?;
        gpu.fill(dst, HALF, 0xd57)?;
        gpu.context.synchronize()?;
        let (batch_first, batch) = first_and_best(&mut device, &moves)?;
        let (one_first, one) = first_and_best(
            &mut device,
            &[CopyMove {
                src,
                dst,
                len: bytes,
            }],
        )?;
        line.push_str(&format!(
            "{kind}: {} moves {:.0} GB/s first, {:.0} best; one memcpy of {} {:.0} first, \
             {:.0} best; ratio first/first {:.2}, best/best {:.2}; ",
            moves.len(),
            gb_per_s(bytes, batch_first),
            gb_per_s(bytes, batch),
            mib(bytes),
            gb_per_s(bytes, one_first),
            gb_per_s(bytes, one),
            one_first.as_secs_f64() / batch_first.as_secs_f64(),
            one.as_secs_f64() / batch.as_secs_f64()
        ));
    }
    device.free_chunk(chunk_b, HALF)?;
    device.free_chunk(chunk_a, HALF)?;
    device.unmap(base + HALF, HALF)?;
    device.unmap(base, HALF)?;
    device.release(base, 2 * HALF)?;
    out.note(&format!(
        "copy path by memory kind (host-timed, first run and best of {PLAIN_REPEATS}): {line}"
    ));
    Ok(())
}
