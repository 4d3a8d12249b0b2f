//! `cudamem heap`: how large `cudaLimitMallocHeapSize` must be for a
//! pattern of in-kernel `malloc` calls, every thread holding one block of
//! each size at once.
//!
//! Without a GPU it predicts from a model of the device heap, which NVIDIA
//! does not document: each block takes its size rounded up to 16 bytes plus
//! a 16-byte header. The real heap runs out sooner when a million threads
//! allocate at once (BENCHMARKS.md, "In-kernel malloc"), so the
//! recommendation adds half again. With the `cuda`
//! feature it measures instead: it runs the pattern with the heap set to a
//! size, and searches for the smallest size with no NULL.

use std::io::Write;

use anyhow::Result;
use serde::Serialize;

use crate::cli::byte_size;
use ctx::text::{LINE_WIDTH, wrap};
use memcore::bytes::{MIB, exact, human};

/// Assumed header of every device-heap block, bytes.
pub const BLOCK_HEADER_BYTES: u64 = 16;
/// Assumed rounding of every device-heap block, bytes.
pub const BLOCK_GRANULE_BYTES: u64 = 16;
/// Headroom of the recommendation over the model, in percent (see the
/// module docs for the measurement behind it).
pub const HEADROOM_PERCENT: u64 = 50;

/// Arguments of `cudamem heap`.
#[derive(Debug, clap::Args)]
pub struct HeapArgs {
    /// Bytes each thread mallocs and holds (repeatable: one block of each size), e.g. 256 or 4KiB.
    /// Sizes: K, KiB, M, MiB, G, GiB are binary (16K = 16384 B), KB, MB, GB decimal (16KB = 16000
    /// B).
    #[arg(long = "size", required = true, value_parser = byte_size::parse)]
    sizes: Vec<u64>,
    /// Threads that allocate at once; default: all an H200 holds resident (132 SMs x 2048).
    #[arg(long, default_value_t = 132 * 2048)]
    threads: u32,
    /// Run the pattern on CUDA device N (needs a build with the `cuda`
    /// feature; such a build uses device 0 unless --predict).
    #[arg(long, conflicts_with = "predict")]
    device: Option<u32>,
    /// Only predict, even in a build that can measure.
    #[arg(long)]
    predict: bool,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// What the model says a pattern needs. Bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HeapPrediction {
    /// Threads allocating at once.
    pub threads: u32,
    /// Requested bytes per thread.
    pub requested_bytes_per_thread: u64,
    /// Heap bytes per thread under the model (sizes, rounding, headers).
    pub heap_bytes_per_thread: u64,
    /// The model's minimum heap, whole MiB.
    pub minimum_heap_bytes: u64,
    /// The minimum plus headroom, whole MiB: what to set.
    pub recommended_heap_bytes: u64,
}

/// Heap bytes one block of `size` takes under the model (128 bits: it can
/// pass 2^64).
pub fn block_bytes(size: u64) -> u128 {
    u128::from(size.div_ceil(BLOCK_GRANULE_BYTES)) * u128::from(BLOCK_GRANULE_BYTES)
        + u128::from(BLOCK_HEADER_BYTES)
}

/// Predict the heap `threads` threads need to each hold one block of every
/// size in `sizes`. Figures are worked out in 128 bits, so the error, when
/// one is past 2^64 bytes, says which and by how much.
pub fn predict(sizes: &[u64], threads: u32) -> Result<HeapPrediction> {
    let requested: u128 = sizes.iter().map(|&size| u128::from(size)).sum();
    let per_thread: u128 = sizes.iter().map(|&size| block_bytes(size)).sum();
    let minimum = per_thread * u128::from(threads);
    let recommended = minimum * u128::from(100 + HEADROOM_PERCENT) / 100;
    let mib = |bytes: u128| bytes.div_ceil(u128::from(MIB)) * u128::from(MIB);
    // The figure as worked out goes in the message; the rounded one in the result.
    let fit = |what: &str, bytes: u128, shown: u128| {
        u64::try_from(shown).map_err(|_| {
            anyhow::anyhow!(
                "{what} would be {bytes} bytes, past the 2^64-byte limit a heap size can have \
                 (and far past any GPU's memory)"
            )
        })
    };
    Ok(HeapPrediction {
        threads,
        requested_bytes_per_thread: fit("the requested bytes per thread", requested, requested)?,
        heap_bytes_per_thread: fit("the heap bytes per thread", per_thread, per_thread)?,
        minimum_heap_bytes: fit("the minimum heap", minimum, mib(minimum))?,
        recommended_heap_bytes: fit("the recommended heap", recommended, mib(recommended))?,
    })
}

/// Run `cudamem heap`, writing the prediction (and measurement) to `out`.
pub fn run(args: HeapArgs, out: &mut dyn Write) -> Result<()> {
    if args.sizes.contains(&0) {
        anyhow::bail!("--size 0: malloc(0) holds no block; give sizes of at least one byte");
    }
    if args.threads == 0 {
        anyhow::bail!("--threads must be at least 1");
    }
    let prediction = predict(&args.sizes, args.threads)?;
    // A heap larger than any device's memory is no setting to recommend.
    if let Some(largest) = ctx::DeviceProfile::all()
        .iter()
        .max_by_key(|profile| profile.total_bytes)
        && prediction.minimum_heap_bytes > largest.total_bytes
    {
        anyhow::bail!(
            "{} threads holding {} each need a heap of at least {}, more than the {} of the \
             largest device cudamem knows ({}): no heap size can serve the pattern; use fewer \
             --threads or smaller --size",
            args.threads,
            human(prediction.requested_bytes_per_thread),
            human(prediction.minimum_heap_bytes),
            human(largest.total_bytes),
            largest.full_name
        );
    }
    let device = match (args.device, args.predict) {
        (_, true) => None,
        (Some(ordinal), false) => Some(ordinal),
        (None, false) => cfg!(feature = "cuda").then_some(0),
    };
    let measured = match device {
        Some(ordinal) => Some(gpu::search(
            ordinal,
            &args.sizes,
            args.threads,
            &prediction,
        )?),
        None => None,
    };
    if args.json {
        let value = serde_json::json!({
            "sizes": args.sizes,
            "prediction": prediction,
            "model": format!(
                "each block = size rounded up to {BLOCK_GRANULE_BYTES} B + {BLOCK_HEADER_BYTES} B header; \
                 recommended = minimum + {HEADROOM_PERCENT}%"
            ),
            "measured": measured,
        });
        writeln!(out, "{value}")?;
        return Ok(());
    }
    let mut lines = vec![
        format!(
            "pattern: {} threads, each holding {} ({} requested bytes per thread)",
            args.threads,
            args.sizes
                .iter()
                .map(|&size| human(size))
                .collect::<Vec<_>>()
                .join(" + "),
            prediction.requested_bytes_per_thread
        ),
        format!(
            "prediction (no GPU measured): minimum heap {}, recommended cudaLimitMallocHeapSize {}",
            exact(prediction.minimum_heap_bytes),
            exact(prediction.recommended_heap_bytes),
        ),
        format!(
            "model: each block takes its size rounded up to {BLOCK_GRANULE_BYTES} B plus a \
             {BLOCK_HEADER_BYTES} B header (an assumption; NVIDIA does not document the device \
             heap); the recommendation adds {HEADROOM_PERCENT}% because the H200's heap returned \
             NULL early under a million concurrent callers"
        ),
    ];
    if let Some(measured) = measured {
        lines.push(format!(
            "measured on the GPU: smallest heap with no NULL {}; tried {}",
            measured
                .smallest_sufficient_bytes
                .map_or_else(|| "not found".into(), exact),
            measured
                .tries
                .iter()
                .map(|t| format!(
                    "{} -> {} NULL of {}",
                    human(t.heap_bytes),
                    t.nulls,
                    t.nulls + t.allocations
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for line in lines {
        writeln!(out, "{}", wrap(&line, LINE_WIDTH, "", "  "))?;
    }
    Ok(())
}

/// One run of the pattern on a GPU.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct HeapTry {
    /// The heap limit it ran with, bytes.
    pub heap_bytes: u64,
    /// `malloc` calls that returned a block.
    pub allocations: u64,
    /// `malloc` calls that returned NULL.
    pub nulls: u64,
}

/// What the GPU search found.
#[derive(Debug, Clone, Serialize)]
pub struct HeapMeasurement {
    /// Every run, in order.
    pub tries: Vec<HeapTry>,
    /// The smallest heap that served every call, bytes (to 1/16 of the
    /// bracket the doubling found).
    pub smallest_sufficient_bytes: Option<u64>,
}

#[cfg(not(feature = "cuda"))]
mod gpu {
    use super::{HeapMeasurement, HeapPrediction};

    pub fn search(
        ordinal: u32,
        _: &[u64],
        _: u32,
        _: &HeapPrediction,
    ) -> anyhow::Result<HeapMeasurement> {
        anyhow::bail!(
            "--device {ordinal}: cudamem was built without the cuda feature; \
             rebuild with `--features cuda` to measure, or drop --device for a prediction"
        )
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use anyhow::{Context, Result};
    use ctx::DeviceMemory;
    use ctx::{CudaContext, CudaDevice, LaunchConfig, Limit};
    use kernels::BLOCK_THREADS;
    use kernels::heap::{CHECK_FREE_HELD, HeapCounters, HeapParams, MALLOC_HOLD};

    use super::{HeapMeasurement, HeapPrediction, HeapTry};

    /// Doublings from the prediction before giving up.
    const DOUBLINGS: u32 = 6;
    /// Bisection steps inside the bracket the doubling found.
    const BISECTIONS: u32 = 4;

    /// Find the smallest heap with no NULL: double from the model's minimum
    /// until a run serves every call, then bisect the bracket.
    pub fn search(
        ordinal: u32,
        sizes: &[u64],
        threads: u32,
        prediction: &HeapPrediction,
    ) -> Result<HeapMeasurement> {
        let mib = memcore::bytes::MIB;
        let mut tries = Vec::new();
        let mut low = 0u64;
        let mut high = None;
        let mut heap = prediction.minimum_heap_bytes.max(mib);
        for _ in 0..=DOUBLINGS {
            let run = run_pattern(ordinal, sizes, threads, heap)?;
            tries.push(run);
            if run.nulls == 0 {
                high = Some(heap);
                break;
            }
            low = heap;
            heap *= 2;
        }
        if let Some(mut sufficient) = high {
            for _ in 0..BISECTIONS {
                let middle = (low + sufficient) / 2 / mib * mib;
                if middle <= low || middle >= sufficient {
                    break;
                }
                let run = run_pattern(ordinal, sizes, threads, middle)?;
                tries.push(run);
                if run.nulls == 0 {
                    sufficient = middle;
                } else {
                    low = middle;
                }
            }
            high = Some(sufficient);
        }
        Ok(HeapMeasurement {
            tries,
            smallest_sufficient_bytes: high,
        })
    }

    /// One run in a fresh primary context (the heap limit cannot change
    /// after a kernel that mallocs has run): every thread mallocs and holds
    /// one block of each size, then checks and frees them.
    fn run_pattern(ordinal: u32, sizes: &[u64], threads: u32, heap_bytes: u64) -> Result<HeapTry> {
        let context = CudaContext::new(ordinal)?;
        context.set_limit(Limit::MallocHeapBytes, heap_bytes)?;
        let module = context.load_ptx(MALLOC_HOLD.module().name, MALLOC_HOLD.module().ptx)?;
        let hold = module.function(MALLOC_HOLD.name())?;
        let release = module.function(CHECK_FREE_HELD.name())?;
        let mut device = CudaDevice::new(&context)?;
        let counters = device.alloc_chunk(HeapCounters::BYTES as u64)?;
        device.write(counters, HeapCounters::default().as_bytes())?;
        let slot_bytes = u64::from(threads) * 8;
        let mut slots = Vec::new();
        for _ in sizes {
            slots.push(device.alloc_chunk(slot_bytes)?);
        }
        let config = LaunchConfig::covering(u64::from(threads), BLOCK_THREADS);
        let params = |size: u64, slots: u64| HeapParams {
            counters,
            slots,
            size,
            threads,
            max_per_thread: 1,
            seed: size,
        };
        for (&size, &slot) in sizes.iter().zip(&slots) {
            let p = params(size, slot);
            hold.launch(&config, MALLOC_HOLD.param_bytes(&p), None)?;
        }
        context.synchronize().context("running heap_malloc_hold")?;
        let mut held = [0u8; HeapCounters::BYTES];
        device.read(counters, &mut held)?;
        let held = HeapCounters::from_bytes(&held).context("reading the heap counters")?;
        for (&size, &slot) in sizes.iter().zip(&slots) {
            let p = params(size, slot);
            release.launch(&config, CHECK_FREE_HELD.param_bytes(&p), None)?;
        }
        context
            .synchronize()
            .context("running heap_check_free_held")?;
        for slot in slots {
            device.free_chunk(slot, slot_bytes)?;
        }
        device.free_chunk(counters, HeapCounters::BYTES as u64)?;
        Ok(HeapTry {
            heap_bytes,
            allocations: held.allocations,
            nulls: held.nulls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_rounds_adds_headers_and_headroom() {
        assert_eq!(block_bytes(1), 32);
        assert_eq!(block_bytes(256), 272);
        assert_eq!(block_bytes(u64::MAX), (1 << 64) + 16);
        let prediction = predict(&[256, 16], 1 << 20).unwrap();
        assert_eq!(prediction.requested_bytes_per_thread, 272);
        assert_eq!(prediction.heap_bytes_per_thread, 272 + 32);
        assert_eq!(prediction.minimum_heap_bytes, 304 << 20);
        assert_eq!(prediction.recommended_heap_bytes, 456 << 20);
        assert!(predict(&[u64::MAX], 2).is_err());
    }

    #[test]
    fn a_terabyte_per_thread_is_worked_out_not_called_an_overflow() {
        // 1 TiB + 16 B for each of 270,336 threads: past 2^58, short of 2^64.
        let threads = 132 * 2048;
        let prediction = predict(&[1 << 40], threads).unwrap();
        let per_thread = (1u64 << 40) + 16;
        assert_eq!(prediction.heap_bytes_per_thread, per_thread);
        let minimum = per_thread * u64::from(threads);
        assert_eq!(
            prediction.minimum_heap_bytes,
            minimum.div_ceil(1 << 20) << 20
        );
        let recommended = (u128::from(minimum) * 3 / 2) as u64;
        assert_eq!(
            prediction.recommended_heap_bytes,
            recommended.div_ceil(1 << 20) << 20
        );
        // 64 TiB per thread is past 2^64 bytes: the message says which figure.
        let message = predict(&[64 << 40], threads).unwrap_err().to_string();
        assert!(
            message.starts_with("the minimum heap would be "),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "{}",
                u128::from((64u64 << 40) + 16) * u128::from(threads)
            )),
            "{message}"
        );
    }
}
