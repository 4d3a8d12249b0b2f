"""What one traced run recorded, counted: records by kind, allocations and
frees by call and calling library (with bytes), module records by call, and
the memory taken by module loads and first launches. For finding which
calls a program makes most, and what the ledger's lines rest on.

    python3 events_summary.py TRACE.csv.events     (the folder of per-process logs)"""

import collections
import os
import sys

folder = sys.argv[1]
kinds = collections.Counter()
allocs = collections.Counter()
alloc_bytes = collections.Counter()
modules = collections.Counter()
module_bytes = collections.Counter()
libraries = {}
for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), "rb") as log:
        # Each thread writes chunks of its own; the unused tail of a chunk
        # is zeros, never part of a record. Order does not matter here.
        text = log.read().replace(b"\0", b"").decode("utf-8", "replace")
    for line in text.splitlines():
        fields = line.split("\t")
        kinds[fields[0]] += 1
        if fields[0] == "library" and len(fields) > 4:
            libraries[fields[3]] = os.path.basename(fields[4])
        elif fields[0] == "alloc" and len(fields) > 8:
            key = (fields[3], fields[7])
            allocs[key] += 1
            if fields[8] == "0":
                alloc_bytes[key] += int(fields[5])
        elif fields[0] == "free" and len(fields) > 6:
            allocs[(fields[3], fields[6])] += 1
        elif fields[0] in ("module", "launch") and len(fields) > 6:
            call = fields[3]
            modules[(fields[0], call)] += 1
            before, after = (fields[5], fields[6]) if fields[0] == "module" else (fields[8], fields[9])
            if before.isdigit() and after.isdigit():
                module_bytes[(fields[0], call)] += max(0, int(before) - int(after))

print("records: " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()))
print("allocation calls by caller (count, bytes allocated):")
for (call, caller), n in allocs.most_common(12):
    print(f"  {call:<24} {libraries.get(caller, caller):<40} {n:>8} {alloc_bytes[(call, caller)] / 2**20:>10.1f} MiB")
print("module and first-launch records (count, free memory taken):")
for (kind, call), n in modules.most_common(12):
    print(f"  {kind:<8} {call:<24} {n:>8} {module_bytes[(kind, call)] / 2**20:>10.1f} MiB")
