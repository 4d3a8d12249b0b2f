#!/usr/bin/env bash
# The stitch policy's trade-off curve: footprint / peak live against modeled
# driver time / trace duration and the share of live bytes at the peak in
# handles of 32 MiB or more, over large-handle sizes and idle-cache sizes.
# Usage: scripts/stitch/sweep.sh [CUDAMEM] (default: target/release/cudamem)
set -euo pipefail
cudamem=${1:-target/release/cudamem}
traces=(traces/rmm/resnet50_train.csv.gz traces/rmm/llama_generate.csv.gz)
printf '%-8s %-10s %-9s %-24s %7s %9s %8s\n' large keep_idle aligned trace ratio drv/time '>=32MiB'
for large in 0 32MiB 64MiB; do
  for keep in 0 256MiB 1GiB 4GiB 1TiB; do
    for align in aligned unaligned; do
      flag=(); [ "$align" = unaligned ] && flag=(--stitch-unaligned)
      "$cudamem" replay --json --policy stitch --stitch-large "$large" \
        --stitch-keep-idle "$keep" "${flag[@]}" "${traces[@]}" |
        python3 -c '
import json, sys
for line in sys.stdin:
    t = json.loads(line); p = t["policies"][0]
    print("%-8s %-10s %-9s %-24s %7.3f %8.2f%% %7.1f%%" % (sys.argv[1], sys.argv[2], sys.argv[3],
        t["trace"], p["footprint_ratio"], 100 * p.get("driver_time_share", 0),
        100 * p.get("full_bandwidth_share", 0)))' "$large" "$keep" "$align"
    done
  done
done
