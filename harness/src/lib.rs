//! # cudamem
//!
//! Where did my GPU memory go? The library behind the `cudamem` command,
//! with every part callable in process:
//!
//! - [`trace`]: readers of recorded allocation traces (RMM
//!   `logging_resource_adaptor` CSV logs, PyTorch memory snapshots), each
//!   record checked, every bad input a typed [`trace::TraceError`] that names
//!   the file and the record;
//! - [`replay`]: a trace replayed through allocation policies, one table of
//!   specs ([`replay::POLICIES`]): memcore's allocators, ctx's pools on a
//!   simulated device or a GPU, other crates' allocators and a model of
//!   PyTorch's expandable segments, each with its footprint, compaction
//!   traffic, driver calls and speed;
//! - [`report`]: the tables, JSON lines and HTML pages of a replay;
//! - [`cli`]: the subcommands (`replay`, `explain`, `heap`), run on any
//!   output ([`cli::run`]), and how a run ends ([`cli::Exit`]).
//!
//! It is not a profiler: it attaches to no running program, it reads what a
//! program recorded and measures a GPU only through a context of its own.
//! It holds no allocator of its own either: those are memcore's (the
//! algorithms) and ctx's (device memory); cudamem compares and explains
//! them. The `cudamem` binary is a thin `main` over [`cli::run`].
//!
//! ```
//! use clap::Parser as _;
//! use cudamem::replay::{self, Settings};
//!
//! // Replay the built-in ResNet-50 trace through TLSF.
//! let trace = &trace::file::load_embedded()?[0];
//! let tlsf = replay::spec::named("tlsf").expect("a policy of the table");
//! let hidden = indicatif::ProgressBar::hidden();
//! let (outcome, _) = replay::run(tlsf, trace, &Settings::default(), &hidden, false)?;
//! assert!(outcome.peak_footprint_bytes >= trace.peak_live_bytes);
//! assert_eq!(outcome.failed_allocations, 0);
//!
//! // Or run a whole command, its output captured.
//! let mut out = Vec::new();
//! let cli = cudamem::cli::Cli::try_parse_from(["cudamem", "explain", "--json"])?;
//! cudamem::cli::run(cli, &mut out)?;
//! let ledger: serde_json::Value = serde_json::from_slice(&out)?;
//! assert_eq!(ledger["device"], "h200");
//! # Ok::<(), anyhow::Error>(())
//! ```

#![warn(missing_docs)]

pub mod cli;
pub mod process;
pub mod replay;
pub mod report;
