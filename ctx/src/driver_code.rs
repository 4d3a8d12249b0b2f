//! [`DriverCode`]: a CUDA driver result code as a value code can decide
//! on, and its name for people. Both backends speak it: the CUDA backend
//! passes on what the driver returned, the simulated device returns what
//! the driver would.

use std::fmt;

use crate::driver::result;

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
    pub const INVALID_VALUE: DriverCode = DriverCode(result::INVALID_VALUE as u32);
    /// `CUDA_ERROR_OUT_OF_MEMORY`: the device cannot give the memory asked.
    pub const OUT_OF_MEMORY: DriverCode = DriverCode(result::OUT_OF_MEMORY as u32);
    /// `CUDA_ERROR_INVALID_DEVICE`: no device of that ordinal.
    pub const INVALID_DEVICE: DriverCode = DriverCode(result::INVALID_DEVICE as u32);
    /// `CUDA_ERROR_INVALID_HANDLE`: a handle this device did not make, or
    /// one given back already.
    pub const INVALID_HANDLE: DriverCode = DriverCode(result::INVALID_HANDLE as u32);
    /// `CUDA_ERROR_NOT_FOUND`: a named symbol (kernel, variable) missing.
    pub const NOT_FOUND: DriverCode = DriverCode(result::NOT_FOUND as u32);
    /// `CUDA_ERROR_NOT_READY`: queued work is not done yet.
    pub const NOT_READY: DriverCode = DriverCode(result::NOT_READY as u32);
    /// `CUDA_ERROR_NOT_SUPPORTED`: the operation is not supported here.
    pub const NOT_SUPPORTED: DriverCode = DriverCode(result::NOT_SUPPORTED as u32);

    /// Whether the device said it has not the memory asked for.
    pub const fn is_out_of_memory(self) -> bool {
        self.0 == Self::OUT_OF_MEMORY.0
    }

    /// The driver's name of the code (`"CUDA_ERROR_OUT_OF_MEMORY"`), or
    /// `"CUresult N"` for a code this table does not know.
    pub fn name(self) -> String {
        match i32::try_from(self.0).ok().and_then(result::name) {
            Some(name) => name.to_owned(),
            None => format!("CUresult {}", self.0),
        }
    }
}

impl fmt::Display for DriverCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_of_the_table_is_named() {
        for &(code, name) in result::NAMES {
            assert_eq!(DriverCode(code as u32).name(), name);
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
