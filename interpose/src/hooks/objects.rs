//! Streams, events, executable graphs and memory pools: the driver takes
//! device memory of its own for some of them, which no allocation call
//! names. The first calls of each kind are measured by free memory around
//! them (two readings each): every stream a program makes (programs make
//! tens to hundreds, and the driver takes memory for many of them), the
//! first events, graphs and pools (each kind has its bound), and a graph's
//! first upload and first launch; every later call is one counter or set
//! probe and the driver's call.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use trace::event::Call;

use crate::driver::CuResult;
use crate::hooks::module::measured;
use crate::hooks::{Seen, hook, real};

/// Calls of one kind measured so far, and how many may be.
struct Measured {
    calls: AtomicU32,
    most: u32,
}

static STREAMS: Measured = Measured::up_to(1 << 16);
static EVENTS: Measured = Measured::up_to(64);
static GRAPHS: Measured = Measured::up_to(1 << 12);
static POOLS: Measured = Measured::up_to(256);

/// Executable graphs uploaded, and launched, at least once.
static UPLOADED: Seen<{ 1 << 13 }> = Seen::new();
static GRAPH_LAUNCHED: Seen<{ 1 << 13 }> = Seen::new();

impl Measured {
    const fn up_to(most: u32) -> Self {
        Self {
            calls: AtomicU32::new(0),
            most,
        }
    }
}

/// Whether this call of a kind counted by `kind` is within its bound.
fn among_first(kind: &Measured) -> bool {
    kind.calls.load(Ordering::Relaxed) < kind.most
        && kind.calls.fetch_add(1, Ordering::Relaxed) < kind.most
}

/// Run `run`, measured when `measure` says so.
fn object_call(call: Call, measure: bool, run: impl FnOnce() -> CuResult) -> CuResult {
    if measure { measured(call, run) } else { run() }
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn stream_create(
    real: Option<usize>,
    _caller: usize,
    stream: *mut *mut c_void,
    flags: c_uint,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, c_uint));
    // SAFETY: the program's arguments.
    object_call(Call::StreamCreate, among_first(&STREAMS), || unsafe {
        real(stream, flags)
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn stream_create_with_priority(
    real: Option<usize>,
    _caller: usize,
    stream: *mut *mut c_void,
    flags: c_uint,
    priority: c_int,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, c_uint, c_int));
    object_call(
        Call::StreamCreateWithPriority,
        among_first(&STREAMS),
        // SAFETY: the program's arguments.
        || unsafe { real(stream, flags, priority) },
    )
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn event_create(
    real: Option<usize>,
    _caller: usize,
    event: *mut *mut c_void,
    flags: c_uint,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, c_uint));
    // SAFETY: the program's arguments.
    object_call(Call::EventCreate, among_first(&EVENTS), || unsafe {
        real(event, flags)
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn graph_instantiate_with_flags(
    real: Option<usize>,
    _caller: usize,
    exec: *mut *mut c_void,
    graph: *mut c_void,
    flags: u64,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *mut c_void, u64));
    object_call(
        Call::GraphInstantiateWithFlags,
        among_first(&GRAPHS),
        // SAFETY: the program's arguments.
        || unsafe { real(exec, graph, flags) },
    )
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn graph_instantiate_with_params(
    real: Option<usize>,
    _caller: usize,
    exec: *mut *mut c_void,
    graph: *mut c_void,
    params: *mut c_void,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *mut c_void, *mut c_void));
    object_call(
        Call::GraphInstantiateWithParams,
        among_first(&GRAPHS),
        // SAFETY: the program's arguments.
        || unsafe { real(exec, graph, params) },
    )
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn graph_upload(
    real: Option<usize>,
    _caller: usize,
    exec: *mut c_void,
    stream: *mut c_void,
) -> CuResult {
    crate::pool::work_queued();
    let real = real!(real, fn(*mut c_void, *mut c_void));
    let first = !exec.is_null() && UPLOADED.first(exec as u64);
    // SAFETY: the program's arguments.
    object_call(Call::GraphUpload, first, || unsafe { real(exec, stream) })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn graph_launch(
    real: Option<usize>,
    _caller: usize,
    exec: *mut c_void,
    stream: *mut c_void,
) -> CuResult {
    let real = real!(real, fn(*mut c_void, *mut c_void));
    let first = !exec.is_null() && GRAPH_LAUNCHED.first(exec as u64);
    // SAFETY: the program's arguments.
    object_call(Call::GraphLaunch, first, || unsafe { real(exec, stream) })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn mem_pool_create(
    real: Option<usize>,
    _caller: usize,
    pool: *mut *mut c_void,
    props: *const c_void,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *const c_void));
    // SAFETY: the program's arguments.
    object_call(Call::MemPoolCreate, among_first(&POOLS), || unsafe {
        real(pool, props)
    })
}

hook!(plain cuStreamCreate = "cuStreamCreate" since 2000 ptsz false
    (stream: *mut *mut c_void, flags: c_uint) => stream_create);
hook!(plain cuStreamCreateWithPriority = "cuStreamCreateWithPriority" since 5050 ptsz false
    (stream: *mut *mut c_void, flags: c_uint, priority: c_int) => stream_create_with_priority);
hook!(plain cuEventCreate = "cuEventCreate" since 2000 ptsz false
    (event: *mut *mut c_void, flags: c_uint) => event_create);
hook!(plain cuGraphInstantiateWithFlags = "cuGraphInstantiateWithFlags" since 11040 ptsz false
    (exec: *mut *mut c_void, graph: *mut c_void, flags: u64) => graph_instantiate_with_flags);
hook!(plain cuGraphInstantiateWithParams = "cuGraphInstantiateWithParams" since 12000 ptsz false
    (exec: *mut *mut c_void, graph: *mut c_void, params: *mut c_void) => graph_instantiate_with_params);
hook!(plain cuGraphUpload = "cuGraphUpload" since 11010 ptsz false
    (exec: *mut c_void, stream: *mut c_void) => graph_upload);
hook!(plain cuGraphUpload_ptsz = "cuGraphUpload" since 11010 ptsz true
    (exec: *mut c_void, stream: *mut c_void) => graph_upload);
hook!(plain cuGraphLaunch = "cuGraphLaunch" since 10000 ptsz false
    (exec: *mut c_void, stream: *mut c_void) => graph_launch);
hook!(plain cuGraphLaunch_ptsz = "cuGraphLaunch" since 10000 ptsz true
    (exec: *mut c_void, stream: *mut c_void) => graph_launch);
hook!(plain cuMemPoolCreate = "cuMemPoolCreate" since 11020 ptsz false
    (pool: *mut *mut c_void, props: *const c_void) => mem_pool_create);
