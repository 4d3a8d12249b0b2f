//! Project automation, run as `cargo xtask <command>` (alias in
//! `.cargo/config.toml`).
//!
//! - `ci`: everything CI checks, in order, stopping at the first failure.
//! - `cuda-tools [--nvcc]`: install the pinned CUDA 13.0 wheels (ptxas; with
//!   `--nvcc` the whole compiler) into `target/cuda-tools`.
//! - `ptx [--check]`: regenerate `kernels/ptx/` from `kernels/cuda/`, or check
//!   that the committed PTX is what the sources produce.
//! - `stub [--empty-cargo-home]`: build the stub libcuda and print the folder
//!   to export as `CUDA_LIBRARY_PATH` for a `cuda` build on a machine without
//!   a driver; with the flag, find `cust_raw` through an empty `CARGO_HOME`,
//!   as `ci` does.
//! - `gpu-test`: on a machine with an NVIDIA GPU, build against the real driver
//!   and run the hardware suite.
//! - `gpu-bundle [--max-mib N] DIR`: build the hardware suite here (against a
//!   stub libcuda) and put it, with a `run.sh`, in DIR for a GPU machine
//!   without Rust; a bundle of N MiB or more (default 64) is refused.
//!
//! Every build with the `cuda` feature goes to `<target>/cuda`, so the
//! `cudamem` in `target/{debug,release}` is always the CPU build.
//!
//! Depends on anyhow and std only, so it builds in seconds.

mod ci;
mod cuda_tools;
mod gpu_bundle;
mod gpu_test;
mod ptx;
mod step;
mod stub;
#[cfg(test)]
mod tidy;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  ci                  install tools, then fmt, PTX check, clippy (with and without `cuda`), tests, cuda build
  cuda-tools [--nvcc] install the pinned CUDA 13.0 wheels into target/cuda-tools (ptxas; --nvcc: nvcc too)
  ptx [--check]       regenerate kernels/ptx from kernels/cuda (--check: fail if they differ instead)
  stub [--empty-cargo-home]
                      build the stub libcuda; print the folder for CUDA_LIBRARY_PATH
                      (--empty-cargo-home: find cust_raw through a fresh registry, as ci does)
  gpu-test            on an NVIDIA GPU machine: build with the real driver and run the hardware suite
  gpu-bundle [--max-mib N] DIR
                      build the hardware suite here and put it in DIR with a run.sh for a GPU machine
                      (--max-mib: refuse a bundle of N MiB or more; default 64)";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let root = workspace_root();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // `--help` anywhere asks for the usage: never a folder named `--help`.
    if args.iter().any(|arg| matches!(*arg, "--help" | "-h")) {
        println!("{USAGE}");
        return Ok(());
    }
    match args.as_slice() {
        ["ci"] => ci::run(&root),
        ["cuda-tools"] => cuda_tools::install(&root, cuda_tools::ToolSet::Ptxas).map(drop),
        ["cuda-tools", "--nvcc"] => cuda_tools::install(&root, cuda_tools::ToolSet::Nvcc).map(drop),
        ["ptx"] => ptx::run(&root, ptx::Mode::Write),
        ["ptx", "--check"] => ptx::run(&root, ptx::Mode::Check),
        ["stub"] => {
            println!("{}", stub::generate(&root)?.display());
            Ok(())
        }
        ["stub", "--empty-cargo-home"] => {
            println!("{}", stub::generate_from_empty_home(&root)?.display());
            Ok(())
        }
        ["gpu-test"] => gpu_test::run(&root),
        ["gpu-bundle", option] if option.starts_with('-') => {
            bail!(
                "gpu-bundle: unknown option {option:?} (a folder named so: ./{option})\n\n{USAGE}"
            )
        }
        ["gpu-bundle", dir] => gpu_bundle::run(&root, Path::new(dir), gpu_bundle::DEFAULT_MAX_MIB),
        ["gpu-bundle", "--max-mib", mib, dir] => {
            gpu_bundle::run(&root, Path::new(dir), parse_mib(mib)?)
        }
        ["help" | "--help" | "-h"] => {
            println!("{USAGE}");
            Ok(())
        }
        [] => bail!("no command given\n\n{USAGE}"),
        _ => bail!("unknown arguments {args:?}\n\n{USAGE}"),
    }
}

/// A `--max-mib` value: a whole, positive number of MiB.
fn parse_mib(text: &str) -> Result<u64> {
    match text.parse::<u64>() {
        Ok(mib) if mib > 0 && mib <= u64::MAX >> 20 => Ok(mib),
        _ => bail!("--max-mib takes a whole number of MiB above 0, not {text:?}"),
    }
}

/// The workspace root: the folder above this crate's manifest.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ sits in the workspace root")
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_arguments_is_an_error_that_lists_the_commands() {
        let error = run(Vec::new()).unwrap_err().to_string();
        assert!(error.starts_with("no command given"), "{error}");
        assert!(!error.contains("unknown arguments"), "{error}");
        for command in [
            "ci",
            "cuda-tools",
            "ptx",
            "stub",
            "gpu-test",
            "gpu-bundle [--max-mib N] DIR",
        ] {
            assert!(
                error.contains(&format!("\n  {command}")),
                "{command}: {error}"
            );
        }
    }

    #[test]
    fn a_bundle_limit_is_a_whole_positive_number_of_mib() {
        assert_eq!(parse_mib("64").unwrap(), 64);
        assert_eq!(parse_mib("1").unwrap(), 1);
        for bad in ["0", "-1", "1.5", "64MiB", "", "99999999999999999999"] {
            let error = parse_mib(bad).unwrap_err().to_string();
            assert!(error.contains("--max-mib"), "{bad}: {error}");
        }
        // A bad limit is refused before anything is built.
        let error = run(vec![
            "gpu-bundle".into(),
            "--max-mib".into(),
            "0".into(),
            "dir".into(),
        ])
        .unwrap_err()
        .to_string();
        assert!(error.contains("--max-mib"), "{error}");
    }

    #[test]
    fn help_is_a_success() {
        for flag in ["help", "--help", "-h"] {
            assert!(run(vec![flag.to_owned()]).is_ok(), "{flag}");
        }
        // After a command too, and nothing is built.
        for command in ["gpu-bundle", "ci", "ptx"] {
            assert!(run(vec![command.to_owned(), "--help".to_owned()]).is_ok());
        }
    }

    #[test]
    fn a_bundle_folder_that_looks_like_an_option_is_refused() {
        let error = run(vec!["gpu-bundle".into(), "--dry-run".into()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown option \"--dry-run\""), "{error}");
    }
}
