//! `CUDAMEM_POLICY` and `CUDAMEM_GROWTH_DIVISOR` read by the C functions, on a
//! simulated device: the policy picks the pool, a bad policy or growth divisor refuses
//! every call with its message. The outer tests run the inner one in a child process
//! with the variable set, since the environment and the registry are process-wide.

#[path = "support/c_abi.rs"]
mod c_abi;
#[path = "support/env_child.rs"]
mod env_child;

use env_child::run;

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
