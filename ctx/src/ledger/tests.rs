use super::*;

fn profile(name: &str) -> DeviceProfile {
    DeviceProfile::builtin(name).unwrap()
}

fn predicted(ledger: &Ledger, kind: LedgerItemKind) -> u64 {
    let item = ledger.item(kind).unwrap();
    item.predicted
        .bytes()
        .unwrap_or_else(|| panic!("{} is {:?}", item.name(), item.predicted))
}

fn prediction(ledger: &Ledger, kind: LedgerItemKind) -> Prediction {
    ledger.item(kind).unwrap().predicted
}

#[test]
fn h200_default_stack_reserves_264_mib() {
    let ledger = Ledger::predict(&profile("h200"), &Limits::cuda_default(), &[], 0);
    assert_eq!(ledger.per_thread_local_bytes(), 1024);
    assert_eq!(ledger.local_memory_per_sm_bytes(), 2048 * 1024);
    assert_eq!(ledger.local_memory_reservation_bytes(), 132 * 2048 * 1024);
    assert_eq!(ledger.local_memory_reservation_bytes(), 276_824_064);
    assert_eq!(predicted(&ledger, LedgerItemKind::ModuleCode), 0);
}

#[test]
fn a_16_kib_frame_raises_the_h200_reservation_to_4_gb() {
    let ledger = Ledger::predict(
        &profile("h200"),
        &Limits::cuda_default(),
        &[512, 16384, 0],
        0,
    );
    assert_eq!(ledger.per_thread_local_bytes(), 16384);
    assert_eq!(ledger.local_memory_reservation_bytes(), 4_429_185_024);
    // A module without printf or malloc costs nothing visible (measured).
    assert_eq!(predicted(&ledger, LedgerItemKind::ModuleCode), 0);
}

#[test]
fn gtx280_with_one_kib_per_thread() {
    let ledger = Ledger::predict(&profile("gtx280"), &Limits::cuda_default(), &[1024], 0);
    assert_eq!(ledger.local_memory_reservation_bytes(), 30 * 1024 * 1024);
    // Nobody measured a GTX 280's context: unknown, not 0, and free is a bound.
    assert_eq!(
        prediction(&ledger, LedgerItemKind::ContextBaseline),
        Prediction::Unknown
    );
    assert_eq!(
        prediction(&ledger, LedgerItemKind::Free),
        Prediction::AtMost((1 << 30) - 30 * 1024 * 1024)
    );
    let unknown: Vec<_> = ledger.unknown_items().map(LedgerItem::name).collect();
    assert_eq!(unknown, ["driver + context", "module code"]);
    assert!(!ledger.is_measured());
}

#[test]
fn frames_round_up_to_the_granule() {
    let p = profile("h200");
    assert_eq!(per_thread_local_bytes(&p, 1024, 1025), 1040);
    assert_eq!(per_thread_local_bytes(&p, 0, 1), 16);
    assert_eq!(per_thread_local_bytes(&p, 0, 0), 0);
    let mut coarse = p;
    coarse.local_memory_granule_bytes = 512;
    assert_eq!(per_thread_local_bytes(&coarse, 1024, 1025), 1536);
}

#[test]
fn free_is_total_minus_every_item() {
    let p = profile("h200");
    let limits = Limits::cuda_default();
    let ledger = Ledger::predict(&p, &limits, &[2048], 1 << 30);
    let expected = 150_109_880_320 - 275_578_880 - 132 * 2048 * 2048 - (1 << 30);
    assert_eq!(predicted(&ledger, LedgerItemKind::Free), expected);
    let order: Vec<_> = ledger.items().iter().map(|i| i.kind).collect();
    assert_eq!(order, LedgerItemKind::ALL);
}

#[test]
fn a_cm_heap_is_a_line_of_its_own_and_comes_out_of_free() {
    let p = profile("h200");
    let limits = Limits::cuda_default();
    let heap = 256 << 20;
    let with = |cm_heap_bytes| {
        Ledger::predict_workload(
            &p,
            &limits,
            &Workload {
                kernels_local_bytes: &[],
                calls_printf: false,
                calls_malloc: false,
                user_bytes: 0,
                cm_heap_bytes,
            },
        )
    };
    let (none, some) = (with(0), with(heap));
    assert_eq!(predicted(&none, LedgerItemKind::CmHeap), 0);
    assert_eq!(predicted(&some, LedgerItemKind::CmHeap), heap);
    assert_eq!(
        predicted(&none, LedgerItemKind::Free) - predicted(&some, LedgerItemKind::Free),
        heap
    );
    assert_eq!(
        predicted(&some, LedgerItemKind::MallocHeap),
        predicted(&none, LedgerItemKind::MallocHeap)
    );
}

#[test]
fn a_fresh_h200_context_matches_the_measurement() {
    // Measured: total - free = 552,402,944 bytes right after creation.
    let ledger = Ledger::predict(&profile("h200"), &Limits::cuda_default(), &[], 0);
    let used = 150_109_880_320 - predicted(&ledger, LedgerItemKind::Free);
    assert_eq!(used, 552_402_944);
    // All of it is the context's own.
    assert_eq!(ledger.context_bytes(), used);
}

#[test]
fn the_context_is_its_own_terms_and_nothing_the_program_holds() {
    let p = profile("h200");
    let ledger = Ledger::predict_workload(
        &p,
        &Limits::cuda_default(),
        &Workload {
            kernels_local_bytes: &[4096],
            calls_printf: true,
            calls_malloc: true,
            user_bytes: 1 << 30,
            cm_heap_bytes: 64 << 20,
        },
    );
    let kinds: Vec<_> = ledger.context_items().map(|item| item.kind).collect();
    assert_eq!(
        kinds,
        [
            LedgerItemKind::ContextBaseline,
            LedgerItemKind::LocalMemory,
            LedgerItemKind::ModuleCode,
            LedgerItemKind::MallocHeap,
            LedgerItemKind::PrintfFifo,
        ]
    );
    let by_hand: u64 = kinds.iter().map(|&kind| predicted(&ledger, kind)).sum();
    assert_eq!(ledger.context_bytes(), by_hand);
    let outside = [LedgerItemKind::CmHeap, LedgerItemKind::UserAllocations];
    assert!(outside.iter().all(|kind| !kind.is_context()));
    assert_eq!(
        ledger.local_memory_reservation_bytes(),
        u64::from(ledger.sm_count()) * ledger.local_memory_per_sm_bytes()
    );
}

#[test]
fn printf_and_malloc_bring_their_module_and_heap_costs() {
    let p = profile("h200");
    let limits = Limits::cuda_default();
    let workload = |calls_printf, calls_malloc| Workload {
        kernels_local_bytes: &[64],
        calls_printf,
        calls_malloc,
        user_bytes: 0,
        cm_heap_bytes: 0,
    };
    let malloc = Ledger::predict_workload(&p, &limits, &workload(false, true));
    assert_eq!(predicted(&malloc, LedgerItemKind::ModuleCode), 144_703_488);
    assert_eq!(predicted(&malloc, LedgerItemKind::MallocHeap), 8_388_608);
    assert_eq!(predicted(&malloc, LedgerItemKind::PrintfFifo), 0);
    let printf = Ledger::predict_workload(&p, &limits, &workload(true, false));
    assert_eq!(predicted(&printf, LedgerItemKind::ModuleCode), 67_108_864);
    assert_eq!(predicted(&printf, LedgerItemKind::MallocHeap), 0);
    // Unmeasured devices count the FIFO at its limit.
    let a100 = Ledger::predict_workload(&profile("a100-80gb"), &limits, &workload(true, true));
    assert_eq!(predicted(&a100, LedgerItemKind::PrintfFifo), 8_650_752);
    assert_eq!(
        prediction(&a100, LedgerItemKind::ModuleCode),
        Prediction::Unknown
    );
    assert!(
        a100.item(LedgerItemKind::ModuleCode)
            .unwrap()
            .explanation
            .contains("not measured on this model")
    );
}

#[test]
fn a_tiny_device_saturates_free_at_zero() {
    let ledger = Ledger::predict(&profile("gtx280"), &Limits::cuda_default(), &[1 << 20], 0);
    assert_eq!(
        prediction(&ledger, LedgerItemKind::Free),
        Prediction::AtMost(0)
    );
    // ... and the check says the reservation cannot happen.
    assert_eq!(
        ledger.check_fits(),
        Err(Error::ExceedsDevice {
            what: "local memory",
            bytes: 30 * 1024 * (1 << 20),
            total_bytes: profile("gtx280").total_bytes,
        })
    );
}

#[test]
fn reservations_larger_than_the_device_fail_the_check() {
    let h200 = profile("h200");
    let stack = |bytes| Limits {
        stack_bytes: bytes,
        ..Limits::cuda_default()
    };
    assert_eq!(
        Ledger::predict(&h200, &stack(1024), &[], 0).check_fits(),
        Ok(())
    );
    // A saturated reservation (a u64::MAX stack) is caught, not printed.
    let err = Ledger::predict(&h200, &stack(u64::MAX), &[], 0)
        .check_fits()
        .unwrap_err();
    assert!(
        matches!(err, Error::ExceedsDevice { what: "local memory", bytes: u64::MAX, total_bytes }
            if total_bytes == h200.total_bytes),
        "{err}"
    );
    // Items that fit one by one but not together: the context's own
    // 552,402,944 bytes beside user allocations of all but 100 MiB.
    let user = |bytes: u64| h200.total_bytes - bytes;
    let err = Ledger::predict(&h200, &Limits::cuda_default(), &[], user(100 << 20))
        .check_fits()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ExceedsDevice {
                what: "the items together",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        Ledger::predict(&h200, &Limits::cuda_default(), &[], user(1 << 30))
            .check_fits()
            .is_ok()
    );
}

#[test]
fn measurements_are_recorded_and_shown() {
    let mut ledger = Ledger::predict(&profile("h200"), &Limits::cuda_default(), &[], 0);
    ledger.set_measured(LedgerItemKind::LocalMemory, 276_824_064);
    assert_eq!(
        ledger.item(LedgerItemKind::LocalMemory).unwrap().measured,
        Some(276_824_064)
    );
    let table = ledger.to_string();
    assert!(table.contains("local memory"));
    assert!(table.contains("264 MiB"), "{table}");
    assert!(table.contains("x 132 SMs"));
}
