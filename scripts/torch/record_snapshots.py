"""Record PyTorch memory snapshots of real workloads, with PyTorch's own figures.

Run on a GPU machine with PyTorch (and transformers, torchvision):

    python3 scripts/torch/record_snapshots.py OUTDIR [--only NAME ...]

For each workload in workloads.py it starts fresh processes:
  - fixture: a few steps, Python stack frames on, for the test suite;
  - full: the long run, no frames (small pickles, the allocator's steady state);
  - full under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
Each writes NAME.SCALE.CONF.pickle.gz and a JSON of what PyTorch said in the
same process (max_memory_allocated, max_memory_reserved, step time, checksum).
Recording starts before the first CUDA allocation, so the trace is complete and
its reserved peak can be checked against max_memory_reserved exactly.
"""

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))


def child(name, scale, conf, stacks, out):
    import torch

    sys.path.insert(0, HERE)
    import workloads

    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    if stacks == "none":
        torch.cuda.memory._record_memory_history(context=None, max_entries=10_000_000)
    else:
        torch.cuda.memory._record_memory_history(stacks=stacks, max_entries=10_000_000)
    start = time.perf_counter()
    checksum, step_s, steps = workloads.run(name, scale)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    figures = {
        "workload": name,
        "scale": scale,
        "alloc_conf": conf,
        "stacks": stacks,
        "checksum": checksum,
        "median_step_s": step_s,
        "steps": steps,
        "wall_s": wall,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "memory_allocated_at_dump": torch.cuda.memory_allocated(),
        "memory_reserved_at_dump": torch.cuda.memory_reserved(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    t = time.perf_counter()
    snap = torch.cuda.memory._snapshot()
    figures["entries"] = sum(len(d) for d in snap["device_traces"])
    with gzip.open(out + ".pickle.gz", "wb", compresslevel=9) as f:
        pickle.dump(snap, f)
    figures["dump_s"] = time.perf_counter() - t
    with open(out + ".json", "w") as f:
        json.dump(figures, f, indent=1)
    print(json.dumps(figures))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--child", nargs=5)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    sys.path.insert(0, HERE)
    import workloads

    os.makedirs(args.outdir, exist_ok=True)
    runs = []
    for name in args.only or list(workloads.WORKLOADS):
        # One fixture at PyTorch's defaults (Python and C++ frames), the rest Python frames.
        stacks = "all" if name == "vit_infer" else "python"
        runs.append((name, "fixture", "default", stacks))
        runs.append((name, "full", "default", "none"))
        runs.append((name, "full", "expandable", "none"))

    def launch(run):
        name, scale, conf, stacks = run
        out = os.path.join(args.outdir, f"{name}.{scale}.{conf}")
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        t = time.perf_counter()
        with open(out + ".log", "w") as log:
            proc = subprocess.run(
                [sys.executable, __file__, args.outdir, "--child", name, scale, conf, stacks, out],
                env=env, stdout=log, stderr=subprocess.STDOUT, timeout=420,
            )
        print(f"{name} {scale} {conf}: exit {proc.returncode} in {time.perf_counter() - t:.0f} s", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(launch, runs))


if __name__ == "__main__":
    main()
