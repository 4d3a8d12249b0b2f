#!/usr/bin/env bash
# `cudamem pause` / `cudamem resume` on a GPU machine, from a bundle made by
# `cargo xtask gpu-bundle BUNDLE`. Each program runs under `cudamem run
# --pool`, is paused by PID mid-run, held paused a few seconds while
# nvidia-smi reads the memory in use, resumed, and its result compared with
# an unpaused run of the same program (no cudamem):
# - pause_job.cu work (nvcc, 16 threads allocating, launching and copying
#   while the pause arrives);
# - a PyTorch training loop, default allocator and expandable segments (the
#   latter maps its own memory through cuMemCreate: cudamem does not pause
#   that yet, so little is given back and the case only informs);
# - CuPy; JAX with XLA_PYTHON_CLIENT_ALLOCATOR=platform.
# Then pause and resume time against bytes (pause_job.cu hold, 1 to 32 GiB)
# beside a plain pinned cudaMemcpy's bandwidth measured in the same run.
# Logs go to OUTDIR, with summary.md. Every step has a timeout; meant to end
# within 15 minutes on one H200. Exits non-zero if a case failed.
#
# usage: gpu_check.sh BUNDLE OUTDIR
#   PYTHON (default /opt/torch/.venv/bin/python3), NVCC (default nvcc, else
#   /usr/local/cuda/bin/nvcc), SIZES (GiB, default "1 4 16 32"),
#   STEP_TIMEOUT (seconds per step, default 300).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../lib/check.sh"
bundle_args "$@"
sizes="${SIZES:-1 4 16 32}"
step_timeout="${STEP_TIMEOUT:-300}"

used_mib() { timeout 30 nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1 | tr -d ' '; }
proc_mib() { timeout 30 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
  | awk -F', *' -v p="$1" '$1==p {print $2}' | head -1; }
checksum_of() { awk '/^checksum /{print $2}' "$1" | tail -1; }

# Wait (up to step_timeout) for "pid PID ready" in FILE while process WAITPID lives.
wait_ready() {
  local file="$1" waitpid="$2" i
  for i in $(seq $((step_timeout * 10))); do
    if grep -q '^pid [0-9]* ready' "$file" 2>/dev/null; then
      awk '/^pid [0-9]* ready/{print $2; exit}' "$file"
      return 0
    fi
    kill -0 "$waitpid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

{
  echo "# cudamem pause on $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  machine_facts
  echo '```'
  echo
} > "$summary"

echo "==> building pause_job with $nvcc"
mkdir -p "$out/build"
if ! timeout "$step_timeout" "$nvcc" -O2 -arch=sm_90 -o "$out/build/pause_job" "$here/pause_job.cu" -lpthread \
    > "$out/build/nvcc.log" 2>&1; then
  echo "nvcc failed: see build/nvcc.log" | tee -a "$summary"
  exit 1
fi

echo "| case | GPU MiB used before / during pause / after resume | process MiB before / during | pause | resume | result |" >> "$summary"
echo "| --- | --- | --- | --- | --- | --- |" >> "$summary"

# pause_case NAME [VAR=VALUE...] -- COMMAND...
pause_case() {
  local name="$1"
  shift
  split_case "$@"
  local dir="$out/$name"
  mkdir -p "$dir"
  echo "==> $name: unpaused reference"
  env ${case_env[@]+"${case_env[@]}"} timeout "$step_timeout" "${case_command[@]}" > "$dir/reference.out" 2> "$dir/reference.err"
  local expected
  expected="$(checksum_of "$dir/reference.out")"
  echo "==> $name: under cudamem run --pool, paused mid-run"
  env ${case_env[@]+"${case_env[@]}"} timeout "$step_timeout" "$cudamem" run --pool -- "${case_command[@]}" \
    > "$dir/run.out" 2> "$dir/run.err" &
  local runner=$!
  local pid
  if ! pid="$(wait_ready "$dir/run.out" "$runner")"; then
    wait "$runner"
    echo "| $name | - | - | - | - | **never ready** (see $name/run.err) |" >> "$summary"
    failed=1
    return
  fi
  local before pbefore during pduring after t0 t1 t1b t2 prc rrc
  before="$(used_mib)"; pbefore="$(proc_mib "$pid")"
  t0=$(date +%s.%N)
  timeout "$step_timeout" "$cudamem" pause "$pid" > "$dir/pause.log" 2>&1
  prc=$?
  t1=$(date +%s.%N)
  sleep 3
  during="$(used_mib)"; pduring="$(proc_mib "$pid")"
  timeout 60 "$cudamem" ledger "$pid" > "$dir/ledger.log" 2>&1
  t1b=$(date +%s.%N)
  timeout "$step_timeout" "$cudamem" resume "$pid" > "$dir/resume.log" 2>&1
  rrc=$?
  t2=$(date +%s.%N)
  after="$(used_mib)"
  wait "$runner"
  local status=$?
  local got result
  got="$(checksum_of "$dir/run.out")"
  if [ "$prc" -ne 0 ] || [ "$rrc" -ne 0 ] || [ "$status" -ne 0 ]; then
    result="**FAIL** pause $prc resume $rrc exit $status: $(head -c 300 "$dir/pause.log" | tr '\n|' '  ')"
    # Cases named info-* tell what happens where cudamem does not pause
    # (yet); they do not fail the check.
    case "$name" in info-*) ;; *) failed=1 ;; esac
  elif [ -z "$expected" ] || [ "$got" != "$expected" ]; then
    result="**DIFFERENT** $got vs $expected"
    case "$name" in info-*) ;; *) failed=1 ;; esac
  else
    result="identical ($got)"
  fi
  echo "| $name | $before / $during / $after | ${pbefore:-?} / ${pduring:-?} | $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s | $(awk -v a="$t1b" -v b="$t2" 'BEGIN{printf "%.2f", b-a}') s | $result |" >> "$summary"
  {
    echo
    echo "### $name"
    echo '```'
    cat "$dir/pause.log" "$dir/resume.log"
    echo '```'
  } >> "$out/reports.md"
}

pause_case nvcc-16-threads -- "$out/build/pause_job" work 1500 16 256
pause_case torch-default -- "$python" "$here/torch_train.py" 400 default
pause_case info-torch-expandable -- "$python" "$here/torch_train.py" 400 expandable
pause_case cupy -- "$python" "$here/cupy_job.py" 300
pause_case jax XLA_PYTHON_CLIENT_ALLOCATOR=platform -- "$python" "$here/jax_job.py" 300

echo "==> pause and resume time against bytes, and a plain pinned copy"
{
  echo
  echo "Pause and resume against bytes (pause_job hold); copy rates as cudamem measured them:"
  echo
  echo '```'
  timeout "$step_timeout" "$out/build/pause_job" bandwidth 4 2>&1
  echo '```'
  echo
  echo "| GiB | pause s (copy GiB/s) | resume: mapped again in, copied back in (GiB/s) | GPU MiB used during pause | result |"
  echo "| --- | --- | --- | --- | --- |"
} >> "$summary"
for gib in $sizes; do
  dir="$out/hold-$gib"
  mkdir -p "$dir"
  done_file="$dir/done"
  rm -f "$done_file"
  timeout "$step_timeout" "$out/build/pause_job" hold "$gib" "$done_file" > "$dir/reference.out" 2>&1 &
  ref=$!
  wait_ready "$dir/reference.out" "$ref" > /dev/null
  touch "$done_file"; wait "$ref"; rm -f "$done_file"
  timeout "$step_timeout" "$cudamem" run --pool -- "$out/build/pause_job" hold "$gib" "$done_file" \
    > "$dir/run.out" 2> "$dir/run.err" &
  runner=$!
  if ! pid="$(wait_ready "$dir/run.out" "$runner")"; then
    touch "$done_file"; wait "$runner"
    echo "| $gib | never ready | | | **FAIL** |" >> "$summary"; failed=1; continue
  fi
  timeout "$step_timeout" "$cudamem" pause "$pid" > "$dir/pause.log" 2>&1; prc=$?
  during="$(used_mib)"
  timeout "$step_timeout" "$cudamem" resume "$pid" > "$dir/resume.log" 2>&1; rrc=$?
  touch "$done_file"; wait "$runner"; status=$?
  ptime="$(grep -o '[0-9.]* s in all' "$dir/pause.log" | head -1)"
  prate="$(grep -o 'copied to pinned host memory in [0-9.]* s ([^)]*)' "$dir/pause.log" | grep -o '([^)]*)' | head -1)"
  rtime="$(grep -o 'in [0-9.]* s, [0-9.]* [KMGT]*i*B copied back in [0-9.]* s ([^)]*)' "$dir/resume.log" | head -1)"
  if [ "$prc" -eq 0 ] && [ "$rrc" -eq 0 ] && [ "$status" -eq 0 ] \
      && [ "$(checksum_of "$dir/run.out")" = "$(checksum_of "$dir/reference.out")" ]; then
    result="identical"
  else
    result="**FAIL** pause $prc resume $rrc exit $status"; failed=1
  fi
  echo "| $gib | $ptime $prate | $rtime | $during | $result |" >> "$summary"
done

cat "$summary"
exit $failed
