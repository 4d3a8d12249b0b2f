//! `cargo xtask gpu-bundle DIR`: build the hardware suite here, against the
//! stub libcuda, and lay it out in DIR for a GPU machine that has no Rust:
//!
//! ```text
//! DIR/bin/gpusuite     the GPU suite (harness, release, `cuda` feature)
//! DIR/bin/cudamem      the command, built with `cuda`, run on the device
//! DIR/bin/libcudamem_interpose.so
//!                      the driver interposer `cudamem run` preloads (found
//!                      beside the command; it links no CUDA library)
//! DIR/tests/*          ctx's test executables built with the `cuda` feature
//! DIR/ptx/*.ptx        the kernels' PTX (also embedded in the binaries)
//! DIR/traces/          the repository's real traces, for `cudamem replay --gpu`
//! DIR/scripts/lib/     check.sh: what the GPU checks and run.sh share
//! DIR/scripts/run/     `cudamem run`'s GPU check: CUDA C sources (built there
//!                      with nvcc), Python jobs, gpu_check.sh
//! DIR/scripts/torch/   the PyTorch workloads gpu_check.sh times
//! DIR/scripts/pause/   `cudamem pause`'s GPU check: pause_job.cu (built
//!                      there with nvcc), PyTorch, CuPy and JAX jobs,
//!                      gpu_check.sh
//! DIR/fixtures/        the fake driver and its test programs (C sources):
//!                      gpu_check.sh times the interposer against them on
//!                      the GPU machine's CPU, beside the real driver
//! DIR/run.sh           runs them all; logs and summary.md to $1 or $OUT
//! ```
//!
//! `DIR/scripts/run/gpu_check.sh DIR OUTDIR` runs `cudamem run`'s check.
//!
//! The builds go to `<target>/cuda`, so `target/release/cudamem` stays the
//! CPU build. Binaries are stripped, and checked to carry no rpath to the stub: on the
//! GPU machine the loader must find the real `libcuda.so.1`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail, ensure};

use crate::{step, stub};

/// The largest bundle made unless `--max-mib` says otherwise, MiB: what a
/// copy to a GPU machine is usually given room for.
pub const DEFAULT_MAX_MIB: u64 = 64;

/// Marks a folder as one this command made, so a rerun may replace it.
const MARKER: &str = ".gpu-bundle";

const RUN_SH: &str = r##"#!/usr/bin/env bash
# Runs the bundled GPU suite and ctx's CUDA test executables on a machine
# with an NVIDIA GPU. Logs and a summary table go to $1, else $OUT.
# Exits non-zero if anything failed. Written by `cargo xtask gpu-bundle`.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# gpu_facts, table_head, record
. "$here/scripts/lib/check.sh"
dest="${1:-${OUT:-}}"
if [ -z "$dest" ]; then
  echo "usage: run.sh LOG_DIR (or set OUT)" >&2
  exit 2
fi
mkdir -p "$dest"
summary="$dest/summary.md"
failed=0
{
  echo "# GPU bundle run, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  gpu_facts
  echo '```'
  echo
  table_head what
} > "$summary"

: > "$dest/tests.log"
for t in "$here"/tests/*; do
  [ -x "$t" ] || continue
  name="$(basename "$t")"
  start=$(date +%s)
  echo "=== $name" >> "$dest/tests.log"
  # One test at a time: several would share the GPU and its mem_get_info.
  "$t" --test-threads=1 >> "$dest/tests.log" 2>&1
  record "test $name" $? $(( $(date +%s) - start )) tests.log
done

start=$(date +%s)
"$here/bin/gpusuite" --log "$dest/gpusuite.log" 2>&1 | tee "$dest/gpusuite.out"
record gpusuite "${PIPESTATUS[0]}" $(( $(date +%s) - start )) "gpusuite.log, gpusuite.out"

# The command a user runs on a GPU: the ledger, predicted and measured, and
# the heap a device-malloc pattern needs.
: > "$dest/cudamem.log"
for args in "explain --device 0" "explain --device 0 --json" \
            "explain --device 0 --lmem 16KiB" "heap --size 256 --threads 1048576 --device 0"; do
  start=$(date +%s)
  echo "=== cudamem $args" >> "$dest/cudamem.log"
  # shellcheck disable=SC2086 # the arguments are meant to split
  "$here/bin/cudamem" $args >> "$dest/cudamem.log" 2>&1
  record "cudamem $args" $? $(( $(date +%s) - start )) cudamem.log
done

# The stitched pool on the driver: every real trace replayed through it, with
# footprint by cuMemGetInfo, time per call and copy bandwidth at the peak.
: > "$dest/replay-gpu.log"
for trace in "$here"/traces/rmm/*.csv.gz "$here"/traces/pytorch/*.full.default.pickle.gz; do
  [ -f "$trace" ] || continue
  name="$(basename "$trace")"
  start=$(date +%s)
  echo "=== cudamem replay $name --gpu 0" >> "$dest/replay-gpu.log"
  "$here/bin/cudamem" replay "$trace" --gpu 0 >> "$dest/replay-gpu.log" 2>&1
  record "cudamem replay $name --gpu 0" $? $(( $(date +%s) - start )) replay-gpu.log
done

cat "$summary"
exit $failed
"##;

/// Files of compiler artifacts named `name` that cargo reports building,
/// from `--message-format=json` output.
fn artifact_files(json_lines: &str, name: &str) -> Vec<PathBuf> {
    json_lines
        .lines()
        .filter(|line| line.contains(r#""reason":"compiler-artifact""#))
        .filter_map(|line| line.split_once(r#""filenames":["#))
        .filter_map(|(_, rest)| rest.split(']').next())
        .flat_map(|list| {
            list.split(',')
                .map(|file| file.trim_matches('"').to_string())
        })
        .map(PathBuf::from)
        .filter(|path| path.file_name() == Some(name.as_ref()))
        .collect()
}

/// Executables that cargo reports building, from `--message-format=json` output.
fn executables(json_lines: &str) -> Vec<PathBuf> {
    json_lines
        .lines()
        .filter(|line| line.contains(r#""reason":"compiler-artifact""#))
        .filter_map(|line| line.split_once(r#""executable":""#))
        .filter_map(|(_, rest)| rest.split('"').next())
        .map(PathBuf::from)
        .collect()
}

/// The hardware suite and `cudamem`, release, `cuda` feature.
const SUITE_ARGS: &[&str] = &[
    "build",
    "--release",
    "-p",
    "harness",
    "--features",
    "cuda",
    "--bin",
    "gpusuite",
    "--bin",
    "cudamem",
];

/// The driver interposer, release, in the default target folder: it needs
/// no `cuda` feature and links no CUDA library (checked), since the program
/// it is loaded into brings the driver.
const HOOK_ARGS: &[&str] = &["build", "--release", "-p", "cudamem-interpose", "--lib"];

/// The interposer's file name.
const HOOK_FILE: &str = "libcudamem_interpose.so";

/// ctx's test executables, release, `cuda` feature.
const TEST_ARGS: &[&str] = &[
    "test",
    "--release",
    "-p",
    "ctx",
    "--features",
    "cuda",
    "--no-run",
];

/// A build with the `cuda` feature against the stub, in `<target>/cuda`.
fn cargo_command(stub: &Path, root: &Path, args: &[&str]) -> Command {
    let mut command = step::cuda_cargo(root, Some(stub));
    command
        .args(args)
        .arg("--message-format=json-render-diagnostics");
    command
}

/// The interposer's build.
fn hook_command(root: &Path) -> Command {
    let mut command = step::cargo();
    command
        .current_dir(root)
        .args(HOOK_ARGS)
        .arg("--message-format=json-render-diagnostics");
    command
}

/// The cargo commands this task runs, in order.
#[cfg(test)]
pub fn cargo_commands(root: &Path, stub: &Path) -> Vec<Command> {
    vec![
        cargo_command(stub, root, SUITE_ARGS),
        hook_command(root),
        cargo_command(stub, root, TEST_ARGS),
    ]
}

fn build(stub: &Path, root: &Path, args: &[&str]) -> Result<Vec<PathBuf>> {
    let mut command = cargo_command(stub, root, args);
    println!("==> cargo {}", args.join(" "));
    Ok(executables(&step::output(&mut command)?))
}

/// Empties `dir` if this command made it; refuses to touch anything else.
fn prepare(dir: &Path) -> Result<()> {
    if dir.exists() {
        let empty = fs::read_dir(dir)?.next().is_none();
        ensure!(
            empty || dir.join(MARKER).is_file(),
            "{} exists and is not a bundle this command made; choose another folder",
            dir.display()
        );
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    for sub in ["bin", "tests", "ptx"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    fs::write(dir.join(MARKER), "made by `cargo xtask gpu-bundle`\n")?;
    Ok(())
}

/// The dynamic section of an ELF file, as `readelf -d` prints it.
fn dynamic_section(path: &Path) -> Result<String> {
    step::output(Command::new("readelf").arg("-d").arg(path))
}

/// Whether the executable loads the CUDA driver library.
fn loads_driver(dynamic: &str) -> bool {
    dynamic.contains("[libcuda.so.1]")
}

/// Copies `exe` to `to`, strips it, and checks it has no rpath to the stub.
fn install_binary(exe: &Path, to: &Path, stub: &Path) -> Result<()> {
    fs::copy(exe, to).with_context(|| format!("copying {}", exe.display()))?;
    step::run(
        &format!("strip {}", to.display()),
        Command::new("strip").arg("--strip-all").arg(to),
    )?;
    let stub_text = stub.to_string_lossy();
    for line in dynamic_section(to)?.lines() {
        if (line.contains("RPATH") || line.contains("RUNPATH"))
            && (line.contains(stub_text.as_ref()) || line.contains("cuda-stub"))
        {
            bail!("{} has an rpath to the stub libcuda: {line}", to.display());
        }
    }
    Ok(())
}

/// Copies the files under `from` to `to`, folders and all.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let path = entry.path();
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&path, &target)?;
        } else {
            fs::copy(&path, &target).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

fn bytes_under(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            bytes_under(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

pub fn run(root: &Path, dir: &Path, max_mib: u64) -> Result<()> {
    let max_bytes = max_mib << 20;
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()?.join(dir)
    };
    let stub = stub::generate(root)?;
    let suite = build(&stub, root, SUITE_ARGS)?;
    let named = |name: &str| {
        suite
            .iter()
            .find(|path| path.file_name() == Some(name.as_ref()))
    };
    let (Some(suite), Some(cudamem)) = (named("gpusuite"), named("cudamem")) else {
        bail!("expected gpusuite and cudamem executables, cargo reported {suite:?}");
    };
    println!("==> cargo {}", HOOK_ARGS.join(" "));
    let hook = artifact_files(&step::output(&mut hook_command(root))?, HOOK_FILE);
    let Some(hook) = hook.first() else {
        bail!("cargo reported no {HOOK_FILE}");
    };
    ensure!(
        !loads_driver(&dynamic_section(hook)?),
        "{} links libcuda.so.1: a program that never touches CUDA would load the driver with it",
        hook.display()
    );
    let tests = build(&stub, root, TEST_ARGS)?;

    ensure!(
        loads_driver(&dynamic_section(suite)?),
        "{} does not load libcuda.so.1",
        suite.display()
    );
    // Test executables that never call the driver (the linker dropped
    // libcuda) run on CI already; only the others need the GPU.
    let mut gpu_tests = Vec::new();
    for test in tests {
        if loads_driver(&dynamic_section(&test)?) {
            gpu_tests.push(test);
        } else {
            println!("    {} does not use the driver; left out", test.display());
        }
    }

    prepare(&dir)?;
    install_binary(suite, &dir.join("bin").join("gpusuite"), &stub)?;
    install_binary(cudamem, &dir.join("bin").join("cudamem"), &stub)?;
    install_binary(hook, &dir.join("bin").join(HOOK_FILE), &stub)?;
    for test in &gpu_tests {
        let name = test.file_name().context("test executable without a name")?;
        install_binary(test, &dir.join("tests").join(name), &stub)?;
    }
    for entry in fs::read_dir(root.join("kernels").join("ptx"))? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            fs::copy(&path, dir.join("ptx").join(name))?;
        }
    }
    copy_tree(&root.join("traces"), &dir.join("traces"))?;
    for scripts in ["lib", "run", "torch", "pause"] {
        copy_tree(
            &root.join("scripts").join(scripts),
            &dir.join("scripts").join(scripts),
        )?;
    }
    copy_tree(
        &root.join("interpose").join("fixtures"),
        &dir.join("fixtures"),
    )?;
    step::run(
        "chmod gpu_check.sh",
        Command::new("chmod")
            .arg("+x")
            .arg(dir.join("scripts/run/gpu_check.sh"))
            .arg(dir.join("scripts/pause/gpu_check.sh")),
    )?;
    let run_sh = dir.join("run.sh");
    fs::write(&run_sh, RUN_SH)?;
    step::run("chmod run.sh", Command::new("chmod").arg("+x").arg(&run_sh))?;

    let bytes = bytes_under(&dir)?;
    ensure!(
        bytes < max_bytes,
        "the bundle is {bytes} bytes; --max-mib {max_mib} allows less than {max_bytes} (pass a larger --max-mib to make it anyway)"
    );
    println!(
        "==> bundle in {} ({:.1} MiB: gpusuite, cudamem, {HOOK_FILE}, traces, scripts + {} test executables); run it with `{}/run.sh LOG_DIR`, and `cudamem run`'s check with `{}/scripts/run/gpu_check.sh {} OUTDIR`",
        dir.display(),
        bytes as f64 / f64::from(1 << 20),
        gpu_tests.len(),
        dir.display(),
        dir.display(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_tree_copies_nested_files() {
        let base = std::env::temp_dir().join(format!("gpu-bundle-copy-{}", std::process::id()));
        let from = base.join("from");
        fs::create_dir_all(from.join("rmm")).unwrap();
        fs::write(from.join("README.md"), b"top").unwrap();
        fs::write(from.join("rmm").join("a.csv.gz"), b"nested").unwrap();
        let to = base.join("to");
        copy_tree(&from, &to).unwrap();
        assert_eq!(fs::read(to.join("README.md")).unwrap(), b"top");
        assert_eq!(
            fs::read(to.join("rmm").join("a.csv.gz")).unwrap(),
            b"nested"
        );
        assert_eq!(bytes_under(&to).unwrap(), 9);
        assert!(copy_tree(&base.join("missing"), &to).is_err());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_interposer_is_found_among_an_artifacts_files() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"cudamem_interpose"},"filenames":["/t/release/libcudamem_interpose.so","/t/release/libcudamem_interpose.rlib"],"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"other"},"filenames":["/t/release/libother.rlib"],"executable":null}"#,
        );
        assert_eq!(
            artifact_files(json, HOOK_FILE),
            [PathBuf::from("/t/release/libcudamem_interpose.so")]
        );
        assert!(artifact_files(json, "libnothing.so").is_empty());
    }

    #[test]
    fn executables_come_from_compiler_artifacts_only() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"ctx"},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"gpusuite"},"executable":"/t/release/gpusuite","fresh":true}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(executables(json), [PathBuf::from("/t/release/gpusuite")]);
    }
}
