//! `cudamem`: where did my GPU memory go? The command is the `cudamem`
//! library's [`cudamem::cli`]; this binary parses the command line, runs it
//! on standard output and exits with its status. Run `cudamem --help` for
//! usage, and see `harness/README.md`.

use std::process::ExitCode;

use clap::Parser;
use cudamem::cli::{self, Cli, Exit, output};

fn main() -> ExitCode {
    let exit = Exit::of(&cli::run(Cli::parse(), &mut output::stdout()));
    if let Exit::Failed(message) = &exit {
        eprintln!("cudamem: {message}");
    }
    ExitCode::from(exit.code())
}
