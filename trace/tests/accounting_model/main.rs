//! The process accounting against a reference model: proptest state
//! machines drive [`trace::process::accounting::Accounting`] (the system
//! under test) and a model simple enough to be obviously right with the
//! same records (allocations and frees of device, managed, stream-ordered,
//! pool and pinned host memory; VMM reserve, create, map, unmap, release;
//! failed frees), and compare every total after every step.
//!
//! - [`model`]: the reference model;
//! - [`transitions`]: the steps and their strategies;
//! - [`sut`]: the steps as records applied to the accounting;
//! - [`assertions`]: what must agree.

mod assertions;
mod model;
mod sut;
mod transitions;

use proptest_state_machine::prop_state_machine;
use sut::AccountingTest;

prop_state_machine! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 256,
        failure_persistence: None,
        .. proptest::test_runner::Config::default()
    })]

    /// Up to 60 records at a time, every total checked after each.
    #[test]
    fn the_accounting_agrees_with_the_model(sequential 1..60 => AccountingTest);
}
