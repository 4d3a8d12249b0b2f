//! The `cudamem` command in process: its arguments ([`Cli`]), each
//! subcommand writing to any output ([`run`]), and how a run ends
//! ([`Exit`]). The binary parses, calls [`run`] with standard output, and
//! exits with [`Exit::code`].

pub mod byte_size;
pub mod explain;
pub mod explain_devices;
pub mod explain_snapshot;
pub mod malloc_heap;
pub mod output;
pub mod pause;
pub mod replay_command;
pub mod run;
pub mod snapshot_oom;
pub mod torch_adoption;

use std::io::Write;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// What `cudamem --help` opens with: what the command is for, and what a
/// bare `cudamem` does.
const ABOUT: &str = "Where did my GPU memory go? cudamem explains what a CUDA context and a \
program's own allocations take (`cudamem run -- PROGRAM` for your own program), and replays recorded \
allocation traces (RMM logs, PyTorch memory snapshots) through the allocators the program could use \
instead, ending with which setting saves how much.

With no command, cudamem replays its built-in ResNet-50 training traces (a PyTorch memory snapshot, \
then an RMM log), prints each table and its conclusion, and writes the HTML report \
cudamem-report.html in the current directory.";

/// The command line of `cudamem`.
#[derive(Debug, Parser)]
#[command(
    name = "cudamem",
    version,
    about = ABOUT,
    long_about = None,
    max_term_width = ctx::text::LINE_WIDTH
)]
pub struct Cli {
    /// The subcommand; none: `replay` of the built-in traces.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay allocation traces through the allocators a program could use,
    /// and say which saves how much (with no trace: the built-in ResNet-50
    /// traces, and an HTML report).
    #[command(after_long_help = crate::report::summary::columns_help())]
    Replay(replay_command::ReplayArgs),
    /// What a CUDA context costs before the first allocation, item by item.
    Explain(explain::ExplainArgs),
    /// The malloc heap (cudaLimitMallocHeapSize) an in-kernel malloc pattern needs.
    Heap(malloc_heap::HeapArgs),
    /// Run a CUDA program with its driver calls recorded, and explain its
    /// memory (and any out-of-memory) item by item; exits with its status.
    Run(run::RunArgs),
    /// Give back the device memory of programs started with `cudamem run
    /// --pool`, by PID: their threads wait, the memory is copied to host and
    /// released, every address stays reserved (all PIDs, or none).
    Pause(pause::PauseArgs),
    /// Bring paused programs' memory back at the same addresses and let
    /// them go on (all PIDs, or none).
    Resume(pause::ResumeArgs),
    /// What a program started with `cudamem run --pool` holds on the device
    /// now, and why each byte stays.
    Ledger(pause::LedgerArgs),
}

/// Run the command `cli` names, writing what it prints to `out` (files it
/// writes, such as reports, go where its arguments say).
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<()> {
    match cli.command {
        None => replay_command::run(replay_command::ReplayArgs::defaults()?, out),
        Some(Command::Replay(args)) => replay_command::run(args, out),
        Some(Command::Explain(args)) => explain::run(args, out),
        Some(Command::Heap(args)) => malloc_heap::run(args, out),
        Some(Command::Pause(args)) => pause::pause(&args, out),
        Some(Command::Resume(args)) => pause::resume(&args, out),
        Some(Command::Ledger(args)) => pause::ledger(&args, out),
        Some(Command::Run(args)) => match run::run(args) {
            0 => Ok(()),
            status => Err(ProgramStatus(status).into()),
        },
    }?;
    // What is still buffered must reach the reader, or the failure be told.
    Ok(out.flush()?)
}

/// `cudamem run`'s program ended with this non-zero exit status (a signal
/// `n` as `128 + n`), which `cudamem` exits with in turn; what went wrong
/// was the program's to tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the program exited with status {0}")]
pub struct ProgramStatus(pub u8);

/// How a run of the command ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It did what was asked.
    Done,
    /// The reader closed the pipe (`cudamem explain | head -1`): it has all
    /// it wanted, so this is no failure.
    ReaderGone,
    /// It failed; the message for standard error, causes included.
    Failed(String),
    /// `cudamem run`'s program exited with this non-zero status, passed on.
    Program(u8),
}

impl Exit {
    /// How `result`, a run's, ends.
    pub fn of(result: &Result<()>) -> Self {
        match result {
            Ok(()) => Exit::Done,
            Err(err) if output::is_closed_pipe(err) => Exit::ReaderGone,
            Err(err) if let Some(ProgramStatus(status)) = err.downcast_ref() => {
                Exit::Program(*status)
            }
            Err(err) => Exit::Failed(format!("{err:#}")),
        }
    }

    /// The process's exit status: 0, or 1 for a failure (clap exits with 2
    /// on arguments it cannot parse, before any run).
    pub fn code(&self) -> u8 {
        match self {
            Exit::Done | Exit::ReaderGone => 0,
            Exit::Failed(_) => 1,
            Exit::Program(status) => *status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_success_and_other_failures_are_one() {
        let pipe: Result<()> = Err(anyhow::Error::new(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        ))
        .context("writing the table"));
        assert_eq!(Exit::of(&pipe), Exit::ReaderGone);
        assert_eq!(Exit::of(&pipe).code(), 0);
        assert_eq!(Exit::of(&Ok(())).code(), 0);
        let full: Result<()> = Err(anyhow::Error::new(std::io::Error::from(
            std::io::ErrorKind::StorageFull,
        ))
        .context("writing to standard output"));
        let exit = Exit::of(&full);
        assert_eq!(exit.code(), 1);
        assert!(
            matches!(&exit, Exit::Failed(message) if message.starts_with("writing to standard output: ")),
            "{exit:?}"
        );
    }
}
