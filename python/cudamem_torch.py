"""Run PyTorch on cudamem's pools: a native CUDA allocator backend.

    import cudamem_torch
    cudamem_torch.install()          # before the first CUDA tensor
    ...                              # the program, unchanged
    torch.cuda.memory_allocated()    # PyTorch's own figures, answered by cudamem
    print(cudamem_torch.stats())     # the pool's figures, a dict
    cudamem_torch.explain()          # where this process's GPU memory went

install() builds a small C++ extension (torch-alloc/cpp/, a
c10::cuda::CUDACachingAllocator::CUDAAllocator over libcudamem_torch.so) with
torch.utils.cpp_extension the first time (cached afterwards), and swaps PyTorch's
allocator for it. Building needs a C++ compiler, ninja, PyTorch's C++ headers (shipped
in the torch wheel) and the CUDA runtime headers (CUDA_HOME, e.g. /usr/local/cuda);
install() says which is missing.

Settings, read when a device is first used: CUDAMEM_POLICY (tlsf, the default, or
stitch), CUDAMEM_PEERS (the other GPUs that may read and write each pool's memory
directly: "all", or ordinals like "0,1"; unset: none), CUDAMEM_MIN_GROWTH (bytes the
TLSF pool maps at least at once, e.g. 2M, the default, or 64M: fewer driver calls, up to
one step more memory held) and CUDAMEM_GROWTH_DIVISOR.
"""

import ctypes
import hashlib
import os
import re
import shutil
import sys

__all__ = [
    "InterfaceMismatch",
    "header_virtuals",
    "source_overrides",
    "interface_defines",
    "build",
    "install",
    "installed",
    "stats",
    "empty_cache",
    "explain",
    "find_library",
    "extension_sources",
    "STATS_FIELDS",
]

LIBRARY_NAME = "libcudamem_torch.so"
EXTENSION_NAME = "cudamem_backend"
# The C++ backend's files in torch-alloc/cpp.
SOURCES = ("cudamem_allocator.cpp", "cudamem_ipc.cpp")
HEADERS = ("cudamem.h", "cudamem_ipc.h")

# The fields of struct cudamem_stats, in order (torch-alloc/src/allocator/mod.rs,
# AllocatorStats); all uint64_t.
STATS_FIELDS = (
    "live_bytes",
    "peak_live_bytes",
    "mapped_bytes",
    "peak_mapped_bytes",
    "pending_bytes",
    "largest_free_bytes",
    "memory_driver_calls",
    "event_calls",
    "allocations",
    "frees",
    "ooms",
    "errors",
    "peer_access_calls",
    "private_pool_bytes",
)


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in STATS_FIELDS]


_lib = None
_path = None
_extension = None


def _repo():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_library(path=None):
    """The library's absolute path: `path`, else $CUDAMEM_TORCH_LIB, else the first
    build in this repository's target folders (the CUDA build first, release before
    debug)."""
    candidates = []
    if path:
        candidates.append(path)
    elif os.environ.get("CUDAMEM_TORCH_LIB"):
        candidates.append(os.environ["CUDAMEM_TORCH_LIB"])
    else:
        for target in ("target/cuda", "target"):
            for profile in ("release", "debug"):
                candidates.append(os.path.join(_repo(), target, profile, LIBRARY_NAME))
    for candidate in candidates:
        if os.path.isdir(candidate):
            candidate = os.path.join(candidate, LIBRARY_NAME)
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    raise FileNotFoundError(
        "cudamem_torch: no %s at %s; build it with `CUDA_LIBRARY_PATH=$(cargo xtask stub) "
        "CARGO_TARGET_DIR=target/cuda cargo build --release -p cudamem-torch --features cuda` "
        "or pass its path" % (LIBRARY_NAME, ", ".join(candidates))
    )


def extension_sources(sources=None):
    """The C++ backend's folder: `sources`, else $CUDAMEM_TORCH_CPP, else this
    repository's torch-alloc/cpp (or cpp/ beside this file, in a bundle)."""
    candidates = [sources, os.environ.get("CUDAMEM_TORCH_CPP")]
    candidates += [
        os.path.join(_repo(), "torch-alloc", "cpp"),
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp"),
    ]
    for candidate in candidates:
        if candidate and all(os.path.isfile(os.path.join(candidate, f)) for f in SOURCES + HEADERS):
            return os.path.realpath(candidate)
    raise FileNotFoundError(
        "cudamem_torch: the C++ backend's sources (%s) are not at %s"
        % (", ".join(SOURCES + HEADERS), ", ".join(c for c in candidates if c))
    )


def _load(path):
    global _lib, _path
    if _lib is not None:
        if path != _path:
            raise RuntimeError(
                "cudamem_torch: %s is loaded already; cannot switch to %s" % (_path, path)
            )
        return _lib
    # The same path as the extension's dependency, so both see one library and one pool.
    lib = ctypes.CDLL(path)
    lib.cudamem_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
    lib.cudamem_stats.restype = ctypes.c_int
    lib.cudamem_stats_fields.argtypes = []
    lib.cudamem_stats_fields.restype = ctypes.c_size_t
    lib.cudamem_empty_cache.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
    lib.cudamem_empty_cache.restype = ctypes.c_int
    lib.cudamem_explain.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.cudamem_explain.restype = ctypes.c_ssize_t
    lib.cudamem_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.cudamem_last_error.restype = ctypes.c_ssize_t
    fields = lib.cudamem_stats_fields()
    if fields != len(STATS_FIELDS):
        raise RuntimeError(
            "cudamem_torch: %s has %d stats fields, this module knows %d; "
            "use the python/cudamem_torch.py of the same checkout" % (path, fields, len(STATS_FIELDS))
        )
    _lib, _path = lib, path
    return lib


# --- The allocator interface: PyTorch's virtuals against the backend's overrides ------
#
# Pure text work (no torch import), so CPU CI tests it (python/test_cudamem_torch.py).


class InterfaceMismatch(RuntimeError):
    """The installed PyTorch's CUDAAllocator declares virtuals the backend does not
    override: building it would leave PyTorch's defaults, which throw, in place."""

    def __init__(self, missing, header):
        self.missing = sorted(missing)
        self.header = header
        super().__init__(
            "cudamem_torch: this PyTorch's allocator interface (%s) declares %s, which "
            "cudamem's backend (torch-alloc/cpp/cudamem_allocator.cpp) does not override; "
            "refusing to install it (the program keeps PyTorch's allocator). Use a PyTorch "
            "whose interface the backend covers, or add the overrides."
            % (header, ", ".join(self.missing))
        )


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _class_body(text, class_name):
    """The text between the braces of `class NAME ... {`, or None."""
    match = re.search(r"\b(?:class|struct)\s+(?:\w+\s+)?%s\b[^;{]*\{" % re.escape(class_name), text)
    if match is None:
        return None
    depth, start = 1, match.end()
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def _parameters(text, open_at):
    """The parameter count of the call whose '(' is at `open_at` (commas at depth 1,
    templates counted as nesting)."""
    depth, angle, count, seen = 0, 0, 0, False
    for ch in text[open_at:]:
        if ch == "(":
            depth += 1
            if depth == 1:
                continue
        elif ch == ")":
            depth -= 1
            if depth == 0:
                break
        elif ch == "<":
            angle += 1
        elif ch == ">":
            angle = max(0, angle - 1)
        elif ch == "," and depth == 1 and angle == 0:
            count += 1
        if depth >= 1 and not ch.isspace():
            seen = True
    return count + 1 if seen else 0


def header_virtuals(header_text, class_name="CUDAAllocator"):
    """The virtual member functions `class_name` declares in `header_text`: a dict from
    each name to its parameter count (the largest, for an overloaded name). Destructors
    are left out; so are functions the class itself implements with `override`."""
    body = _class_body(_strip_comments(header_text), class_name)
    if body is None:
        raise ValueError("no class %s in the header" % class_name)
    found = {}
    for match in re.finditer(r"\bvirtual\b([^;{(]*?)\b(~?\w+)\s*\(", body):
        name = match.group(2)
        if name.startswith("~") or body[match.start(2) - 1] == "~":
            continue
        found[name] = max(found.get(name, 0), _parameters(body, match.end() - 1))
    return found


def source_overrides(source_text):
    """The member functions the C++ source marks `override` (or `final`)."""
    text = _strip_comments(source_text)
    names = set()
    for match in re.finditer(r"\b(\w+)\s*\(", text):
        depth, i = 0, match.end() - 1
        while i < len(text):
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        tail = re.match(r"\s*(?:const\s*)?(?:noexcept\s*)?(override|final)\b", text[i + 1:])
        if tail:
            names.add(match.group(1))
    return names


def interface_defines(header_text, source_text, header="CUDACachingAllocator.h"):
    """The compiler flags that tell the backend which virtuals the header declares
    (`-DCUDAMEM_HAS_<name>=<parameter count>`); raises InterfaceMismatch naming every
    virtual the source does not override."""
    virtuals = header_virtuals(header_text)
    missing = set(virtuals) - source_overrides(source_text)
    if missing:
        raise InterfaceMismatch(missing, header)
    return ["-DCUDAMEM_HAS_%s=%d" % (name, count) for name, count in sorted(virtuals.items())]


def _missing_build_tools(cpp_extension):
    """What the extension's build lacks, as sentences (empty when nothing is missing)."""
    import torch

    missing = []
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None and shutil.which("g++") is None:
        missing.append("a C++ compiler (no %s or g++ on PATH; install g++ or set CXX)" % compiler)
    if not cpp_extension.is_ninja_available():
        missing.append("ninja (pip install ninja)")
    header = os.path.join(
        os.path.dirname(torch.__file__), "include", "c10", "cuda", "CUDACachingAllocator.h"
    )
    if not os.path.isfile(header):
        missing.append("PyTorch's C++ headers (%s is missing)" % header)
    cuda_home = cpp_extension.CUDA_HOME
    if not cuda_home or not os.path.isfile(os.path.join(cuda_home, "include", "cuda_runtime_api.h")):
        missing.append(
            "the CUDA runtime headers (set CUDA_HOME to a CUDA toolkit with "
            "include/cuda_runtime_api.h; now %r)" % cuda_home
        )
    return missing


def _build(lib_path, sources, verbose):
    """Builds (or loads the cached build of) the C++ backend, linked to `lib_path`."""
    from torch.utils import cpp_extension

    missing = _missing_build_tools(cpp_extension)
    if missing:
        raise RuntimeError(
            "cudamem_torch: cannot build the PyTorch backend; missing: " + "; ".join(missing)
        )
    cpp = [os.path.join(sources, name) for name in SOURCES]
    import torch

    header = os.path.join(
        os.path.dirname(torch.__file__), "include", "c10", "cuda", "CUDACachingAllocator.h"
    )
    with open(header) as f:
        header_text = f.read()
    with open(os.path.join(sources, SOURCES[0])) as f:
        source_text = f.read()
    defines = interface_defines(header_text, source_text, header)
    digest = hashlib.sha256()
    for name in HEADERS:
        with open(os.path.join(sources, name), "rb") as header:
            digest.update(header.read())
    abi = digest.hexdigest()[:16]
    lib_dir = os.path.dirname(lib_path)
    return cpp_extension.load(
        name=EXTENSION_NAME,
        sources=cpp,
        extra_include_paths=[sources],
        # The headers' hash: a changed C ABI rebuilds the cached extension.
        extra_cflags=["-O2", "-DCUDAMEM_ABI=0x%s" % abi] + defines,
        extra_ldflags=["-L" + lib_dir, "-lcudamem_torch", "-Wl,-rpath," + lib_dir],
        with_cuda=True,
        verbose=verbose,
    )


def build(path=None, sources=None, verbose=False):
    """Builds the C++ backend (or finds its cached build) without installing it;
    returns the extension module. install() does this itself; calling it first only
    moves the build's minute out of the program."""
    path = find_library(path)
    _load(path)
    return _build(path, extension_sources(sources), verbose)


def install(path=None, sources=None, verbose=False):
    """Make PyTorch allocate CUDA memory through cudamem. Call it before the first CUDA
    tensor (PyTorch refuses to swap an allocator it has used). Builds the C++ backend
    the first time (see the module's docs for what that needs). Returns the library
    path."""
    global _extension
    import torch

    path = find_library(path)
    if _extension is not None:
        return path
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "cudamem_torch: install() must run before the first CUDA tensor "
            "(CUDA is initialized already)"
        )
    extension = build(path, sources, verbose)
    extension.install()
    _extension = extension
    return path


def installed():
    """Whether PyTorch allocates through cudamem in this process."""
    return _extension is not None and bool(_extension.installed())


def _library():
    if _lib is None:
        raise RuntimeError("cudamem_torch: call install() first")
    return _lib


def _last_error(lib):
    buf = ctypes.create_string_buffer(1 << 16)
    lib.cudamem_last_error(buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def stats(device=0):
    """The pool's figures on `device` as a dict (bytes and counts)."""
    lib = _library()
    out = _Stats()
    if lib.cudamem_stats(int(device), ctypes.byref(out)) != 0:
        raise RuntimeError("cudamem_torch: no stats for device %d: %s" % (device, _last_error(lib)))
    return {name: int(getattr(out, name)) for name in STATS_FIELDS}


def empty_cache():
    """Every device waits for its freed blocks and gives back what its pool can (what
    torch.cuda.empty_cache() does too); returns the mapped bytes given back."""
    lib = _library()
    given_back = ctypes.c_uint64(0)
    if lib.cudamem_empty_cache(-1, ctypes.byref(given_back)) != 0:
        raise RuntimeError("cudamem_torch: empty_cache failed: %s" % _last_error(lib))
    return int(given_back.value)


def explain(device=0, file=None):
    """Print (and return) the ledger of this process's context on `device`: total,
    driver and context, local memory from the current stack limit, malloc heap and
    printf FIFO, what the pool holds, and what the process holds outside it."""
    lib = _library()
    size = 1 << 14
    while True:
        buf = ctypes.create_string_buffer(size)
        n = lib.cudamem_explain(int(device), buf, size)
        if n < 0:
            raise RuntimeError(
                "cudamem_torch: explain failed for device %d: %s" % (device, _last_error(lib))
            )
        if n < size:
            text = buf.value.decode("utf-8", "replace")
            print(text, file=file or sys.stdout, end="")
            return text
        size = n + 1
