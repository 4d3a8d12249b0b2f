"""Run PyTorch on cudamem's pool: load libcudamem_torch.so (built by cargo) with ctypes.

    import cudamem_torch
    cudamem_torch.install()          # before the first CUDA tensor
    ...                              # the program, unchanged
    print(cudamem_torch.stats())     # the pool's figures, a dict
    cudamem_torch.explain()          # where this process's GPU memory went

Settings, read when a device is first used: CUDAMEM_POLICY (tlsf, the default),
CUDAMEM_PEERS (the other GPUs that may read and write each pool's memory directly:
"all", or ordinals like "0,1"; unset: none) and
CUDAMEM_MIN_GROWTH (bytes the pool maps at least at once, e.g. 2M, the default, or 64M:
fewer driver calls, up to one step more memory held).
"""

import ctypes
import os
import sys

__all__ = ["install", "stats", "empty_cache", "explain", "find_library", "STATS_FIELDS"]

LIBRARY_NAME = "libcudamem_torch.so"

# The fields of struct cudamem_stats, in order (torch-alloc/src/allocator.rs,
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
)


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in STATS_FIELDS]


_lib = None
_path = None


def find_library(path=None):
    """The library's absolute path: `path`, else $CUDAMEM_TORCH_LIB, else the first
    build in this repository's target folders (release before debug)."""
    candidates = []
    if path:
        candidates.append(path)
    elif os.environ.get("CUDAMEM_TORCH_LIB"):
        candidates.append(os.environ["CUDAMEM_TORCH_LIB"])
    else:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for target in ("target/cuda", "target"):
            for profile in ("release", "debug"):
                candidates.append(os.path.join(repo, target, profile, LIBRARY_NAME))
    for candidate in candidates:
        if os.path.isdir(candidate):
            candidate = os.path.join(candidate, LIBRARY_NAME)
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    raise FileNotFoundError(
        "cudamem_torch: no %s at %s; build it with "
        "`cargo build --release -p cudamem-torch --features cuda` or pass its path"
        % (LIBRARY_NAME, ", ".join(candidates))
    )


def _load(path):
    global _lib, _path
    if _lib is not None:
        if path != _path:
            raise RuntimeError(
                "cudamem_torch: %s is loaded already; cannot switch to %s" % (_path, path)
            )
        return _lib
    # The same path as PyTorch's dlopen, so both see one library and one pool.
    lib = ctypes.CDLL(path)
    lib.cudamem_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
    lib.cudamem_stats.restype = ctypes.c_int
    lib.cudamem_stats_fields.argtypes = []
    lib.cudamem_stats_fields.restype = ctypes.c_size_t
    lib.cudamem_empty_cache.argtypes = []
    lib.cudamem_empty_cache.restype = None
    lib.cudamem_explain.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.cudamem_explain.restype = ctypes.c_ssize_t
    fields = lib.cudamem_stats_fields()
    if fields != len(STATS_FIELDS):
        raise RuntimeError(
            "cudamem_torch: %s has %d stats fields, this module knows %d; "
            "use the python/cudamem_torch.py of the same checkout" % (path, fields, len(STATS_FIELDS))
        )
    _lib, _path = lib, path
    return lib


def install(path=None):
    """Make PyTorch allocate CUDA memory through cudamem. Call it before the first CUDA
    tensor (PyTorch refuses to swap an allocator it has used). Returns the library path."""
    import torch

    path = find_library(path)
    _load(path)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "cudamem_malloc", "cudamem_free")
    torch.cuda.memory.change_current_allocator(allocator)
    return path


def _library():
    if _lib is None:
        raise RuntimeError("cudamem_torch: call install() first")
    return _lib


def stats(device=0):
    """The pool's figures on `device` as a dict (bytes and counts)."""
    out = _Stats()
    if _library().cudamem_stats(int(device), ctypes.byref(out)) != 0:
        raise RuntimeError("cudamem_torch: no stats for device %d (see stderr)" % device)
    return {name: int(getattr(out, name)) for name in STATS_FIELDS}


def empty_cache():
    """Every device waits for its pending frees and gives free pages at the top back."""
    _library().cudamem_empty_cache()


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
            raise RuntimeError("cudamem_torch: explain failed for device %d (see stderr)" % device)
        if n < size:
            text = buf.value.decode("utf-8", "replace")
            print(text, file=file or sys.stdout, end="")
            return text
        size = n + 1
