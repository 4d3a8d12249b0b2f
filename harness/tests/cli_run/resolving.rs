//! How programs reach the wrappers: `dlsym`, `cuGetProcAddress` of base
//! names (every wrapped one, at the version a runtime asks for), a shared
//! runtime, `RTLD_NEXT`.

use std::collections::HashMap;

use super::*;

#[test]
fn dlopen_and_dlsym_reach_the_wrappers_and_missing_symbols_stay_missing() {
    let run = traced("dlopen", &[&program("cuda_dynamic"), "dlopen"], &[]);
    // The program exits 25 if a function the driver lacks was found.
    assert_eq!(run.status(), Some(0), "{}{}", run.stdout(), run.stderr());
    let log = run.log();
    assert_eq!(records(&log, "alloc").len(), 2, "{log}");
    assert_eq!(records(&log, "free").len(), 1, "{log}");
    assert_eq!(records(&log, "context").len(), 1, "{log}");
}

#[test]
fn cu_get_proc_address_of_base_names_hands_out_wrappers_for_the_drivers_abi() {
    for thunks in ["0", "1"] {
        let run = traced(
            "procaddr",
            &[&program("cuda_dynamic"), "procaddr"],
            &[("FAKE_CUDA_THUNKS", thunks)],
        );
        assert_eq!(run.status(), Some(0), "{}{}", run.stdout(), run.stderr());
        let log = run.log();
        assert_eq!(records(&log, "alloc").len(), 2, "thunks {thunks}: {log}");
        assert_eq!(records(&log, "free").len(), 1, "thunks {thunks}: {log}");
        let how: Vec<(&str, &str, &str)> = records(&log, "resolve")
            .iter()
            .map(|r| (r[3], r[4], r[6]))
            .collect();
        // A pointer that is no export is placed by the version table; the
        // 32-bit ABI of version 2000 is handed on as the driver gave it.
        let wrapped = if thunks == "1" { "table" } else { "export" };
        assert!(how.contains(&("cuMemAlloc", "12000", wrapped)), "{how:?}");
        assert!(how.contains(&("cuMemFree", "12000", wrapped)), "{how:?}");
        assert!(
            how.contains(&("cuMemAlloc", "2000", "unwrapped")),
            "{how:?}"
        );
    }
}

#[test]
fn through_a_shared_runtime_the_caller_is_the_program_not_the_runtime() {
    let run = traced("runtime", &[&program("cuda_runtime"), "alloc"], &[]);
    assert_eq!(run.status(), Some(0), "{}", run.stderr());
    let log = run.log();
    let alloc = &records(&log, "alloc")[0];
    let libraries: HashMap<&str, &str> = records(&log, "library")
        .iter()
        .map(|r| (r[3], r[4]))
        .collect();
    let caller = libraries[alloc[7]];
    assert!(caller.ends_with("/cuda_runtime"), "{caller} in {log}");
    assert!(
        records(&log, "resolve").iter().all(|r| r[6] == "export"),
        "{log}"
    );
}

#[test]
fn a_runtime_that_asks_for_cuda_13s_synchronize_gets_the_abi_that_takes_a_context() {
    // CUDA 13's cuCtxSynchronize (version 13000) takes the context to wait
    // for; handed the older ABI's wrapper, the driver got no context
    // argument and answered "context is destroyed".
    let alone = Command::new(program("cuda_runtime"))
        .arg("sync")
        .env("LD_LIBRARY_PATH", &fixtures().dir)
        .output()
        .unwrap();
    assert_eq!(alone.status.code(), Some(0), "{}", text(&alone.stdout));
    for pool in [false, true] {
        let mut args = vec!["--"];
        if pool {
            args.insert(0, "--pool");
        }
        let argv = [program("cuda_runtime"), "sync".to_string()];
        args.extend(argv.iter().map(String::as_str));
        let output = run(&args, &[]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "pool {pool}: {}{}",
            text(&output.stdout),
            text(&output.stderr)
        );
        assert_eq!(text(&output.stdout).trim(), "sync: 0", "pool {pool}");
    }
}

#[test]
fn rtld_next_lookups_keep_the_callers_view() {
    let output = run(&["--", &program("cuda_dynamic"), "rtldnext"], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // From probe_b nothing follows that defines probe_value: 0, not probe_a's 1.
    assert_eq!(text(&output.stdout).trim(), "rtldnext: 0");
}

#[test]
fn every_wrapped_base_name_gets_its_wrapper_through_cu_get_proc_address() {
    // The base names of every recorded ABI, as cuda_dynamic.c asks for them.
    let bases = [
        "cuMemAlloc",
        "cuMemAllocPitch",
        "cuMemAllocManaged",
        "cuMemFree",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "cuMemFreeAsync",
        "cuMemHostAlloc",
        "cuMemAllocHost",
        "cuMemFreeHost",
        "cuMemGetInfo",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuDevicePrimaryCtxRetain",
        "cuCtxCreate",
        "cuCtxSetLimit",
        "cuModuleLoad",
        "cuModuleLoadData",
        "cuModuleLoadDataEx",
        "cuModuleLoadFatBinary",
        "cuLibraryLoadData",
        "cuLibraryLoadFromFile",
        "cuModuleGetFunction",
        "cuLibraryGetKernel",
        "cuKernelGetFunction",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuFuncGetAttribute",
        "cuKernelGetAttribute",
        "cuStreamCreate",
        "cuStreamCreateWithPriority",
        "cuEventCreate",
        "cuGraphInstantiateWithFlags",
        "cuGraphInstantiateWithParams",
        "cuGraphUpload",
        "cuGraphLaunch",
        "cuMemPoolCreate",
    ];
    // The driver's pointers are its exports, or (as a real driver's
    // internal entry points) none of them: then the version table decides.
    for (thunks, wrapped) in [("0", "export"), ("all", "table")] {
        let run = traced(
            "procall",
            &[&program("cuda_dynamic"), "procall"],
            &[("FAKE_CUDA_THUNKS", thunks)],
        );
        assert_eq!(run.status(), Some(0), "{}{}", run.stdout(), run.stderr());
        assert!(
            run.stdout().contains("procall: 42 names"),
            "{}",
            run.stdout()
        );
        let log = run.log();
        let answers: HashMap<(&str, &str), &str> = records(&log, "resolve")
            .iter()
            .filter(|r| r[4] == "13000")
            .map(|r| ((r[3], r[5]), r[6]))
            .collect();
        for base in bases {
            for flags in ["0", "2"] {
                assert_eq!(
                    answers.get(&(base, flags)).copied(),
                    Some(wrapped),
                    "thunks {thunks}: {base} with flags {flags} in {answers:?}"
                );
            }
        }
        // What went through the answers was recorded.
        let calls: Vec<&str> = records(&log, "alloc").iter().map(|r| r[3]).collect();
        assert_eq!(
            calls,
            ["cuMemAlloc", "cuMemAlloc", "cuMemAllocAsync"],
            "thunks {thunks}: {log}"
        );
        assert_eq!(records(&log, "free").len(), 2, "thunks {thunks}: {log}");
        assert_eq!(records(&log, "context").len(), 1, "thunks {thunks}: {log}");
        let launch = &records(&log, "launch")[0];
        assert_eq!((launch[5], launch[12]), ("64", "other"), "{log}");
    }
}
