//! The `cudamem` subcommands: their arguments, how they read and print, and
//! the byte counts they accept.

pub mod byte_size;
pub mod explain;
pub mod explain_devices;
pub mod explain_snapshot;
pub mod malloc_heap;
pub mod output;
pub mod replay_command;
#[cfg(feature = "cuda")]
pub mod replay_gpu;
pub mod run;
