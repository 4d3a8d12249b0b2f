#!/usr/bin/env bash
# The stitch policy's trade-off curve over every trace in traces/: for each
# configuration (large-handle size, budget slack, large-handle overshoot,
# growth with nothing idle in large handles or pages, alignment of large
# requests), how many traces meet each stitching goal
# (footprint <= 1.03 x peak live, modeled driver time <= 1% of the trace's
# recorded duration, >= 90% of live bytes at the peak in >= 32 MiB handles)
# and the worst figure of each. PyTorch's expandable segments (the model)
# is the first row, for reference.
# Usage: scripts/stitch/sweep.sh [CUDAMEM] [--detail]
#   CUDAMEM  the binary (default: target/release/cudamem)
#   --detail also print every trace's figures under the default configuration
set -euo pipefail
cudamem=${1:-target/release/cudamem}
detail=${2:-}
traces=(traces/pytorch/*.pickle.gz traces/rmm/*.csv.gz)
summarize='
import json, sys
label = sys.argv[1]
rows = []
for line in sys.stdin:
    t = json.loads(line); p = t["policies"][0]
    rows.append((t["trace"], p["footprint_ratio"], p.get("driver_time_share") or 0.0,
                 p.get("full_bandwidth_share")))
if sys.argv[2] == "detail":
    for name, ratio, drv, share in rows:
        print("  %-52s %7.3f %8.2f%% %8s" % (name, ratio, 100 * drv,
              "-" if share is None else "%.1f%%" % (100 * share)))
    sys.exit()
f = sum(r[1] <= 1.03 for r in rows); d = sum(r[2] <= 0.01 for r in rows)
s = sum((r[3] or 0) >= 0.9 for r in rows)
a = sum(r[1] <= 1.03 and r[2] <= 0.01 and (r[3] or 0) >= 0.9 for r in rows)
shares = [r[3] for r in rows if r[3] is not None]
print("%-52s %2d/%d %2d/%d %2d/%d %2d/%d   %6.3f %7.2f%% %7s" % (label, f, len(rows), d, len(rows),
      s, len(rows), a, len(rows), max(r[1] for r in rows), 100 * max(r[2] for r in rows),
      "%.1f%%" % (100 * min(shares)) if shares else "-"))
'
printf '%-52s %5s %5s %5s %5s   %6s %8s %7s\n' config 'F<=1.03' 'D<=1%' 'S>=90%' all worstF worstD worstS
"$cudamem" replay --json --policy pytorch-expandable "${traces[@]}" |
  python3 -c "$summarize" pytorch-expandable summary
for large in 32MiB 64MiB; do
  for slack in 0 10 20 30 100; do
    for overshoot in 0 1000; do
      for grow in large pages; do
        for align in no yes; do
          flags=(--stitch-large "$large" --stitch-slack "$slack" --stitch-overshoot "$overshoot")
          [ "$grow" = pages ] && flags+=(--stitch-grow-pages)
          [ "$align" = yes ] && flags+=(--stitch-align-large)
          label="stitch $large slack=$slack over=$overshoot grow=$grow align=$align"
          "$cudamem" replay --json --policy stitch "${flags[@]}" "${traces[@]}" |
            python3 -c "$summarize" "$label" summary
        done
      done
    done
  done
done
if [ "$detail" = --detail ]; then
  echo "default configuration, per trace: footprint ratio, driver time / duration, share in >= 32 MiB"
  "$cudamem" replay --json --policy stitch "${traces[@]}" | python3 -c "$summarize" default detail
  echo "pytorch-expandable, per trace"
  "$cudamem" replay --json --policy pytorch-expandable "${traces[@]}" | python3 -c "$summarize" expandable detail
fi
