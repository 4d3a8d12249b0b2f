//! The kernels' logic, run on the host: `emulation/kernels_on_host.cpp`
//! compiles the CUDA sources as plain C++ (a small shim makes the CUDA
//! keywords empty and runs one thread after another, or a block's threads
//! as real threads for a kernel that synchronizes them) and checks what
//! fill, verify, the heap lists, the local arrays and the two copy kernels
//! compute. The GPU suite checks
//! the same kernels on the device; this catches logic errors on every CI run.
//!
//! Needs a C++20 compiler (`$CXX`, else `c++`); fails if there is none.

use std::path::Path;
use std::process::Command;

#[test]
fn kernels_compute_on_the_host_what_they_should() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emulation");
    let out_dir = std::env::temp_dir().join(format!("kernels-emulation-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join("kernels_on_host");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let build = Command::new(&compiler)
        .args([
            "-std=c++20",
            "-pthread",
            "-O1",
            "-Wall",
            "-Wno-unknown-pragmas",
            "-Werror",
            "-o",
        ])
        .arg(&exe)
        .arg(dir.join("kernels_on_host.cpp"))
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler `{compiler}`: {e}"));
    assert!(
        build.status.success(),
        "compiling the kernels as host C++ failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );

    let run = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    std::fs::remove_dir_all(&out_dir).unwrap();
    assert!(
        run.status.success(),
        "kernels misbehaved on the host:\n{stdout}"
    );
    assert_eq!(stdout.lines().last(), Some("ok"), "{stdout}");

    // The device's pattern words are the host's.
    let mut compared = 0;
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("word ") else {
            continue;
        };
        let (index, value) = rest.split_once(' ').unwrap();
        let index: u64 = index.parse().unwrap();
        let value: u64 = value.parse().unwrap();
        assert_eq!(
            value,
            kernels::pattern::word(1_234_567, index),
            "word {index}"
        );
        compared += 1;
    }
    assert_eq!(compared, 4, "{stdout}");
}
