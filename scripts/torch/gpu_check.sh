#!/usr/bin/env bash
# cudamem's PyTorch backend on a GPU machine, in one go:
#
#   scripts/torch/gpu_check.sh SRC OUTDIR [build|checklist|bench|ddp|all]...
#
# SRC is this repository's checkout (libcudamem_torch.so in target/cuda/release, the
# `cudamem` command in target/release or target/cuda/release) or a folder laid out
# like a bundle (lib/libcudamem_torch.so, bin/cudamem, python/, torch-alloc/cpp/,
# scripts/torch/); CUDAMEM_BIN names the `cudamem` command elsewhere. Steps, each cut
# at its limit in seconds (the CUT_* settings); the benchmark also stops CUT_ALL
# seconds after the start, so `all` ends within seven minutes (a cut benchmark has the
# table of the workloads it finished; BENCH_WORKLOADS runs the rest in another go):
#
#   build      the C++ extension with torch.utils.cpp_extension (cached)   CUT_BUILD 90
#   checklist  scripts/torch/checklist.py, every habit under PyTorch's
#              default allocator and cudamem's tlsf and stitch pools        CUT_CHECKLIST 150
#              (the habits that measure the device after the rest)          CUT_EXCLUSIVE 60
#   bench      scripts/torch/bench_allocator.py, $BENCH_WORKLOADS (default:
#              all six) x four modes, --repeat $BENCH_REPEAT (default 3)     CUT_BENCH 240
#              (and never past CUT_ALL, 420 s after the start)
#   ddp        scripts/torch/ddp_bench.py on $DDP_WORLD GPUs (default 1, the
#              one-GPU check) under default, expandable, tlsf and stitch    CUT_DDP 90
#
# The build always runs first (the steps need it); then the checklist and the DDP
# check side by side (on one GPU the DDP check measures nothing), then the benchmark
# alone. Logs go to OUTDIR (build.log, checklist.shared.txt, checklist.exclusive.txt,
# checklist/, bench.txt, bench/, ddp.txt, ddp/) with a summary.md; the exit status is
# non-zero if any step failed. Settings: PYTHON (default /opt/torch/.venv/bin/python3,
# else python3), CUDA_HOME (default /usr/local/cuda), BENCH_WORKLOADS, BENCH_REPEAT,
# BENCH_ROUNDS (default 1),
# CHECKLIST_ALLOCATORS (default: all three), CHECKLIST_ONLY (habits; default: all),
# DDP_WORLD, DDP_STEPS (default 16).
set -u
# gpu_facts, table_head, record
. "$(dirname "${BASH_SOURCE[0]}")/../lib/check.sh"
if [ $# -lt 2 ]; then
  echo "usage: gpu_check.sh SRC OUTDIR [build|checklist|bench|ddp|all]..." >&2
  exit 2
fi
src="$(cd "$1" && pwd)"
out="$2"
shift 2
steps="${*:-all}"
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
bin="$(first "${CUDAMEM_BIN:-}" "$src/bin/cudamem" "$src/target/cuda/release/cudamem" \
  "$src/target/release/cudamem")" || bin=""
export CUDAMEM_TORCH_CPP="$src/torch-alloc/cpp"
[ -f "$CUDAMEM_TORCH_CPP/cudamem_allocator.cpp" ] || export CUDAMEM_TORCH_CPP="$src/cpp"
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"

began=$(date +%s)
summary="$out/summary.md"
failed=0
{
  echo "# cudamem PyTorch backend check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  gpu_facts
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  echo "lib $lib"
  echo "cudamem ${bin:-(none: the snapshot habit fails)}"
  echo '```'
  echo
  table_head step
} > "$summary"

want() {
  local step
  for step in $steps; do
    if [ "$step" = all ] || [ "$step" = "$1" ]; then
      return 0
    fi
  done
  return 1
}

if want build || want checklist || want bench || want ddp; then
  start=$(date +%s)
  timeout "${CUT_BUILD:-90}" "$python" -c \
    'import sys, cudamem_torch; cudamem_torch.build(sys.argv[1], verbose=True)' "$lib" \
    > "$out/build.log" 2>&1
  code=$?
  record "build the extension" $code $(( $(date +%s) - start )) build.log
  if [ $code -ne 0 ]; then
    tail -20 "$out/build.log" >&2
    cat "$summary"
    exit 1
  fi
fi

run_checklist() { # part cut
  local start
  start=$(date +%s)
  # shellcheck disable=SC2086 # the allocators are meant to split
  timeout "$2" "$python" "$src/scripts/torch/checklist.py" --lib "$lib" --part "$1" \
    ${CHECKLIST_ONLY:+--only $CHECKLIST_ONLY} ${bin:+--cudamem-bin "$bin"} \
    --out "$out/checklist" --timeout 120 \
    --allocators ${CHECKLIST_ALLOCATORS:-default tlsf stitch} > "$out/checklist.$1.txt" 2>&1
  record "checklist ($1 habits)" $? $(( $(date +%s) - start )) "checklist.$1.txt, checklist/"
  cat "$out/checklist.$1.txt"
}

run_ddp() { # prints the exit status and the seconds
  local start
  start=$(date +%s)
  timeout "${CUT_DDP:-90}" "$python" "$src/scripts/torch/ddp_bench.py" --lib "$lib" \
    --out "$out/ddp" --world "${DDP_WORLD:-1}" --steps "${DDP_STEPS:-16}" --shapes 4 \
    --timeout 60 --modes default expandable tlsf stitch > "$out/ddp.txt" 2>&1
  echo "$? $(( $(date +%s) - start ))"
}

# On one GPU the DDP step checks that the backend runs under DDP and that the losses
# are deterministic; it measures nothing, so it runs beside the checklist's habits that
# share the device, before those that need it alone.
if want ddp; then
  run_ddp > "$out/ddp.status" &
  ddp_pid=$!
fi
if want checklist; then
  run_checklist shared "${CUT_CHECKLIST:-150}"
fi
if want ddp; then
  wait "$ddp_pid"
  read -r code seconds < "$out/ddp.status"
  record ddp "$code" "$seconds" "ddp.txt, ddp/"
  tail -32 "$out/ddp.txt"
fi
if want checklist; then
  run_checklist exclusive "${CUT_EXCLUSIVE:-60}"
fi

if want bench; then
  start=$(date +%s)
  # What is left of CUT_ALL (default 420 s) since the start, at most CUT_BENCH.
  left=$(( ${CUT_ALL:-420} - (start - began) - 5 ))
  cut=${CUT_BENCH:-240}
  [ "$left" -lt "$cut" ] && cut=$left
  [ "$cut" -lt 1 ] && cut=1
  # shellcheck disable=SC2086 # the workloads are meant to split
  timeout "$cut" "$python" "$src/scripts/torch/bench_allocator.py" --lib "$lib" \
    --out "$out/bench" --repeat "${BENCH_REPEAT:-3}" --rounds "${BENCH_ROUNDS:-1}" --timeout 60 \
    --only ${BENCH_WORKLOADS:-resnet50_train gpt2_train bert_train vit_infer llama_finetune mixtral_moe_infer} \
    > "$out/bench.txt" 2>&1
  record "benchmark (cut at $cut s)" $? $(( $(date +%s) - start )) "bench.txt, bench/"
  tail -45 "$out/bench.txt"
fi

cat "$summary"
exit $failed
