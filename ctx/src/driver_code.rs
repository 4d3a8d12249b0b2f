//! [`DriverCode`]: a CUDA driver result code as a value code can decide
//! on, and its name for people. Both backends speak it: the CUDA backend
//! passes on what the driver returned, the simulated device returns what
//! the driver would.

use std::fmt;

/// A `CUresult` other than success, as the driver returned it (or as the
/// simulated device returns it where the driver would).
///
/// ```
/// use ctx::DriverCode;
///
/// assert!(DriverCode::OUT_OF_MEMORY.is_out_of_memory());
/// assert_eq!(DriverCode(2), DriverCode::OUT_OF_MEMORY);
/// assert_eq!(DriverCode::INVALID_VALUE.name(), "CUDA_ERROR_INVALID_VALUE");
/// assert_eq!(DriverCode(7777).name(), "CUresult 7777");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DriverCode(pub u32);

impl DriverCode {
    /// `CUDA_ERROR_INVALID_VALUE`: an argument out of range, or a range
    /// that breaks the driver's rules for reservations and mappings.
    pub const INVALID_VALUE: DriverCode = DriverCode(1);
    /// `CUDA_ERROR_OUT_OF_MEMORY`: the device cannot give the memory asked.
    pub const OUT_OF_MEMORY: DriverCode = DriverCode(2);
    /// `CUDA_ERROR_INVALID_DEVICE`: no device of that ordinal.
    pub const INVALID_DEVICE: DriverCode = DriverCode(101);
    /// `CUDA_ERROR_INVALID_HANDLE`: a handle this device did not make, or
    /// one given back already.
    pub const INVALID_HANDLE: DriverCode = DriverCode(400);
    /// `CUDA_ERROR_NOT_FOUND`: a named symbol (kernel, variable) missing.
    pub const NOT_FOUND: DriverCode = DriverCode(500);
    /// `CUDA_ERROR_NOT_READY`: queued work is not done yet.
    pub const NOT_READY: DriverCode = DriverCode(600);
    /// `CUDA_ERROR_NOT_SUPPORTED`: the operation is not supported here.
    pub const NOT_SUPPORTED: DriverCode = DriverCode(801);

    /// Whether the device said it has not the memory asked for.
    pub const fn is_out_of_memory(self) -> bool {
        self.0 == Self::OUT_OF_MEMORY.0
    }

    /// The driver's name of the code (`"CUDA_ERROR_OUT_OF_MEMORY"`), or
    /// `"CUresult N"` for a code this table does not know.
    pub fn name(self) -> String {
        match NAMES.binary_search_by_key(&self.0, |&(code, _)| code) {
            Ok(index) => NAMES[index].1.to_owned(),
            Err(_) => format!("CUresult {}", self.0),
        }
    }
}

impl fmt::Display for DriverCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The driver API's result codes and their names (the `CUresult` enum of
/// the CUDA driver API reference), sorted by code.
const NAMES: &[(u32, &str)] = &[
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (5, "CUDA_ERROR_PROFILER_DISABLED"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"),
    (205, "CUDA_ERROR_MAP_FAILED"),
    (206, "CUDA_ERROR_UNMAP_FAILED"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED"),
    (208, "CUDA_ERROR_ALREADY_MAPPED"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED"),
    (211, "CUDA_ERROR_NOT_MAPPED"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"),
    (300, "CUDA_ERROR_INVALID_SOURCE"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (710, "CUDA_ERROR_ASSERT"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    (805, "CUDA_ERROR_MPS_CONNECTION_FAILED"),
    (806, "CUDA_ERROR_MPS_RPC_FAILURE"),
    (807, "CUDA_ERROR_MPS_SERVER_NOT_READY"),
    (808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"),
    (809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
    (902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"),
    (903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"),
    (904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"),
    (905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"),
    (906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"),
    (907, "CUDA_ERROR_CAPTURED_EVENT"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"),
    (909, "CUDA_ERROR_TIMEOUT"),
    (910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE"),
    (912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_table_is_sorted_so_every_code_is_found() {
        assert!(NAMES.windows(2).all(|pair| pair[0].0 < pair[1].0));
        for &(code, name) in NAMES {
            assert_eq!(DriverCode(code).name(), name);
        }
        for code in [
            DriverCode::INVALID_VALUE,
            DriverCode::OUT_OF_MEMORY,
            DriverCode::INVALID_DEVICE,
            DriverCode::INVALID_HANDLE,
            DriverCode::NOT_FOUND,
            DriverCode::NOT_READY,
            DriverCode::NOT_SUPPORTED,
        ] {
            assert!(code.name().starts_with("CUDA_ERROR_"), "{code:?}");
        }
        assert_eq!(DriverCode(0).name(), "CUresult 0");
        assert!(!DriverCode::INVALID_VALUE.is_out_of_memory());
    }
}
