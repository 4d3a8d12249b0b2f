//! Every module assembles with ptxas for sm_90, and each kernel's stack frame
//! (its local memory per thread) is what its description says, with no
//! spills.
//!
//! ptxas comes from the pinned `nvidia-cuda-nvcc==13.0.88` wheel, installed
//! by `cargo xtask cuda-tools` (which `cargo xtask ci` runs first), or from
//! the path in `KERNELS_PTXAS`. Without it this test fails: it is the only
//! check that the driver's own assembler will accept the committed PTX.

use std::path::{Path, PathBuf};
use std::process::Command;

use kernels::{MODULES, Module};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("kernels/ sits in the workspace root")
        .to_path_buf()
}

fn ptxas() -> PathBuf {
    if let Some(path) = std::env::var_os("KERNELS_PTXAS") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "KERNELS_PTXAS={} is not a file",
            path.display()
        );
        return path;
    }
    let path = workspace_root().join("target/cuda-tools/nvidia/cu13/bin/ptxas");
    assert!(
        path.is_file(),
        "ptxas not found at {}: run `cargo xtask cuda-tools` (needs python3 -m pip and PyPI) \
         or set KERNELS_PTXAS to a CUDA 13.0 ptxas",
        path.display()
    );
    path
}

/// What ptxas -v reports for one function.
#[derive(Debug, PartialEq, Eq)]
struct FunctionProperties {
    stack_frame_bytes: u64,
    spill_store_bytes: u64,
    spill_load_bytes: u64,
}

/// Parses `Function properties for NAME` followed by
/// `N bytes stack frame, S bytes spill stores, L bytes spill loads`.
fn parse_properties(report: &str) -> Vec<(String, FunctionProperties)> {
    let mut found = Vec::new();
    let mut lines = report.lines();
    while let Some(line) = lines.next() {
        let Some((_, name)) = line.split_once("Function properties for ") else {
            continue;
        };
        let numbers: Vec<u64> = lines
            .next()
            .unwrap_or("")
            .split(',')
            .map(|part| {
                let n = part.trim().split(' ').next().unwrap_or("");
                n.parse()
                    .unwrap_or_else(|_| panic!("unexpected ptxas line for {name}: {part}"))
            })
            .collect();
        assert_eq!(numbers.len(), 3, "ptxas properties of {name}: {numbers:?}");
        found.push((
            name.trim().to_string(),
            FunctionProperties {
                stack_frame_bytes: numbers[0],
                spill_store_bytes: numbers[1],
                spill_load_bytes: numbers[2],
            },
        ));
    }
    found
}

fn assemble(ptxas: &Path, module: &Module, out_dir: &Path) -> String {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("ptx")
        .join(format!("{}.ptx", module.name));
    let on_disk = std::fs::read_to_string(&source).unwrap();
    assert_eq!(
        on_disk,
        module.ptx,
        "{} differs from the embedded PTX",
        source.display()
    );
    let output = Command::new(ptxas)
        .arg("-arch=sm_90")
        .arg("-v")
        .arg("-o")
        .arg(out_dir.join(format!("{}.cubin", module.name)))
        .arg(&source)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "ptxas rejected {}: {report}",
        source.display()
    );
    report
}

#[test]
fn ptxas_is_the_pinned_release() {
    let output = Command::new(ptxas()).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "ptxas --version failed");
    assert!(
        text.contains("release 13.0"),
        "expected CUDA 13.0 ptxas, got: {text}"
    );
}

#[test]
fn every_kernel_assembles_with_its_described_local_memory() {
    let ptxas = ptxas();
    let out_dir = std::env::temp_dir().join(format!("kernels-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    for module in MODULES {
        let report = assemble(&ptxas, module, &out_dir);
        let properties = parse_properties(&report);
        let mut reported: Vec<&str> = properties.iter().map(|(n, _)| n.as_str()).collect();
        let mut described: Vec<&str> = module.kernels.iter().map(|k| k.name).collect();
        reported.sort_unstable();
        described.sort_unstable();
        assert_eq!(
            reported, described,
            "functions ptxas compiled in {}",
            module.name
        );
        for (name, props) in &properties {
            let info = module.kernel(name).unwrap();
            let expected = FunctionProperties {
                stack_frame_bytes: info.local_bytes_per_thread,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
            };
            assert_eq!(props, &expected, "{name} in {}.ptx", module.name);
        }
    }
    std::fs::remove_dir_all(&out_dir).unwrap();
}

#[test]
fn the_parser_reads_ptxas_reports() {
    let report = "ptxas info    : Function properties for local_4k\n    \
                  4096 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n";
    let expected = FunctionProperties {
        stack_frame_bytes: 4096,
        spill_store_bytes: 8,
        spill_load_bytes: 12,
    };
    assert_eq!(
        parse_properties(report),
        [("local_4k".to_string(), expected)]
    );
}
