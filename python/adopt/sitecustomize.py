"""cudamem's zero-code adoption for PyTorch: `cudamem run --torch POLICY -- python ...`
puts this folder first on PYTHONPATH, so Python runs this file at start. When the
program imports torch, cudamem's backend is installed right after (before any CUDA
call the program can make); the program itself is unchanged.

It acts only when CUDAMEM_TORCH_POLICY is set (tlsf or stitch; it becomes
CUDAMEM_POLICY). If the backend cannot be installed (a PyTorch whose allocator
interface the backend does not cover, no compiler, no library), it says why on stderr
and the program runs on PyTorch's own allocator. A sitecustomize that was on the path
before this one is run afterwards, as if this one were not there.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _say(text):
    sys.stderr.write("cudamem: %s\n" % text)


def _install():
    """Install the backend into the torch just imported; never raises."""
    try:
        sys.path.insert(0, os.path.dirname(_HERE))
        try:
            import cudamem_torch
        finally:
            sys.path.remove(os.path.dirname(_HERE))
        cudamem_torch.install(os.environ.get("CUDAMEM_TORCH_LIB") or None)
        if os.environ.get("CUDAMEM_TORCH_VERBOSE"):
            _say("PyTorch allocates through cudamem (%s)" % os.environ.get("CUDAMEM_POLICY"))
    except Exception as error:  # the program must run whatever happened here
        _say("not installed, the program runs on PyTorch's allocator: %s" % error)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds `torch` with the other finders and installs the backend once it has
    been executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _install()

        spec.loader.exec_module = exec_module
        return spec


def _chain():
    """Runs the sitecustomize this one hides, if any, under its own name."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("CUDAMEM_TORCH_POLICY"):
    os.environ.setdefault("CUDAMEM_POLICY", os.environ["CUDAMEM_TORCH_POLICY"])
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _AfterTorch())
_chain()
