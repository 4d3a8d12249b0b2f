//! The CUDA driver's numbers, declared once for every crate that speaks to
//! the driver or reads what it said: result codes (`CUresult`), context
//! limits (`CUlimit`) and the attributes cudamem reads. Plain data, no
//! `cust`, no driver: the interposer, the trace readers, the PyTorch
//! backend and ctx's own CUDA backend use these (the backend checks its
//! binding's values against them at compile time).
//!
//! ```
//! use ctx::driver::{limit, result};
//!
//! assert_eq!(result::OUT_OF_MEMORY, 2);
//! assert_eq!(result::name(2), Some("CUDA_ERROR_OUT_OF_MEMORY"));
//! assert_eq!(limit::name(limit::MALLOC_HEAP_SIZE), Some("CU_LIMIT_MALLOC_HEAP_SIZE"));
//! ```

/// `CUDA_SUCCESS`.
pub const SUCCESS: i32 = 0;

/// `numbers! { /// doc  pub mod NAME: TYPE = "PREFIX" { NAME = VALUE, ... } }`: a
/// module of constants, each documented with its driver name (`PREFIX`
/// and its own), `NAMES` (every value and driver name, sorted by value)
/// and `name(value)`.
macro_rules! numbers {
    (
        $(#[$meta:meta])*
        pub mod $module:ident: $ty:ty = $prefix:literal {
            $( $(#[$item_meta:meta])* $name:ident = $value:literal, )*
        }
    ) => {
        $(#[$meta])*
        pub mod $module {
            $(
                #[doc = concat!("`", $prefix, stringify!($name), "`.")]
                $(#[$item_meta])*
                pub const $name: $ty = $value;
            )*

            /// Every value and its driver name, sorted by value.
            pub const NAMES: &[($ty, &str)] = &[
                $( ($value, concat!($prefix, stringify!($name))), )*
            ];

            /// The driver's name of `value`, where this table knows it.
            pub fn name(value: $ty) -> Option<&'static str> {
                NAMES
                    .binary_search_by_key(&value, |&(known, _)| known)
                    .ok()
                    .map(|index| NAMES[index].1)
            }
        }
    };
}

numbers! {
    /// `CUresult` codes other than success (the driver API reference's
    /// `CUresult` enum).
    pub mod result: i32 = "CUDA_ERROR_" {
        INVALID_VALUE = 1,
        OUT_OF_MEMORY = 2,
        NOT_INITIALIZED = 3,
        DEINITIALIZED = 4,
        PROFILER_DISABLED = 5,
        PROFILER_NOT_INITIALIZED = 6,
        PROFILER_ALREADY_STARTED = 7,
        PROFILER_ALREADY_STOPPED = 8,
        STUB_LIBRARY = 34,
        DEVICE_UNAVAILABLE = 46,
        NO_DEVICE = 100,
        INVALID_DEVICE = 101,
        DEVICE_NOT_LICENSED = 102,
        INVALID_IMAGE = 200,
        INVALID_CONTEXT = 201,
        CONTEXT_ALREADY_CURRENT = 202,
        MAP_FAILED = 205,
        UNMAP_FAILED = 206,
        ARRAY_IS_MAPPED = 207,
        ALREADY_MAPPED = 208,
        NO_BINARY_FOR_GPU = 209,
        ALREADY_ACQUIRED = 210,
        NOT_MAPPED = 211,
        NOT_MAPPED_AS_ARRAY = 212,
        NOT_MAPPED_AS_POINTER = 213,
        ECC_UNCORRECTABLE = 214,
        UNSUPPORTED_LIMIT = 215,
        CONTEXT_ALREADY_IN_USE = 216,
        PEER_ACCESS_UNSUPPORTED = 217,
        INVALID_PTX = 218,
        INVALID_GRAPHICS_CONTEXT = 219,
        NVLINK_UNCORRECTABLE = 220,
        JIT_COMPILER_NOT_FOUND = 221,
        UNSUPPORTED_PTX_VERSION = 222,
        JIT_COMPILATION_DISABLED = 223,
        UNSUPPORTED_EXEC_AFFINITY = 224,
        INVALID_SOURCE = 300,
        FILE_NOT_FOUND = 301,
        SHARED_OBJECT_SYMBOL_NOT_FOUND = 302,
        SHARED_OBJECT_INIT_FAILED = 303,
        OPERATING_SYSTEM = 304,
        INVALID_HANDLE = 400,
        ILLEGAL_STATE = 401,
        NOT_FOUND = 500,
        NOT_READY = 600,
        ILLEGAL_ADDRESS = 700,
        LAUNCH_OUT_OF_RESOURCES = 701,
        LAUNCH_TIMEOUT = 702,
        LAUNCH_INCOMPATIBLE_TEXTURING = 703,
        PEER_ACCESS_ALREADY_ENABLED = 704,
        PEER_ACCESS_NOT_ENABLED = 705,
        PRIMARY_CONTEXT_ACTIVE = 708,
        CONTEXT_IS_DESTROYED = 709,
        ASSERT = 710,
        TOO_MANY_PEERS = 711,
        HOST_MEMORY_ALREADY_REGISTERED = 712,
        HOST_MEMORY_NOT_REGISTERED = 713,
        HARDWARE_STACK_ERROR = 714,
        ILLEGAL_INSTRUCTION = 715,
        MISALIGNED_ADDRESS = 716,
        INVALID_ADDRESS_SPACE = 717,
        INVALID_PC = 718,
        LAUNCH_FAILED = 719,
        COOPERATIVE_LAUNCH_TOO_LARGE = 720,
        NOT_PERMITTED = 800,
        NOT_SUPPORTED = 801,
        SYSTEM_NOT_READY = 802,
        SYSTEM_DRIVER_MISMATCH = 803,
        COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
        MPS_CONNECTION_FAILED = 805,
        MPS_RPC_FAILURE = 806,
        MPS_SERVER_NOT_READY = 807,
        MPS_MAX_CLIENTS_REACHED = 808,
        MPS_MAX_CONNECTIONS_REACHED = 809,
        STREAM_CAPTURE_UNSUPPORTED = 900,
        STREAM_CAPTURE_INVALIDATED = 901,
        STREAM_CAPTURE_MERGE = 902,
        STREAM_CAPTURE_UNMATCHED = 903,
        STREAM_CAPTURE_UNJOINED = 904,
        STREAM_CAPTURE_ISOLATION = 905,
        STREAM_CAPTURE_IMPLICIT = 906,
        CAPTURED_EVENT = 907,
        STREAM_CAPTURE_WRONG_THREAD = 908,
        TIMEOUT = 909,
        GRAPH_EXEC_UPDATE_FAILURE = 910,
        EXTERNAL_DEVICE = 911,
        INVALID_CLUSTER_SIZE = 912,
        UNKNOWN = 999,
    }
}

numbers! {
    /// Context limits (`CUlimit`), for `cuCtxGetLimit`/`cuCtxSetLimit`.
    pub mod limit: u32 = "CU_LIMIT_" {
        /// Stack per thread, bytes.
        STACK_SIZE = 0,
        /// The printf FIFO, bytes.
        PRINTF_FIFO_SIZE = 1,
        /// The heap of in-kernel `malloc`, bytes.
        MALLOC_HEAP_SIZE = 2,
        DEV_RUNTIME_SYNC_DEPTH = 3,
        DEV_RUNTIME_PENDING_LAUNCH_COUNT = 4,
        MAX_L2_FETCH_GRANULARITY = 5,
        PERSISTING_L2_CACHE_SIZE = 6,
    }
}

numbers! {
    /// Device attributes cudamem reads (`CUdevice_attribute`).
    pub mod device_attribute: i32 = "CU_DEVICE_ATTRIBUTE_" {
        MULTIPROCESSOR_COUNT = 16,
        MAX_THREADS_PER_MULTIPROCESSOR = 39,
        COMPUTE_CAPABILITY_MAJOR = 75,
        COMPUTE_CAPABILITY_MINOR = 76,
        VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    }
}

numbers! {
    /// Function attributes cudamem reads (`CUfunction_attribute`).
    pub mod function_attribute: i32 = "CU_FUNC_ATTRIBUTE_" {
        MAX_THREADS_PER_BLOCK = 0,
        SHARED_SIZE_BYTES = 1,
        CONST_SIZE_BYTES = 2,
        /// Local memory per thread, bytes.
        LOCAL_SIZE_BYTES = 3,
        NUM_REGS = 4,
    }
}

numbers! {
    /// Memory pool attributes cudamem reads (`CUmemPool_attribute`).
    pub mod mempool_attribute: i32 = "CU_MEMPOOL_ATTR_" {
        /// Bytes the pool holds from the device.
        RESERVED_MEM_CURRENT = 5,
    }
}

numbers! {
    /// Where memory lives (`CUmemLocationType`).
    pub mod mem_location_type: u32 = "CU_MEM_LOCATION_TYPE_" {
        DEVICE = 1,
        HOST = 2,
    }
}

numbers! {
    /// Kinds of physical memory `cuMemCreate` makes (`CUmemAllocationType`).
    pub mod mem_allocation_type: u32 = "CU_MEM_ALLOCATION_TYPE_" {
        PINNED = 1,
    }
}

numbers! {
    /// Access a mapping grants (`CUmemAccess_flags`).
    pub mod mem_access_flags: u32 = "CU_MEM_ACCESS_FLAGS_PROT_" {
        NONE = 0,
        READ = 1,
        READWRITE = 3,
    }
}

numbers! {
    /// Pointer attributes cudamem answers for its pool's blocks
    /// (`CUpointer_attribute`).
    pub mod pointer_attribute: i32 = "CU_POINTER_ATTRIBUTE_" {
        RANGE_START_ADDR = 11,
        RANGE_SIZE = 12,
    }
}

numbers! {
    /// Flags of `cuGetProcAddress` (`CUdriverProcAddress_flags`).
    pub mod proc_address_flag: u64 = "CU_GET_PROC_ADDRESS_" {
        LEGACY_STREAM = 1,
        PER_THREAD_DEFAULT_STREAM = 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_sorted_so_every_value_is_found() {
        fn check<T: Copy + Ord + std::fmt::Debug>(
            names: &[(T, &str)],
            name: fn(T) -> Option<&'static str>,
        ) {
            assert!(
                names.windows(2).all(|pair| pair[0].0 < pair[1].0),
                "{names:?}"
            );
            for &(value, text) in names {
                assert_eq!(name(value), Some(text));
            }
        }
        check(result::NAMES, result::name);
        check(limit::NAMES, limit::name);
        check(device_attribute::NAMES, device_attribute::name);
        check(function_attribute::NAMES, function_attribute::name);
        check(mempool_attribute::NAMES, mempool_attribute::name);
        check(mem_location_type::NAMES, mem_location_type::name);
        check(proc_address_flag::NAMES, proc_address_flag::name);
        assert_eq!(result::name(SUCCESS), None);
        assert_eq!(
            result::name(result::NOT_FOUND),
            Some("CUDA_ERROR_NOT_FOUND")
        );
    }
}
