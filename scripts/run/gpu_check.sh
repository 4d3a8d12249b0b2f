#!/usr/bin/env bash
# Runs `cudamem run` on real CUDA programs on a GPU machine, from a bundle
# made by `cargo xtask gpu-bundle BUNDLE`:
# - the seed's case (seed_local_memory.cu, nvcc's default build with static
#   cudart): a kernel whose local memory takes most of the device, then an
#   out of memory while allocating little; the explanation must name the
#   kernel and its reservation;
# - an 8 GiB in-kernel malloc heap taken at the first launch of a kernel
#   that calls malloc, then an out of memory (heap_oom.cu): the ledger must
#   name the heap;
# - PyTorch (caching allocator, expandable segments, cudaMallocAsync, and an
#   out of memory), CuPy, JAX (with and without its preallocation), and one
#   of the repository's PyTorch workloads (its peak ledger);
# each traced, the trace replayed with `cudamem replay`;
# - the interposer's overhead: the cheap calls it wraps (alloc_pairs.cu:
#   allocation pairs, stream-ordered pairs, cudaMemGetInfo, launches) and a
#   PyTorch ResNet-50 training step, each bare and under `cudamem run`,
#   alternating, pinned to the same cores, medians of the rounds.
# Logs go to OUTDIR, with summary.md: the cases, the overhead table, and the
# PyTorch workload's ledger at its peak with its unexplained share. Meant to
# end within 300 s on one H200. Exits non-zero if a case did not end as
# expected.
#
# usage: gpu_check.sh BUNDLE OUTDIR
#   PYTHON (default /opt/torch/.venv/bin/python3), NVCC (default nvcc, else
#   /usr/local/cuda/bin/nvcc), ROUNDS (alternations of the call benchmark,
#   default 5), STEP_ROUNDS (of the training step, default 5), WORKLOAD
#   (default resnet50_train), CASE_TIMEOUT (seconds per case, default 120).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../lib/check.sh"
bundle_args "$@"
rounds="${ROUNDS:-5}"
step_rounds="${STEP_ROUNDS:-5}"
step_count="${STEPS:-60}"
workload="${WORKLOAD:-resnet50_train}"
case_timeout="${CASE_TIMEOUT:-120}"

{
  echo "# cudamem run on $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  machine_facts
  "$python" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1 | tail -1
  echo '```'
  echo
} > "$summary"

echo "==> building the CUDA programs with $nvcc"
mkdir -p "$out/build"
# The seed's frame takes about 85% of this device's memory as local memory
# (threads per SM x SMs x frame), so the case is the same on any size of GPU.
frame_kib="$("$python" -c 'import torch; p = torch.cuda.get_device_properties(0); print(min(448, int(p.total_memory * 0.85 / (p.max_threads_per_multi_processor * p.multi_processor_count) / 1024)))' 2>/dev/null || echo 448)"
"$nvcc" -O2 -arch=sm_90 -DFRAME_KIB="$frame_kib" -o "$out/build/seed_local_memory" "$here/seed_local_memory.cu" > "$out/build/nvcc.log" 2>&1 \
  && "$nvcc" -O2 -arch=sm_90 -o "$out/build/alloc_pairs" "$here/alloc_pairs.cu" >> "$out/build/nvcc.log" 2>&1 \
  && "$nvcc" -O2 -arch=sm_90 -o "$out/build/heap_oom" "$here/heap_oom.cu" >> "$out/build/nvcc.log" 2>&1
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
  split_case "$@"
  local dir="$out/$name"
  mkdir -p "$dir"
  echo "==> $name: $*"
  local start=$SECONDS
  env ${case_env[@]+"${case_env[@]}"} timeout "$case_timeout" "$cudamem" run --trace "$dir/trace.csv" --report "$dir/report.html" -- "${case_command[@]}" \
    > "$dir/stdout.log" 2> "$dir/stderr.log"
  local status=$?
  local replay=0
  if [ -e "$dir/trace.csv" ]; then
    timeout "$case_timeout" "$cudamem" replay "$dir/trace.csv" > "$dir/replay.log" 2>&1
    replay=$?
  elif ! grep -q "no trace written" "$dir/stderr.log"; then
    echo "no trace.csv, and cudamem did not say why" > "$dir/replay.log"
    replay=1
  fi
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
case_run heap 2 -- "$out/build/heap_oom"
if ! grep -qi "malloc heap" "$out/heap/stderr.log"; then
  echo "heap: the ledger does not name the malloc heap" >> "$summary"
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
      "$(cat "$dir"/*.events | tr -d '\000' | awk -F'\t' '$1=="resolve"{n[$7]++} END{for(k in n) printf "%s=%d ", k, n[k]}')"
  done
  echo '```'
} >> "$summary"

# Each device's ledger at its peak, as `cudamem run` printed it, and what
# the run recorded (for the cases whose unexplained share is asked about).
for name in "torch-$workload" torch-async jax-on-demand; do
  [ -f "$out/$name/stderr.log" ] || continue
  {
    echo
    echo "### $name: the ledger at its peak, and what was recorded"
    echo '```'
    awk '/^cudamem run: .*exit status/{show=1} show' "$out/$name/stderr.log" | head -80
    "$python" "$here/events_summary.py" "$out/$name/trace.csv.events" 2>&1 | head -40
    echo '```'
  } >> "$summary"
done

echo "==> overhead: the cheap calls, bare and under cudamem run, $rounds rounds"
: > "$out/calls.log"
# Both sides pinned to one core (the same each time): where the scheduler
# puts a process moves these calls' cost more than the interposer does.
pin=()
if command -v taskset > /dev/null; then
  pin=(taskset -c "$(( $(nproc) / 2 ))")
fi
for round in $(seq "$rounds"); do
  "${pin[@]}" "$out/build/alloc_pairs" 20000 | sed "s/^/bare $round /" >> "$out/calls.log"
  "${pin[@]}" "$cudamem" run -- "$out/build/alloc_pairs" 20000 2> /dev/null | sed "s/^/hooked $round /" >> "$out/calls.log"
done
echo "==> overhead: a ResNet-50 training step, bare and under cudamem run, $step_rounds rounds"
: > "$out/step.log"
# One run first, not counted: the first process after an idle spell meets
# a cold GPU. Then the order alternates (bare first in odd rounds, hooked
# first in even ones), so neither side always runs on the warmer device.
# Both sides on the same four cores, so where the scheduler puts the
# Python thread and the driver's does not differ between them.
step_pin=()
if command -v taskset > /dev/null && [ "$(nproc)" -ge 8 ]; then
  step_pin=(taskset -c "4-7")
fi
"${step_pin[@]}" "$python" "$here/torch_step.py" loop "$step_count" > /dev/null 2>&1
step_bare() { echo "bare $1 $("${step_pin[@]}" "$python" "$here/torch_step.py" loop "$step_count" 2> /dev/null)" >> "$out/step.log"; }
step_hooked() { echo "hooked $1 $("${step_pin[@]}" "$cudamem" run -- "$python" "$here/torch_step.py" loop "$step_count" 2> /dev/null)" >> "$out/step.log"; }
for round in $(seq "$step_rounds"); do
  if [ $((round % 2)) -eq 1 ]; then
    step_bare "$round"; step_hooked "$round"
  else
    step_hooked "$round"; step_bare "$round"
  fi
done
# The workload's own median step, bare, beside the traced case's.
echo "bare-workload 1 $("$python" "$here/torch_step.py" "$workload" full 2> /dev/null)" >> "$out/step.log"
echo "hooked-workload 1 $(cat "$out/torch-$workload/stdout.log" 2> /dev/null | tail -1)" >> "$out/step.log"
echo "==> overhead on this machine's CPU: the fake driver's calls, bare, preloaded, preloaded with a log"
# The same calls against a driver that does nothing tell the interposer's
# own cost on this CPU apart from what the real driver adds around it.
fake_log="$out/fake-calls.log"
{
  echo "clock source: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null || echo unknown)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "cores: $(nproc)"
  echo "temporary folder: $(df -T "${TMPDIR:-/tmp}" 2>/dev/null | awk 'NR==2 {print $2}')"
  echo "columns: launch (not the first), cuMemGetInfo_v2, cuMemAllocAsync+cuMemFreeAsync pair, cuModuleGetFunction (seen before); ns per call"
} > "$fake_log"
if sh "$bundle/fixtures/build.sh" "$out/fixtures" > "$out/build/fixtures.log" 2>&1; then
  for round in 1 2 3; do
    echo "bare   $(LD_LIBRARY_PATH="$out/fixtures" "$out/fixtures/cuda_linked" calls 1000000)" >> "$fake_log"
    echo "hook   $(LD_LIBRARY_PATH="$out/fixtures" LD_PRELOAD="$bundle/bin/libcudamem_interpose.so" "$out/fixtures/cuda_linked" calls 1000000)" >> "$fake_log"
    rm -rf "$out/fixtures/logs"; mkdir -p "$out/fixtures/logs"
    echo "logged $(LD_LIBRARY_PATH="$out/fixtures" LD_PRELOAD="$bundle/bin/libcudamem_interpose.so" CUDAMEM_HOOK_DIR="$out/fixtures/logs" "$out/fixtures/cuda_linked" calls 1000000)" >> "$fake_log"
  done
  # Allocation pairs through the shared runtime on 1 and 16 threads: each
  # thread's wall time and CPU time per pair (on a machine with 16 cores
  # or more, the wall time at 16 threads is what contention costs).
  echo "threads: cudaMalloc+cudaFree pairs of 256 B; columns: threads, wall ns, CPU ns per pair per thread" >> "$fake_log"
  for round in 1 2 3; do
    for threads in 1 16; do
      echo "bare   $threads $(LD_LIBRARY_PATH="$out/fixtures" FAKE_CUDA_PER_THREAD=1 "$out/fixtures/cuda_runtime" bench 300000 "$threads")" >> "$fake_log"
      echo "hook   $threads $(LD_LIBRARY_PATH="$out/fixtures" FAKE_CUDA_PER_THREAD=1 LD_PRELOAD="$bundle/bin/libcudamem_interpose.so" "$out/fixtures/cuda_runtime" bench 300000 "$threads")" >> "$fake_log"
      rm -rf "$out/fixtures/logs"; mkdir -p "$out/fixtures/logs"
      echo "logged $threads $(LD_LIBRARY_PATH="$out/fixtures" FAKE_CUDA_PER_THREAD=1 LD_PRELOAD="$bundle/bin/libcudamem_interpose.so" CUDAMEM_HOOK_DIR="$out/fixtures/logs" "$out/fixtures/cuda_runtime" bench 300000 "$threads")" >> "$fake_log"
    done
  done
  rm -rf "$out/fixtures/logs"
else
  echo "the fake driver did not build: see build/fixtures.log" >> "$fake_log"
fi
{ echo; echo "The interposer against the fake driver on this machine's CPU:"; echo '```'; cat "$fake_log"; echo '```'; } >> "$summary"

"$python" - "$out/calls.log" "$out/step.log" >> "$summary" << 'PY'
import math, statistics, sys
calls, step = sys.argv[1], sys.argv[2]

def median(values):
    return statistics.median(values) if values else math.nan

# calls.log: SIDE ROUND KIND MEDIAN_BATCH FASTEST_BATCH (ns per call or pair)
rows, fastest = {}, {}
for line in open(calls):
    parts = line.split()
    if len(parts) == 5:
        rows.setdefault(parts[2], {}).setdefault(parts[0], []).append(float(parts[3]))
        fastest.setdefault(parts[2], {}).setdefault(parts[0], []).append(float(parts[4]))
print("\n## Overhead: bare against under `cudamem run`, alternating rounds, pinned to one core\n")
print("Per round, each kind runs in 25 batches: the median batch, and the fastest (a quiet machine).\n")
print("| call | rounds | bare ns (median of medians) | under cudamem run ns | added per driver call ns | added per call, fastest batches ns |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for kind, by in rows.items():
    bare, hooked = median(by.get("bare", [])), median(by.get("hooked", []))
    quick = fastest[kind]
    quick_bare, quick_hooked = min(quick.get("bare", [math.nan])), min(quick.get("hooked", [math.nan]))
    # A pair is two driver calls.
    per = 2 if "+" in kind else 1
    print(f"| {kind} | {len(by.get('bare', []))} | {bare:.0f} | {hooked:.0f} | {(hooked - bare) / per:+.0f} "
          f"| {(quick_hooked - quick_bare) / per:+.0f} |")
steps = {}
for line in open(step):
    parts = line.split()
    if len(parts) == 6:
        steps.setdefault(parts[0], []).append(float(parts[3]))
steps_per_run = next((float(line.split()[4]) for line in open(step) if len(line.split()) == 6), 0)
bare, hooked = median(steps.get("bare", [])), median(steps.get("hooked", []))
quick_step = min(steps.get("hooked", [math.nan])) / min(steps.get("bare", [math.nan])) - 1
print(f"| ResNet-50 training step, batch 32 (median of {int(steps_per_run)} steps per run) | {len(steps.get('bare', []))} "
      f"| {bare * 1e9:.0f} | {hooked * 1e9:.0f} | {(hooked / bare - 1) * 100:+.2f}% of the step "
      f"| {quick_step * 100:+.2f}% (fastest run of each) |")
wb, wh = median(steps.get("bare-workload", [])), median(steps.get("hooked-workload", []))
print(f"| workload's median step (scripts/torch/workloads.py, one run each) | 1 "
      f"| {wb * 1e9:.0f} | {wh * 1e9:.0f} | {(wh / wb - 1) * 100:+.2f}% of the step | |")
print("\nPer round (ns; steps in ms):\n```")
for kind, by in rows.items():
    print(f"{kind:<40} bare {' '.join(f'{v:.0f}' for v in by.get('bare', []))} | "
          f"hooked {' '.join(f'{v:.0f}' for v in by.get('hooked', []))}")
for variant, values in steps.items():
    print(f"{'step (ms), ' + variant:<40} {' '.join(f'{v * 1e3:.2f}' for v in values)}")
print("```")
PY

echo "gpu_check.sh took $SECONDS s" >> "$summary"
cat "$summary"
exit $failed
