//! The child-process half of the tests that set environment variables the
//! C functions read (`CUDAMEM_PEERS`, `CUDAMEM_POLICY`, ...): the variables
//! and the registry are process-wide, so each outer test runs the test
//! binary again with them set, and reads what its inner test,
//! [`inner_every_device_allocates`], printed. Each test file includes this
//! file and `c_abi.rs` by path.

#![allow(dead_code)]

use std::ffi::c_void;
use std::process::Command;

use ctx::SimConfig;
use cudamem_torch::ffi::{CUDAMEM_OK, cudamem_free, cudamem_stats};
use cudamem_torch::{AllocatorStats, registry};

use crate::c_abi;

pub const MIB: u64 = 1 << 20;

/// `size` bytes on `device` through the C ABI: the pointer, or the last error.
pub fn allocate(device: i32, size: u64) -> Result<u64, String> {
    match c_abi::allocate_with(device, c_abi::request(size, 0)) {
        (CUDAMEM_OK, out) => Ok(out.ptr),
        _ => Err(c_abi::last_error()),
    }
}

/// Allocates twice on every device of a host of `ENV_TEST_DEVICES` devices (1 when
/// unset) and prints, per device, `device D: mapped M, G grants` or
/// `device D: refused: <message>`.
#[test]
fn inner_every_device_allocates() {
    let devices = std::env::var("ENV_TEST_DEVICES")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(1);
    registry::install_simulated(SimConfig::small(64 * MIB), devices as usize)
        .expect("first C call");
    for device in 0..devices {
        // Two sizes past the TLSF pool's 2 MiB step: two growths, two mappings.
        let (a, b) = match (allocate(device, 3 * MIB), allocate(device, 5 * MIB)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(message), _) | (_, Err(message)) => {
                println!("device {device}: refused: {message}");
                continue;
            }
        };
        let mut out = AllocatorStats::default();
        // SAFETY: `out` is a live, writable AllocatorStats.
        assert_eq!(unsafe { cudamem_stats(device, &mut out) }, CUDAMEM_OK);
        println!(
            "device {device}: mapped {}, {} grants",
            out.mapped_bytes / MIB,
            out.peer_access_calls
        );
        for ptr in [a, b] {
            // SAFETY: a pointer this device handed out; a null out is allowed.
            let code = unsafe { cudamem_free(ptr as *mut c_void, 0, std::ptr::null_mut()) };
            assert_eq!(code, CUDAMEM_OK);
        }
    }
}

/// The inner test's stdout with `ENV_TEST_DEVICES=devices` and `vars` set.
pub fn run(devices: u32, vars: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("the test binary");
    let output = Command::new(exe)
        .args([
            "--exact",
            "env_child::inner_every_device_allocates",
            "--nocapture",
        ])
        .env("ENV_TEST_DEVICES", devices.to_string())
        .envs(vars.iter().copied())
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    stdout
}
