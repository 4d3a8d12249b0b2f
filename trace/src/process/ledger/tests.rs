//! The ledger read from hand-made records: every byte in use named or
//! unexplained, the local memory cause, advice by library.

use super::*;
use crate::event::{Call, ContextHow, Event, MemInfoWhy, Record, Window};

const TOTAL: u64 = 1 << 30;

fn accounting(events: Vec<Event<'static>>) -> Accounting {
    let mut accounting = Accounting::default();
    for (index, event) in events.into_iter().enumerate() {
        accounting.apply(&Record {
            time_ns: index as u64,
            thread: 1,
            event,
        });
    }
    accounting
}

fn context(free: u64) -> Event<'static> {
    Event::Context {
        how: ContextHow::Primary,
        device: 0,
        ctx: 1,
        result: 0,
        sm_count: Some(4),
        threads_per_sm: Some(2048),
        total: Some(TOTAL),
        free: Some(free),
        stack: Some(1024),
        heap: Some(8 << 20),
        fifo: Some(1 << 20),
    }
}

fn alloc(ptr: u64, size: u64, caller: u32) -> Event<'static> {
    Event::Alloc {
        call: Call::MemAlloc,
        ptr,
        size,
        stream: 0,
        caller,
        result: 0,
    }
}

fn reading(free: u64) -> Event<'static> {
    Event::MemInfo {
        why: MemInfoWhy::Peak,
        device: 0,
        free,
        total: TOTAL,
        pool_reserved: None,
    }
}

#[test]
fn every_byte_in_use_is_named_or_unexplained() {
    // Context: 32 MiB baseline + 8 MiB of local memory (4 x 2048 x 1 KiB).
    let at_context = TOTAL - (40 << 20);
    let snapshot = Snapshot::of(
        &accounting(vec![
            context(at_context),
            Event::Library {
                id: 1,
                path: "/opt/app/libtorch_cuda.so".into(),
            },
            Event::Module {
                call: Call::ModuleLoadData,
                result: 0,
                window: Window {
                    free_before: Some(at_context),
                    free_after: Some(at_context - (2 << 20)),
                    live_change: 0,
                },
            },
            alloc(0x1000, 100 << 20, 1),
            // 1 MiB more in use than the records name.
            reading(at_context - (2 << 20) - (100 << 20) - (1 << 20)),
        ]),
        0,
    )
    .unwrap();
    assert_eq!(snapshot.context_measured(), Some(32 << 20));
    assert_eq!(snapshot.local_measured, Some(8 << 20));
    assert_eq!(snapshot.module_measured, 2 << 20);
    assert_eq!(snapshot.unexplained(), Some(1 << 20));
    let ledger = snapshot.ledger();
    let measured = |kind| ledger.item(kind).unwrap().measured;
    assert_eq!(measured(LedgerItemKind::ContextBaseline), Some(32 << 20));
    assert_eq!(measured(LedgerItemKind::ModuleCode), Some(2 << 20));
    let text = snapshot.render();
    assert!(text.contains("by libtorch_cuda.so"), "{text}");
    assert!(text.contains("unexplained"), "{text}");
    assert!(text.contains("1.00 MiB"), "{text}");
}

#[test]
fn a_kernel_that_raised_the_stack_is_the_local_memory_cause() {
    let launch = Event::Launch {
        call: Call::LaunchKernel,
        handle: 7,
        local_bytes: Some(64 << 10),
        stack_before: Some(1024),
        stack_after: Some(64 << 10),
        window: Window {
            free_before: Some(TOTAL - (40 << 20)),
            free_after: Some(TOTAL - (40 << 20) - 8192 * ((64 << 10) - 1024)),
            live_change: 0,
        },
        result: 0,
        name: "_Z5deepv".into(),
    };
    let snapshot = Snapshot::of(&accounting(vec![context(TOTAL - (40 << 20)), launch]), 0).unwrap();
    assert_eq!(snapshot.local_predicted, 8192 * (64 << 10));
    assert_eq!(snapshot.local_measured, Some(8192 * (64 << 10)));
    assert!(
        snapshot
            .local_memory_cause()
            .starts_with("kernel _Z5deepv has a 64.0 KiB (65536 B) local frame"),
        "{}",
        snapshot.local_memory_cause()
    );
    let advice = crate::process::advice::advice(&snapshot, None, None);
    assert!(
        advice[0].contains("local memory takes 512 MiB"),
        "{advice:?}"
    );
}

fn module_load(free_before: u64, taken: u64) -> Event<'static> {
    Event::Module {
        call: Call::ModuleLoadData,
        result: 0,
        window: Window {
            free_before: Some(free_before),
            free_after: Some(free_before - taken),
            live_change: 0,
        },
    }
}

#[test]
fn many_modules_leave_module_code_unpredicted_beside_its_measure() {
    let at_context = TOTAL - (40 << 20);
    let snapshot = Snapshot::of(
        &accounting(vec![
            context(at_context),
            module_load(at_context, 2 << 20),
            module_load(at_context - (2 << 20), 4 << 20),
            module_load(at_context - (6 << 20), 0),
            reading(at_context - (6 << 20)),
        ]),
        0,
    )
    .unwrap();
    let rows = snapshot.ledger_rows();
    let module = rows
        .iter()
        .find(|row| row.item == LedgerItemKind::ModuleCode.name())
        .unwrap();
    assert_eq!(module.predicted, Some(ctx::Prediction::Unknown));
    assert_eq!(module.measured, Some(6 << 20));
    assert!(
        module
            .why
            .starts_with("unknown before the run (3 module loads")
    );
    assert_eq!(snapshot.unexplained(), Some(0));
}

#[test]
fn the_async_pools_reserve_is_its_own_line_and_not_unexplained() {
    let at_context = TOTAL - (40 << 20);
    let snapshot = Snapshot::of(
        &accounting(vec![
            context(at_context),
            Event::Alloc {
                call: Call::MemAllocAsync,
                ptr: 0x1000,
                size: 10 << 20,
                stream: 7,
                caller: 0,
                result: 0,
            },
            // The pool keeps 64 MiB: 10 live, 54 freed and kept.
            Event::MemInfo {
                why: MemInfoWhy::Peak,
                device: 0,
                free: at_context - (64 << 20),
                total: TOTAL,
                pool_reserved: Some(64 << 20),
            },
            // The program's own reading does not read the pool: the
            // last reserve read still holds.
            Event::MemInfo {
                why: MemInfoWhy::Program,
                device: 0,
                free: at_context - (64 << 20),
                total: TOTAL,
                pool_reserved: None,
            },
        ]),
        0,
    )
    .unwrap();
    assert_eq!(snapshot.pool_held(), Some(54 << 20));
    assert_eq!(snapshot.unexplained(), Some(0));
    let line = snapshot
        .extra_lines()
        .into_iter()
        .find(|line| line.name == "held by the driver's async pool")
        .unwrap();
    assert_eq!(line.bytes, 54 << 20);
}

#[test]
fn advice_follows_the_library_that_allocated_and_the_one_that_asked() {
    let venv = "/opt/torch/.venv/lib/python3.12/site-packages";
    let at_context = TOTAL - (40 << 20);
    let events = |caller_path: String, size: u64| {
        vec![
            context(at_context),
            Event::Library {
                id: 1,
                path: caller_path.into(),
            },
            alloc(0x1000, size, 1),
            reading(at_context - size),
        ]
    };
    // JAX's preallocation, in an environment under /opt/torch.
    let xla = Snapshot::of(
        &accounting(events(format!("{venv}/jaxlib/libjax_common.so"), TOTAL / 2)),
        0,
    )
    .unwrap();
    let advice = crate::process::advice::advice(&xla, Some(1 << 30), None).join("\n");
    assert!(
        advice.contains("XLA_PYTHON_CLIENT_PREALLOCATE=false"),
        "{advice}"
    );
    assert!(
        advice.contains("XLA_PYTHON_CLIENT_ALLOCATOR=platform"),
        "{advice}"
    );
    assert!(!advice.contains("PyTorch"), "{advice}");
    // A small holder gets no framework advice at the peak, but the one
    // whose request failed does.
    let cupy_path = format!("{venv}/cupy_backends/cuda/api/driver.so");
    let cupy = Snapshot::of(&accounting(events(cupy_path.clone(), 1 << 20)), 0).unwrap();
    let at_peak = crate::process::advice::advice(&cupy, None, None).join("\n");
    assert!(!at_peak.contains("CuPy"), "{at_peak}");
    let asked = crate::process::advice::advice(&cupy, Some(1 << 20), Some(&cupy_path)).join("\n");
    assert!(
        asked.contains("the request came from driver.so: CuPy's memory pool"),
        "{asked}"
    );
    assert!(
        asked.contains("free_all_blocks()") && asked.contains("set_limit"),
        "{asked}"
    );
    assert!(
        !asked.contains("XLA") && !asked.contains("PyTorch"),
        "{asked}"
    );
}

#[test]
fn a_process_without_a_context_says_so() {
    let snapshot = Snapshot::of(
        &accounting(vec![alloc(0x10, 4096, 0), reading(TOTAL / 2)]),
        0,
    )
    .unwrap();
    assert!(
        snapshot
            .render()
            .starts_with("no context was made in this process")
    );
}
