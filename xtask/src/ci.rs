//! `cargo xtask ci`: what CI runs, in order, stopping at the first failure.
//!
//! The tools it needs (the pinned CUDA wheels for the PTX checks, the stub
//! libcuda for building the `cuda` feature without a driver) are installed
//! first, so a fresh machine with cargo, python3/pip and a C compiler passes
//! (and chromium, from `scripts/install_browser.sh`, for the report tests).
//! The stub is generated through a `CARGO_HOME` that is empty at the start,
//! so CI proves on every run that a fresh registry finds `cust_raw`; every
//! other step uses the user's `CARGO_HOME`. Builds with the `cuda` feature
//! go to `<target>/cuda` (`step::cuda_cargo`).

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::cuda_tools::{self, ToolSet};
use crate::{ptx, step, stub};

/// The `cuda` features of the workspace, as cargo's `--features` takes them.
pub const CUDA_FEATURES: &str = "harness/cuda,ctx/cuda";

pub fn run(root: &Path) -> Result<()> {
    cuda_tools::install(root, ToolSet::Nvcc)?;
    println!("==> generate the stub libcuda, from an empty CARGO_HOME (a fresh registry)");
    let stub = stub::generate_from_empty_home(root)?;
    println!("    CUDA_LIBRARY_PATH={}", stub.display());
    ptx::run(root, ptx::Mode::Check)?;
    // The report tests render pages in a real headless browser.
    step::run(
        "install the headless browser",
        Command::new("sh")
            .current_dir(root)
            .arg("scripts/install_browser.sh"),
    )?;
    for (title, mut command) in cargo_steps(root, &stub) {
        step::run(title, &mut command)?;
    }
    println!("==> ci passed");
    Ok(())
}

/// The cargo commands of CI, in order, each with its title.
fn cargo_steps(root: &Path, stub: &Path) -> Vec<(&'static str, Command)> {
    let plain = |args: &[&str]| {
        let mut command = step::cargo();
        command.current_dir(root).args(args);
        command
    };
    let cuda = |args: &[&str]| {
        let mut command = step::cuda_cargo(root, Some(stub));
        command.args(args);
        command
    };
    let mut tests = plain(&["test", "--workspace"]);
    tests.env("KERNELS_PTXAS", cuda_tools::ptxas(root));
    vec![
        ("rustfmt", plain(&["fmt", "--all", "--", "--check"])),
        (
            "clippy",
            plain(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
        ),
        (
            // The workspace turns ctx's `kernels` feature on (harness needs
            // it); ctx alone builds without the kernels crate.
            "clippy of ctx alone, without PTX",
            plain(&[
                "clippy",
                "-p",
                "ctx",
                "--no-default-features",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
        ),
        (
            "clippy with the cuda feature (stub libcuda)",
            cuda(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--features",
                CUDA_FEATURES,
                "--",
                "-D",
                "warnings",
            ]),
        ),
        ("tests", tests),
        (
            "build with the cuda feature (stub libcuda)",
            cuda(&["build", "--workspace", "--features", CUDA_FEATURES]),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{gpu_bundle, gpu_test};

    /// Whether `command` turns on a `cuda` feature.
    fn enables_cuda(command: &Command) -> bool {
        let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
        args.windows(2)
            .any(|pair| pair[0] == "--features" && pair[1].contains("cuda"))
    }

    fn target_dir_of(command: &Command) -> Option<std::path::PathBuf> {
        command
            .get_envs()
            .find(|(key, _)| *key == "CARGO_TARGET_DIR")
            .and_then(|(_, value)| value.map(Into::into))
    }

    /// ctx alone, its `kernels` feature off as a user of the pools gets it,
    /// is checked apart from the workspace, which turns the feature on.
    #[test]
    fn ctx_is_checked_without_the_kernels_crate() {
        let steps = cargo_steps(Path::new("/w"), Path::new("/w/target/cuda-stub"));
        let alone = steps.iter().any(|(_, command)| {
            let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
            args.windows(2)
                .any(|pair| pair[0] == "-p" && pair[1] == "ctx")
                && args.iter().any(|arg| arg == "--no-default-features")
                && !enables_cuda(command)
        });
        assert!(alone, "no CI step checks ctx without its features");
    }

    /// Every cargo command xtask runs that builds the `cuda` feature writes
    /// to `<target>/cuda`; the others to the default target folder, where
    /// the CPU `cudamem` a user runs lives.
    #[test]
    fn every_cuda_build_stays_out_of_the_default_target_dir() {
        let root = Path::new("/w");
        let stub = Path::new("/w/target/cuda-stub");
        let mut commands: Vec<(String, Command)> = cargo_steps(root, stub)
            .into_iter()
            .map(|(title, command)| (title.to_owned(), command))
            .collect();
        for (index, command) in gpu_bundle::cargo_commands(root, stub)
            .into_iter()
            .enumerate()
        {
            commands.push((format!("gpu-bundle #{index}"), command));
        }
        for (index, command) in gpu_test::cargo_commands(root).into_iter().enumerate() {
            commands.push((format!("gpu-test #{index}"), command));
        }
        let cuda_dir = step::cuda_target_dir(root);
        let mut cuda_builds = 0;
        for (title, command) in &commands {
            if enables_cuda(command) {
                cuda_builds += 1;
                assert_eq!(target_dir_of(command), Some(cuda_dir.clone()), "{title}");
            } else {
                assert_eq!(target_dir_of(command), None, "{title}");
            }
        }
        // clippy and build in CI, two builds in gpu-bundle, two in gpu-test.
        assert_eq!(cuda_builds, 6);
    }
}
