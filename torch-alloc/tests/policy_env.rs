//! `CUDAMEM_POLICY` and `CUDAMEM_GROWTH_DIVISOR` read by the C functions: an unknown
//! policy or a divisor that is not a number refuses every call with one message. The outer test runs the inner one in a child process with the variable
//! set, since the environment and the registry are process-wide.

use std::process::Command;

use ctx::SimConfig;
use cudamem_torch::ffi::{cudamem_malloc, cudamem_stats};
use cudamem_torch::{AllocatorStats, registry};

/// Serves or refuses as `CUDAMEM_POLICY` in this process says.
#[test]
fn inner_malloc_follows_the_policy_variable() {
    registry::install_simulated(SimConfig::small(16 << 20), 1).expect("first C call");
    let unknown = std::env::var("CUDAMEM_POLICY").is_ok_and(|p| p != "tlsf")
        || std::env::var("CUDAMEM_GROWTH_DIVISOR").is_ok_and(|d| d.parse::<u32>().is_err());
    for _ in 0..3 {
        // SAFETY: the simulated backend only compares stream handles.
        let ptr = unsafe { cudamem_malloc(4096, 0, std::ptr::null_mut()) };
        assert_eq!(ptr.is_null(), unknown);
    }
    let mut out = AllocatorStats::default();
    // SAFETY: `out` is a live, writable AllocatorStats.
    let code = unsafe { cudamem_stats(0, &mut out) };
    assert_eq!(code, if unknown { -1 } else { 0 });
}

/// The inner test, run again with `name=value`; its stderr.
fn inner_with(name: &str, value: &str) -> String {
    let exe = std::env::current_exe().expect("the test binary");
    let output = Command::new(exe)
        .args([
            "--exact",
            "inner_malloc_follows_the_policy_variable",
            "--nocapture",
        ])
        .env(name, value)
        .output()
        .expect("run the test binary again");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

#[test]
fn a_growth_divisor_is_a_number_or_refused_with_one_message() {
    let stderr = inner_with("CUDAMEM_GROWTH_DIVISOR", "sixteen");
    let message = "CUDAMEM_GROWTH_DIVISOR=\"sixteen\" is not a whole number";
    assert_eq!(stderr.matches(message).count(), 1, "{stderr}");
    let stderr = inner_with("CUDAMEM_GROWTH_DIVISOR", "16");
    assert!(!stderr.contains("CUDAMEM_GROWTH_DIVISOR"), "{stderr}");
}

#[test]
fn an_unknown_policy_refuses_with_one_message() {
    let stderr = inner_with("CUDAMEM_POLICY", "stitch");
    let message = "CUDAMEM_POLICY=\"stitch\" is not a policy; known: tlsf";
    assert_eq!(stderr.matches(message).count(), 1, "{stderr}");
}
