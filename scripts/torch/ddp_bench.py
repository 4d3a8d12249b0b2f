"""PyTorch DistributedDataParallel on two GPUs: PyTorch's allocators against cudamem's.

Run on a machine with 2 GPUs, PyTorch, transformers and nvidia-ml-py, with
libcudamem_torch.so built for it (README, "Use it from PyTorch"):

    python3 scripts/torch/ddp_bench.py --lib path/to/libcudamem_torch.so --out OUTDIR

Each mode is a fresh `torchrun --standalone --nproc_per_node W` launch of this file
(W = --world, 2 by default; NCCL, one GPU per rank, rank r on cuda:r) training a GPT-2 (transformers config, no
weights downloaded) with AdamW on random tokens: fixed seeds, sequence lengths and
batches that vary per step (the same on both ranks), different tokens per rank.

Modes: `default` (PyTorch's caching allocator), `default_again` (the same launch a
second time: PyTorch's own run-to-run spread), `expandable`
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), `tlsf` and `stitch` (each rank
calls cudamem_torch.install(lib) before its first CUDA tensor, with CUDAMEM_POLICY set
to the mode; the library serves that rank's device from its own pool) and `cudamem`
(the same with CUDAMEM_POLICY unset: the library's default policy). Deterministic algorithms are on in every mode
(torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8) unless
--nondeterministic.

Per mode: rank 0's loss at every step; peak memory per GPU (NVML used bytes of each
device sampled every ~1 ms by this launcher, minus the used bytes before the launch;
the GPUs must not be shared); the step time: --shapes distinct (length, batch) shapes
are cycled over --steps steps, and the step time is rank 0's mean over the steps after
the first cycle (each step ends with a synchronizing loss.item()), so every mode times
the same warm shapes (the median is kept in the JSON too); PyTorch's max_memory_reserved /
max_memory_allocated per rank (its own allocators) or cudamem_stats per rank (ours).

Loss comparison: `max_rel` is the largest |loss - default loss| / |default loss| over
all steps. A mode is `identical` when every loss is bit-equal to the default's,
`within spread` when its max_rel is at most PyTorch's own spread (the larger of
default_again's and expandable's max_rel, or 1e-6 when both are 0), else `DIFFERS`.

Also the mode `twogpu`: one plain process (no torchrun) with cudamem serving both GPUs
(CUDAMEM_PEERS=all): tensors on cuda:0 and cuda:1, a copy between them both ways, a
matmul on each, checksums compared with the same work on the CPU, cudamem_stats of
both devices (each must show its own allocations, and peer grants: every mapping of
each pool is granted to the other GPU).

Goals, checked in the table's last lines for each cudamem mode run: the losses
identical to the default's (or within PyTorch's own spread), the peak memory on each
GPU at most expandable segments', the step time at most 1.02 x the default's. Rank
0's losses of every mode are printed in full precision (repr) after the table.

On one GPU: --world 1 runs every mode as one rank (NCCL refuses two ranks on one
device), which checks the backend under DDP and the losses' determinism, not the
traffic between GPUs; `twogpu` needs two.

Time: five launches, each a Python start, NCCL set-up and --steps (40) steps of a small
GPT-2 (6 layers, 768 wide, 12 heads; batches of 2-8 sequences of 32-1024 tokens):
meant to take well under a minute each on two H200s, a few minutes in all (not yet
timed on the GPUs).

Every environment started here keeps NVLink multicast off: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1. A launch past --timeout
seconds (120) is killed with its process group and reported; the others go on.
Prints a table; writes OUTDIR/MODE.rankR.json, OUTDIR/MODE.log (each launch's output),
OUTDIR/twogpu.json, OUTDIR/summary.json and the table as OUTDIR/summary.txt.
--dry-run exercises the launcher's comparison and reporting on made-up results
(no GPU, no torch): it checks this script, not the allocator.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from nvml_peaks import PeakSampler

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DDP_MODES = ("default", "default_again", "expandable", "tlsf", "stitch", "cudamem")
CUDAMEM_MODES = ("tlsf", "stitch", "cudamem")
ALL_MODES = DDP_MODES + ("twogpu",)
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


# ---------------------------------------------------------------- launcher side


def environment(mode, args):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(NO_MULTICAST)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's device r is NVML's device r
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if not args.nondeterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.pop("CUDAMEM_POLICY", None)
    if mode in ("tlsf", "stitch"):
        env["CUDAMEM_POLICY"] = mode
    if mode == "twogpu":
        env["CUDAMEM_PEERS"] = "all"
    env["PYTHONPATH"] = os.pathsep.join(
        [HERE, os.path.join(REPO, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def worker_args(args):
    extra = ["--lib", args.lib or "", "--steps", str(args.steps), "--shapes", str(args.shapes),
             "--out", os.path.abspath(args.out)]
    if args.nondeterministic:
        extra.append("--nondeterministic")
    return extra


def launch(mode, args):
    """One fresh launch of `mode`; returns its result dict (or one with "error")."""
    outs = ([os.path.join(args.out, "twogpu.json")] if mode == "twogpu" else
            [os.path.join(args.out, "%s.rank%d.json" % (mode, r)) for r in range(args.world)])
    for out in outs:
        if os.path.exists(out):
            os.remove(out)
    if mode == "twogpu":
        command = [sys.executable, os.path.abspath(__file__), "--twogpu-worker"] + worker_args(args)
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", str(args.world), os.path.abspath(__file__),
                   "--worker", mode] + worker_args(args)
    sampler = PeakSampler(range(2 if mode == "twogpu" else args.world))
    before = sampler.used()
    sampler.start()
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=environment(mode, args), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks
        output, _ = proc.communicate()
        sampler.stop()
        return {"mode": mode, "error": "timed out after %d s: %s" % (args.timeout, output[-1500:])}
    peaks = sampler.stop()
    wall = time.perf_counter() - started
    with open(os.path.join(args.out, "%s.log" % mode), "w") as f:
        f.write(output)
    missing = [o for o in outs if not os.path.exists(o)]
    if proc.returncode != 0 or missing:
        return {"mode": mode, "error": "exit %d after %.1f s, missing %s: %s" % (
            proc.returncode, wall, [os.path.basename(m) for m in missing], output[-1500:])}
    ranks = []
    for out in outs:
        with open(out) as f:
            ranks.append(json.load(f))
    return {
        "mode": mode,
        "wall_s": wall,
        "used_before": before,
        "peak_used": peaks,
        "peak_bytes_per_gpu": [p - b for p, b in zip(peaks, before)],
        "samples": sampler.samples,
        "ranks": ranks,
    }


def max_rel(losses, base):
    if len(losses) != len(base):
        return float("inf")
    worst = 0.0
    for a, b in zip(losses, base):
        if a != b:
            worst = max(worst, abs(a - b) / max(abs(b), 1e-30))
    return worst


def compare(results):
    """Adds to each DDP result its loss comparison with the default run (in place);
    returns PyTorch's own spread."""
    by_mode = {r["mode"]: r for r in results if "error" not in r and r["mode"] in DDP_MODES}
    base = by_mode.get("default")
    if base is None:
        return None
    base_losses = base["ranks"][0]["losses"]
    for r in by_mode.values():
        r["max_rel"] = max_rel(r["ranks"][0]["losses"], base_losses)
        r["identical"] = r["ranks"][0]["losses"] == base_losses
    own = [by_mode[m]["max_rel"] for m in ("default_again", "expandable") if m in by_mode]
    spread = max(own) if own else 0.0
    limit = spread if spread > 0 else 1e-6
    for r in by_mode.values():
        if r["mode"] == "default":
            r["verdict"] = "base"
        elif r["identical"]:
            r["verdict"] = "identical"
        elif r["max_rel"] <= limit:
            r["verdict"] = "within spread"
        else:
            r["verdict"] = "DIFFERS"
    return spread


def mib(value):
    return "-" if value is None else "%.0f" % (value / 2**20)


def table(results, spread):
    lines = ["%-14s %10s %10s %10s %10s %10s %10s %9s %9s %s" % (
        "mode", "peak0 MiB", "peak1 MiB", "reserved0", "alloc0", "pool0", "pool1",
        "step ms", "x default", "losses (max_rel)")]
    base = next((r for r in results if r["mode"] == "default" and "error" not in r), None)
    for r in results:
        if r["mode"] == "twogpu":
            continue
        if "error" in r:
            lines.append("%-14s FAILED: %s" % (r["mode"], (r["error"].strip().splitlines() or [""])[-1]))
            continue
        r0 = r["ranks"][0]
        pools = [rank.get("cudamem", {}).get("peak_mapped_bytes") for rank in r["ranks"]]
        peaks = r["peak_bytes_per_gpu"]
        step = r0["warm_mean_step_s"]
        ratio = step / base["ranks"][0]["warm_mean_step_s"] if base else None
        lines.append("%-14s %10s %10s %10s %10s %10s %10s %9.2f %9s %s (%.2e)" % (
            r["mode"], mib(peaks[0]), mib(peaks[1] if len(peaks) > 1 else None),
            mib(r0.get("max_memory_reserved")),
            mib(r0.get("max_memory_allocated", r0.get("cudamem", {}).get("peak_live_bytes"))),
            mib(pools[0]), mib(pools[1] if len(pools) > 1 else None), step * 1e3,
            "-" if ratio is None else "%.3f" % ratio, r.get("verdict", "?"), r.get("max_rel", 0.0)))
    if spread is not None:
        lines.append("PyTorch's own spread (max_rel of default_again, expandable): %.2e" % spread)
    lines.extend(goals(results))
    for r in results:
        if r["mode"] != "twogpu" and "error" not in r:
            lines.append("losses %s: %s" % (r["mode"], " ".join(repr(v) for v in r["ranks"][0]["losses"])))
    for r in results:
        if r["mode"] != "twogpu":
            continue
        if "error" in r:
            lines.append("twogpu FAILED: %s" % (r["error"].strip().splitlines() or [""])[-1])
        else:
            t = r["ranks"][0]
            lines.append("twogpu: checks %s; pool allocations per device %s; peer grants per "
                         "device %s; peak per GPU %s MiB" % (
                             "passed" if t["ok"] else "FAILED: " + "; ".join(t["failures"]),
                             [s["allocations"] for s in t["cudamem"]],
                             [s.get("peer_access_calls") for s in t["cudamem"]],
                             [mib(b) for b in r["peak_bytes_per_gpu"]]))
    return "\n".join(lines)


def goals(results):
    """The goals for each cudamem mode run, one line each."""
    by_mode = {r["mode"]: r for r in results if "error" not in r}
    default, expandable = by_mode.get("default"), by_mode.get("expandable")
    ran = [m for m in CUDAMEM_MODES if m in by_mode]
    if not ran:
        return ["goals: no cudamem result"]
    lines = []
    for mode in ran:
        ours = by_mode[mode]
        lines.append("%s goal, losses identical to the default's (or within PyTorch's spread): %s" % (
            mode, "met (%s)" % ours["verdict"] if ours.get("verdict") in ("identical", "within spread")
            else "NOT met (%s)" % ours.get("verdict", "no default run")))
        if expandable is not None:
            pairs = list(zip(ours["peak_bytes_per_gpu"], expandable["peak_bytes_per_gpu"]))
            lines.append("%s goal, peak per GPU at most expandable segments': %s (%s MiB)" % (
                mode, "met" if all(a <= b for a, b in pairs) else "NOT met",
                ", ".join("gpu%d %s vs %s" % (i, mib(a), mib(b)) for i, (a, b) in enumerate(pairs))))
        if default is not None:
            ratio = ours["ranks"][0]["warm_mean_step_s"] / default["ranks"][0]["warm_mean_step_s"]
            lines.append("%s goal, step time at most 1.02 x default's: %s (%.3f)" % (
                mode, "met" if ratio <= 1.02 else "NOT met", ratio))
    return lines


def fake_results(args):
    """Made-up results in the workers' format, for --dry-run."""
    results = []
    for i, mode in enumerate(DDP_MODES):
        losses = [10.0 - 0.1 * s for s in range(args.steps)]
        if mode == "expandable":
            losses[-1] += 1e-6
        if mode == "default_again":
            losses[-1] += 2e-6
        ranks = []
        for rank in range(args.world):
            r = {"rank": rank, "losses": losses, "median_step_s": 0.020 + 0.001 * i,
                 "warm_mean_step_s": 0.021 + 0.001 * i, "steps": args.steps}
            if mode in CUDAMEM_MODES:
                r["cudamem"] = {"peak_live_bytes": 5 << 30, "peak_mapped_bytes": 5 << 30, "allocations": 100}
            else:
                r["max_memory_reserved"], r["max_memory_allocated"] = 6 << 30, 5 << 30
            ranks.append(r)
        results.append({"mode": mode, "peak_bytes_per_gpu": [6 << 30] * args.world, "ranks": ranks})
    results.append({"mode": "twogpu", "peak_bytes_per_gpu": [1 << 30, 1 << 30], "ranks": [
        {"ok": True, "failures": [], "cudamem": [{"allocations": 5, "peer_access_calls": 3},
                                                 {"allocations": 4, "peer_access_calls": 2}]}]})
    return results


# ---------------------------------------------------------------- worker side


def ddp_worker(mode, args):
    rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    lib_stats = None
    if mode in CUDAMEM_MODES:
        import cudamem_torch

        cudamem_torch.install(args.lib or None)  # before the first CUDA tensor
        lib_stats = cudamem_torch.stats
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import GPT2Config, GPT2LMHeadModel

    if not args.nondeterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    # Eager attention when deterministic: the memory-efficient kernel's backward is
    # nondeterministic even under use_deterministic_algorithms, so losses would differ
    # from run to run whatever the allocator.
    attention = {} if args.nondeterministic else {"attn_implementation": "eager"}
    config = GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=1024, **attention)
    torch.manual_seed(4)  # the same weights on every rank (DDP broadcasts rank 0's anyway)
    model = DistributedDataParallel(GPT2LMHeadModel(config).to(device), device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    shapes = torch.Generator().manual_seed(4)  # the same lengths on every rank
    tokens = torch.Generator().manual_seed(100 + rank)  # different data per rank
    # `--shapes` distinct (length, batch) pairs, cycled: after the first cycle every
    # shape has been seen once, so later steps time the warm loop.
    distinct = min(args.shapes, args.steps)
    cycle_lengths = [int(x) for x in torch.randint(32, 1024 + 1, (distinct,), generator=shapes)]
    cycle_batches = [int(x) for x in torch.randint(2, 8 + 1, (distinct,), generator=shapes)]
    lengths = [cycle_lengths[i % distinct] for i in range(args.steps)]
    batches = [cycle_batches[i % distinct] for i in range(args.steps)]
    losses, times, driver_calls = [], [], []
    torch.cuda.synchronize()
    dist.barrier()
    for length, batch in zip(lengths, batches):
        start = time.perf_counter()
        ids = torch.randint(0, config.vocab_size, (batch, length), generator=tokens).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().item()))  # synchronizes
        times.append(time.perf_counter() - start)
        if lib_stats:
            driver_calls.append(lib_stats(rank)["memory_driver_calls"])
    dist.barrier()
    steady = sorted(times[1:] or times)
    warm = times[distinct:] or times[1:] or times
    result = {
        "mode": mode,
        "rank": rank,
        "world": world,
        "losses": losses,
        "lengths": lengths,
        "batches": batches,
        "median_step_s": steady[len(steady) // 2],
        "warm_mean_step_s": sum(warm) / len(warm),
        "step_s": times,
        "steps": len(times),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device),
    }
    if lib_stats:
        result["cudamem"] = lib_stats(rank)
        result["memory_driver_calls_after_step"] = driver_calls
    else:
        result["max_memory_reserved"] = torch.cuda.max_memory_reserved(device)
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    with open(os.path.join(args.out, "%s.rank%d.json" % (mode, rank)), "w") as f:
        json.dump(result, f, indent=1)
    dist.destroy_process_group()


def twogpu_worker(args):
    import cudamem_torch

    cudamem_torch.install(args.lib or None)
    import torch

    failures = []
    gen = torch.Generator().manual_seed(7)
    host = torch.randn(1 << 22, generator=gen)  # 16 MiB of float32
    a_host = torch.randn(512, 512, generator=gen, dtype=torch.float64)
    x0 = host.to("cuda:0")
    x1 = x0.to("cuda:1")  # device to device: GPU 0's pool -> GPU 1's pool
    x1.mul_(2)
    back = x1.to("cuda:0")  # and back
    checks = {
        "to_gpu1": float(x1.double().sum().item()),
        "back_on_gpu0": float(back.double().sum().item()),
        "host": float(host.double().sum().item()) * 2,
    }
    if not torch.equal(back.cpu(), host * 2):
        failures.append("cuda:0 -> cuda:1 -> cuda:0 copy differs from the host's")
    for d in (0, 1):
        a = a_host.to("cuda:%d" % d)
        got = (a @ a).cpu()
        if not torch.allclose(got, a_host @ a_host, rtol=1e-9, atol=1e-9):
            failures.append("matmul on cuda:%d differs from the host's" % d)
        checks["matmul_gpu%d" % d] = float(got.sum().item())
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    stats = [cudamem_torch.stats(d) for d in (0, 1)]
    for d, s in enumerate(stats):
        if s["allocations"] == 0:
            failures.append("device %d's pool served nothing" % d)
        if s.get("peer_access_calls", 0) == 0:
            failures.append("device %d's pool granted the other GPU nothing (CUDAMEM_PEERS=all)" % d)
    pointers = {"x0": x0.data_ptr(), "x1": x1.data_ptr()}
    result = {"mode": "twogpu", "ok": not failures, "failures": failures, "checks": checks,
              "cudamem": stats, "pointers": pointers, "torch": torch.__version__}
    with open(os.path.join(args.out, "twogpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    if failures:
        sys.exit(1)


# ---------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="libcudamem_torch.so (default: cudamem_torch.find_library)")
    parser.add_argument("--out", default="ddp-bench", help="output folder")
    parser.add_argument("--modes", nargs="*", default=list(ALL_MODES), choices=ALL_MODES)
    parser.add_argument("--steps", type=int, default=40, help="training steps per launch")
    parser.add_argument("--shapes", type=int, default=10,
                        help="distinct (length, batch) shapes, cycled; step time is the mean "
                             "of the steps after the first cycle")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per launch")
    parser.add_argument("--world", type=int, default=2,
                        help="ranks per launch, one GPU each (1: the one-GPU check)")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="leave PyTorch's nondeterministic algorithms on")
    parser.add_argument("--dry-run", action="store_true",
                        help="report on made-up results (checks this script only)")
    parser.add_argument("--worker", choices=DDP_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--twogpu-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is left out of the median), got %d" % args.steps)
    if args.world < 1:
        parser.error("--world must be at least 1, got %d" % args.world)
    if args.timeout < 1:
        parser.error("--timeout must be at least 1 s, got %d" % args.timeout)
    if args.worker:
        ddp_worker(args.worker, args)
        return 0
    if args.twogpu_worker:
        twogpu_worker(args)
        return 0
    os.makedirs(args.out, exist_ok=True)
    if args.dry_run:
        results = fake_results(args)
    else:
        for key, value in NO_MULTICAST.items():
            os.environ[key] = value  # this process too (NVML only, but no exceptions)
        results = []
        for mode in args.modes:
            r = launch(mode, args)
            print("%s: %s" % (mode, ("FAILED: " + r["error"]) if "error" in r else
                              "peak per GPU %s MiB" % [mib(b) for b in r["peak_bytes_per_gpu"]]),
                  file=sys.stderr, flush=True)
            results.append(r)
    spread = compare(results)
    text = table(results, spread)
    print(text)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"spread": spread, "results": results}, f, indent=1)
    failed = any("error" in r or r.get("verdict") == "DIFFERS" or
                 (r["mode"] == "twogpu" and not r["ranks"][0]["ok"]) for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
