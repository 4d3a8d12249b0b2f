//! `libcudamem_interpose.so`: the driver interposer `cudamem run` preloads into
//! an unmodified CUDA program.
//!
//! It defines `dlsym`, `dlvsym`, `dlopen` (which notes a load of the driver, [`loading`]), `cuGetProcAddress`, `cuGetProcAddress_v2` and the
//! driver's exported allocation, VMM, context, limit, module and launch
//! functions, and those that make streams, events, graphs and pools
//! ([`hooks`]). Every wrapper calls the real driver, records the
//! call, and returns exactly what the driver returned; a function the
//! driver lacks stays missing. Records go to one log per process
//! (`trace::event`'s format) when `CUDAMEM_HOOK_DIR` names a folder;
//! an out-of-memory return is explained on stderr before the program sees
//! it, with or without a log.
//!
//! It is not a library to link: its rlib exists only so that tests can name
//! this package as a dependency and have the shared library built. Its one
//! constructor registers the fork handlers and finds the C library's
//! `dlsym` and `dlvsym` (no driver call): the driver is found, and the
//! recorder set up, on the first call that needs them.
//!
//! It never changes what the program does: no panic leaves it (one stops
//! recording instead), nothing on the exit path or in a signal handler
//! waits for a lock its own thread holds, the log holds no descriptor the
//! program could close or reuse, and the program's signal actions (and
//! what `sigaction` reads of them) stay its own.
//!
//! Everything that needs no `unsafe` (the records, the accounting, the
//! explanations) is in the `cudamem-trace` crate (`trace`), the pool is
//! ctx's; this crate is the layer over the C ABI. Its behaviour is tested end to end, against a fake
//! driver, by `cudamem run`'s tests (harness/tests/cli_run/):
//!
//! ```text
//! LD_PRELOAD=target/release/libcudamem_interpose.so CUDAMEM_HOOK_DIR=/tmp/logs ./my_cuda_program
//! cat /tmp/logs/<pid>.events
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

mod caller;
mod control;
mod driver;
mod gate;
mod hooks;
mod interpose;
mod lifecycle;
mod loading;
mod lock;
mod logfile;
mod pool;
mod recorder;
mod stop;
mod symbols;
mod thread;
