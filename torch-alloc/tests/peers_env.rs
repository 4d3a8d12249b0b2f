//! `CUDAMEM_PEERS` read by the C functions, on simulated hosts: several devices served
//! in one process, each pool granting the others (on both pools); one device per
//! process (as under torchrun with `CUDA_VISIBLE_DEVICES`); a bad value refused with
//! its message. The outer tests run the inner one in a child process with the
//! variables set, since the environment and the registry are process-wide.

use std::ffi::c_void;
use std::process::Command;

#[path = "support/c_abi.rs"]
mod c_abi;

use ctx::SimConfig;
use cudamem_torch::ffi::{CUDAMEM_OK, cudamem_free, cudamem_stats};
use cudamem_torch::{AllocatorStats, registry};

const MIB: u64 = 1 << 20;

fn allocate(device: i32, size: u64) -> Result<u64, String> {
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
fn run(devices: u32, vars: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("the test binary");
    let output = Command::new(exe)
        .args(["--exact", "inner_every_device_allocates", "--nocapture"])
        .env("ENV_TEST_DEVICES", devices.to_string())
        .envs(vars.iter().copied())
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    stdout
}

#[test]
fn one_process_serves_three_devices_each_granting_the_others() {
    for policy in ["tlsf", "stitch"] {
        let grants = if policy == "tlsf" { 2 } else { 1 };
        for peers in ["all", "0,2"] {
            let out = run(3, &[("CUDAMEM_PEERS", peers), ("CUDAMEM_POLICY", policy)]);
            for device in 0..3 {
                assert!(
                    out.contains(&format!("device {device}: mapped"))
                        && out.contains(&format!(", {grants} grants")),
                    "{policy} {peers}: {out}"
                );
            }
        }
        let none = run(3, &[("CUDAMEM_PEERS", ""), ("CUDAMEM_POLICY", policy)]);
        assert_eq!(none.matches(", 0 grants").count(), 3, "{none}");
    }
}

#[test]
fn one_device_per_process_grants_nothing_for_all_and_refuses_a_missing_peer() {
    let out = run(1, &[("CUDAMEM_PEERS", "all")]);
    assert!(out.contains("device 0: mapped 8, 0 grants"), "{out}");
    // torchrun with CUDA_VISIBLE_DEVICES: the process sees one device, so a peer 1
    // named explicitly does not exist.
    let out = run(1, &[("CUDAMEM_PEERS", "0,1")]);
    assert!(
        out.contains(
            "device 0: refused: cudamem: device 1 cannot access memory of device 0: no such device"
        ),
        "{out}"
    );
}

#[test]
fn a_bad_peer_list_is_refused_with_its_message() {
    let out = run(1, &[("CUDAMEM_PEERS", "0,gpu1")]);
    let message = "CUDAMEM_PEERS=\"0,gpu1\" is not `all` or device ordinals 0 to 63 \
                   separated by commas (e.g. 0,1); the bad part: \"gpu1\"";
    assert!(out.contains(message), "{out}");
}
