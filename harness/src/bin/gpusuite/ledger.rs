//! (d) The ledger's predictions against `cuMemGetInfo` deltas measured in
//! fresh contexts with ctx's own measurements (the ones `cudamem` uses):
//! the context baseline, stack limits, a kernel with 16 KiB of local memory
//! per thread, and loading a module.

use anyhow::{Context as _, Result};
use ctx::{CudaContext, LaunchConfig, Limit};
use ctx::{DeviceProfile, Ledger, LedgerItemKind, Limits, Preflight};
use ctx::{local_memory_reservation_bytes, per_thread_local_bytes};
use kernels::LaunchShape;
use kernels::local::{self, LocalParams};

use crate::report::{Checks, mib_signed};
use memcore::bytes::mib;

const STACK_LIMITS: [u64; 5] = [1 << 10, 2 << 10, 4 << 10, 16 << 10, 64 << 10];
/// How far a measured delta may be from the prediction.
const TOLERANCE: u64 = 2 << 20;
const LAUNCH_THREADS: u32 = 1024;

/// A fresh context: no other handle to device 0's primary context may be
/// alive, so retaining it creates it anew.
fn fresh_context() -> Result<CudaContext> {
    CudaContext::new(0).context("opening CUDA device 0")
}

/// Checks `measured` against `predicted` where the model has a prediction.
fn compare(out: &mut Checks, name: &str, predicted: Option<u64>, measured: u64) {
    match predicted {
        Some(predicted) => out.check(
            name,
            predicted.abs_diff(measured) <= TOLERANCE,
            format!(
                "predicted {}, measured {}, difference {}",
                mib(predicted),
                mib(measured),
                mib_signed(i128::from(measured) - i128::from(predicted))
            ),
        ),
        None => out.check(
            name,
            true,
            format!("measured {} (no prediction for this device)", mib(measured)),
        ),
    }
}

/// Device-wide local memory reserved for `per_thread` bytes per thread.
fn reservation(profile: &DeviceProfile, per_thread: u64) -> u64 {
    local_memory_reservation_bytes(profile, per_thread_local_bytes(profile, per_thread, 0))
}

pub fn run(out: &mut Checks) -> Result<()> {
    let context = fresh_context()?;
    let profile = context.profile()?;
    // The measured constants (baseline, first module) live in the built-in
    // profile; the device's own figures come from the device.
    let builtin = DeviceProfile::builtin(profile.name);
    out.note(&format!(
        "device: {} = profile {:?} ({} SMs x {} threads, local memory granule {} B)",
        profile.full_name,
        profile.name,
        profile.sm_count,
        profile.max_threads_per_sm,
        profile.local_memory_granule_bytes
    ));
    let at_open = context.mem_info_at_open();
    let default_stack = Limits::cuda_default().stack_bytes;
    // A fresh context already holds local memory for the default stack limit
    // on every resident thread, on top of the driver's own baseline.
    compare(
        out,
        "fresh context: baseline + default-stack local memory (total - free)",
        builtin
            .and_then(|p| p.context_baseline_bytes)
            .map(|baseline| baseline + reservation(&profile, default_stack)),
        at_open.total - at_open.free,
    );
    // The measured column `cudamem explain --device` shows, in the same
    // fresh context.
    let mut ledger = Ledger::predict(&profile, &Limits::cuda_default(), &[], 0);
    context.fill_measured(&mut ledger, 0)?;
    for kind in [LedgerItemKind::LocalMemory, LedgerItemKind::ContextBaseline] {
        let item = ledger
            .item(kind)
            .with_context(|| format!("the ledger has no {kind:?} item"))?;
        compare(
            out,
            &format!("ledger {kind:?}, measured as `cudamem explain --device` does"),
            item.predicted.bytes(),
            item.measured.unwrap_or(0),
        );
    }
    drop(context);

    for stack in STACK_LIMITS {
        let context = fresh_context()?;
        let delta = context.measure_stack_limit(stack)?;
        let predicted = reservation(&profile, stack) - reservation(&profile, default_stack);
        compare(
            out,
            &format!("stack limit {} KiB", stack >> 10),
            Some(predicted),
            delta.cost_bytes(),
        );
    }

    // A kernel with 16 KiB of local memory, in a fresh context: what loading
    // its module costs, then looking it up (its local size read), then
    // launching it.
    let context = fresh_context()?;
    let results = context.mem_alloc(u64::from(LAUNCH_THREADS) * 8)?;
    let (module, load) = context.measure_module_load(local::MODULE.name, local::MODULE.ptx)?;
    compare(
        out,
        "first module load",
        builtin.and_then(|p| p.first_module_bytes),
        load.cost_bytes(),
    );
    let kernel = local::LOCAL_16K;
    let ((function, reported), lookup) = context.measure_function(&module, kernel.name())?;
    let params = LocalParams {
        out: results,
        threads: LAUNCH_THREADS,
        index: 2,
    };
    let shape = LaunchShape::covering(u64::from(LAUNCH_THREADS));
    let launch = context.measure_launch(
        &function,
        &LaunchConfig::linear(shape.grid, shape.block),
        kernel.param_bytes(&params),
    )?;
    let preflight = Preflight::kernel(
        &profile,
        &Limits::cuda_default(),
        default_stack,
        kernel.info().local_bytes_per_thread,
        load.free_after,
    );
    compare(
        out,
        "16 KiB local kernel: lookup + launch",
        Some(preflight.extra_reservation_bytes),
        lookup.cost_bytes() + launch.cost_bytes(),
    );
    out.note(&format!(
        "lookup {} + launch {}; stack limit afterwards {} B",
        mib(lookup.cost_bytes()),
        mib(launch.cost_bytes()),
        context.limit(Limit::StackBytes)?
    ));

    // Every kernel of the crate, as the driver's JIT compiled it, against
    // its description (which ptxas 13.0 confirms on CI).
    let mut disagree = Vec::new();
    let mut kernels_checked = 0;
    for description in kernels::MODULES {
        let loaded = context.load_ptx(description.name, description.ptx)?;
        for k in description.kernels {
            let driver = loaded.function(k.name)?.local_bytes()?;
            kernels_checked += 1;
            if driver != k.local_bytes_per_thread {
                disagree.push(format!(
                    "{}: driver {driver} B, described {} B",
                    k.name, k.local_bytes_per_thread
                ));
            }
        }
    }
    out.check(
        "driver's local sizes match the descriptions",
        disagree.is_empty() && reported == kernel.info().local_bytes_per_thread,
        if disagree.is_empty() {
            format!("{kernels_checked} kernels agree (local_16k: {reported} B)")
        } else {
            disagree.join(", ")
        },
    );
    context.synchronize()?;
    context.mem_free(results)?;
    Ok(())
}
