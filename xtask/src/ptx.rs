//! Generating `kernels/ptx/NAME.ptx` from `kernels/cuda/NAME.cu` with the
//! pinned nvcc, or checking that the committed PTX is what it generates.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::cuda_tools::{self, ToolSet};
use crate::step;

/// Regenerate the committed PTX, or compare against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Overwrite `kernels/ptx/`.
    Write,
    /// Generate into a scratch folder and fail if anything differs.
    Check,
}

/// nvcc's flags besides input and output; kernels/README.md quotes them.
const NVCC_FLAGS: &[&str] = &[
    "-ptx",
    "-arch=sm_90",
    "-O3",
    "-std=c++17",
    "--Werror",
    "all-warnings",
];

/// Modules compiled with relocatable device code (`-rdc=true`): they are
/// linked with each other when loaded (ctx's `CudaContext::link_ptx`).
pub const RELOCATABLE: &[&str] = &["cm_link", "cm_user"];

/// The files of `dir` ending in `.extension`, as sorted names without it.
fn names_with_extension(dir: &Path, extension: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == extension) {
            if let Some(stem) = path.file_stem() {
                names.push(stem.to_string_lossy().into_owned());
            }
        }
    }
    names.sort();
    Ok(names)
}

pub fn run(root: &Path, mode: Mode) -> Result<()> {
    let cuda = cuda_tools::install(root, ToolSet::Nvcc)?;
    let nvcc = cuda.join("bin").join("nvcc");
    let kernels = root.join("kernels");
    let out_dir: PathBuf = match mode {
        Mode::Write => kernels.join("ptx"),
        Mode::Check => root.join("target").join("ptx-check"),
    };
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let names = names_with_extension(&kernels.join("cuda"), "cu")?;
    for name in &names {
        // Relative paths from kernels/, so nothing machine-specific can reach
        // the output.
        let mut command = Command::new(&nvcc);
        command
            .current_dir(&kernels)
            .args(NVCC_FLAGS)
            .args(RELOCATABLE.contains(&name.as_str()).then_some("-rdc=true"))
            .arg("-o")
            .arg(out_dir.join(format!("{name}.ptx")))
            .arg(format!("cuda/{name}.cu"));
        step::run(&format!("nvcc {name}.cu"), &mut command)?;
    }
    if mode == Mode::Write {
        return Ok(());
    }
    let mut stale = Vec::new();
    for name in &names {
        let fresh = fs::read(out_dir.join(format!("{name}.ptx")))?;
        let old = fs::read(kernels.join("ptx").join(format!("{name}.ptx"))).unwrap_or_default();
        if fresh != old {
            stale.push(format!("kernels/ptx/{name}.ptx"));
        }
    }
    for name in names_with_extension(&kernels.join("ptx"), "ptx")? {
        if !names.contains(&name) {
            stale.push(format!(
                "kernels/ptx/{name}.ptx (no kernels/cuda/{name}.cu)"
            ));
        }
    }
    if !stale.is_empty() {
        bail!(
            "PTX out of date with its CUDA source: {}; run `cargo xtask ptx` and commit the result",
            stale.join(", ")
        );
    }
    println!(
        "==> kernels/ptx matches kernels/cuda ({} modules)",
        names.len()
    );
    Ok(())
}
