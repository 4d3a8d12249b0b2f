"""What PyTorch users rely on, under PyTorch's own allocator and under cudamem.

Each habit runs in a fresh process under PyTorch's default allocator, then under
cudamem with CUDAMEM_POLICY=tlsf and =stitch, and prints one line:

    PASS  stitch   cuda_graph       replays bit-identical to the default's (5 replays)

Habits: stats (memory_allocated/memory_stats/memory_summary/max_*/resets, the
profiler's memory, and under cudamem max_memory_reserved() == the pool's peak mapped
bytes), cudnn_benchmark (a ResNet-18 with torch.backends.cudnn.benchmark), cuda_graph
(capture, replay, replays stay right while eager tensors are allocated and written
around them), torch_compile (torch.compile(mode="reduce-overhead"): cudagraph trees,
training then inference), snapshot (_record_memory_history + _dump_snapshot, read by
memory_viz and by `cudamem replay`), ipc (a CUDA tensor shared with a spawned process
through torch.multiprocessing), oom (past the device, and 1 GiB at a time until out
of memory: the error comes at once, then 1 GiB allocates) and empty_cache (512 MiB
freed comes back to the device). Outputs that must not depend on the allocator
(graph replays, compiled training) are compared with the default's, bit for bit.
Exits non-zero on any FAIL.

    python3 scripts/torch/checklist.py --lib target/cuda/release/libcudamem_torch.so \\
        [--cudamem-bin target/release/cudamem] [--only cuda_graph ...] [--out DIR]
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ALLOCATORS = ("default", "tlsf", "stitch")
# Habits that measure the device's memory run alone; the rest run side by side.
EXCLUSIVE = ("oom", "empty_cache", "huge_block")
MIB = 1 << 20

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class Failed(Exception):
    """A habit that did not work; the message says how."""


def expect(condition, message):
    if not condition:
        raise Failed(message)


def digest_of(tensors):
    """A hash of the tensors' bytes and shapes: equal only when bit-identical. A 0-dim
    tensor (a loss) is read as one element: `view(uint8)` refuses 0-dim tensors."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        t = t.detach()
        h.update(repr((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


@case
def stats(env):
    import torch

    torch.cuda.reset_peak_memory_stats()
    a = torch.empty(1000, dtype=torch.uint8, device="cuda")
    b = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
    allocated = torch.cuda.memory_allocated()
    expect(allocated == 1024 + 3 * MIB, "memory_allocated() is %d, not 1024 + 3 MiB" % allocated)
    s = torch.cuda.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "active_bytes.all.current",
                "requested_bytes.all.current", "num_ooms", "num_alloc_retries",
                "allocation.all.current", "segment.all.current"):
        expect(key in s, "memory_stats() lacks %s" % key)
    expect(s["allocated_bytes.all.current"] == allocated, "memory_stats() disagrees")
    expect(s["active_bytes.all.current"] >= allocated, "active < allocated")
    expect(torch.cuda.memory_reserved() >= allocated, "reserved < allocated")
    expect(s["allocated_bytes.all.peak"] >= s["allocated_bytes.all.current"], "peak < current")
    expect("Allocated memory" in torch.cuda.memory_summary(), "memory_summary() is empty")
    reserved_peak = torch.cuda.max_memory_reserved()
    if env["cudamem"] is not None:
        pool = env["cudamem"].stats(0)
        expect(reserved_peak == pool["peak_mapped_bytes"],
               "max_memory_reserved() %d != the pool's peak mapped bytes %d"
               % (reserved_peak, pool["peak_mapped_bytes"]))
    del b
    expect(torch.cuda.max_memory_allocated() >= 1024 + 3 * MIB, "max_memory_allocated() forgot")
    expect(torch.cuda.memory_allocated() == 1024, "the free was not counted")
    torch.cuda.reset_peak_memory_stats()
    expect(torch.cuda.max_memory_allocated() == 1024, "reset_peak_memory_stats() did not reset")
    torch.cuda.reset_accumulated_memory_stats()
    expect(torch.cuda.memory_stats()["allocation.all.allocated"] == 0, "accumulated counts kept")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
        c = torch.ones(MIB, device="cuda") * 2
        torch.cuda.synchronize()
    seen = 0
    for event in prof.key_averages():
        seen += abs(getattr(event, "device_memory_usage", 0) or getattr(event, "cuda_memory_usage", 0) or 0)
    expect(seen > 0, "the profiler saw no CUDA memory")
    del a, c
    return "figures agree; max reserved %d MiB; profiler saw %d MiB" % (reserved_peak // MIB, seen // MIB), None


@case
def cudnn_benchmark(env):
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).cuda()
    x = torch.randn(16, 3, 224, 224, device="cuda")
    loss = None
    for _ in range(3):
        loss = model(x).float().square().mean()
        loss.backward()
    torch.cuda.synchronize()
    expect(bool(torch.isfinite(loss)), "the loss is %r" % loss.item())
    return "ResNet-18 forward+backward, loss %.4f" % loss.item(), None


def _mlp(torch, width, hidden, activation):
    """Two linear layers around `activation` on the GPU, from seed 0."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden), activation, torch.nn.Linear(hidden, width)
    ).cuda()


@case
def cuda_graph(env):
    import torch

    model = _mlp(torch, 512, 2048, torch.nn.GELU())
    static_in = torch.randn(64, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_in)
    second = torch.cuda.CUDAGraph()
    with torch.cuda.graph(second, pool=graph.pool()):
        static_sum = static_out.sum(dim=1)
    gen = torch.Generator(device="cuda").manual_seed(1)
    replays = []
    clutter = []
    for i in range(5):
        static_in.copy_(torch.randn(64, 512, device="cuda", generator=gen))
        # Eager tensors allocated and written between replays must never land on
        # the graphs' memory.
        clutter.append(torch.full((4 * MIB,), float(i), device="cuda"))
        graph.replay()
        second.replay()
        replays += [static_out.clone(), static_sum.clone()]
        eager = model(static_in)
        expect(torch.allclose(eager, static_out, rtol=1e-4, atol=1e-5),
               "replay %d differs from eager" % i)
    for i, t in enumerate(clutter):
        expect(bool((t == float(i)).all()), "a replay overwrote an eager tensor")
    torch.cuda.synchronize()
    del graph, second, static_out, static_sum
    torch.cuda.empty_cache()
    return "5 replays of two graphs sharing a pool", digest_of(replays)


@case
def torch_compile(env):
    import torch
    import torch._dynamo

    model = _mlp(torch, 256, 1024, torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, mode="reduce-overhead")
    gen = torch.Generator(device="cuda").manual_seed(2)
    inputs = [torch.randn(128, 256, device="cuda", generator=gen) for _ in range(4)]
    losses = []
    for step in range(8):
        out = compiled(inputs[step % 4])
        loss = out.square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().clone())
    with torch.no_grad():
        evals = [compiled(x).clone() for x in inputs]
    torch.cuda.synchronize()
    skips = torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)
    expect(skips == 0, "cudagraphs were skipped %d times" % skips)
    expect(all(bool(torch.isfinite(l)) for l in losses), "a loss is not finite")
    return "8 training steps, 4 inference calls, no cudagraph skip", digest_of(losses + evals)


@case
def snapshot(env):
    import pickle

    import torch
    from torch.cuda import _memory_viz

    torch.cuda.memory._record_memory_history(max_entries=100000)
    model = torch.nn.Linear(1024, 1024).cuda()
    kept = []
    for i in range(20):
        x = torch.randn(64 + i, 1024, device="cuda")
        y = model(x).relu()
        if i % 5 == 0:
            kept.append(y)
    path = os.path.join(env["tmp"], "snapshot.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    expect(snap["segments"], "no segments")
    events = snap["device_traces"][0]
    allocs = [e for e in events if e["action"] == "alloc"]
    expect(len(allocs) >= 40, "only %d alloc events" % len(allocs))
    expect(any(e.get("frames") for e in allocs), "no stacks on the alloc events")
    live = sum(1 for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    expect(live >= len(kept), "the segments show %d live blocks" % live)
    expect("segments:" in _memory_viz.segsum(snap), "memory_viz's segsum read nothing")
    expect(len(_memory_viz.trace(snap)) > 100, "memory_viz's trace read nothing")
    html = _memory_viz.trace_plot(snap)
    expect(len(html) > 1000, "memory_viz's trace_plot is empty")
    expect(len(_memory_viz.segment_plot(snap)) > 1000, "memory_viz's segment_plot is empty")
    detail = "%d events, %d segments; memory_viz reads it" % (len(events), len(snap["segments"]))
    binary = env["cudamem_bin"]
    expect(binary and os.path.isfile(binary), "no cudamem binary to replay it (--cudamem-bin)")
    proc = subprocess.run([binary, "replay", path, "--policy", "stitch"], capture_output=True, text=True)
    expect(proc.returncode == 0, "cudamem replay failed: %s" % (proc.stderr or proc.stdout)[-500:])
    return detail + "; cudamem replay reads it", None


def _ipc_child(queue, done, lib):
    # The child runs on the parent's allocator, as a program that installs cudamem at
    # import does in every process it spawns.
    if lib is not None:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import cudamem_torch

        cudamem_torch.install(lib)
    import torch

    tensor = queue.get()
    tensor.add_(1)
    torch.cuda.synchronize()
    done.put(float(tensor.sum().item()))
    del tensor


@case
def ipc(env):
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Queue()
    lib = env["cudamem"].find_library(env["lib"]) if env["cudamem"] is not None else None
    child = ctx.Process(target=_ipc_child, args=(queue, done, lib))
    child.start()
    tensor = torch.arange(1 << 16, dtype=torch.float32, device="cuda")
    before = float(tensor.sum().item())
    queue.put(tensor)
    seen = done.get(timeout=120)
    child.join(timeout=60)
    torch.cuda.synchronize()
    after = float(tensor.sum().item())
    expect(seen == before + (1 << 16), "the child saw %r" % seen)
    expect(after == seen, "the child's write is not in the parent's tensor")
    return "a spawned process (on the same allocator) wrote the parent's tensor in place", None


@case
def oom(env):
    import torch

    stage = ["twice the device"]

    def free_mib():
        try:
            return torch.cuda.mem_get_info()[0] // MIB
        except Exception as error:  # the device cannot say: say so
            return "unknown (%s)" % type(error).__name__

    try:
        return _oom(env, torch, stage, free_mib)
    except Failed:
        raise
    except Exception as error:
        raise Failed("%s at %r (device free: %s MiB): %s" % (
            type(error).__name__, stage[0], free_mib(), str(error).splitlines()[0][:200] if str(error) else ""))


def _oom(env, torch, stage, free_mib):
    total = torch.cuda.get_device_properties(0).total_memory
    start = time.perf_counter()
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        raise Failed("2x the device was handed out")
    except torch.cuda.OutOfMemoryError as error:
        message = str(error)
    first = time.perf_counter() - start
    expect(first < 5, "the error took %.1f s" % first)
    if env["cudamem"] is not None:
        expect("cudamem pool (physical)" in message, "the message lacks the ledger: %s" % message[:300])
    chunks = []
    stage[0] = "1 GiB at a time"
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < 60:
            chunks.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
        raise Failed("no out of memory after %d GiB in 60 s" % len(chunks))
    except torch.cuda.OutOfMemoryError:
        pass
    loop = time.perf_counter() - start
    got = len(chunks)
    left = free_mib()
    stage[0] = "1 GiB after the error"
    del chunks
    again = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    stage[0] = "fill the 1 GiB"
    again.fill_(7)
    torch.cuda.synchronize()
    expect(int(again[-1].item()) == 7, "the 1 GiB after the error is wrong")
    return ("2x device: error in %.2f s; %d GiB then error in %.1f s (%s MiB left free); "
            "then 1 GiB works" % (first, got, loop, left)), None


@case
def empty_cache(env):
    import torch

    small = torch.ones(16 * MIB, dtype=torch.uint8, device="cuda")
    big = torch.ones(512 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    reserved_before = torch.cuda.memory_reserved()
    del big
    torch.cuda.empty_cache()
    free_after = torch.cuda.mem_get_info()[0]
    back = free_after - free_before
    expect(back >= 500 * MIB, "only %d MiB came back" % (back // MIB))
    expect(torch.cuda.memory_reserved() <= reserved_before - 500 * MIB, "memory_reserved() did not drop")
    del small
    return "%d MiB back to the device" % (back // MIB), None


@case
def huge_block(env):
    """A 40 GiB tensor (past cudamem's 32 GiB: one handle of its own): written at
    both ends, read back, freed. Under stitch its memory goes back to the device at
    the free, with no empty_cache(); the other allocators keep it cached."""
    import torch

    torch.cuda.synchronize()
    free_start = torch.cuda.mem_get_info()[0]
    n = 40 * 1024 * MIB
    t0 = time.perf_counter()
    big = torch.empty(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    allocate_ms = (time.perf_counter() - t0) * 1e3
    expect(torch.cuda.memory_allocated() >= n, "memory_allocated() misses the tensor")
    big[:MIB].fill_(7)
    big[-MIB:].fill_(9)
    ends = (int(big[:MIB].sum()), int(big[-MIB:].sum()))
    expect(ends == (7 * MIB, 9 * MIB), "the tensor's ends read back %s" % (ends,))
    used = free_start - torch.cuda.mem_get_info()[0]
    expect(used >= n, "the device gave only %d MiB for a 40 GiB tensor" % (used // MIB))
    del big
    torch.cuda.synchronize()
    back = torch.cuda.mem_get_info()[0] - (free_start - used)
    if env["cudamem"] is not None and os.environ.get("CUDAMEM_POLICY") == "stitch":
        expect(back >= n, "only %d MiB came back at the free" % (back // MIB))
    return "allocate %.1f ms, device used +%d MiB, %d MiB back at the free (no empty_cache)" % (
        allocate_ms, used // MIB, back // MIB), None


def child(name, allocator, lib, cudamem_bin, out):
    """Runs one habit in this process and writes its result to `out`."""
    env = {"cudamem": None, "lib": lib, "cudamem_bin": cudamem_bin,
           "tmp": tempfile.mkdtemp(prefix="checklist-")}
    result = {"case": name, "allocator": allocator}
    try:
        if allocator != "default":
            sys.path.insert(0, os.path.join(REPO, "python"))
            import cudamem_torch

            cudamem_torch.install(lib)
            env["cudamem"] = cudamem_torch
        import torch

        torch.cuda.init()
        detail, digest = CASES[name](env)
        if env["cudamem"] is not None:
            import torch

            expect(torch.cuda.memory.get_allocator_backend() == "cudamem",
                   "the allocator is %s, not cudamem" % torch.cuda.memory.get_allocator_backend())
        result.update(ok=True, detail=detail, digest=digest)
    except Failed as failure:
        result.update(ok=False, detail=str(failure))
    except Exception as error:  # the habit broke: say how (the trace goes to the log)
        traceback.print_exc()
        result.update(ok=False, detail="%s: %s" % (type(error).__name__, str(error).splitlines()[0][:300] if str(error) else ""))
    with open(out, "w") as f:
        json.dump(result, f)


def run_one(name, allocator, args):
    out = os.path.join(args.out, "%s.%s.json" % (name, allocator))
    if os.path.exists(out):
        os.remove(out)
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if allocator != "default":
        env["CUDAMEM_POLICY"] = allocator
    command = [sys.executable, os.path.abspath(__file__), "--child", name, allocator,
               "--lib", args.lib or "", "--cudamem-bin", args.cudamem_bin or "", "--json", out]
    started = time.perf_counter()
    log = os.path.join(args.out, "%s.%s.log" % (name, allocator))
    try:
        with open(log, "w") as f:
            proc = subprocess.run(command, env=env, timeout=args.timeout, stdout=f, stderr=subprocess.STDOUT)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        return {"case": name, "allocator": allocator, "ok": False,
                "detail": "timed out after %d s (log: %s)" % (args.timeout, log)}
    seconds = time.perf_counter() - started
    if not os.path.exists(out):
        with open(log) as f:
            tail = f.read()[-300:].strip().replace("\n", " | ")
        return {"case": name, "allocator": allocator, "ok": False,
                "detail": "exit %d after %.0f s: %s" % (code, seconds, tail)}
    with open(out) as f:
        result = json.load(f)
    result["seconds"] = seconds
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="libcudamem_torch.so (default: cudamem_torch.find_library)")
    parser.add_argument("--cudamem-bin", help="the cudamem command, to replay the snapshot")
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="habits to run (default: all)")
    parser.add_argument("--part", choices=("all", "shared", "exclusive"), default="all",
                        help="the habits that run side by side, or those that measure the "
                             "device and need it to themselves (%s), or both" % ", ".join(EXCLUSIVE))
    parser.add_argument("--allocators", nargs="*", default=list(ALLOCATORS), choices=ALLOCATORS)
    parser.add_argument("--out", default="checklist", help="folder for logs and results")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per habit")
    parser.add_argument("--jobs", type=int, default=12, help="habits run side by side")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.lib or None, args.cudamem_bin or None, args.json)
        return 0
    os.makedirs(args.out, exist_ok=True)
    names = args.only or list(CASES)
    if args.part != "all":
        names = [n for n in names if (n in EXCLUSIVE) == (args.part == "exclusive")]
    results = {}
    shared = [n for n in names if n not in EXCLUSIVE]
    # The default allocator's habits first, alone: its compiled kernels are cached for
    # the rest. Then cudamem's side by side, then the habits that measure the device.
    first = [a for a in args.allocators if a == "default"]
    rest = [a for a in args.allocators if a != "default"]
    for group in (first, rest):
        runs = [(n, a) for a in group for n in shared]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for r in pool.map(lambda run: run_one(run[0], run[1], args), runs):
                results[(r["case"], r["allocator"])] = r
    for allocator in args.allocators:
        for name in [n for n in names if n in EXCLUSIVE]:
            results[(name, allocator)] = run_one(name, allocator, args)
    failed = 0
    for name in names:
        base = results.get((name, "default"), {})
        for allocator in args.allocators:
            r = results[(name, allocator)]
            ok, detail = r.get("ok", False), r.get("detail", "")
            if ok and allocator != "default" and r.get("digest") is not None:
                if base.get("digest") == r["digest"]:
                    detail += "; bit-identical to the default's"
                else:
                    ok = False
                    detail += "; DIFFERS from the default's (%s vs %s)" % (r["digest"], base.get("digest"))
            failed += not ok
            print("%s  %-8s %-16s %s" % ("PASS" if ok else "FAIL", allocator, name, detail), flush=True)
    with open(os.path.join(args.out, "checklist.%s.json" % args.part), "w") as f:
        json.dump([results[k] for k in sorted(results)], f, indent=1)
    print("%d of %d FAIL" % (failed, len(results)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
