#!/usr/bin/env bash
# PyTorch's allocator tests under PyTorch's default allocator and cudamem's tlsf and
# stitch pools, in one go, with the counts of each:
#
#   scripts/torch/pytorch_allocator_tests.sh LIB OUTDIR
#
# LIB is libcudamem_torch.so built with the cuda feature. If PyTorch's
# test/test_cuda.py is installed beside torch (a source checkout; the wheels ship no
# tests), its caching-allocator tests run under each allocator with pytest (cudamem
# installed by python/adopt/sitecustomize.py, the zero-code path); either way
# scripts/torch/conformance.py runs the same behaviours as our own cases. PYTHON
# defaults to /opt/torch/.venv/bin/python3.
set -u
lib="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
out="$2"
mkdir -p "$out"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-/opt/torch/.venv/bin/python3}"
[ -x "$python" ] || python="$(command -v python3)"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/cudamem-torch-extensions}"
export CUDAMEM_TORCH_CPP="${CUDAMEM_TORCH_CPP:-$repo/torch-alloc/cpp}"
tests="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "test", "test_cuda.py"))')"
status=0
if [ -f "$tests" ] && "$python" -c 'import pytest' 2>/dev/null; then
  for allocator in default tlsf stitch; do
    policy=""
    [ "$allocator" = default ] || policy="$allocator"
    env PYTHONPATH="$repo/python/adopt${PYTHONPATH:+:$PYTHONPATH}" CUDAMEM_TORCH_POLICY="$policy" \
      CUDAMEM_TORCH_LIB="$lib" timeout 600 "$python" -m pytest -q -x --timeout=120 "$tests" \
      -k "caching_allocator or memory_stats or mempool or MemPool or memory_snapshot or oom" \
      > "$out/test_cuda.$allocator.txt" 2>&1
    echo "test_cuda.py under $allocator: $(tail -1 "$out/test_cuda.$allocator.txt")"
  done
else
  echo "PyTorch's test/test_cuda.py is not on this machine ($tests missing, or no pytest):" \
    "running cudamem's conformance cases instead"
fi
"$python" "$here/conformance.py" --lib "$lib" --out "$out/conformance" || status=1
exit $status
