#!/usr/bin/env bash
# The interposer's cost per call as threads are added, on this machine's
# cores: cudaMalloc+cudaFree pairs of 256 B through the fake runtime and
# driver (interpose/fixtures), bare, preloaded, and preloaded with a log
# (what `cudamem run` does), on 1, 2, 4, 8 and 16 threads, rounds
# interleaved. Each thread makes PAIRS pairs (default 100000).
# One line per run: KIND THREADS WALL_NS CPU_NS (per pair, per thread);
# contention.md: the fastest and the median of the rounds.
#
# usage: contention.sh BUNDLE OUTDIR   (ROUNDS, default 5; THREADS)
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../lib/check.sh"
bundle_args "$@"
rounds="${ROUNDS:-5}"
pairs="${PAIRS:-100000}"
threads_list="${THREADS:-1 2 4 8 16}"
lib="$bundle/bin/libcudamem_interpose.so"
if ! sh "$bundle/fixtures/build.sh" "$out/fixtures" > "$out/fixtures.log" 2>&1; then
  echo "the fake driver did not build: see fixtures.log" >&2
  exit 1
fi
bench() { LD_LIBRARY_PATH="$out/fixtures" FAKE_CUDA_PER_THREAD=1 "$@" "$out/fixtures/cuda_runtime" bench "$((pairs * threads))" "$threads"; }
log="$out/contention.log"
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "cores: $(nproc)"
  echo "clock source: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null || echo unknown)"
} > "$log"
for round in $(seq "$rounds"); do
  for threads in $threads_list; do
    echo "bare $threads $(bench env)" >> "$log"
    echo "preloaded $threads $(bench env LD_PRELOAD="$lib")" >> "$log"
    rm -rf "$out/logs"; mkdir -p "$out/logs"
    echo "logged $threads $(bench env LD_PRELOAD="$lib" CUDAMEM_HOOK_DIR="$out/logs")" >> "$log"
  done
done
rm -rf "$out/logs"
# Fastest and median of the rounds, and what each thread adds per call
# over bare (the median of a kind against bare's median). One thread's
# logged runs spread widely between runs on some machines (most likely
# the kernel's page-cache work for the log), and the fastest of them is a
# low no run of 16 threads reaches on every thread at once: the median
# says the typical.
awk '/^(bare|preloaded|logged) / {
  key = $1 " " $2
  if (!(key in wall) || $3 < wall[key]) { wall[key] = $3; cpu[key] = $4 }
  n[key]++; runs[key, n[key]] = $3
}
function median(key,    i, j, v, count, sorted) {
  count = n[key]
  for (i = 1; i <= count; i++) sorted[i] = runs[key, i]
  for (i = 2; i <= count; i++) {
    v = sorted[i]
    for (j = i - 1; j >= 1 && sorted[j] > v; j--) sorted[j + 1] = sorted[j]
    sorted[j + 1] = v
  }
  return count % 2 ? sorted[(count + 1) / 2] : (sorted[count / 2] + sorted[count / 2 + 1]) / 2
}
END {
  printf "%-10s %7s %12s %12s %14s %14s %12s %14s %14s\n", "kind", "threads", "wall ns", "cpu ns", "added/call", "x 1 thread", "median ns", "median added", "median x 1"
  split("preloaded logged", kinds, " ")
  m = split("'"$threads_list"'", ts, " ")
  for (i = 1; i <= m; i++) printf "%-10s %7d %12.1f %12.1f %14s %14s %12.1f\n", "bare", ts[i], wall["bare " ts[i]], cpu["bare " ts[i]], "", "", median("bare " ts[i])
  for (k = 1; k <= 2; k++) for (i = 1; i <= m; i++) {
    key = kinds[k] " " ts[i]
    added = (wall[key] - wall["bare " ts[i]]) / 2
    one = (wall[kinds[k] " 1"] - wall["bare 1"]) / 2
    madded = (median(key) - median("bare " ts[i])) / 2
    mone = (median(kinds[k] " 1") - median("bare 1")) / 2
    printf "%-10s %7d %12.1f %12.1f %14.1f %14.2f %12.1f %14.1f %14.2f\n", kinds[k], ts[i], wall[key], cpu[key], added, added / one, median(key), madded, madded / mone
  }
}' "$log" | tee "$out/contention.md"
