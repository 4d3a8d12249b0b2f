#!/usr/bin/env bash
# Why memory served by `cudamem run --pool` can fail on a real GPU: probe.cu
# (one allocation, one kernel, one synchronize) alone and under the pool,
# by size and by the thread that makes the first allocation; then the same
# under compute-sanitizer, and PyTorch's smallest case. Each case's output
# and its event log go to OUTDIR.
#
# usage: probe.sh BUNDLE OUTDIR   (NVCC, PYTHON as in scripts/lib/check.sh)
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../lib/check.sh"
bundle_args "$@"
mkdir -p "$out/build"
if ! timeout 300 "$nvcc" -O2 -arch=sm_90 -o "$out/build/probe" "$here/probe.cu" -lpthread > "$out/build/nvcc.log" 2>&1; then
  echo "nvcc failed: see build/nvcc.log" | tee -a "$summary"
  exit 1
fi
probe="$out/build/probe"
echo "| case | alone | under --pool |" > "$summary"
echo "| --- | --- | --- |" >> "$summary"
for size in 1 2 4 31 32 33 64 256; do
  for where in main thread; do
    name="probe-$size-$where"
    alone="$(timeout 60 "$probe" "$size" "$where" 2>&1 | tail -1)"
    pooled="$(timeout 60 "$cudamem" run --pool --trace "$out/$name.trace" -- "$probe" "$size" "$where" 2> "$out/$name.err" | tail -1)"
    echo "| $size MiB, $where | $alone | $pooled |" >> "$summary"
  done
done
# The pool without cudamem run (the interposer preloaded with serving on),
# so a fault is not hidden by the recorder.
for size in 4 256; do
  echo "| preload only, $size MiB | | $(CUDAMEM_POOL=stitch LD_PRELOAD="$bundle/bin/libcudamem_interpose.so" timeout 60 "$probe" "$size" main 2>&1 | tail -1) |" >> "$summary"
done
if command -v compute-sanitizer > /dev/null 2>&1 || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  CUDAMEM_POOL=stitch timeout 120 "$sanitizer" --target-processes all \
    env LD_PRELOAD="$bundle/bin/libcudamem_interpose.so" "$probe" 256 main > "$out/sanitizer.log" 2>&1
  echo "sanitizer exit $?" >> "$out/sanitizer.log"
fi
timeout 120 "$cudamem" run --pool --trace "$out/torch.trace" -- "$python" -c \
  'import torch; x = torch.ones(1 << 20, device="cuda"); torch.cuda.synchronize(); print("ok", float(x.sum()))' \
  > "$out/torch.out" 2> "$out/torch.err"
echo "| torch.ones(1M) | | $(tail -1 "$out/torch.out") $(tail -2 "$out/torch.err" | tr '\n' ' ') |" >> "$summary"
cat "$summary"
