#!/usr/bin/env bash
# Check the pytorch-expandable model against PyTorch's own figures: for each
# full-scale snapshot, the model's peak footprint beside the
# max_memory_reserved PyTorch reported in the same process (the .json
# beside the snapshot). Needs a snapshot reader that reads the real files.
# Usage: scripts/stitch/expandable_check.sh [CUDAMEM] (default: target/release/cudamem)
set -euo pipefail
cudamem=${1:-target/release/cudamem}
printf '%-44s %14s %14s %8s\n' snapshot model_bytes pytorch_bytes model/pt
for snapshot in traces/pytorch/*.full.*.pickle.gz; do
  figures=${snapshot%.pickle.gz}.json
  "$cudamem" replay --json --policy pytorch-expandable "$snapshot" |
    python3 -c '
import json, sys
pytorch = json.load(open(sys.argv[2]))["max_memory_reserved"]
for line in sys.stdin:
    t = json.loads(line); model = t["policies"][0]["peak_footprint_bytes"]
    print("%-44s %14d %14d %8.3f" % (t["trace"], model, pytorch, model / pytorch))' "$snapshot" "$figures"
done
