//! The resolution table against the hooks: every exported driver function
//! this library defines is in [`ENTRIES`], every row names an ABI of a
//! recorded call, and every recorded call has a row.

use std::collections::BTreeSet;
use std::process::Command;

use trace::event::Call;

use super::ENTRIES;

/// The driver functions (`cu…`) defined in this test binary, which is this
/// crate's code: read from its symbol table with `nm`, so a `hook!` the
/// table forgot is seen whatever file it is in.
fn defined_driver_functions() -> BTreeSet<String> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = Command::new(std::env::var("NM").unwrap_or_else(|_| "nm".into()))
        .arg("--defined-only")
        .arg(&exe)
        .output()
        .expect("nm (binutils) runs: it reads the test binary's symbols");
    assert!(
        output.status.success(),
        "nm {}: {}",
        exe.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
            // Global code symbols named like the driver's functions.
            (kind == "T" && name.starts_with("cu") && !name.contains("::")).then(|| name.to_owned())
        })
        .collect()
}

#[test]
fn every_exported_hook_has_its_row_and_every_row_its_hook() {
    let wrapped: BTreeSet<String> = ENTRIES
        .iter()
        .filter(|entry| entry.wrap.is_some())
        .map(|entry| entry.name.to_str().unwrap().to_owned())
        .collect();
    let defined = defined_driver_functions();
    let missing_rows: Vec<_> = defined.difference(&wrapped).collect();
    let missing_hooks: Vec<_> = wrapped.difference(&defined).collect();
    assert!(
        missing_rows.is_empty() && missing_hooks.is_empty(),
        "hooks without a row in ENTRIES: {missing_rows:?}; rows without a hook: {missing_hooks:?}"
    );
    assert!(wrapped.len() >= 59, "{} wrapped ABIs", wrapped.len());
}

#[test]
fn each_abi_has_one_row() {
    let mut seen = BTreeSet::new();
    for entry in ENTRIES {
        assert!(seen.insert(entry.name), "{:?} has two rows", entry.name);
        let name = entry.name.to_str().unwrap();
        assert!(
            name.starts_with(entry.base),
            "{name} is an ABI of {}",
            entry.base
        );
    }
}

#[test]
fn rows_and_recorded_calls_name_the_same_functions() {
    // Wrapped only to hand out the other wrappers.
    const RESOLVERS: [&str; 1] = ["cuGetProcAddress"];
    // Recorded as the call they answer the same question for.
    const RECORDED_AS_ANOTHER: [&str; 1] = ["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"];
    for entry in ENTRIES {
        assert!(
            Call::from_name(entry.base).is_some()
                || RESOLVERS.contains(&entry.base)
                || super::gated::NOT_RECORDED.contains(&entry.base)
                || RECORDED_AS_ANOTHER.contains(&entry.base),
            "{} is in ENTRIES but no recorded Call",
            entry.base
        );
    }
    for call in Call::ALL {
        assert!(
            ENTRIES
                .iter()
                .any(|entry| entry.base == call.name() && entry.wrap.is_some()),
            "{} is a recorded Call with no hook",
            call.name()
        );
    }
}
