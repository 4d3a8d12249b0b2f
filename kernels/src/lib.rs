#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cm_heap;
pub mod cm_link;
pub mod heap;
mod kernel;
pub mod local;
mod module;
pub mod moves;
pub mod pattern;

pub use kernel::{BLOCK_THREADS, Kernel, LaunchShape};
pub use module::{KernelInfo, MODULES, Module};
