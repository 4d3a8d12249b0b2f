//! `cargo xtask gpu-test`: on a machine with an NVIDIA GPU and Rust, build
//! against the real driver library and run ctx's tests and the hardware
//! suite. Refuses to run, with a non-zero exit, where there is no GPU.

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

use crate::step;

/// Fails unless the machine has an NVIDIA GPU and its driver library.
pub fn require_gpu() -> Result<()> {
    let device_node = Path::new("/dev/nvidia0").exists();
    let listed = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|out| {
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("GPU ")
        });
    if !device_node && !listed {
        bail!(
            "no NVIDIA GPU here: /dev/nvidia0 is missing and `nvidia-smi -L` lists none. \
             gpu-test needs a GPU; on a GPU machine without Rust, use `cargo xtask gpu-bundle DIR` \
             here and run DIR/run.sh there"
        );
    }
    if !driver_library_present() {
        bail!(
            "the NVIDIA driver library libcuda.so.1 is not in the loader cache (`ldconfig -p`) \
             nor in LD_LIBRARY_PATH"
        );
    }
    Ok(())
}

fn driver_library_present() -> bool {
    let cached = Command::new("ldconfig")
        .arg("-p")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("libcuda.so.1"));
    let on_path = std::env::var_os("LD_LIBRARY_PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("libcuda.so.1").is_file())
    });
    cached || on_path
}

pub fn run(root: &Path) -> Result<()> {
    require_gpu()?;
    if std::env::var_os("CUDA_LIBRARY_PATH")
        .is_some_and(|p| p.to_string_lossy().contains("cuda-stub"))
    {
        bail!("CUDA_LIBRARY_PATH points at the stub libcuda; unset it to build against the driver");
    }
    let [mut tests, mut suite] = cargo_commands(root);
    step::run("ctx tests with the cuda feature (real driver)", &mut tests)?;
    step::run("GPU suite", &mut suite)?;
    println!(
        "==> gpu-test passed; the suite's log is {}",
        gpusuite_log(root).display()
    );
    Ok(())
}

fn gpusuite_log(root: &Path) -> std::path::PathBuf {
    step::target_dir(root).join("gpusuite.log")
}

/// ctx's tests and the hardware suite, built with the `cuda` feature in
/// `<target>/cuda` against the real driver.
pub fn cargo_commands(root: &Path) -> [Command; 2] {
    let mut tests = step::cuda_cargo(root, None);
    tests.args([
        "test",
        "-p",
        "ctx",
        "--features",
        "cuda",
        "--",
        "--test-threads=1",
    ]);
    let mut suite = step::cuda_cargo(root, None);
    suite
        .args(["run", "--release", "-p", "harness", "--features", "cuda"])
        .args(["--bin", "gpusuite", "--", "--log"])
        .arg(gpusuite_log(root));
    [tests, suite]
}
