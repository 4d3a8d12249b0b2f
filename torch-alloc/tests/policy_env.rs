//! `CUDAMEM_POLICY` and `CUDAMEM_GROWTH_DIVISOR` read by the C functions, on a
//! simulated device: the policy picks the pool, a bad policy or growth divisor refuses
//! every call with its message. The outer tests run the inner one in a child process
//! with the variable set, since the environment and the registry are process-wide.

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
fn the_policy_variable_picks_the_pool_or_is_refused() {
    let tlsf = run(1, &[("CUDAMEM_POLICY", "tlsf")]);
    assert!(tlsf.contains("device 0: mapped 8, 0 grants"), "{tlsf}");
    let stitch = run(1, &[("CUDAMEM_POLICY", "stitch")]);
    assert!(
        stitch.contains("device 0: mapped 32, 0 grants"),
        "one large handle holds both: {stitch}"
    );
    let unknown = run(1, &[("CUDAMEM_POLICY", "buddy")]);
    assert!(
        unknown.contains(
            "refused: cudamem: CUDAMEM_POLICY=\"buddy\" is not a policy; known: tlsf, stitch"
        ),
        "{unknown}"
    );
}

#[test]
fn a_growth_divisor_is_a_number_or_refused() {
    let bad = run(1, &[("CUDAMEM_GROWTH_DIVISOR", "sixteen")]);
    assert!(
        bad.contains("CUDAMEM_GROWTH_DIVISOR=\"sixteen\" is not a whole number"),
        "{bad}"
    );
    let good = run(1, &[("CUDAMEM_GROWTH_DIVISOR", "16")]);
    assert!(good.contains("device 0: mapped"), "{good}");
}
