//! The wrapped driver functions.
//!
//! Each wrapped ABI (an exported name such as `cuMemAlloc_v2`) is a module
//! made by [`hook!`]: the exported wrapper of that name (a program linked
//! against the driver, or `dlsym`, reaches it), which calls the driver's
//! export of the same name; a second wrapper for a pointer
//! `cuGetProcAddress` handed out that is no export (see [`crate::interpose`]),
//! which calls that pointer; and its [`Entry`], which it adds to
//! [`ENTRIES`] itself. A new driver call is its `Call` row in the event
//! format and its `hook!` here. Both
//! wrappers run the same body: call the driver, record, return the driver's
//! answer unchanged.

use std::cell::Cell;
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::driver::Sym;

pub mod context;
pub mod gated;
pub mod image;
pub mod memory;
pub mod module;
pub mod objects;

/// One driver ABI the interposer knows.
pub struct Entry {
    /// The exported name.
    pub name: &'static CStr,
    /// The name `cuGetProcAddress` is asked for (without `_v2`, `_ptsz`).
    pub base: &'static str,
    /// The first `cudaVersion` for which `cuGetProcAddress` of `base`
    /// hands out this ABI (from the driver's published typedefs,
    /// `PFN_<base>_v<version>`).
    pub since: i32,
    /// A per-thread-default-stream variant.
    pub ptsz: bool,
    /// The driver's export of `name`.
    pub export: &'static Sym,
    /// The wrappers; `None` for an ABI that is told apart but not recorded.
    pub wrap: Option<Wrap>,
}

/// The two wrappers of an ABI.
pub struct Wrap {
    /// The exported wrapper (calls the driver's export).
    pub export_fn: *const c_void,
    /// The wrapper of a handed-out pointer.
    pub resolved_fn: *const c_void,
    /// The pointer `resolved_fn` calls (0 until one is handed out).
    pub resolved: &'static AtomicUsize,
}

// SAFETY: the pointers are code addresses, never written through.
unsafe impl Sync for Entry {}

/// `name` (with its NUL) as a C string, at compile time.
pub const fn c_name(name: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(name.as_bytes()) {
        Ok(name) => name,
        Err(_) => panic!("a hooked name must end in one NUL"),
    }
}

/// The pointer a resolved wrapper calls.
pub fn resolved_addr(slot: &AtomicUsize) -> Option<usize> {
    match slot.load(Ordering::Acquire) {
        0 => None,
        addr => Some(addr),
    }
}

/// The driver function `$real` (an `Option<usize>`) as a function of the
/// given type; returns `CUDA_ERROR_NOT_FOUND` from the enclosing wrapper
/// when there is none.
macro_rules! real {
    ($real:expr, fn($($ty:ty),* $(,)?)) => {
        match $real {
            // SAFETY: the address is the driver's function of this ABI: the
            // export of the wrapper's own name, or the pointer
            // cuGetProcAddress handed out for it.
            Some(addr) => unsafe {
                std::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> $crate::driver::CuResult>(addr)
            },
            None => return $crate::driver::ERROR_NOT_FOUND,
        }
    };
}
pub(crate) use real;

/// One wrapped ABI: `hook!(caller NAME [REG] = "BASE" since V ptsz P (ARGS) => BODY)`
/// for allocation calls (their body gets the immediate caller; REG is the
/// register after the arguments), `plain` for the rest (the body gets 0).
macro_rules! hook {
    ($kind:ident $name:ident $([$reg:ident])? = $base:literal since $since:literal ptsz $ptsz:literal
        ($($arg:ident: $ty:ty),* $(,)?) => $body:path) => {
        #[allow(non_snake_case)]
        pub mod $name {
            #[allow(unused_imports)]
            use super::*;
            use std::sync::atomic::AtomicUsize;
            use $crate::driver::{CuResult, Sym};
            use $crate::hooks::{Entry, Wrap, c_name, resolved_addr};

            const NAME: &std::ffi::CStr = c_name(concat!(stringify!($name), "\0"));
            pub static EXPORT: Sym = Sym::new(NAME);
            pub static RESOLVED: AtomicUsize = AtomicUsize::new(0);

            $crate::hooks::hook!(@stubs $kind $name $([$reg])? ($($arg: $ty),*) => $body);

            pub static ENTRY: Entry = Entry {
                name: NAME,
                base: $base,
                since: $since,
                ptsz: $ptsz,
                export: &EXPORT,
                wrap: Some(Wrap {
                    export_fn: $name as *const std::ffi::c_void,
                    resolved_fn: resolved as *const std::ffi::c_void,
                    resolved: &RESOLVED,
                }),
            };

            #[linkme::distributed_slice($crate::hooks::ENTRIES)]
            static REGISTERED: &Entry = &ENTRY;
        }
    };
    (@stubs caller $name:ident [$reg:ident] ($($arg:ident: $ty:ty),*) => $body:path) => {
        $crate::caller::with_caller!(export $name [$reg] ($($arg: $ty),*) => export_inner);
        $crate::caller::with_caller!(local resolved [$reg] ($($arg: $ty),*) => resolved_inner);

        /// # Safety
        ///
        /// Entered from the stub only: the program's arguments to this ABI, valid
        /// as the driver requires them, and the caller's stack pointer at entry (or 0).
        unsafe extern "C" fn export_inner($($arg: $ty,)* caller: usize) -> CuResult {
            let _pass = $crate::gate::pass();
            // SAFETY: the program's arguments, passed on as it gave them.
            unsafe { $body(EXPORT.addr(true), caller, $($arg),*) }
        }

        /// # Safety
        ///
        /// Entered from the stub only: the program's arguments to this ABI, valid
        /// as the driver requires them, and the caller's stack pointer at entry (or 0).
        unsafe extern "C" fn resolved_inner($($arg: $ty,)* caller: usize) -> CuResult {
            let _pass = $crate::gate::pass();
            // SAFETY: as above.
            unsafe { $body(resolved_addr(&RESOLVED), caller, $($arg),*) }
        }
    };
    (@stubs plain $name:ident ($($arg:ident: $ty:ty),*) => $body:path) => {
        /// # Safety
        ///
        /// The driver's contract for this ABI: the arguments are valid as the
        /// driver requires them.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CuResult {
            let _pass = $crate::gate::pass();
            // SAFETY: the program's arguments, passed on as it gave them.
            unsafe { $body(EXPORT.addr(true), 0, $($arg),*) }
        }

        /// # Safety
        ///
        /// The driver's contract for this ABI: the arguments are valid as the
        /// driver requires them.
        pub unsafe extern "C" fn resolved($($arg: $ty),*) -> CuResult {
            let _pass = $crate::gate::pass();
            // SAFETY: as above.
            unsafe { $body(resolved_addr(&RESOLVED), 0, $($arg),*) }
        }
    };
}
pub(crate) use hook;

/// An ABI told apart from the recorded ones but not recorded itself (the
/// 32-bit `v1` allocation functions).
macro_rules! unrecorded {
    ($static:ident = $name:literal, $base:literal since $since:literal) => {
        pub static $static: Entry = Entry {
            name: c_name(concat!($name, "\0")),
            base: $base,
            since: $since,
            ptsz: false,
            export: &$crate::hooks::unrecorded_syms::$static,
            wrap: None,
        };

        const _: () = {
            #[linkme::distributed_slice($crate::hooks::ENTRIES)]
            static REGISTERED: &Entry = &$static;
        };
    };
}

mod unrecorded_syms {
    use crate::driver::Sym;
    use crate::hooks::c_name;

    pub static MEM_ALLOC_V1: Sym = Sym::new(c_name("cuMemAlloc\0"));
    pub static MEM_ALLOC_PITCH_V1: Sym = Sym::new(c_name("cuMemAllocPitch\0"));
    pub static MEM_FREE_V1: Sym = Sym::new(c_name("cuMemFree\0"));
    pub static MEM_ALLOC_HOST_V1: Sym = Sym::new(c_name("cuMemAllocHost\0"));
    pub static MEM_GET_INFO_V1: Sym = Sym::new(c_name("cuMemGetInfo\0"));
    pub static CTX_CREATE_V1: Sym = Sym::new(c_name("cuCtxCreate\0"));
}

unrecorded!(MEM_ALLOC_V1 = "cuMemAlloc", "cuMemAlloc" since 2000);
unrecorded!(MEM_ALLOC_PITCH_V1 = "cuMemAllocPitch", "cuMemAllocPitch" since 2000);
unrecorded!(MEM_FREE_V1 = "cuMemFree", "cuMemFree" since 2000);
unrecorded!(MEM_ALLOC_HOST_V1 = "cuMemAllocHost", "cuMemAllocHost" since 2000);
unrecorded!(MEM_GET_INFO_V1 = "cuMemGetInfo", "cuMemGetInfo" since 2000);
unrecorded!(CTX_CREATE_V1 = "cuCtxCreate", "cuCtxCreate" since 2000);

/// Every ABI the interposer knows: each [`hook!`] and [`unrecorded!`]
/// adds its entry where it is written, so a new hook is in the table by
/// being declared.
#[linkme::distributed_slice]
pub static ENTRIES: [&'static Entry];

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// This thread is inside a wrapper; dropped when it leaves.
pub struct Inside(());

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|inside| inside.set(false));
    }
}

/// Whether this thread is inside a wrapper (a signal handler that runs now
/// interrupted it, perhaps inside the driver: the exit path then calls
/// nothing of the driver's).
pub fn inside() -> bool {
    INSIDE.with(Cell::get)
}

/// Enter a wrapper, or `None` when this thread is inside one already (the
/// driver calling an exported function on its own): the inner call is
/// passed on unrecorded.
pub fn enter() -> Option<Inside> {
    INSIDE.with(|inside| {
        if inside.get() {
            None
        } else {
            inside.set(true);
            Some(Inside(()))
        }
    })
}

/// A set of 64-bit keys that answers "is this the first time?" without a
/// lock: a fixed table, probed linearly; a key that finds no free slot
/// within [`SEEN_PROBES`] is taken as seen (it is then not recorded again,
/// which costs a record, never a wrong answer to the program).
pub struct Seen<const SLOTS: usize> {
    slots: [AtomicU64; SLOTS],
}

/// Slots probed per key.
const SEEN_PROBES: usize = 16;

impl<const SLOTS: usize> Seen<SLOTS> {
    /// An empty set (`SLOTS` a power of two).
    pub const fn new() -> Self {
        assert!(SLOTS.is_power_of_two());
        Self {
            slots: [const { AtomicU64::new(0) }; SLOTS],
        }
    }

    /// Whether this is the first time `key` is asked about (exactly one
    /// caller gets `true`, however many threads ask at once).
    pub fn first(&self, key: u64) -> bool {
        // 0 marks an empty slot.
        let key = key.max(1);
        let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize;
        for probe in 0..SEEN_PROBES {
            let slot = &self.slots[(start + probe) & (SLOTS - 1)];
            // A plain load first: every later ask of a key only reads.
            match slot.load(Ordering::Acquire) {
                existing if existing == key => return false,
                0 => match slot.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return true,
                    Err(existing) if existing == key => return false,
                    Err(_) => {}
                },
                _ => {}
            }
        }
        false
    }
}

/// A key for a handle and a name (FNV-1a over both).
pub fn key_of(handle: u64, name: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in handle.to_le_bytes().iter().chain(name) {
        hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Functions launched at least once.
static LAUNCHED: Seen<{ 1 << 14 }> = Seen::new();

/// Whether this is the first launch of `handle` (exactly one caller gets
/// `true`, however many threads launch it at once).
pub fn first_launch(handle: u64) -> bool {
    handle != 0 && LAUNCHED.first(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_is_first_once_however_many_threads_ask() {
        static SET: Seen<{ 1 << 10 }> = Seen::new();
        let firsts: usize = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| (1..=200u64).filter(|&key| SET.first(key * 4096)).count()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        assert_eq!(firsts, 200);
        assert!(!SET.first(4096));
        assert!(SET.first(7));
    }

    #[test]
    fn a_full_table_answers_seen_rather_than_first_again() {
        static SMALL: Seen<16> = Seen::new();
        let firsts = (1..=40u64).filter(|&key| SMALL.first(key)).count();
        assert_eq!(firsts, 16);
        // Every slot is taken: a new key is taken as seen, an old one is.
        assert!(!SMALL.first(1000));
        assert!((1..=40u64).all(|key| !SMALL.first(key)));
        assert_ne!(key_of(1, b"f"), key_of(1, b"g"));
        assert_ne!(key_of(1, b"f"), key_of(2, b"f"));
    }
}

#[cfg(test)]
mod table_tests;
