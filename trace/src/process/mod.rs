//! What a process's event records add up to, and what that explains.
//!
//! `libcudamem_interpose.so` (the `cudamem-interpose` package) is loaded into
//! an unmodified CUDA program with `LD_PRELOAD` by `cudamem run`. It answers
//! `dlsym`, `cuGetProcAddress` and the driver's exported allocation, context,
//! module and launch functions, and writes one event log per process. This
//! crate is everything about that which needs no `unsafe` and no driver:
//!
//! - [`accounting`]: [`Accounting`], the state a process's records build
//!   (live blocks by calling library, each device's context, limits,
//!   kernels, readings of free memory), fed by the interposer as it records
//!   and by `cudamem run` as it reads back;
//! - [`snapshot`]: [`Snapshot`], one device at one moment as ctx's
//!   [`ctx::Ledger`] (converted in one place) plus the lines it lacks
//!   (callers, VMM, pinned host memory, the unexplained rest);
//! - [`advice`]: the biggest holders, advice that fits them, and the
//!   out-of-memory explanation the interposer prints;
//!
//! It is not the interposer: it calls no driver and loads nothing into
//! another process; and it is not a profiler: it sees driver calls, not
//! kernels' work.
//!
//! ```
//! use trace::process::{Accounting, Snapshot};
//! use trace::event::{Call, ContextHow, Event, Record};
//!
//! // A context on a device of 132 SMs x 2048 threads, then a kernel with a
//! // 16 KiB frame, then 4 MiB.
//! let mut accounting = Accounting::default();
//! let mut apply = |event| accounting.apply(&Record { time_ns: 0, thread: 1, event });
//! apply(Event::Context {
//!     how: ContextHow::Primary, device: 0, ctx: 1, result: 0,
//!     sm_count: Some(132), threads_per_sm: Some(2048), total: Some(150_109_880_320),
//!     free: Some(150_109_880_320 - 552_402_944), stack: Some(1024),
//!     heap: Some(8 << 20), fifo: Some(8_650_752),
//! });
//! apply(Event::Launch {
//!     call: Call::LaunchKernel, handle: 0x10, local_bytes: Some(16384),
//!     stack_before: Some(1024), stack_after: Some(16384),
//!     window: Default::default(), result: 0, name: "big_frame".into(),
//! });
//! apply(Event::Alloc {
//!     call: Call::MemAlloc, ptr: 0x7000, size: 4 << 20, stream: 0, caller: 0, result: 0,
//! });
//! let snapshot = Snapshot::of(&accounting, 0).unwrap();
//! assert_eq!(snapshot.local_predicted, 132 * 2048 * 16384);
//! assert!(snapshot.local_memory_cause().contains("kernel big_frame"));
//! println!("{}", snapshot.render());
//! ```

#![forbid(unsafe_code)]

pub mod accounting;
pub mod advice;
pub mod ledger;
pub mod libraries;

pub use accounting::Accounting;
pub use ledger::Snapshot;
