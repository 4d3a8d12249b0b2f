//! `CUDAMEM_PEERS` read by the C functions, on simulated hosts: several devices served
//! in one process, each pool granting the others (on both pools); one device per
//! process (as under torchrun with `CUDA_VISIBLE_DEVICES`); a bad value refused with
//! its message. The outer tests run the inner one in a child process with the
//! variables set, since the environment and the registry are process-wide.

#[path = "support/c_abi.rs"]
mod c_abi;
#[path = "support/env_child.rs"]
mod env_child;

use env_child::run;

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
