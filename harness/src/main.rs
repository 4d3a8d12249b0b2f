//! `cudamem`: where did my GPU memory go?
//!
//! - `cudamem replay [TRACE...]` replays recorded allocation traces (RMM CSV
//!   logs, PyTorch memory snapshots) through several allocation policies and
//!   reports each one's footprint, compaction traffic and speed; with no
//!   trace it replays a built-in ResNet-50 trace and writes an HTML report.
//! - `cudamem explain` shows the context ledger: what a CUDA context takes
//!   before the first allocation (local memory, malloc heap, printf FIFO);
//!   `cudamem explain --snapshot FILE` shows the state a PyTorch memory
//!   snapshot captured (segments, fragmentation, what pins memory).
//! - `cudamem heap` sizes `cudaLimitMallocHeapSize` for an in-kernel malloc
//!   pattern.
//!
//! It is not a profiler: it does not attach to a running program. Run
//! `cudamem --help` for usage, and see `harness/README.md`.

mod cli;
mod replay;
mod report;
mod trace;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::{explain, malloc_heap, output, replay_command, run};

/// What `cudamem --help` opens with: what the command is for, and what a
/// bare `cudamem` does.
const ABOUT: &str = "Where did my GPU memory go? cudamem replays recorded allocation traces \
(RMM logs, PyTorch memory snapshots) through allocation policies to compare their footprint \
and compaction cost, and explains what a CUDA context takes before the first allocation.

With no command, cudamem replays its built-in ResNet-50 training trace, prints the table and \
writes the HTML report cudamem-report.html in the current directory.";

#[derive(Debug, Parser)]
#[command(name = "cudamem", version, about = ABOUT, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay allocation traces through allocation policies (with no trace:
    /// the built-in ResNet-50 trace, and an HTML report).
    Replay(replay_command::ReplayArgs),
    /// What a CUDA context costs before the first allocation, item by item.
    Explain(explain::ExplainArgs),
    /// The malloc heap (cudaLimitMallocHeapSize) an in-kernel malloc pattern needs.
    Heap(malloc_heap::HeapArgs),
    /// Run a CUDA program with its driver calls recorded, and explain its
    /// memory (and any out-of-memory) item by item; exits with its status.
    Run(run::RunArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => replay_command::run(replay_command::ReplayArgs::default()),
        Some(Command::Replay(args)) => replay_command::run(args),
        Some(Command::Explain(args)) => explain::run(args),
        Some(Command::Heap(args)) => malloc_heap::run(args),
        Some(Command::Run(args)) => return run::run(args),
    };
    // What is still buffered must reach the reader, or the failure be told.
    let result = result.and_then(|()| Ok(output::stdout().flush()?));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader has all it wanted (`cudamem explain | head -1`).
        Err(err) if output::is_closed_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cudamem: {err:#}");
            ExitCode::FAILURE
        }
    }
}
