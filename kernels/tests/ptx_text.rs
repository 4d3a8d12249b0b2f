//! The committed PTX declares what the Rust descriptions say: the entries,
//! one by-value parameter of the struct's size each, the PTX ISA version the
//! H200 machine's driver loads, and in-kernel malloc exactly where described.

use kernels::{MODULES, Module};

/// Highest PTX ISA version that driver 580 (CUDA 13.0) loads.
const MAX_PTX_VERSION: (u32, u32) = (9, 0);

fn directive<'a>(module: &'a Module, name: &str) -> &'a str {
    module
        .ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(name))
        .unwrap_or_else(|| panic!("{}.ptx has no {name} directive", module.name))
        .trim()
}

/// The text of each `.entry`, from its name to the next entry.
fn entries(module: &Module) -> Vec<(&str, &str)> {
    let parts: Vec<&str> = module.ptx.split(".entry ").skip(1).collect();
    parts
        .into_iter()
        .map(|text| {
            let name = text.split('(').next().unwrap_or("").trim();
            (name, text)
        })
        .collect()
}

#[test]
fn every_module_targets_sm_90_with_a_loadable_ptx_version() {
    for module in MODULES {
        assert_eq!(directive(module, ".target"), "sm_90", "{}", module.name);
        assert_eq!(directive(module, ".address_size"), "64", "{}", module.name);
        let version = directive(module, ".version");
        let (major, minor) = version
            .split_once('.')
            .unwrap_or_else(|| panic!("{}.ptx: .version {version}", module.name));
        let parsed: (u32, u32) = (major.parse().unwrap(), minor.parse().unwrap());
        assert!(
            parsed <= MAX_PTX_VERSION,
            "{}.ptx is .version {version}; driver 580 loads at most 9.0",
            module.name
        );
    }
}

#[test]
fn entries_match_the_descriptions() {
    for module in MODULES {
        let mut in_ptx: Vec<&str> = entries(module).into_iter().map(|(n, _)| n).collect();
        let mut described: Vec<&str> = module.kernels.iter().map(|k| k.name).collect();
        in_ptx.sort_unstable();
        described.sort_unstable();
        assert_eq!(in_ptx, described, "{}.ptx", module.name);
    }
}

#[test]
fn each_entry_takes_one_struct_of_the_described_size() {
    for module in MODULES {
        for (name, text) in entries(module) {
            let info = module.kernel(name).unwrap();
            let params: Vec<&str> = text
                .split(')')
                .next()
                .unwrap()
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with(".param"))
                .collect();
            let expected = format!(".param .align 8 .b8 {name}_param_0[{}]", info.param_bytes);
            assert_eq!(params, [expected.as_str()], "{name}");
        }
    }
}

#[test]
fn device_heap_calls_are_where_described() {
    for module in MODULES {
        for (name, text) in entries(module) {
            // nvcc writes `call.uni (retval0),` then the callee on a line of its own.
            let calls_heap = text
                .lines()
                .any(|l| matches!(l.trim(), "malloc," | "free,"));
            let info = module.kernel(name).unwrap();
            assert_eq!(calls_heap, info.uses_device_heap, "{name}");
        }
    }
}

#[test]
fn typed_kernels_name_their_entries() {
    use kernels::{cm_heap, heap, local, moves, pattern};
    let typed = [
        (pattern::FILL.name(), "pattern_fill"),
        (pattern::VERIFY.name(), "pattern_verify"),
        (heap::MALLOC_FREE.name(), "heap_malloc_free"),
        (heap::MALLOC_HOLD.name(), "heap_malloc_hold"),
        (heap::CHECK_FREE_HELD.name(), "heap_check_free_held"),
        (heap::EXHAUST.name(), "heap_exhaust"),
        (heap::FRAGMENT_FILL.name(), "heap_fragment_fill"),
        (heap::FRAGMENT_PUNCH.name(), "heap_fragment_punch"),
        (heap::FRAGMENT_LARGE.name(), "heap_fragment_large"),
        (heap::RELEASE_LISTS.name(), "heap_release_lists"),
        (heap::MALLOC_FREE_MIXED.name(), "heap_malloc_free_mixed"),
        (cm_heap::MALLOC_FREE.name(), "cm_malloc_free"),
        (cm_heap::MALLOC_FREE_MIXED.name(), "cm_malloc_free_mixed"),
        (
            cm_heap::MALLOC_HOLD_MISSING.name(),
            "cm_malloc_hold_missing",
        ),
        (cm_heap::CHECK_FREE_HELD.name(), "cm_check_free_held"),
        (cm_heap::EXHAUST.name(), "cm_exhaust"),
        (cm_heap::FRAGMENT_FILL.name(), "cm_fragment_fill"),
        (cm_heap::FRAGMENT_PUNCH.name(), "cm_fragment_punch"),
        (cm_heap::FRAGMENT_LARGE.name(), "cm_fragment_large"),
        (cm_heap::RELEASE_LISTS.name(), "cm_release_lists"),
        (local::LOCAL_0.name(), "local_0"),
        (local::LOCAL_1K.name(), "local_1k"),
        (local::LOCAL_4K.name(), "local_4k"),
        (local::LOCAL_16K.name(), "local_16k"),
        (moves::MOVE_BLOCKS.name(), "move_blocks"),
    ];
    for (got, expected) in typed {
        assert_eq!(got, expected);
    }
    let sizes: Vec<u64> = local::ALL
        .iter()
        .map(|k| k.info().local_bytes_per_thread)
        .collect();
    assert_eq!(sizes, [0, 1024, 4096, 16384]);
}
