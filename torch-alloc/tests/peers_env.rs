//! `CUDAMEM_PEERS` read by the C functions, on simulated hosts: several devices served
//! in one process, each pool granting the others; one device per process (as under
//! torchrun with `CUDA_VISIBLE_DEVICES`); a bad value refused with one message. The
//! outer tests run the inner one in a child process with the variables set, since the
//! environment and the registry are process-wide.

use std::process::Command;

use ctx::SimConfig;
use cudamem_torch::ffi::{cudamem_free, cudamem_malloc, cudamem_stats};
use cudamem_torch::{AllocatorStats, registry};

const MIB: isize = 1 << 20;

/// Allocates twice on every device of a host of `PEERS_TEST_DEVICES` devices (2 when
/// unset) and prints each device's peer grants as `device D: G grants`, or
/// `device D: refused`. Run as is, without `CUDAMEM_PEERS`, no device grants anything.
#[test]
fn inner_every_device_allocates() {
    let devices = std::env::var("PEERS_TEST_DEVICES")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(2);
    let peers_set = std::env::var_os("CUDAMEM_PEERS").is_some();
    registry::install_simulated(SimConfig::small(64 << 20), devices as usize)
        .expect("first C call");
    for device in 0..devices {
        // Two sizes past the 2 MiB step: two growths, two mappings.
        // SAFETY: the simulated backend only compares stream handles.
        let a = unsafe { cudamem_malloc(3 * MIB, device, std::ptr::null_mut()) };
        // SAFETY: as above.
        let b = unsafe { cudamem_malloc(5 * MIB, device, std::ptr::null_mut()) };
        let mut out = AllocatorStats::default();
        // SAFETY: `out` is a live, writable AllocatorStats.
        let code = unsafe { cudamem_stats(device, &mut out) };
        if a.is_null() || b.is_null() || code != 0 {
            println!("device {device}: refused");
            assert!(peers_set, "device {device} refused without CUDAMEM_PEERS");
            continue;
        }
        assert!(peers_set || out.peer_access_calls == 0, "{out:?}");
        println!("device {device}: {} grants", out.peer_access_calls);
        // SAFETY: pointers this device handed out, with their sizes.
        unsafe {
            cudamem_free(a, 3 * MIB, device, std::ptr::null_mut());
            cudamem_free(b, 5 * MIB, device, std::ptr::null_mut());
        }
    }
}

/// The inner test's stdout and stderr with `PEERS_TEST_DEVICES=devices` and
/// `CUDAMEM_PEERS=peers`.
fn run(devices: u32, peers: &str) -> (String, String) {
    let exe = std::env::current_exe().expect("the test binary");
    let output = Command::new(exe)
        .args(["--exact", "inner_every_device_allocates", "--nocapture"])
        .env("PEERS_TEST_DEVICES", devices.to_string())
        .env("CUDAMEM_PEERS", peers)
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn one_process_serves_three_devices_each_granting_the_others() {
    let (stdout, stderr) = run(3, "all");
    for device in 0..3 {
        assert!(
            stdout.contains(&format!("device {device}: 2 grants")),
            "{stdout}\n{stderr}"
        );
    }
    // Naming a subset: device 2's pool grants device 0, device 1's grants 0 and 2,
    // device 0's grants 2.
    let (stdout, _) = run(3, "0,2");
    for device in 0..3 {
        assert!(
            stdout.contains(&format!("device {device}: 2 grants")),
            "{stdout}"
        );
    }
    let (stdout, _) = run(3, "");
    for device in 0..3 {
        assert!(
            stdout.contains(&format!("device {device}: 0 grants")),
            "{stdout}"
        );
    }
}

#[test]
fn one_device_per_process_grants_nothing_for_all_and_refuses_a_missing_peer() {
    let (stdout, _) = run(1, "all");
    assert!(stdout.contains("device 0: 0 grants"), "{stdout}");
    // torchrun with CUDA_VISIBLE_DEVICES: the process sees one device, so a peer 1
    // named explicitly does not exist.
    let (stdout, stderr) = run(1, "0,1");
    assert!(stdout.contains("device 0: refused"), "{stdout}");
    assert!(
        stderr.contains("device 1 cannot access memory of device 0: no such device"),
        "{stderr}"
    );
}

#[test]
fn a_bad_value_is_refused_with_one_message_per_device() {
    let (stdout, stderr) = run(1, "0,gpu1");
    assert!(stdout.contains("device 0: refused"), "{stdout}");
    let message = "CUDAMEM_PEERS=\"0,gpu1\" is not `all` or device ordinals 0 to 63 \
                   separated by commas (e.g. 0,1); the bad part: \"gpu1\"";
    assert_eq!(stderr.matches(message).count(), 1, "{stderr}");
}
