//! Module and library loads, function lookups (where lazy loading loads
//! code), and launches: the first launch of each function reads its local
//! memory per thread and what the launch took.
//!
//! Lookups and launches are on the program's hot path (a runtime looks a
//! function up again, and launches it, at every call): only the first
//! lookup of a name in a module (of a kernel in a context) and the first
//! launch of a function are measured and recorded; every later one is a
//! lock-free check of a [`Seen`] set and the driver's call.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use trace::event::{Call, Event, LimitKind, Window};

use crate::driver::{CuResult, SUCCESS, read};
use crate::hooks::image::{self, Source};
use crate::hooks::{Seen, enter, first_launch, hook, key_of, real};
use crate::recorder::{self, Measure};

/// Run a call that may take device memory no allocation names (a load,
/// a driver object), recording free memory around it.
pub(super) fn measured(call: Call, run: impl FnOnce() -> CuResult) -> CuResult {
    let Some(_inside) = enter() else {
        return run();
    };
    let measure = Measure::start();
    let result = run();
    let window = measure.finish();
    recorder::measured(
        Event::Module {
            call,
            result,
            window,
        },
        call,
        None,
        result,
    );
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn module_load(
    real: Option<usize>,
    _caller: usize,
    module: *mut *mut c_void,
    path: *const c_char,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *const c_char));
    // SAFETY: the program's file name.
    unsafe { image::record(Call::ModuleLoad, Source::File(path)) };
    // SAFETY: the program's arguments.
    measured(Call::ModuleLoad, || unsafe { real(module, path) })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn module_load_data(
    real: Option<usize>,
    _caller: usize,
    module: *mut *mut c_void,
    image: *const c_void,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *const c_void));
    // SAFETY: the image the program hands the driver.
    unsafe { image::record(Call::ModuleLoadData, Source::Memory(image)) };
    // SAFETY: the program's arguments.
    measured(Call::ModuleLoadData, || unsafe { real(module, image) })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn module_load_data_ex(
    real: Option<usize>,
    _caller: usize,
    module: *mut *mut c_void,
    image: *const c_void,
    count: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CuResult {
    let real = real!(
        real,
        fn(*mut *mut c_void, *const c_void, c_uint, *mut c_int, *mut *mut c_void)
    );
    // SAFETY: the image the program hands the driver.
    unsafe { image::record(Call::ModuleLoadDataEx, Source::Memory(image)) };
    measured(Call::ModuleLoadDataEx, || {
        // SAFETY: the program's arguments.
        unsafe { real(module, image, count, options, values) }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn module_load_fat_binary(
    real: Option<usize>,
    _caller: usize,
    module: *mut *mut c_void,
    image: *const c_void,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *const c_void));
    // SAFETY: the image the program hands the driver.
    unsafe { image::record(Call::ModuleLoadFatBinary, Source::Memory(image)) };
    // SAFETY: the program's arguments.
    measured(Call::ModuleLoadFatBinary, || unsafe { real(module, image) })
}

type LibraryLoad = unsafe extern "C" fn(
    *mut *mut c_void,
    *const c_void,
    *mut c_int,
    *mut *mut c_void,
    c_uint,
    *mut c_int,
    *mut *mut c_void,
    c_uint,
) -> CuResult;

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
#[allow(clippy::too_many_arguments)]
unsafe fn library_load(
    call: Call,
    real: Option<usize>,
    library: *mut *mut c_void,
    code: *const c_void,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    jit_count: c_uint,
    library_options: *mut c_int,
    library_values: *mut *mut c_void,
    library_count: c_uint,
) -> CuResult {
    let Some(real) = real else {
        return crate::driver::ERROR_NOT_FOUND;
    };
    // SAFETY: both library loads share this ABI (the second argument is
    // the code or the file name).
    let real: LibraryLoad = unsafe { std::mem::transmute::<usize, LibraryLoad>(real) };
    let source = if call == Call::LibraryLoadFromFile {
        Source::File(code.cast())
    } else {
        Source::Memory(code)
    };
    // SAFETY: the program's image or file name, as the driver reads it.
    unsafe { image::record(call, source) };
    measured(call, || {
        // SAFETY: the program's arguments.
        unsafe {
            real(
                library,
                code,
                jit_options,
                jit_values,
                jit_count,
                library_options,
                library_values,
                library_count,
            )
        }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
#[allow(clippy::too_many_arguments)]
unsafe fn library_load_data(
    real: Option<usize>,
    _caller: usize,
    library: *mut *mut c_void,
    code: *const c_void,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    jit_count: c_uint,
    library_options: *mut c_int,
    library_values: *mut *mut c_void,
    library_count: c_uint,
) -> CuResult {
    // SAFETY: the program's arguments.
    unsafe {
        library_load(
            Call::LibraryLoadData,
            real,
            library,
            code,
            jit_options,
            jit_values,
            jit_count,
            library_options,
            library_values,
            library_count,
        )
    }
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
#[allow(clippy::too_many_arguments)]
unsafe fn library_load_from_file(
    real: Option<usize>,
    _caller: usize,
    library: *mut *mut c_void,
    path: *const c_char,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    jit_count: c_uint,
    library_options: *mut c_int,
    library_values: *mut *mut c_void,
    library_count: c_uint,
) -> CuResult {
    // SAFETY: the program's arguments.
    unsafe {
        library_load(
            Call::LibraryLoadFromFile,
            real,
            library,
            path.cast(),
            jit_options,
            jit_values,
            jit_count,
            library_options,
            library_values,
            library_count,
        )
    }
}

/// Lookups seen: (module or library, name) and (kernel, context).
static LOOKED_UP: Seen<{ 1 << 14 }> = Seen::new();

/// Whether this is the first lookup of `name` in `scope`.
///
/// # Safety
/// `name` is null or a C string.
unsafe fn first_lookup(scope: *mut c_void, name: *const c_char) -> bool {
    let name = if name.is_null() {
        &[][..]
    } else {
        // SAFETY: the program passed a C string.
        unsafe { CStr::from_ptr(name) }.to_bytes()
    };
    LOOKED_UP.first(key_of(scope as u64, name))
}

/// Remember the name a lookup gave the handle it wrote.
///
/// # Safety
/// `out` is null or where the driver wrote the handle; `name` is null or a
/// C string.
unsafe fn remember(result: CuResult, out: *mut *mut c_void, name: *const c_char, kernel: bool) {
    if result != SUCCESS || out.is_null() || name.is_null() {
        return;
    }
    // SAFETY: the driver wrote the handle; the program passed a C string.
    let (handle, name) = unsafe { (*out as u64, CStr::from_ptr(name)) };
    recorder::name_function(handle, name.to_string_lossy().into_owned(), kernel);
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn module_get_function(
    real: Option<usize>,
    _caller: usize,
    function: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *mut c_void, *const c_char));
    // SAFETY: the program's C string.
    if !unsafe { first_lookup(module, name) } {
        // SAFETY: the program's arguments.
        return unsafe { real(function, module, name) };
    }
    // SAFETY: the program's arguments.
    let result = measured(Call::ModuleGetFunction, || unsafe {
        real(function, module, name)
    });
    // SAFETY: as `remember` needs.
    unsafe { remember(result, function, name, false) };
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn library_get_kernel(
    real: Option<usize>,
    _caller: usize,
    kernel: *mut *mut c_void,
    library: *mut c_void,
    name: *const c_char,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *mut c_void, *const c_char));
    // SAFETY: the program's C string.
    if !unsafe { first_lookup(library, name) } {
        // SAFETY: the program's arguments.
        return unsafe { real(kernel, library, name) };
    }
    // SAFETY: the program's arguments.
    let result = measured(Call::LibraryGetKernel, || unsafe {
        real(kernel, library, name)
    });
    // SAFETY: as `remember` needs.
    unsafe { remember(result, kernel, name, true) };
    result
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn kernel_get_function(
    real: Option<usize>,
    _caller: usize,
    function: *mut *mut c_void,
    kernel: *mut c_void,
) -> CuResult {
    let real = real!(real, fn(*mut *mut c_void, *mut c_void));
    // A kernel's function is one per context: the context is the name.
    let context = read::current_context().unwrap_or(0);
    if !LOOKED_UP.first(key_of(kernel as u64, &context.to_le_bytes())) {
        // SAFETY: the program's arguments.
        return unsafe { real(function, kernel) };
    }
    // SAFETY: the program's arguments.
    let result = measured(Call::KernelGetFunction, || unsafe {
        real(function, kernel)
    });
    if result == SUCCESS && !function.is_null() {
        // SAFETY: the driver wrote the function.
        let function = unsafe { *function } as u64;
        recorder::alias_function(function, kernel as u64);
    }
    result
}

/// Functions (and kernels, per device) whose attributes were queried or
/// set, or that were loaded explicitly.
static USED: Seen<{ 1 << 14 }> = Seen::new();

/// Run a call that uses function `key` without launching it: lazy loading
/// loads the function's code at the first such call, so the first one per
/// function is measured and recorded; every later one is passed on.
fn used(call: Call, key: u64, run: impl FnOnce() -> CuResult) -> CuResult {
    if key == 0 || !USED.first(key) {
        return run();
    }
    measured(call, run)
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn func_get_attribute(
    real: Option<usize>,
    _caller: usize,
    value: *mut c_int,
    attribute: c_int,
    function: *mut c_void,
) -> CuResult {
    let real = real!(real, fn(*mut c_int, c_int, *mut c_void));
    used(Call::FuncGetAttribute, function as u64, || {
        // SAFETY: the program's arguments.
        unsafe { real(value, attribute, function) }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn func_set_attribute(
    real: Option<usize>,
    _caller: usize,
    function: *mut c_void,
    attribute: c_int,
    value: c_int,
) -> CuResult {
    let real = real!(real, fn(*mut c_void, c_int, c_int));
    used(Call::FuncSetAttribute, function as u64, || {
        // SAFETY: the program's arguments.
        unsafe { real(function, attribute, value) }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn kernel_get_attribute(
    real: Option<usize>,
    _caller: usize,
    value: *mut c_int,
    attribute: c_int,
    kernel: *mut c_void,
    device: c_int,
) -> CuResult {
    let real = real!(real, fn(*mut c_int, c_int, *mut c_void, c_int));
    let key = key_of(kernel as u64, &device.to_le_bytes());
    used(Call::KernelGetAttribute, key, || {
        // SAFETY: the program's arguments.
        unsafe { real(value, attribute, kernel, device) }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn kernel_set_attribute(
    real: Option<usize>,
    _caller: usize,
    attribute: c_int,
    value: c_int,
    kernel: *mut c_void,
    device: c_int,
) -> CuResult {
    let real = real!(real, fn(c_int, c_int, *mut c_void, c_int));
    let key = key_of(kernel as u64, &device.to_le_bytes());
    used(Call::KernelSetAttribute, key, || {
        // SAFETY: the program's arguments.
        unsafe { real(attribute, value, kernel, device) }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn func_load(real: Option<usize>, _caller: usize, function: *mut c_void) -> CuResult {
    let real = real!(real, fn(*mut c_void));
    used(Call::FuncLoad, function as u64, || {
        // SAFETY: the program's argument.
        unsafe { real(function) }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn occupancy(
    real: Option<usize>,
    _caller: usize,
    blocks: *mut c_int,
    function: *mut c_void,
    block_size: c_int,
    shared: usize,
) -> CuResult {
    let real = real!(real, fn(*mut c_int, *mut c_void, c_int, usize));
    used(
        Call::OccupancyMaxActiveBlocksPerMultiprocessor,
        function as u64,
        || {
            // SAFETY: the program's arguments.
            unsafe { real(blocks, function, block_size, shared) }
        },
    )
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn occupancy_with_flags(
    real: Option<usize>,
    _caller: usize,
    blocks: *mut c_int,
    function: *mut c_void,
    block_size: c_int,
    shared: usize,
    flags: c_uint,
) -> CuResult {
    let real = real!(real, fn(*mut c_int, *mut c_void, c_int, usize, c_uint));
    used(
        Call::OccupancyMaxActiveBlocksPerMultiprocessor,
        function as u64,
        || {
            // SAFETY: the program's arguments.
            unsafe { real(blocks, function, block_size, shared, flags) }
        },
    )
}

/// Launch `function` on `stream` with `launch`; its first launch reads its
/// local memory, the stack limit and free memory around it (but for a
/// launch captured into a graph, which runs nothing: its local memory
/// only).
fn launch_with(
    call: Call,
    function: *mut c_void,
    stream: *mut c_void,
    launch: impl FnOnce() -> CuResult,
) -> CuResult {
    crate::pool::work_queued();
    // Every launch after a function's first: one lock-free check.
    if !first_launch(function as u64) {
        return launch();
    }
    let Some(_inside) = enter() else {
        return launch();
    };
    let stack = LimitKind::Stack.to_cu();
    let (result, stack_before, stack_after, window) = if read::capturing(stream) {
        (launch(), None, None, Window::default())
    } else {
        let stack_before = read::limit(stack);
        let measure = Measure::start();
        let result = launch();
        let window = measure.finish();
        (result, stack_before, read::limit(stack), window)
    };
    // Read after the launch: with lazy loading, a query of a function not
    // loaded yet loads its code, which the window must see.
    let known = recorder::function_name(function as u64);
    let kernel = known.as_ref().is_some_and(|(_, kernel)| *kernel);
    let local_bytes = read::local_bytes(function, kernel);
    let name = known
        .map(|(name, _)| name)
        .or_else(|| read::function_name(function))
        .unwrap_or_else(|| format!("{:#x}", function as u64));
    recorder::measured(
        Event::Launch {
            call,
            handle: function as u64,
            local_bytes,
            stack_before,
            stack_after,
            window,
            result,
            name: name.as_str().into(),
        },
        call,
        None,
        result,
    );
    result
}

/// The stream of a `CUlaunchConfig` (after the grid, block and shared
/// memory sizes: seven 32-bit fields, padded to eight).
///
/// # Safety
/// `config` is null or a `CUlaunchConfig`.
unsafe fn config_stream(config: *const c_void) -> *mut c_void {
    if config.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the driver reads the same field of the program's config.
    unsafe { *config.cast::<u8>().add(32).cast::<*mut c_void>() }
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_kernel(
    real: Option<usize>,
    _caller: usize,
    function: *mut c_void,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    let real = real!(
        real,
        fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        )
    );
    launch_with(Call::LaunchKernel, function, stream, || {
        // SAFETY: the program's arguments.
        unsafe {
            real(
                function, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared, stream,
                params, extra,
            )
        }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
unsafe fn launch_kernel_ex(
    real: Option<usize>,
    _caller: usize,
    config: *const c_void,
    function: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    let real = real!(
        real,
        fn(*const c_void, *mut c_void, *mut *mut c_void, *mut *mut c_void)
    );
    // SAFETY: the program's config, which the driver reads too.
    let stream = unsafe { config_stream(config) };
    launch_with(Call::LaunchKernelEx, function, stream, || {
        // SAFETY: the program's arguments.
        unsafe { real(config, function, params, extra) }
    })
}

/// # Safety
///
/// A hook's body: `real` is the driver's function of this ABI (or `None`),
/// and the arguments are the program's, valid as the driver requires them.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_cooperative(
    real: Option<usize>,
    _caller: usize,
    function: *mut c_void,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
) -> CuResult {
    let real = real!(
        real,
        fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            *mut c_void,
            *mut *mut c_void,
        )
    );
    launch_with(Call::LaunchCooperativeKernel, function, stream, || {
        // SAFETY: the program's arguments.
        unsafe {
            real(
                function, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared, stream, params,
            )
        }
    })
}

hook!(plain cuModuleLoad = "cuModuleLoad" since 2000 ptsz false
    (module: *mut *mut c_void, path: *const c_char) => module_load);
hook!(plain cuModuleLoadData = "cuModuleLoadData" since 2000 ptsz false
    (module: *mut *mut c_void, image: *const c_void) => module_load_data);
hook!(plain cuModuleLoadDataEx = "cuModuleLoadDataEx" since 2010 ptsz false
    (module: *mut *mut c_void, image: *const c_void, count: c_uint, options: *mut c_int,
     values: *mut *mut c_void) => module_load_data_ex);
hook!(plain cuModuleLoadFatBinary = "cuModuleLoadFatBinary" since 2000 ptsz false
    (module: *mut *mut c_void, image: *const c_void) => module_load_fat_binary);
hook!(plain cuLibraryLoadData = "cuLibraryLoadData" since 12000 ptsz false
    (library: *mut *mut c_void, code: *const c_void, jit_options: *mut c_int,
     jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int,
     library_values: *mut *mut c_void, library_count: c_uint) => library_load_data);
hook!(plain cuLibraryLoadFromFile = "cuLibraryLoadFromFile" since 12000 ptsz false
    (library: *mut *mut c_void, path: *const c_char, jit_options: *mut c_int,
     jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int,
     library_values: *mut *mut c_void, library_count: c_uint) => library_load_from_file);
hook!(plain cuModuleGetFunction = "cuModuleGetFunction" since 2000 ptsz false
    (function: *mut *mut c_void, module: *mut c_void, name: *const c_char) => module_get_function);
hook!(plain cuLibraryGetKernel = "cuLibraryGetKernel" since 12000 ptsz false
    (kernel: *mut *mut c_void, library: *mut c_void, name: *const c_char) => library_get_kernel);
hook!(plain cuKernelGetFunction = "cuKernelGetFunction" since 12000 ptsz false
    (function: *mut *mut c_void, kernel: *mut c_void) => kernel_get_function);
hook!(plain cuLaunchKernel = "cuLaunchKernel" since 4000 ptsz false
    (function: *mut c_void, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
     block_y: c_uint, block_z: c_uint, shared: c_uint, stream: *mut c_void,
     params: *mut *mut c_void, extra: *mut *mut c_void) => launch_kernel);
hook!(plain cuLaunchKernel_ptsz = "cuLaunchKernel" since 7000 ptsz true
    (function: *mut c_void, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
     block_y: c_uint, block_z: c_uint, shared: c_uint, stream: *mut c_void,
     params: *mut *mut c_void, extra: *mut *mut c_void) => launch_kernel);
hook!(plain cuLaunchKernelEx = "cuLaunchKernelEx" since 11060 ptsz false
    (config: *const c_void, function: *mut c_void, params: *mut *mut c_void,
     extra: *mut *mut c_void) => launch_kernel_ex);
hook!(plain cuLaunchKernelEx_ptsz = "cuLaunchKernelEx" since 11060 ptsz true
    (config: *const c_void, function: *mut c_void, params: *mut *mut c_void,
     extra: *mut *mut c_void) => launch_kernel_ex);
hook!(plain cuLaunchCooperativeKernel = "cuLaunchCooperativeKernel" since 9000 ptsz false
    (function: *mut c_void, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
     block_y: c_uint, block_z: c_uint, shared: c_uint, stream: *mut c_void,
     params: *mut *mut c_void) => launch_cooperative);
hook!(plain cuLaunchCooperativeKernel_ptsz = "cuLaunchCooperativeKernel" since 9000 ptsz true
    (function: *mut c_void, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
     block_y: c_uint, block_z: c_uint, shared: c_uint, stream: *mut c_void,
     params: *mut *mut c_void) => launch_cooperative);
hook!(plain cuFuncGetAttribute = "cuFuncGetAttribute" since 2020 ptsz false
    (value: *mut c_int, attribute: c_int, function: *mut c_void) => func_get_attribute);
hook!(plain cuFuncSetAttribute = "cuFuncSetAttribute" since 9000 ptsz false
    (function: *mut c_void, attribute: c_int, value: c_int) => func_set_attribute);
hook!(plain cuKernelGetAttribute = "cuKernelGetAttribute" since 12000 ptsz false
    (value: *mut c_int, attribute: c_int, kernel: *mut c_void, device: c_int) => kernel_get_attribute);
hook!(plain cuKernelSetAttribute = "cuKernelSetAttribute" since 12000 ptsz false
    (attribute: c_int, value: c_int, kernel: *mut c_void, device: c_int) => kernel_set_attribute);
hook!(plain cuFuncLoad = "cuFuncLoad" since 12040 ptsz false
    (function: *mut c_void) => func_load);
hook!(plain cuOccupancyMaxActiveBlocksPerMultiprocessor = "cuOccupancyMaxActiveBlocksPerMultiprocessor"
    since 6050 ptsz false
    (blocks: *mut c_int, function: *mut c_void, block_size: c_int, shared: usize) => occupancy);
hook!(plain cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags =
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" since 7000 ptsz false
    (blocks: *mut c_int, function: *mut c_void, block_size: c_int, shared: usize, flags: c_uint)
    => occupancy_with_flags);
