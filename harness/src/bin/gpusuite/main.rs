//! The hardware suite: what ctx and the kernels do on a real NVIDIA GPU.
//!
//! Sections (each PASS/FAIL with its numbers):
//! a. random pool sequences on the device, contents checked on the device;
//! b. compaction keeps contents, and its bandwidth against a plain copy;
//! c. VMM growth and shrink against `cuMemGetInfo`;
//! d. the ledger's predictions against measured deltas (stack limits, a
//!    16 KiB-local kernel, module load);
//! e. in-kernel malloc: throughput, held blocks, usable heap, fragmentation,
//!    the heap limit freezing after the first malloc launch;
//! f. host cost of allocate+free against the driver's allocators, and VMM
//!    growth against cuMemAlloc;
//! g. context teardown gives the memory back, seen from another process;
//! h. cm_malloc against CUDA's malloc: throughput, usable heap,
//!    fragmentation, growth between launches;
//! p. peer access on two GPUs: kernels on GPU 1 in GPU 0's pool memory, and
//!    peer copy bandwidth over pool memory against cuMemAlloc memory.
//!
//! Usage: `gpusuite [--log FILE] [--only LETTERS]`. Details go to stdout
//! and FILE, then a summary table to stdout; the exit status is non-zero if
//! any check failed. Run by `cargo xtask gpu-test`, or from the bundle that
//! `cargo xtask gpu-bundle` makes.

mod cm_heap;
mod compaction;
mod device_heap;
mod gpu;
mod host_alloc;
mod ledger;
mod peers;
mod pool_sequences;
mod report;
mod stitched;
mod teardown;
mod vmm;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};

use report::{Checks, Log, Section};

type SectionFn = fn(&mut Checks) -> Result<()>;

const SECTIONS: [(char, &str, SectionFn); 10] = [
    ('a', "pool sequences on the device", pool_sequences::run),
    ('b', "compaction contents and bandwidth", compaction::run),
    ('c', "VMM growth and shrink", vmm::run),
    ('d', "ledger predicted vs measured", ledger::run),
    ('e', "device malloc heap", device_heap::run),
    ('f', "host allocation cost", host_alloc::run),
    ('g', "context teardown", teardown::run),
    ('h', "cm_malloc device heap", cm_heap::run),
    ('p', "peer access on two GPUs", peers::run),
    ('s', "stitched pool on the driver", stitched::run),
];

struct Options {
    log: Option<PathBuf>,
    only: Option<String>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        log: None,
        only: None,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--log" => options.log = args.next().map(PathBuf::from),
            "--only" => options.only = args.next().cloned(),
            other => {
                bail!("unknown argument {other:?}; usage: gpusuite [--log FILE] [--only LETTERS]")
            }
        }
    }
    Ok(options)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

fn run(options: &Options) -> Result<bool> {
    let mut log = Log::create(options.log.as_deref())?;
    log.line(&format!(
        "gpusuite: CUDA driver {}, {} device(s)",
        ctx::CudaContext::driver_version()?,
        ctx::CudaContext::device_count()?
    ));
    let mut sections = Vec::new();
    for (letter, title, section) in SECTIONS {
        if options
            .only
            .as_ref()
            .is_some_and(|only| !only.contains(letter))
        {
            continue;
        }
        log.line(&format!("\n[{letter}] {title}"));
        let start = Instant::now();
        let mut checks = Checks::new(&mut log);
        let outcome = catch_unwind(AssertUnwindSafe(|| section(&mut checks)));
        let checks = checks.into_checks();
        let error = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(payload) => Some(format!("panicked: {}", panic_message(payload.as_ref()))),
        };
        if let Some(error) = &error {
            log.line(&format!("  FAIL (stopped): {error}"));
        }
        sections.push(Section {
            letter,
            title,
            checks,
            error,
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    if sections.is_empty() {
        bail!("--only selected no section (letters a-h, p)");
    }
    log.line(&format!("\n{}", report::summary_table(&sections)));
    let failed = sections.iter().filter(|s| !s.passed()).count();
    log.line(&format!(
        "{} passed, {failed} failed",
        sections.len() - failed
    ));
    Ok(failed == 0)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(teardown::PROBE_ARG) {
        return match teardown::probe() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpusuite probe: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let outcome = parse(&args).and_then(|options| run(&options));
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("gpusuite: {e:#}");
            ExitCode::FAILURE
        }
    }
}
