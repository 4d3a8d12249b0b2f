"""Pause and resume this process's device memory from Python, with any
framework, when the process runs under ``cudamem run --pool``.

The interposer ``cudamem run`` preloads exports a C ABI (``cudamem_pause``,
``cudamem_resume``, ``cudamem_ledger``); this module calls it through ctypes.
A pause waits until the device's work is done, holds every other thread of
the process at its next CUDA call, copies the live bytes to pinned host
memory and gives the device memory back, keeping every address reserved; a
resume maps it back at the same addresses and lets the threads go on.

Between ``pause()`` and ``resume()`` the pausing thread must make no CUDA
call (it would wait for the resume for ever): free no tensor, touch no
array. ``with paused(): ...`` runs a block of host-only work in between.

From outside the process, ``cudamem pause PID`` and ``cudamem resume PID``
do the same.
"""

import contextlib
import ctypes
import sys

__all__ = ["PauseError", "available", "pause", "resume", "ledger", "paused"]

# The C ABI's statuses.
_STATUS = {
    1: "no-pool",
    2: "already-paused",
    3: "not-paused",
    4: "no-room",
    5: "busy",
    6: "failed",
    7: "bad-request",
}


class PauseError(RuntimeError):
    """A pause or resume that did not happen; ``kind`` says why
    (``no-pool``, ``already-paused``, ``not-paused``, ``no-room``, ``busy``,
    ``failed``, ``bad-request``, ``unavailable``). After ``no-room`` the
    process is still paused: resume again once memory is free."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _library():
    process = ctypes.CDLL(None)
    try:
        pause_fn = process.cudamem_pause
        resume_fn = process.cudamem_resume
        ledger_fn = process.cudamem_ledger
    except AttributeError:
        return None
    pause_fn.argtypes = [ctypes.c_char_p]
    pause_fn.restype = ctypes.c_int
    resume_fn.argtypes = []
    resume_fn.restype = ctypes.c_int
    ledger_fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
    ledger_fn.restype = ctypes.c_size_t
    return pause_fn, resume_fn, ledger_fn


_LIB = _library()


def available():
    """Whether this process runs under ``cudamem run`` (the C ABI is there)."""
    return _LIB is not None


def _need():
    if _LIB is None:
        raise PauseError(
            "unavailable",
            "this process does not run under `cudamem run --pool` "
            "(no cudamem_pause in the process)",
        )
    return _LIB


def _text(which):
    _, _, ledger_fn = _need()
    size = ledger_fn(None, 0, which) + 1
    buf = ctypes.create_string_buffer(size)
    ledger_fn(buf, size, which)
    return buf.value.decode("utf-8", "replace")


def _check(status):
    text = _text(0)
    if status != 0:
        raise PauseError(_STATUS.get(status, "failed"), text.strip())
    return text


def _release_framework_caches():
    """Hand cached free blocks back before a pause, where a framework in
    this process keeps them, so that they are released rather than copied."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()


def pause(discard_all=False, release_caches=True):
    """Pause; returns the report (free memory before and after, and the
    residency ledger). ``discard_all`` drops every block's contents instead
    of copying them (they read as undefined after resume)."""
    pause_fn, _, _ = _need()
    if release_caches:
        _release_framework_caches()
    options = b"discard=all" if discard_all else None
    return _check(pause_fn(options))


def resume():
    """Resume; returns the report. Raises ``PauseError`` with kind
    ``no-room`` (still paused) when the device has no room."""
    _, resume_fn, _ = _need()
    return _check(resume_fn())


def ledger():
    """The residency ledger now: what the process holds on the device, and
    why each byte stays."""
    return _text(1)


@contextlib.contextmanager
def paused(discard_all=False, release_caches=True):
    """``with paused(): ...``: paused for the block (which must make no CUDA
    call), resumed after it."""
    report = pause(discard_all=discard_all, release_caches=release_caches)
    try:
        yield report
    finally:
        resume()
