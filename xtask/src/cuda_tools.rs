//! The pinned CUDA 13.0 compiler tools, from NVIDIA's PyPI wheels, installed
//! into `target/cuda-tools` so a fresh machine needs only python3 and pip.
//!
//! CUDA 13.0 because the H200 machine's driver (580) loads PTX up to ISA 9.0,
//! which is what nvcc 13.0 emits; a newer nvcc would emit PTX that driver
//! rejects.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::step;

/// The version of every wheel.
pub const VERSION: &str = "13.0.88";

/// Which tools to install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSet {
    /// ptxas alone (the `nvidia-cuda-nvcc` wheel): what the PTX tests need.
    Ptxas,
    /// nvcc and what it needs to compile `.cu` to `.ptx` (cicc, headers).
    Nvcc,
}

impl ToolSet {
    fn wheels(self) -> &'static [&'static str] {
        match self {
            ToolSet::Ptxas => &["nvidia-cuda-nvcc"],
            ToolSet::Nvcc => &[
                "nvidia-cuda-nvcc",
                "nvidia-nvvm",
                "nvidia-cuda-crt",
                "nvidia-cuda-runtime",
            ],
        }
    }

    /// Files (under the CUDA folder) whose presence means the set is there.
    fn marker_files(self) -> &'static [&'static str] {
        match self {
            ToolSet::Ptxas => &["bin/ptxas"],
            ToolSet::Nvcc => &[
                "bin/ptxas",
                "bin/nvcc",
                "nvvm/bin/cicc",
                "include/crt/host_config.h",
                "include/cuda_runtime.h",
            ],
        }
    }
}

/// Where pip installs the wheels.
fn install_dir(root: &Path) -> PathBuf {
    root.join("target").join("cuda-tools")
}

/// The CUDA folder inside the installed wheels (`bin/`, `include/`, `nvvm/`).
pub fn cuda_dir(root: &Path) -> PathBuf {
    install_dir(root).join("nvidia").join("cu13")
}

/// The ptxas that the kernels tests use.
pub fn ptxas(root: &Path) -> PathBuf {
    cuda_dir(root).join("bin").join("ptxas")
}

/// Whether the installed ptxas is the pinned release.
fn pinned_release_installed(root: &Path) -> bool {
    Command::new(ptxas(root))
        .arg("--version")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(&format!("V{VERSION}")))
}

/// Installs `set` unless it is already there; returns the CUDA folder.
pub fn install(root: &Path, set: ToolSet) -> Result<PathBuf> {
    let cuda = cuda_dir(root);
    let present = set.marker_files().iter().all(|f| cuda.join(f).is_file());
    if present && pinned_release_installed(root) {
        println!(
            "==> CUDA {VERSION} tools ({set:?}) already in {}",
            cuda.display()
        );
        return Ok(cuda);
    }
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let mut pip = Command::new(python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--root-user-action=ignore",
    ])
    .args(["--no-deps", "--only-binary=:all:", "--upgrade", "--target"])
    .arg(install_dir(root))
    .args(set.wheels().iter().map(|w| format!("{w}=={VERSION}")));
    step::run(&format!("install CUDA {VERSION} tools ({set:?})"), &mut pip)?;
    let missing: Vec<&str> = set
        .marker_files()
        .iter()
        .copied()
        .filter(|f| !cuda.join(f).is_file())
        .collect();
    if !missing.is_empty() || !pinned_release_installed(root) {
        bail!(
            "pip finished but {} lacks {missing:?} or its ptxas is not V{VERSION}",
            cuda.display()
        );
    }
    Ok(cuda)
}
