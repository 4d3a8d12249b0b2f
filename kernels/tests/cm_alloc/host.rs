//! `cuda/cm_alloc.cuh` compiled for the host (`emulation/cm_on_host.cpp`, a
//! shared object built with `$CXX`, else `c++`, the first time a test needs
//! it) and its C ABI: [`Warp`]s of 32 lanes, each a host thread, that call
//! `cm_heap_malloc` / `cm_heap_free` together on a [`Heap`]. The only
//! `unsafe` of these tests: loading the object and calling into it.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::process::Command;
use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::heap::Heap;

/// Lanes in a warp.
pub const LANES: usize = 32;

type WarpNew = unsafe extern "C" fn() -> *mut c_void;
type WarpDrop = unsafe extern "C" fn(*mut c_void);
type Malloc =
    unsafe extern "C" fn(*mut c_void, *mut c_void, u32, u32, u32, *const u64, *mut u64) -> c_int;
type Free = unsafe extern "C" fn(*mut c_void, *mut c_void, u32, u32, u32, *const u64) -> c_int;
type DescriptorBytes = unsafe extern "C" fn() -> u64;

/// The loaded object's functions.
struct Library {
    warp_new: WarpNew,
    warp_drop: WarpDrop,
    malloc: Malloc,
    free: Free,
    descriptor_bytes: DescriptorBytes,
}

const RTLD_NOW: c_int = 2;

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}

fn dl_error() -> String {
    // SAFETY: dlerror takes no arguments; it returns NULL or a NUL-terminated
    // string that stays valid until the next dl* call on this thread, and it
    // is copied out before any.
    let text = unsafe { dlerror() };
    if text.is_null() {
        return "no error text".to_string();
    }
    // SAFETY: non-NULL, so a NUL-terminated string (see above).
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// Flags added to the host build from `KERNELS_HOST_CXXFLAGS` (split at
/// spaces), for instance a sanitizer.
fn extra_flags() -> Vec<String> {
    std::env::var("KERNELS_HOST_CXXFLAGS")
        .map(|flags| flags.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Compiles the object into a fresh folder, loads it and removes the folder
/// (the loaded mapping outlives the file).
fn load() -> Library {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emulation/cm_on_host.cpp");
    let dir = std::env::temp_dir().join(format!("kernels-cm-alloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let object = dir.join("libcm_on_host.so");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let build = Command::new(&compiler)
        .args([
            "-std=c++20",
            "-O2",
            "-pthread",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wno-unknown-pragmas",
            "-Werror",
            // Undefined behaviour in the allocator (a shift by 64, an
            // overflow) stops the test with its line.
            "-fsanitize=undefined",
            "-fno-sanitize-recover=undefined",
            "-o",
        ])
        .arg(&object)
        .arg(&source)
        .args(extra_flags())
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler `{compiler}`: {e}"));
    assert!(
        build.status.success(),
        "compiling cm_alloc.cuh as host C++ failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let path = CString::new(object.to_str().unwrap()).unwrap();
    // SAFETY: `path` is a NUL-terminated file name; the object's
    // initializers only construct the C++ runtime's statics.
    let handle = unsafe { dlopen(path.as_ptr(), RTLD_NOW) };
    assert!(
        !handle.is_null(),
        "dlopen {}: {}",
        object.display(),
        dl_error()
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let symbol = |name: &str| {
        let name = CString::new(name).unwrap();
        // SAFETY: `handle` is a live handle from dlopen (never closed) and
        // `name` a NUL-terminated symbol name.
        let found = unsafe { dlsym(handle, name.as_ptr()) };
        assert!(!found.is_null(), "dlsym {name:?}: {}", dl_error());
        found
    };
    // SAFETY: each symbol is the extern "C" function of cm_on_host.cpp with
    // that name, whose C signature the type beside it restates.
    unsafe {
        Library {
            warp_new: std::mem::transmute::<*mut c_void, WarpNew>(symbol("cm_host_warp_new")),
            warp_drop: std::mem::transmute::<*mut c_void, WarpDrop>(symbol("cm_host_warp_drop")),
            malloc: std::mem::transmute::<*mut c_void, Malloc>(symbol("cm_host_malloc")),
            free: std::mem::transmute::<*mut c_void, Free>(symbol("cm_host_free")),
            descriptor_bytes: std::mem::transmute::<*mut c_void, DescriptorBytes>(symbol(
                "cm_host_descriptor_bytes",
            )),
        }
    }
}

fn library() -> &'static Library {
    static LIBRARY: OnceLock<Library> = OnceLock::new();
    LIBRARY.get_or_init(load)
}

/// `sizeof(CmHeap)` as the host compiler lays it out.
pub fn descriptor_bytes() -> u64 {
    // SAFETY: the function takes nothing and returns a constant.
    unsafe { (library().descriptor_bytes)() }
}

/// A warp: 32 lanes, each a host thread, idle between steps.
pub struct Warp {
    raw: NonNull<c_void>,
    /// The warp's slot, which picks the active chunks its leaders look at
    /// first (`%smid * 64 + %warpid` on the device).
    pub slot: u32,
    /// Yields a lane takes wherever it holds a chunk that no map shows: 0
    /// normally; a test raises it to widen the windows that thousands of
    /// warps hit on the device and a few threads rarely do.
    pub transit_yields: u32,
}

impl Warp {
    pub fn new(slot: u32) -> Self {
        // SAFETY: the function takes nothing; it returns a new warp or NULL.
        let raw = unsafe { (library().warp_new)() };
        Self {
            raw: NonNull::new(raw).expect("the warp's lane threads did not start"),
            slot,
            transit_yields: 0,
        }
    }

    /// One step: every lane `l` in `lanes` calls `cm_heap_malloc(heap,
    /// bytes[l])` at once; what each got (0 for NULL and for lanes not in
    /// `lanes`).
    pub fn malloc(&self, heap: &Heap, lanes: u32, bytes: &[u64; LANES]) -> [u64; LANES] {
        let mut out = [0u64; LANES];
        // SAFETY: `self.raw` is a live warp, used by one step at a time (the
        // call returns when the step is over, and `&self` is not Sync).
        // `heap.descriptor()` points at a CmHeap laid out by kernels::cm_heap
        // whose regions live as long as `heap`, which outlives the call, and
        // which the lanes change only through atomics, as the Rust side
        // reads it. `bytes` and `out` hold the 32 entries the function reads
        // and writes.
        let failed = unsafe {
            (library().malloc)(
                self.raw.as_ptr(),
                heap.descriptor(),
                self.slot,
                self.transit_yields,
                lanes,
                bytes.as_ptr(),
                out.as_mut_ptr(),
            )
        };
        assert_eq!(failed, 0, "the host could not run the warp's step");
        out
    }

    /// One step: every lane `l` in `lanes` calls `cm_heap_free(heap,
    /// ptrs[l])` at once.
    pub fn free(&self, heap: &Heap, lanes: u32, ptrs: &[u64; LANES]) {
        // SAFETY: as in `malloc`; `ptrs` holds the 32 entries the function reads.
        let failed = unsafe {
            (library().free)(
                self.raw.as_ptr(),
                heap.descriptor(),
                self.slot,
                self.transit_yields,
                lanes,
                ptrs.as_ptr(),
            )
        };
        assert_eq!(failed, 0, "the host could not run the warp's step");
    }
}

impl Drop for Warp {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from warp_new, no step runs (steps end
        // before `malloc`/`free` return), and it is not used again.
        unsafe { (library().warp_drop)(self.raw.as_ptr()) }
    }
}
