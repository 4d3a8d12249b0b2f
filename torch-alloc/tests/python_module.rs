//! The Python module's CPU tests (python/test_*.py: the allocator-interface check that
//! decides whether the C++ backend may be built against an installed PyTorch), run
//! under `cargo test` so CI runs them. They need python3, not torch.

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_module_passes_its_cpu_tests() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let output = Command::new(std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into()))
        .args(["-m", "unittest", "discover", "-s"])
        .arg(&python)
        .args(["-p", "test_*.py"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs (CI machines have it)");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(report.contains("Ran ") && report.contains("OK"), "{report}");
}
