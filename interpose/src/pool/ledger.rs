//! The residency ledger: every byte of the device this process still
//! holds, each line classed (pausable; held by the driver for the context,
//! modules, local memory, heap and FIFO, its objects; outside the pool), and
//! what no record names (other processes, the driver).

use std::fmt::Write as _;

use memcore::bytes::human;
use trace::process::Snapshot;

use super::pause::{PauseReport, ResumeReport};
use crate::driver::read;
use crate::recorder;

fn gib_per_s(bytes: u64, seconds: f64) -> String {
    if seconds <= 0.0 || bytes == 0 {
        return "-".into();
    }
    format!("{:.2} GiB/s", bytes as f64 / seconds / (1u64 << 30) as f64)
}

/// What a pause did, two lines.
pub fn pause_text(report: &PauseReport) -> String {
    format!(
        "paused: free device memory {} before, {} after ({} given back) of {}\n\
         paused: {} pool handle(s) released ({}); {} copied to pinned host memory in {:.3} s ({}); \
         {} of free pool pages released without a copy; {} discarded; {:.3} s in all\n",
        human(report.free_before),
        human(report.free_after),
        human(report.free_after.saturating_sub(report.free_before)),
        human(report.total),
        report.handles,
        human(report.released_bytes),
        human(report.copied_bytes),
        report.copy_seconds,
        gib_per_s(report.copied_bytes, report.copy_seconds),
        human(report.cache_bytes),
        human(report.discarded_bytes),
        report.seconds,
    )
}

/// What a resume did, one line.
pub fn resume_text(report: &ResumeReport) -> String {
    format!(
        "resumed: free device memory {} before, {} after; {} mapped again at the same addresses \
         in {:.3} s, {} copied back in {:.3} s ({}); host copies freed; {:.3} s in all\n",
        human(report.free_before),
        human(report.free_after),
        human(report.mapped_bytes),
        report.map_seconds,
        human(report.copied_bytes),
        report.copy_seconds,
        gib_per_s(report.copied_bytes, report.copy_seconds),
        report.seconds,
    )
}

/// One ledger line.
struct Line {
    class: &'static str,
    what: String,
    bytes: u64,
    why: String,
}

/// The residency ledger of the pool's device now; `paused` when a pause is
/// in force.
pub fn render(paused: Option<&PauseReport>) -> String {
    let Some(served) = super::get() else {
        return "no pool in this process\n".into();
    };
    let info = read::with_context(served.context as *mut _, read::mem_info).flatten();
    let stats = served.pool.stats().model;
    let pool_live: u64 = served.live_blocks().iter().map(|&(_, size)| size).sum();
    let snapshot = recorder::with_accounting(|accounting| {
        let index = accounting
            .devices()
            .iter()
            .position(|d| d.facts.ordinal == served.ordinal)?;
        Some((
            Snapshot::of(accounting, index)?,
            accounting.vmm_bytes(),
            accounting.live_device_bytes(),
            accounting.live_async_bytes(),
        ))
    })
    .flatten();
    let mut lines = Vec::new();
    let on_device_pool = if paused.is_some() {
        0
    } else {
        stats.physical_bytes
    };
    if let Some(report) = paused {
        lines.push(Line {
            class: "released",
            what: "pool memory given back by the pause".into(),
            bytes: report.released_bytes + report.cache_bytes,
            why: format!(
                "{} copied to host, {} free pages dropped, {} discarded; addresses stay reserved",
                human(report.copied_bytes),
                human(report.cache_bytes),
                human(report.discarded_bytes)
            ),
        });
    }
    lines.push(Line {
        class: "pausable",
        what: "the pool's pages on the device".into(),
        bytes: on_device_pool,
        why: format!(
            "{} live in {} allocation(s); the rest free pages the pool keeps",
            human(pool_live),
            served.live_blocks().len()
        ),
    });
    lines.push(Line {
        class: "held: cudamem",
        what: "the pause's copy stream".into(),
        bytes: super::pause::STREAM_BYTES.load(std::sync::atomic::Ordering::Relaxed),
        why: "made at the first pause, measured; kept for the next".into(),
    });
    lines.push(Line {
        class: "held: referenced",
        what: "pool pages something else references".into(),
        bytes: 0,
        why: "no IPC export or peer mapping of pool memory".into(),
    });
    if let Some((snap, (_, _, created), live_device, live_async)) = &snapshot {
        let allocations = live_device.saturating_sub(*created);
        let outside = allocations
            .saturating_sub(pool_live)
            .saturating_sub(*live_async);
        let driver_lines = [
            (
                "context",
                snap.context_measured().unwrap_or(0),
                "measured at the context's creation",
            ),
            (
                "local memory",
                snap.local_measured.unwrap_or(snap.local_predicted),
                "the stack of every resident thread",
            ),
            (
                "module code",
                snap.module_measured,
                "measured around loads and first launches",
            ),
            (
                "malloc heap, printf FIFO",
                snap.heap_fifo_measured,
                "measured when the limits were set",
            ),
            (
                "driver objects",
                snap.objects_measured,
                "streams, events, graphs and pools, measured",
            ),
        ];
        for (what, bytes, why) in driver_lines {
            lines.push(Line {
                class: "held: driver",
                what: what.into(),
                bytes,
                why: why.into(),
            });
        }
        lines.push(Line {
            class: "held: outside",
            what: "driver allocations outside the pool".into(),
            bytes: outside,
            why: "another device, pitched or managed memory, or made before the pool".into(),
        });
        lines.push(Line {
            class: "held: outside",
            what: "stream-ordered allocations".into(),
            bytes: *live_async + snap.pool_held().unwrap_or(0),
            why: "cuMemAllocAsync and its pool's reserve: not paused".into(),
        });
        lines.push(Line {
            class: "held: outside",
            what: "the program's own VMM handles".into(),
            bytes: *created,
            why: "cuMemCreate by the program (expandable segments, JAX): not paused".into(),
        });
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "residency ledger, device {} (pid {}){}:",
        served.ordinal,
        std::process::id(),
        if paused.is_some() {
            ", paused"
        } else {
            ", running"
        }
    );
    let named: u64 = lines
        .iter()
        .filter(|line| line.class != "released")
        .map(|line| line.bytes)
        .sum();
    for line in &lines {
        let _ = writeln!(
            out,
            "  {:<17} {:<40} {:>12}  {}",
            line.class,
            line.what,
            human(line.bytes),
            line.why
        );
    }
    match info {
        Some((free, total)) => {
            let used = total.saturating_sub(free);
            let rest = i128::from(used) - i128::from(named);
            let _ = writeln!(
                out,
                "  {:<17} {:<40} {:>12}  other processes on the device, and what the driver took unrecorded",
                "other",
                "not named above",
                if rest < 0 {
                    format!("-{}", human(rest.unsigned_abs() as u64))
                } else {
                    human(rest as u64)
                },
            );
            let _ = writeln!(
                out,
                "  device: {} used, {} free of {}",
                human(used),
                human(free),
                human(total)
            );
        }
        None => {
            let _ = writeln!(out, "  device: free memory could not be read");
        }
    }
    out
}
