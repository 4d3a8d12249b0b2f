//! (b) Compaction on the device keeps every byte, and how fast it moves them.
//!
//! Four compactions, each checked byte for byte on the device afterwards:
//! (i) a full compaction (`Pool::compact`) of a pool of mixed sizes with
//! every other block freed, which slides; (ii) a targeted compaction: a pool
//! of equal blocks, every other one freed, asked for one large block with
//! `CompactionPolicy::BeforeGrow`, which relocates the blocks in the way into
//! holes elsewhere; (iii) one hole at the bottom, which the top block fills;
//! (iv) a hole at the bottom that no block fills exactly: everything slides
//! down by less than a block, each move overlapping itself and landing where
//! the previous block was, a chain only `slide_blocks` takes in one launch.
//!
//! Each is timed on two clocks (`CopyCalls`): the device's, between events
//! recorded around the copies, and the host's, from handing the moves to the
//! device until it reported them done (planning apart). Each is set against
//! a plain copy of the same bytes in the same run, timed the same ways
//! through the same call (`DeviceMemory::copy_moves` of one move between two
//! `cuMemAlloc` buffers, which is one `cuMemcpyDtoDAsync`). GB/s count bytes
//! moved once.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use ctx::BlockMove;
use ctx::Handle;
use ctx::{CompactionPolicy, DeviceMemory as _, PeerSet, PhysicalHandle, Pool, PoolConfig};
use ctx::{CopyCalls, CudaDevice};

use crate::gpu::{Gpu, Rng};
use crate::report::Checks;
use memcore::bytes::mib;

const RESERVE_BYTES: u64 = 64 << 30;
/// (i): blocks allocated; sizes uniform in [1, 3) MiB, about 4 GiB in all.
const SPREAD_BLOCKS: usize = 2048;
const MIN_BLOCK: u64 = 1 << 20;
/// (ii) to (iv): blocks of one size.
const UNIFORM_BLOCK: u64 = 2 << 20;
/// (ii): blocks allocated (4 GiB), and the request that needs room (1 GiB).
const ROOM_BLOCKS: usize = 2048;
const ROOM_REQUEST: u64 = 1 << 30;
/// Fresh pools the targeted compaction runs on; the best is reported.
const ROOM_ROUNDS: usize = 4;
/// (iii) and (iv): blocks allocated (2 GiB).
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

/// One timed run of a batch of copies: host time from the call until the
/// device reported them done, and the device time between events around the
/// copies.
#[derive(Clone, Copy)]
struct CopyTime {
    host: Duration,
    device: Duration,
}

impl CopyTime {
    fn of(calls: &CopyCalls) -> Self {
        CopyTime {
            host: Duration::from_nanos(calls.host_nanos),
            device: Duration::from_nanos(calls.device_nanos),
        }
    }

    /// The faster of two runs, on each clock.
    fn min(self, other: CopyTime) -> CopyTime {
        CopyTime {
            host: self.host.min(other.host),
            device: self.device.min(other.device),
        }
    }
}

/// Runs `moves` through `device` once; its times.
fn timed_copy(device: &mut CudaDevice, moves: &[BlockMove]) -> Result<CopyTime> {
    let before = device.copy_calls();
    device.copy_moves(moves)?;
    Ok(CopyTime::of(&device.copy_calls().since(&before)))
}

/// A plain copy of `bytes` between two fresh buffers through the same call
/// (`copy_moves` of one move, which is one `cuMemcpyDtoDAsync`): best of
/// [`PLAIN_REPEATS`] after a warm-up, on each clock.
fn plain_copy(gpu: &mut Gpu, bytes: u64) -> Result<CopyTime> {
    let src = gpu.memory.alloc_chunk(bytes)?;
    let dst = gpu.memory.alloc_chunk(bytes)?;
    let copy = [BlockMove {
        src,
        dst,
        len: bytes,
    }];
    gpu.memory.copy_moves(&copy)?;
    let mut best = timed_copy(&mut gpu.memory, &copy)?;
    for _ in 1..PLAIN_REPEATS {
        best = best.min(timed_copy(&mut gpu.memory, &copy)?);
    }
    gpu.memory.free_chunk(dst, bytes)?;
    gpu.memory.free_chunk(src, bytes)?;
    Ok(best)
}

/// What one timed compaction did, for its report line.
struct Timed {
    moves: u64,
    bytes: u64,
    plan: Duration,
    calls: CopyCalls,
}

fn verdict(ratio: f64) -> &'static str {
    if ratio >= GOAL_RATIO {
        "met"
    } else {
        "not met"
    }
}

/// Logs the bandwidth of one compaction against a plain copy of the same
/// bytes, on the device's clock (events around the copies) and on the
/// host's (from handing the moves over until the device reported them done).
fn report(out: &mut Checks, gpu: &mut Gpu, name: &str, timed: &Timed) -> Result<()> {
    let plain = plain_copy(gpu, timed.bytes.max(1))?;
    let c = &timed.calls;
    let copy = CopyTime::of(c);
    let device_rate = gb_per_s(timed.bytes, copy.device);
    let host_rate = gb_per_s(timed.bytes, copy.host);
    let device_ratio = plain.device.as_secs_f64() / copy.device.as_secs_f64().max(1e-12);
    let host_ratio = plain.host.as_secs_f64() / copy.host.as_secs_f64().max(1e-12);
    out.check(
        name,
        true,
        format!(
            "{} in {} moves ({} move_blocks launches carrying {} moves, {} slide_blocks \
             launches carrying {}, {} cuMemcpyDtoDAsync, {} scratch bounces, one wait): device {:.3} ms = {device_rate:.0} GB/s, host \
             {:.3} ms = {host_rate:.0} GB/s of which {:.3} ms until all was queued; \
             planning {:.3} ms apart; plain copy of the same bytes device {:.3} ms = {:.0} GB/s, \
             host {:.3} ms = {:.0} GB/s; ratio device {device_ratio:.2} ({}), host \
             {host_ratio:.2} ({}) (goal {GOAL_RATIO})",
            mib(timed.bytes),
            timed.moves,
            c.launches,
            c.launched_moves,
            c.slide_launches,
            c.slid_moves,
            c.memcpys,
            c.bounces,
            ms(copy.device),
            ms(copy.host),
            ms(Duration::from_nanos(c.queue_nanos)),
            ms(timed.plan),
            ms(plain.device),
            gb_per_s(timed.bytes, plain.device),
            ms(plain.host),
            gb_per_s(timed.bytes, plain.host),
            verdict(device_ratio),
            verdict(host_ratio),
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
    // The same compaction on fresh pools, ROOM_ROUNDS times for each way the
    // pool got its memory, alternating: the first round pays first-use costs
    // (kernel's first launch, cold caches and TLBs), the best is the steady
    // state a long-running pool sees.
    let mut rounds: Vec<(bool, Timed)> = Vec::with_capacity(2 * ROOM_ROUNDS);
    for round in 0..2 * ROOM_ROUNDS {
        let grown_once = round % 2 == 1;
        rounds.push((
            grown_once,
            targeted_round(out, gpu, round == 0, grown_once)?,
        ));
    }
    for grown_once in [false, true] {
        let kind: Vec<&Timed> = rounds
            .iter()
            .filter(|(once, _)| *once == grown_once)
            .map(|(_, timed)| timed)
            .collect();
        let device = |t: &Timed| Duration::from_nanos(t.calls.device_nanos);
        let first = kind.first().context("no targeted round ran")?;
        let best = kind
            .iter()
            .min_by_key(|t| device(t))
            .context("no targeted round ran")?;
        let how = if grown_once {
            "mapped in one growth"
        } else {
            "grown a block at a time"
        };
        out.note(&format!(
            "targeted rounds, pool {how}: device {} GB/s, first {:.0}, best {:.0}",
            kind.iter()
                .map(|t| format!("{:.0}", gb_per_s(t.bytes, device(t))))
                .collect::<Vec<_>>()
                .join(" / "),
            gb_per_s(first.bytes, device(first)),
            gb_per_s(best.bytes, device(best)),
        ));
        report(
            out,
            gpu,
            &format!("targeted compaction bandwidth, pool {how} (best round)"),
            best,
        )?;
    }
    Ok(())
}

/// One round of (ii); logs its content check when `log` is set, and always
/// fails the suite if contents or growth are wrong.
/// With `grown_once` the pool maps all it needs in one growth first (one
/// block of everything, freed), else it grows by each block as it comes.
fn targeted_round(out: &mut Checks, gpu: &mut Gpu, log: bool, grown_once: bool) -> Result<Timed> {
    let (pool, _) = pool(gpu)?;
    ensure!(
        pool.config().compaction == CompactionPolicy::BeforeGrow,
        "the targeted case needs a pool that compacts before it grows"
    );
    if grown_once {
        pool.free(pool.allocate(ROOM_BLOCKS as u64 * UNIFORM_BLOCK, 256, None)?)?;
    }
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
        calls,
    })
}

/// (iii) Equal blocks with only the first freed: the plan fills the hole
/// with the top block, one move where a slide would move every block.
/// (iv) The same with a first block of half the size: no block fills the
/// hole exactly, so everything slides down by half a block, each move
/// overlapping itself and landing on the previous block's place: a chain,
/// the worst case for any copy path but the slide kernel.
fn bottom_hole(out: &mut Checks, gpu: &mut Gpu) -> Result<()> {
    bottom_hole_round(out, gpu, false, true)?;
    // The short slide on fresh pools, ROOM_ROUNDS times; the best is
    // reported against the plain copy, every round's rate in a note.
    let mut rounds = Vec::with_capacity(ROOM_ROUNDS);
    for round in 0..ROOM_ROUNDS {
        rounds.push(bottom_hole_round(out, gpu, true, round == 0)?);
    }
    let device = |t: &Timed| Duration::from_nanos(t.calls.device_nanos);
    out.note(&format!(
        "short slide rounds: device {} GB/s",
        rounds
            .iter()
            .map(|t| format!("{:.0}", gb_per_s(t.bytes, device(t))))
            .collect::<Vec<_>>()
            .join(" / ")
    ));
    let best = rounds
        .iter()
        .min_by_key(|t| device(t))
        .context("no short slide ran")?;
    report(
        out,
        gpu,
        "a short slide (worst case) bandwidth against a plain copy (best round)",
        best,
    )
}

/// One pool of (iii), or of (iv) with `half_sized_hole`, compacted and
/// checked byte for byte; the check is logged when `log` is set, and
/// always when it fails.
fn bottom_hole_round(
    out: &mut Checks,
    gpu: &mut Gpu,
    half_sized_hole: bool,
    log: bool,
) -> Result<Timed> {
    let (pool, _) = pool(gpu)?;
    let mut sizes = vec![UNIFORM_BLOCK; CHAIN_BLOCKS];
    if half_sized_hole {
        sizes[0] = UNIFORM_BLOCK / 2;
    }
    let mut blocks = fill(gpu, &pool, &sizes, 0xc4a1)?;
    pool.free(blocks.remove(0).handle)?;
    let before = copy_calls(&pool);
    let done = pool.compact()?;
    let calls = copy_calls(&pool).since(&before);
    let bad = mismatches(gpu, &pool, &blocks)?;
    let (name, expected_moves) = if half_sized_hole {
        ("a short slide (worst case)", CHAIN_BLOCKS - 1)
    } else {
        ("one hole at the bottom", 1)
    };
    let intact = bad == 0 && done.moves == expected_moves;
    if log || !intact {
        out.check(
            &format!("{name} keeps every byte"),
            intact,
            format!(
                "a {} hole under {} blocks of {}: {} moves of {}, largest free block {} \
                 after; {bad} bytes differ",
                mib(sizes[0]),
                blocks.len(),
                mib(UNIFORM_BLOCK),
                done.moves,
                mib(done.bytes_moved),
                mib(done.largest_free_after),
            ),
        );
    }
    for block in blocks {
        pool.free(block.handle)?;
    }
    Ok(Timed {
        moves: done.moves as u64,
        bytes: done.bytes_moved,
        plan: done.plan_time,
        calls,
    })
}

pub fn run(out: &mut Checks) -> Result<()> {
    let mut gpu = Gpu::open()?;
    full_slide(out, &mut gpu)?;
    targeted(out, &mut gpu)?;
    bottom_hole(out, &mut gpu)?;
    memory_kinds(out, &gpu)
}

/// The first run of `moves` (nothing has touched those bytes since they
/// were mapped and filled), and the best of [`PLAIN_REPEATS`] runs after it.
fn first_and_best(device: &mut CudaDevice, moves: &[BlockMove]) -> Result<(CopyTime, CopyTime)> {
    let first = timed_copy(device, moves)?;
    let mut best = timed_copy(device, moves)?;
    for _ in 1..PLAIN_REPEATS {
        best = best.min(timed_copy(device, moves)?);
    }
    Ok((first, best))
}

/// `bytes` of fresh physical memory mapped at `addr` and readable and
/// writable by the device, as a pool's growth maps them.
fn map(device: &mut CudaDevice, addr: u64, bytes: u64) -> Result<(u64, u64, PhysicalHandle)> {
    let handle = device.create_physical(bytes)?;
    device.map_physical(handle, addr)?;
    device.grant_access(addr, bytes, PeerSet::of(&[device.ordinal()])?)?;
    Ok((addr, bytes, handle))
}

/// Where the compaction copies lose against one memcpy: the same 256
/// independent 2 MiB moves (one kernel batch) and one memcpy of the same
/// bytes, in VMM memory mapped 1 GiB at a time, in VMM memory mapped 2 MiB at
/// a time (a pool that grew by each block), and in `cuMemAlloc` chunks.
fn memory_kinds(out: &mut Checks, gpu: &Gpu) -> Result<()> {
    const HALF: u64 = 1 << 30;
    let mut device = CudaDevice::new(&gpu.context)?;
    device.load_move_kernel()?;
    let base = device.reserve(4 * HALF)?;
    let small = base + 2 * HALF;
    let mut mapped = vec![
        map(&mut device, base, HALF)?,
        map(&mut device, base + HALF, HALF)?,
    ];
    for page in 0..2 * HALF / UNIFORM_BLOCK {
        mapped.push(map(
            &mut device,
            small + page * UNIFORM_BLOCK,
            UNIFORM_BLOCK,
        )?);
    }
    let chunk_a = device.alloc_chunk(HALF)?;
    let chunk_b = device.alloc_chunk(HALF)?;
    let mut line = String::new();
    for (kind, src, dst) in [
        ("VMM 1 GiB mappings", base, base + HALF),
        ("VMM 2 MiB mappings", small, small + HALF),
        ("cuMemAlloc", chunk_a, chunk_b),
    ] {
        // Every other 2 MiB block of the source to every other block of
        // the destination: independent moves, as a targeted compaction's.
        let moves: Vec<BlockMove> = (0..ROOM_BLOCKS as u64 / 8)
            .map(|i| BlockMove {
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
            &[BlockMove {
                src,
                dst,
                len: bytes,
            }],
        )?;
        let rate = |t: Duration| gb_per_s(bytes, t);
        let ratio =
            |one: Duration, batch: Duration| one.as_secs_f64() / batch.as_secs_f64().max(1e-12);
        line.push_str(&format!(
            "{kind}: {} moves device {:.0} GB/s first, {:.0} best (host {:.0}, {:.0}); one \
             memcpy of {} device {:.0} first, {:.0} best (host {:.0}, {:.0}); ratio device \
             first/first {:.2}, best/best {:.2}, host {:.2}, {:.2}; ",
            moves.len(),
            rate(batch_first.device),
            rate(batch.device),
            rate(batch_first.host),
            rate(batch.host),
            mib(bytes),
            rate(one_first.device),
            rate(one.device),
            rate(one_first.host),
            rate(one.host),
            ratio(one_first.device, batch_first.device),
            ratio(one.device, batch.device),
            ratio(one_first.host, batch_first.host),
            ratio(one.host, batch.host),
        ));
    }
    device.free_chunk(chunk_b, HALF)?;
    device.free_chunk(chunk_a, HALF)?;
    for (addr, bytes, handle) in mapped {
        device.unmap_physical(addr, bytes)?;
        device.release_physical(handle)?;
    }
    device.release(base, 4 * HALF)?;
    out.note(&format!(
        "copy path by memory kind (first run and best of {PLAIN_REPEATS}): {line}"
    ));
    Ok(())
}
