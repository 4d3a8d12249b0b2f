//! `cargo xtask ci`: what CI runs, in order, stopping at the first failure.
//!
//! The tools it needs (the pinned CUDA wheels for the PTX checks, the stub
//! libcuda for building the `cuda` feature without a driver) are installed
//! first, so a fresh machine with cargo, python3/pip and a C compiler passes.

use std::path::Path;

use anyhow::Result;

use crate::cuda_tools::{self, ToolSet};
use crate::{ptx, step, stub};

/// The `cuda` features of the workspace, as cargo's `--features` takes them.
pub const CUDA_FEATURES: &str = "harness/cuda,ctx/cuda";

pub fn run(root: &Path) -> Result<()> {
    cuda_tools::install(root, ToolSet::Nvcc)?;
    println!("==> generate the stub libcuda");
    let stub = stub::generate(root)?;
    println!("    CUDA_LIBRARY_PATH={}", stub.display());

    step::run(
        "rustfmt",
        step::cargo()
            .current_dir(root)
            .args(["fmt", "--all", "--", "--check"]),
    )?;
    ptx::run(root, ptx::Mode::Check)?;
    step::run(
        "clippy",
        step::cargo().current_dir(root).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    step::run(
        "clippy with the cuda feature (stub libcuda)",
        step::cargo()
            .current_dir(root)
            .env("CUDA_LIBRARY_PATH", &stub)
            .args(["clippy", "--workspace", "--all-targets", "--features"])
            .args([CUDA_FEATURES, "--", "-D", "warnings"]),
    )?;
    step::run(
        "tests",
        step::cargo()
            .current_dir(root)
            .env("KERNELS_PTXAS", cuda_tools::ptxas(root))
            .args(["test", "--workspace"]),
    )?;
    step::run(
        "build with the cuda feature (stub libcuda)",
        step::cargo()
            .current_dir(root)
            .env("CUDA_LIBRARY_PATH", &stub)
            .args(["build", "--workspace", "--features", CUDA_FEATURES]),
    )?;
    println!("==> ci passed");
    Ok(())
}
