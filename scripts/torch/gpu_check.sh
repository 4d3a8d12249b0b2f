#!/usr/bin/env bash
# cudamem's PyTorch backend on a GPU machine, in one go:
#
#   scripts/torch/gpu_check.sh SRC OUTDIR [build|checklist|bench|all]
#
# SRC is this repository's checkout (libcudamem_torch.so in target/cuda/release, the
# `cudamem` command in target/release or target/cuda/release) or a folder laid out
# like a bundle (lib/libcudamem_torch.so, bin/cudamem, python/, torch-alloc/cpp/,
# scripts/torch/). Steps, and about how long each takes on one H200:
#
#   build      the C++ extension with torch.utils.cpp_extension        about 1 min
#   checklist  scripts/torch/checklist.py, every habit under PyTorch's
#              default allocator and cudamem's tlsf and stitch pools     about 3-5 min
#   bench      scripts/torch/bench_allocator.py on $BENCH_WORKLOADS
#              (default: resnet50_train gpt2_train), four modes each     about 2-3 min
#
# (estimates; each step is cut at 330 s and 200 s so that `all` fits in ten minutes;
# run the steps one call each for more room: the built extension stays in /tmp.)
#
# Logs go to OUTDIR (build.log, checklist.txt, checklist/, bench.txt, bench/) with a
# summary.md; the exit status is non-zero if any step failed. Settings: PYTHON
# (default /opt/torch/.venv/bin/python3, else python3), CUDA_HOME (default
# /usr/local/cuda), BENCH_WORKLOADS, CHECKLIST_ALLOCATORS (default: all three).
set -u
if [ $# -lt 2 ]; then
  echo "usage: gpu_check.sh SRC OUTDIR [build|checklist|bench|all]" >&2
  exit 2
fi
src="$(cd "$1" && pwd)"
out="$2"
what="${3:-all}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

python="${PYTHON:-/opt/torch/.venv/bin/python3}"
[ -x "$python" ] || python="$(command -v python3)"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
# Build products stay on the machine; only logs come back.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/cudamem-torch-extensions}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/cudamem-inductor-cache}"

first() { # the first of the arguments that is a file
  for f in "$@"; do
    if [ -f "$f" ]; then
      echo "$f"
      return 0
    fi
  done
  return 1
}

lib="$(first "${CUDAMEM_TORCH_LIB:-}" "$src/target/cuda/release/libcudamem_torch.so" \
  "$src/lib/libcudamem_torch.so")" || {
  echo "gpu_check: no libcudamem_torch.so under $src (build it with the cuda feature and carry it)" >&2
  exit 2
}
bin="$(first "$src/bin/cudamem" "$src/target/release/cudamem" "$src/target/cuda/release/cudamem")" \
  || bin=""
export CUDAMEM_TORCH_CPP="$src/torch-alloc/cpp"
[ -f "$CUDAMEM_TORCH_CPP/cudamem_allocator.cpp" ] || export CUDAMEM_TORCH_CPP="$src/cpp"
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"

summary="$out/summary.md"
failed=0
{
  echo "# cudamem PyTorch backend check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 \
    || echo "nvidia-smi failed"
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  echo "lib $lib"
  echo "cudamem ${bin:-(none: the snapshot habit fails)}"
  echo '```'
  echo
  echo "| step | result | seconds | log |"
  echo "| --- | --- | --- | --- |"
} > "$summary"

record() { # name exit-status seconds log
  local result=PASS
  if [ "$2" -ne 0 ]; then
    result="FAIL (exit $2)"
    failed=1
  fi
  echo "| $1 | $result | $3 | $4 |" >> "$summary"
}

want() { [ "$what" = all ] || [ "$what" = "$1" ]; }

if want build || want checklist || want bench; then
  start=$(date +%s)
  "$python" -c 'import sys, cudamem_torch; cudamem_torch.build(sys.argv[1], verbose=True)' "$lib" \
    > "$out/build.log" 2>&1
  code=$?
  record "build the extension" $code $(( $(date +%s) - start )) build.log
  if [ $code -ne 0 ]; then
    tail -20 "$out/build.log" >&2
    cat "$summary"
    exit 1
  fi
fi

if want checklist; then
  start=$(date +%s)
  # shellcheck disable=SC2086 # the allocators are meant to split
  timeout 330 "$python" "$src/scripts/torch/checklist.py" --lib "$lib" ${bin:+--cudamem-bin "$bin"} \
    --out "$out/checklist" --allocators ${CHECKLIST_ALLOCATORS:-default tlsf stitch} \
    > "$out/checklist.txt" 2>&1
  record checklist $? $(( $(date +%s) - start )) "checklist.txt, checklist/"
  cat "$out/checklist.txt"
fi

if want bench; then
  start=$(date +%s)
  # shellcheck disable=SC2086 # the workloads are meant to split
  timeout 200 "$python" "$src/scripts/torch/bench_allocator.py" --lib "$lib" --out "$out/bench" \
    --only ${BENCH_WORKLOADS:-resnet50_train gpt2_train} > "$out/bench.txt" 2>&1
  record benchmark $? $(( $(date +%s) - start )) "bench.txt, bench/"
  tail -12 "$out/bench.txt"
fi

cat "$summary"
exit $failed
