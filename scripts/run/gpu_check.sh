#!/usr/bin/env bash
# Runs `cudamem run` on real CUDA programs on a GPU machine, from a bundle
# made by `cargo xtask gpu-bundle BUNDLE`:
# - the seed's case (seed_local_memory.cu, nvcc's default build with static
#   cudart): a kernel whose local memory takes most of the device, then an
#   out of memory while allocating little; the explanation must name the
#   kernel and its reservation;
# - PyTorch (caching allocator, expandable segments, cudaMallocAsync, and an
#   out of memory), CuPy, JAX (with and without its preallocation), and one
#   of the repository's PyTorch workloads (its peak ledger);
# each traced, the trace replayed with `cudamem replay`;
# - the interposer's overhead: cudaMalloc/cudaFree pairs and a PyTorch
#   training step, each bare and under `cudamem run`, alternating.
# Logs go to OUTDIR, with summary.md. Exits non-zero if a case did not end
# as expected.
#
# usage: gpu_check.sh BUNDLE OUTDIR
#   PYTHON (default /opt/torch/.venv/bin/python3), NVCC (default nvcc, else
#   /usr/local/cuda/bin/nvcc), ROUNDS (overhead alternations, default 5),
#   WORKLOAD (default resnet50_train).
set -u
if [ $# -ne 2 ]; then
  echo "usage: gpu_check.sh BUNDLE OUTDIR" >&2
  exit 2
fi
bundle="$(cd "$1" && pwd)"
mkdir -p "$2"
out="$(cd "$2" && pwd)"
cudamem="$bundle/bin/cudamem"
here="$bundle/scripts/run"
python="${PYTHON:-/opt/torch/.venv/bin/python3}"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
rounds="${ROUNDS:-5}"
workload="${WORKLOAD:-resnet50_train}"
summary="$out/summary.md"
failed=0

{
  echo "# cudamem run on $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi failed"
  "$nvcc" --version 2>&1 | tail -1
  "$python" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1 | tail -1
  echo '```'
  echo
} > "$summary"

echo "==> building the CUDA programs with $nvcc"
mkdir -p "$out/build"
"$nvcc" -O2 -arch=sm_90 -o "$out/build/seed_local_memory" "$here/seed_local_memory.cu" > "$out/build/nvcc.log" 2>&1 \
  && "$nvcc" -O2 -o "$out/build/alloc_pairs" "$here/alloc_pairs.cu" >> "$out/build/nvcc.log" 2>&1
if [ $? -ne 0 ]; then
  echo "nvcc failed: see build/nvcc.log" | tee -a "$summary"
  exit 1
fi
"$nvcc" -O2 -arch=sm_90 -Xptxas -v -c -o /dev/null "$here/seed_local_memory.cu" > "$out/build/ptxas.log" 2>&1

echo "| case | exit (expected) | replay | what the report says |" >> "$summary"
echo "| --- | --- | --- | --- |" >> "$summary"

# case NAME EXPECTED [VAR=VALUE...] -- COMMAND...
case_run() {
  local name="$1" expected="$2"
  shift 2
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  shift
  local dir="$out/$name"
  mkdir -p "$dir"
  echo "==> $name: $*"
  local start=$SECONDS
  env ${env[@]+"${env[@]}"} timeout 600 "$cudamem" run --trace "$dir/trace.csv" --report "$dir/report.html" -- "$@" \
    > "$dir/stdout.log" 2> "$dir/stderr.log"
  local status=$?
  timeout 600 "$cudamem" replay "$dir/trace.csv" > "$dir/replay.log" 2>&1
  local replay=$?
  local verdict="$status ($expected)"
  if [ "$status" -ne "$expected" ]; then
    verdict="**$status** ($expected)"
    failed=1
  fi
  local replayed="ok"
  [ "$replay" -ne 0 ] && replayed="**failed $replay**" && failed=1
  local said
  said="$(grep -E '^(local memory cause|unexplained|warning|out of memory at|advice)|cudamem: +[0-9.]+ [KMGT]?i?B ' "$dir/stderr.log" \
    | head -6 | sed 's/|/\\|/g' | tr '\n' ' ')"
  echo "| $name ($((SECONDS - start)) s) | $verdict | $replayed | $said |" >> "$summary"
}

case_run seed 2 -- "$out/build/seed_local_memory"
if ! grep -q "^cudamem: .*local memory (kernel .*big_frame" "$out/seed/stderr.log"; then
  echo "seed: the out-of-memory explanation does not name big_frame's local memory among the holders" >> "$summary"
  failed=1
fi
case_run torch-default 0 -- "$python" "$here/torch_alloc.py" default
case_run torch-expandable 0 -- "$python" "$here/torch_alloc.py" expandable
case_run torch-async 0 -- "$python" "$here/torch_alloc.py" async
case_run torch-oom 3 -- "$python" "$here/torch_alloc.py" default --oom
case_run cupy 0 -- "$python" "$here/cupy_alloc.py"
case_run jax 0 -- "$python" "$here/jax_alloc.py"
case_run jax-on-demand 0 XLA_PYTHON_CLIENT_PREALLOCATE=false -- "$python" "$here/jax_alloc.py"
case_run "torch-$workload" 0 -- "$python" "$here/torch_step.py" "$workload" full

# How cuGetProcAddress answers were handed on, per case.
{
  echo
  echo "Entry points handed out through cuGetProcAddress (export / table / unwrapped), per case:"
  echo '```'
  for dir in "$out"/*/trace.csv.events; do
    [ -d "$dir" ] || continue
    printf '%-24s %s\n' "$(basename "$(dirname "$dir")")" \
      "$(cat "$dir"/*.events | awk -F'\t' '$1=="resolve"{n[$7]++} END{for(k in n) printf "%s=%d ", k, n[k]}')"
  done
  echo '```'
} >> "$summary"

echo "==> overhead: cudaMalloc/cudaFree pairs, bare and under cudamem run, $rounds rounds"
: > "$out/overhead.log"
for round in $(seq "$rounds"); do
  for bytes in 256 1048576; do
    echo "bare $("$out/build/alloc_pairs" "$bytes" 20000)" >> "$out/overhead.log"
    echo "hooked $("$cudamem" run -- "$out/build/alloc_pairs" "$bytes" 20000 2> /dev/null)" >> "$out/overhead.log"
  done
done
echo "==> overhead: $workload training step, bare and under cudamem run, 3 rounds"
: > "$out/step.log"
for round in 1 2 3; do
  echo "bare $("$python" "$here/torch_step.py" "$workload" full 2> /dev/null)" >> "$out/step.log"
  echo "hooked $("$cudamem" run -- "$python" "$here/torch_step.py" "$workload" full 2> /dev/null)" >> "$out/step.log"
done
"$python" - "$out/overhead.log" "$out/step.log" >> "$summary" << 'PY'
import statistics, sys
pairs, step = sys.argv[1], sys.argv[2]
rows = {}
for line in open(pairs):
    parts = line.split()
    if len(parts) == 4:
        rows.setdefault((int(parts[1]), parts[0]), []).append(float(parts[3]))
print("\n| cudaMalloc+cudaFree pair | bare ns (median) | under cudamem run ns | added per call ns |")
print("| --- | --- | --- | --- |")
for size in sorted({k[0] for k in rows}):
    bare = statistics.median(rows.get((size, "bare"), [float("nan")]))
    hooked = statistics.median(rows.get((size, "hooked"), [float("nan")]))
    print(f"| {size} B | {bare:.0f} | {hooked:.0f} | {(hooked - bare) / 2:.0f} |")
steps = {}
for line in open(step):
    parts = line.split()
    if len(parts) == 5:
        steps.setdefault(parts[0], []).append(float(parts[2]))
names = set()
for line in open(step):
    parts = line.split()
    if len(parts) == 5:
        names.add(parts[1])
if steps:
    bare = statistics.median(steps.get("bare", [float("nan")]))
    hooked = statistics.median(steps.get("hooked", [float("nan")]))
    print(f"\n{', '.join(sorted(names))} training step (median of each): bare {bare * 1e3:.2f} ms, "
          f"under cudamem run {hooked * 1e3:.2f} ms ({(hooked / bare - 1) * 100:+.2f}%)")
PY

cat "$summary"
exit $failed
