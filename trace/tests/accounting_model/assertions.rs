//! What the accounting and the model must agree on after every step.

use trace::process::accounting::Accounting;

use crate::model::Model;

/// Every total the accounting reports, against the model's.
pub fn agree(accounting: &Accounting, model: &Model) {
    assert_eq!(
        accounting.live_device_bytes(),
        model.device_bytes(),
        "device bytes"
    );
    assert_eq!(
        accounting.live_host_bytes(),
        model.host_bytes(),
        "pinned host bytes"
    );
    assert_eq!(
        accounting.live_async_bytes(),
        model.async_bytes(),
        "stream-ordered bytes"
    );
    assert_eq!(
        accounting.live_blocks(),
        model.device.len() + model.handles.len(),
        "live blocks"
    );
    let (reserved, mapped, created) = accounting.vmm_bytes();
    assert_eq!(reserved, model.reserved.values().sum::<u64>(), "reserved");
    assert_eq!(mapped, model.mapped.values().sum::<u64>(), "mapped");
    assert_eq!(
        created,
        model.handles.values().map(|h| h.size).sum::<u64>(),
        "created"
    );
    for (ptr, held) in model.device.iter().chain(&model.host) {
        assert_eq!(
            accounting.block_of(crate::transitions::free_of(held.call), *ptr),
            Some((held.size, held.caller)),
            "block at {ptr:#x}"
        );
    }
    // Callers are unnamed here (no library records): compare each one's
    // device bytes and blocks, as a sorted list.
    let mut callers: Vec<(u64, u64)> = accounting
        .callers()
        .iter()
        .filter(|(_, bytes)| bytes.blocks > 0)
        .map(|(_, bytes)| (bytes.device_bytes, bytes.blocks))
        .collect();
    let mut expected: Vec<(u64, u64)> = (0..4)
        .map(|caller| model.caller(caller))
        .filter(|&(_, blocks)| blocks > 0)
        .collect();
    callers.sort_unstable();
    expected.sort_unstable();
    assert_eq!(callers, expected, "callers' device bytes and blocks");
    let counts = &accounting.counts;
    assert_eq!(counts.allocations, model.allocations, "allocations");
    assert_eq!(counts.frees, model.frees, "frees");
    assert_eq!(counts.unknown_frees, model.unknown_frees, "unknown frees");
    assert_eq!(
        counts.out_of_memory, model.out_of_memory,
        "out-of-memory returns"
    );
    assert_eq!(
        counts.other_failures, model.other_failures,
        "other failures"
    );
}
