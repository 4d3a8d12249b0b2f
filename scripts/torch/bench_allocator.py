"""PyTorch's allocators against cudamem's pool on real workloads (workloads.py).

Run on a GPU machine with PyTorch, transformers, torchvision and nvidia-ml-py, with
libcudamem_torch.so built for it (see README, "Use it from PyTorch"):

    python3 scripts/torch/bench_allocator.py --lib path/to/libcudamem_torch.so --out OUTDIR
    python3 scripts/torch/bench_allocator.py --lib ... --explain gpt2_train

For each workload, four fresh processes one after another, same seeds: PyTorch's
default allocator, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and cudamem
(cudamem_torch.install first) with CUDAMEM_POLICY=tlsf and =stitch. Each reports the
peak device memory the process used (NVML used bytes sampled every ~1 ms in a
background thread, minus the used bytes right after the context was created; the GPU
must not be shared), PyTorch's own max_memory_reserved / memory_reserved /
max_memory_allocated (answered by cudamem under cudamem, which must report the pool's
peak mapped bytes exactly: `reserved = pool` in the table), the checksum (must equal
the default run's) and the step time. --repeat N runs the workload N times in the
process (the first warms up when N > 1): a run's step time is the mean of its steps
but the first (which builds the model), and the figure reported is the median over
the repeats; every repeat must give the same checksum. --rounds R starts R processes
per mode, the modes taking turns (default, expandable, tlsf, stitch, default, ...):
the step time is then the median over the processes, the peak their largest (a
process's step time moves by tens of percent from one process or machine to the
next, the peak does not).
A run that fails or passes --timeout seconds is reported and the others go on.
Prints a table after each workload (the last one is complete) and the verdict of
the default-policy rule: stitch where its peak is at most expandable segments' on
every workload and its step time within 1.02 x the default allocator's, else tlsf.
Writes OUTDIR/NAME.MODE.json and OUTDIR/summary.json.
--explain NAME runs one workload under cudamem and prints explain() at the end.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from nvml_peaks import PeakSampler

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODES = ("default", "expandable", "tlsf", "stitch")
CUDAMEM_MODES = ("tlsf", "stitch")


# The rule that picks the default policy from a benchmark: the stitched pool when, on
# every workload, its peak is at most expandable segments' and its step time at most
# this many times the default allocator's.
STEP_TIME_GOAL = 1.02


def child(name, mode, lib, out, explain, repeat):
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(REPO, "python"))
    if mode in CUDAMEM_MODES:
        import cudamem_torch

        cudamem_torch.install(lib)
    import torch
    import workloads

    torch.cuda.init()
    torch.cuda.synchronize()  # the context exists now
    sampler = PeakSampler([0])
    baseline = sampler.used()[0]
    sampler.start()
    start = time.perf_counter()
    checksums, means, steps = [], [], 0

    def driver_calls():
        # cudamem: the pool's driver calls that took or gave memory; PyTorch's own
        # allocators: its device allocations and frees (cudaMalloc/cudaFree, or maps).
        if mode in CUDAMEM_MODES:
            return cudamem_torch.stats(0)["memory_driver_calls"]
        s = torch.cuda.memory_stats()
        return s.get("num_device_alloc", 0) + s.get("num_device_free", 0)

    warm_calls = None
    for index in range(max(1, repeat)):
        if index == 1:
            warm_calls = driver_calls()  # steady state: every repeat after the first
        times = []
        checksum, _, steps = workloads.run(name, "full", times)
        checksums.append(checksum)
        steady = times[1:] or times
        means.append(sum(steady) / len(steady) if steady else 0.0)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    peak = sampler.stop()[0]
    timed = sorted(means[1:] or means)
    result = {
        "workload": name,
        "mode": mode,
        "checksum": checksums[0],
        "checksums_agree": all(c == checksums[0] for c in checksums),
        "median_step_s": timed[len(timed) // 2],
        "spread_step_s": [timed[0], timed[-1]],
        "steady_driver_calls": None if warm_calls is None else driver_calls() - warm_calls,
        "repeat_step_s": means,
        "steps": steps,
        "wall_s": wall,
        "used_after_context": baseline,
        "peak_used": peak,
        "peak_process_bytes": peak - baseline,
        "samples": sampler.samples,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    result["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    result["memory_reserved"] = torch.cuda.memory_reserved()
    result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    if mode in CUDAMEM_MODES:
        result["allocator"] = torch.cuda.memory.get_allocator_backend()
        pool = cudamem_torch.stats(0)
        result["cudamem"] = pool
        result["reserved_equals_pool_peak"] = result["max_memory_reserved"] == pool["peak_mapped_bytes"]
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    if explain:
        cudamem_torch.explain(0)


def run_one(name, mode, args, round_=0):
    out = os.path.join(args.out, "%s.%s.json" % (name, mode) if round_ == 0 else
                       "%s.%s.round%d.json" % (name, mode, round_))
    if os.path.exists(out):
        os.remove(out)
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("CUDAMEM_POLICY", None)
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if mode in CUDAMEM_MODES:
        env["CUDAMEM_POLICY"] = mode
    command = [sys.executable, os.path.abspath(__file__), "--child", name, mode,
               "--lib", args.lib or "", "--json", out, "--repeat", str(args.repeat)]
    if args.explain:
        command.append("--print-explain")
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env, timeout=args.timeout,
                              capture_output=not args.explain, text=True)
    except subprocess.TimeoutExpired:
        return {"workload": name, "mode": mode, "error": "timed out after %d s" % args.timeout}
    if proc.returncode != 0 or not os.path.exists(out):
        tail = ((proc.stderr or "") + (proc.stdout or ""))[-2000:]
        return {"workload": name, "mode": mode,
                "error": "exit %d after %.1f s: %s" % (proc.returncode, time.perf_counter() - started, tail)}
    with open(out) as f:
        return json.load(f)


def mib(value):
    return "-" if value is None else "%.0f" % (value / 2**20)


def table(results):
    rows = ["%-20s %-10s %10s %10s %10s %10s %8s %13s %9s %9s %7s %s" % (
        "workload", "mode", "peak MiB", "reserved", "allocated", "pool peak",
        "step ms", "spread ms", "x default", "vs expand", "drv/ss", "checksum")]
    for name in sorted({r["workload"] for r in results}):
        by_mode = {r["mode"]: r for r in results if r["workload"] == name}
        base = by_mode.get("default", {})
        expandable = by_mode.get("expandable", {})
        for mode in MODES:
            r = by_mode.get(mode)
            if r is None:
                continue
            if "error" in r:
                rows.append("%-20s %-10s FAILED: %s" % (name, mode, r["error"].splitlines()[-1] if r["error"] else ""))
                continue
            pool = r.get("cudamem", {})
            ratio = (r["median_step_s"] / base["median_step_s"]) if base.get("median_step_s") else None
            vs_expandable = (r["peak_process_bytes"] / expandable["peak_process_bytes"]
                             if expandable.get("peak_process_bytes") else None)
            same = "base" if mode == "default" else (
                "same" if base.get("checksum") == r["checksum"] else
                "DIFFERS (%r vs %r)" % (r["checksum"], base.get("checksum")))
            if not r.get("checksums_agree", True):
                same += "; REPEATS DIFFER"
            if mode in CUDAMEM_MODES:
                same += "; reserved = pool" if r.get("reserved_equals_pool_peak") else (
                    "; RESERVED %s != POOL PEAK %s" % (r.get("max_memory_reserved"), pool.get("peak_mapped_bytes")))
            spread = r.get("spread_step_s") or [r["median_step_s"]] * 2
            calls = r.get("steady_driver_calls")
            rows.append("%-20s %-10s %10s %10s %10s %10s %8.2f %13s %9s %9s %7s %s" % (
                name, mode, mib(r["peak_process_bytes"]), mib(r.get("max_memory_reserved")),
                mib(r.get("max_memory_allocated")), mib(pool.get("peak_mapped_bytes")),
                r["median_step_s"] * 1e3, "%.2f-%.2f" % (spread[0] * 1e3, spread[1] * 1e3),
                "-" if ratio is None else "%.3f" % ratio,
                "-" if vs_expandable is None else "%.3f" % vs_expandable,
                "-" if calls is None else str(calls), same))
    return "\n".join(rows)


def merge_rounds(runs):
    """One result for a mode's processes: the first good run's figures, the step time
    the median of the runs' (each already a median over its repeats), the peak the
    largest; an error only when every run failed."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    merged = dict(good[0])
    steps = sorted(r["median_step_s"] for r in good)
    merged["median_step_s"] = steps[len(steps) // 2]
    merged["round_step_s"] = [r["median_step_s"] for r in good]
    merged["peak_process_bytes"] = max(r["peak_process_bytes"] for r in good)
    merged["checksums_agree"] = all(r.get("checksums_agree", True) and r["checksum"] == good[0]["checksum"]
                                    for r in good)
    merged["rounds"] = len(good)
    merged["failed_rounds"] = len(runs) - len(good)
    return merged


def verdict(results):
    """The default-policy rule on `results`: (policy, one line per workload why)."""
    lines, stitch_wins = [], True
    for name in sorted({r["workload"] for r in results}):
        by_mode = {r["mode"]: r for r in results if r["workload"] == name and "error" not in r}
        need = ("default", "expandable", "stitch")
        if not all(m in by_mode for m in need):
            lines.append("%s: not decided (missing %s)" % (
                name, ", ".join(m for m in need if m not in by_mode)))
            stitch_wins = False
            continue
        stitch, expandable, base = by_mode["stitch"], by_mode["expandable"], by_mode["default"]
        memory = stitch["peak_process_bytes"] <= expandable["peak_process_bytes"]
        ratio = stitch["median_step_s"] / base["median_step_s"] if base["median_step_s"] else float("inf")
        fast = ratio <= STEP_TIME_GOAL
        stitch_wins = stitch_wins and memory and fast
        lines.append("%s: stitch peak %s MiB vs expandable %s MiB (%s); step %.3f x default (%s)" % (
            name, mib(stitch["peak_process_bytes"]), mib(expandable["peak_process_bytes"]),
            "ok" if memory else "MORE", ratio, "ok" if fast else "SLOWER"))
    return ("stitch" if stitch_wins and lines else "tlsf"), lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="libcudamem_torch.so (default: cudamem_torch.find_library)")
    parser.add_argument("--out", default="bench-allocator", help="output folder")
    parser.add_argument("--only", nargs="*", help="workloads to run (default: all)")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--timeout", type=int, default=120, help="seconds per run")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of the workload per process (the first warms up when more than 1)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="processes per mode, the modes taking turns; the step time is "
                             "the median over them")
    parser.add_argument("--explain", metavar="NAME", help="run NAME under cudamem (stitch) and print explain()")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--print-explain", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.lib or None, args.json, args.print_explain, args.repeat)
        return 0
    os.makedirs(args.out, exist_ok=True)
    if args.explain:
        r = run_one(args.explain, "stitch", args)
        print(json.dumps(r, indent=1))
        return 0 if "error" not in r else 1
    sys.path.insert(0, HERE)
    import workloads  # noqa: E402  (names only; the runs are in children)

    names = args.only or list(workloads.WORKLOADS)
    results = []
    for name in names:
        rounds = {mode: [] for mode in args.modes}
        # Modes take turns round by round, so that a drift of the machine's speed falls
        # on every mode alike.
        for round_ in range(max(1, args.rounds)):
            for mode in args.modes:
                r = run_one(name, mode, args, round_)
                if "error" in r:
                    print("%s / %s failed: %s" % (name, mode, r["error"]), file=sys.stderr, flush=True)
                else:
                    print("%s / %s: peak %s MiB, %.2f ms/step" % (
                        name, mode, mib(r["peak_process_bytes"]), r["median_step_s"] * 1e3), flush=True)
                rounds[mode].append(r)
        for mode in args.modes:
            results.append(merge_rounds(rounds[mode]))
        # After every workload, so that a run cut short still leaves its table.
        print(table(results), flush=True)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(results, f, indent=1)
    policy, why = verdict(results)
    print("default policy by the rule: %s" % policy)
    for line in why:
        print("  " + line)
    mismatched = [r for r in results if r.get("mode") in CUDAMEM_MODES and "error" not in r
                  and not r.get("reserved_equals_pool_peak")]
    for r in mismatched:
        print("%s / %s: max_memory_reserved() is not the pool's peak mapped bytes" % (
            r["workload"], r["mode"]), file=sys.stderr)
    return 1 if mismatched or any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
