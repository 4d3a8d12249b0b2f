# Shared by the GPU checks (scripts/*/gpu_check.sh) and a bundle's run.sh;
# sourced, never run.

# bundle_args BUNDLE OUTDIR: the arguments of a check run from a bundle made
# by `cargo xtask gpu-bundle`. Sets bundle and out (made if missing), both
# absolute, here (the calling script's folder), cudamem (the bundle's
# command), python (PYTHON, default
# /opt/torch/.venv/bin/python3), nvcc (NVCC, default nvcc on the PATH, else
# /usr/local/cuda/bin/nvcc), summary (OUTDIR/summary.md) and failed=0. Wrong
# arguments: usage, exit 2.
bundle_args() {
  if [ $# -ne 2 ]; then
    echo "usage: gpu_check.sh BUNDLE OUTDIR" >&2
    exit 2
  fi
  bundle="$(cd "$1" && pwd)"
  mkdir -p "$2"
  out="$(cd "$2" && pwd)"
  here="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
  cudamem="$bundle/bin/cudamem"
  python="${PYTHON:-/opt/torch/.venv/bin/python3}"
  nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
  summary="$out/summary.md"
  failed=0
}

# split_case VAR=VALUE... -- COMMAND...: a case's arguments, its settings
# into the array case_env, its command into case_command.
split_case() {
  case_env=()
  while [ "$1" != "--" ]; do case_env+=("$1"); shift; done
  shift
  case_command=("$@")
}

# gpu_facts: the GPU's name, driver and memory on one line, or why not.
gpu_facts() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 \
    || echo "nvidia-smi failed"
}

# machine_facts: gpu_facts, then the CUDA compiler's version.
machine_facts() {
  gpu_facts
  "$nvcc" --version 2>&1 | tail -1
}

# table_head FIRST: the head of a table of `record` rows, FIRST naming its
# first column.
table_head() {
  echo "| $1 | result | seconds | log |"
  echo "| --- | --- | --- | --- |"
}

# record NAME EXIT-STATUS SECONDS LOG: one row of the table in $summary;
# a non-zero status sets failed=1.
record() {
  local result=PASS
  if [ "$2" -ne 0 ]; then
    result="FAIL (exit $2)"
    failed=1
  fi
  echo "| $1 | $result | $3 | $4 |" >> "$summary"
}
