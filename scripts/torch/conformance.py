"""The allocator behaviours PyTorch's own allocator tests (test/test_cuda.py) check,
run under PyTorch's default allocator and cudamem's tlsf and stitch pools in one go,
each case in a fresh process; prints a table of PASS/FAIL per case and allocator and
the counts. Needs a GPU, PyTorch, and libcudamem_torch.so built with the cuda feature.

    python3 scripts/torch/conformance.py --lib path/to/libcudamem_torch.so [--out DIR]

If PyTorch's test/test_cuda.py is installed beside torch, its path is printed; the
wheels do not ship it, so these cases stand in for it (no PyTorch code is copied).
Cases: caching stats, MemPool without and with its own allocator (and its
destruction, which must not abort), MemPool(use_on_oom), graph pools, snapshots,
out of memory (PyTorch's message, one argument, the counters) and an
accelerate-style batch finder, IPC to a child process.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ALLOCATORS = ("default", "tlsf", "stitch")
MIB = 1 << 20


def setup(allocator, lib):
    if allocator != "default":
        sys.path.insert(0, os.path.join(REPO, "python"))
        import cudamem_torch

        cudamem_torch.install(lib)
    import torch

    return torch


def case_caching_stats(torch):
    torch.cuda.reset_peak_memory_stats()
    a = torch.empty(10 * MIB, dtype=torch.uint8, device="cuda")
    s = torch.cuda.memory_stats()
    assert s["allocated_bytes.all.current"] >= 10 * MIB, s["allocated_bytes.all.current"]
    assert s["allocation.all.current"] >= 1
    assert torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()
    peak = torch.cuda.max_memory_allocated()
    del a
    assert torch.cuda.memory_allocated() <= peak - 10 * MIB
    torch.cuda.empty_cache()
    summary = torch.cuda.memory_summary()
    assert "Allocated memory" in summary and "GPU reserved memory" in summary, summary[:400]
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
    return "stats, summary, resets"


def case_mempool(torch):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.ones(4 * MIB, device="cuda")
    y = torch.ones(4 * MIB, device="cuda")
    assert pool.use_count() >= 1
    seg = pool.snapshot()
    assert any(s["total_size"] >= 16 * MIB for s in seg), seg
    del x, y
    del pool  # PyTorch calls releasePool and emptyCache from the destructor
    torch.cuda.synchronize()
    return "MemPool() + use_mem_pool + destroy"


def case_mempool_use_on_oom(torch):
    try:
        pool = torch.cuda.MemPool(use_on_oom=True)
    except TypeError:
        return "SKIP: this PyTorch's MemPool has no use_on_oom"
    with torch.cuda.use_mem_pool(pool):
        x = torch.ones(MIB, device="cuda")
    del x, pool
    return "MemPool(use_on_oom=True) made and destroyed"


ALLOC_SOURCE = r"""
#include <sys/types.h>
#include <cuda_runtime_api.h>
extern "C" {
void* my_alloc(ssize_t size, int device, cudaStream_t stream) {
  void* ptr = nullptr; cudaMalloc(&ptr, size); return ptr;
}
void my_free(void* ptr, ssize_t size, int device, cudaStream_t stream) { cudaFree(ptr); }
}
"""


def case_mempool_own_allocator(torch):
    from torch.utils import cpp_extension

    build = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", "/tmp"), "conformance_alloc")
    os.makedirs(build, exist_ok=True)
    src = os.path.join(build, "alloc.cpp")
    with open(src, "w") as f:
        f.write(ALLOC_SOURCE)
    so = os.path.join(build, "alloc.so")
    if not os.path.exists(so):
        cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        subprocess.check_call(["g++", "-shared", "-fPIC", "-O2", "-I", cuda + "/include", src,
                               "-o", so, "-L", cuda + "/lib64", "-lcudart"])
    own = torch.cuda.memory.CUDAPluggableAllocator(so, "my_alloc", "my_free")
    pool = torch.cuda.MemPool(own.allocator())
    with torch.cuda.use_mem_pool(pool):
        x = torch.arange(1000, device="cuda", dtype=torch.float32)
    assert float(x.sum()) == 499500.0
    del x
    del pool
    torch.cuda.synchronize()
    return "MemPool(CUDAPluggableAllocator) allocates and frees through it"


def case_graph_pool(torch):
    s = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            y = x * 2
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2 + 1
    g.replay()
    torch.cuda.synchronize()
    assert float(y.sum()) == 3 * 1024
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=g.pool()):
        z = y + 1
    g2.replay()
    torch.cuda.synchronize()
    assert float(z.sum()) == 4 * 1024
    del g, g2, y, z
    torch.cuda.empty_cache()
    return "graph capture, replay, shared pool"


def case_snapshot(torch):
    torch.cuda.memory._record_memory_history(max_entries=1000)
    a = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
    del a
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    actions = {e["action"] for t in snap["device_traces"] for e in t}
    assert "alloc" in actions and ("free_requested" in actions or "free_completed" in actions), actions
    return "history: %d segments, actions %s" % (len(snap["segments"]), sorted(actions))


def case_oom(torch):
    before = torch.cuda.memory_stats()
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        assert len(e.args) == 1, e.args
        first = e.args[0].splitlines()[0]
        assert first.startswith("CUDA out of memory. Tried to allocate "), first
        assert "GPU 0 has a total capacity of" in first, first
        after = torch.cuda.memory_stats()
        ooms = after["num_ooms"] - before.get("num_ooms", 0)
        assert ooms == 1, ooms
        print("OOM first line:", first[:160])
        return "one argument, PyTorch's first line, num_ooms +1"
    raise AssertionError("no OutOfMemoryError")


def case_batch_finder(torch):
    """accelerate's find_executable_batch_size when installed, else the same loop:
    halve the batch on an error whose text says CUDA out of memory."""
    total = torch.cuda.get_device_properties(0).total_memory
    tried = []

    def step(batch):
        tried.append(batch)
        # 1 GiB per sample: the first batches cannot fit.
        x = torch.empty(batch, 1 << 30, dtype=torch.uint8, device="cuda")
        return x.shape[0]

    try:
        from accelerate.utils import find_executable_batch_size

        finder = "accelerate"
        run = find_executable_batch_size(lambda batch: step(batch), starting_batch_size=1024)
        got = run()
    except ImportError:
        finder = "own loop (accelerate is not installed)"
        batch = 1024
        while True:
            try:
                got = step(batch)
                break
            except RuntimeError as e:
                if "CUDA out of memory." not in str(e.args[0]):
                    raise
                torch.cuda.empty_cache()
                batch //= 2
    assert got < total / (1 << 30), got
    return "%s: tried %s, ran %d" % (finder, tried, got)


def case_ipc(torch):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    done = ctx.Event()
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    p = ctx.Process(target=_ipc_child, args=(q, done, os.environ.get("CONFORMANCE_ALLOCATOR"),
                                              os.environ.get("CONFORMANCE_LIB")))
    p.start()
    q.put(x)
    total = q.get(timeout=120)
    done.set()
    p.join(60)
    assert total == float(x.sum()), (total, float(x.sum()))
    return "tensor shared with a spawned process"


def _ipc_child(q, done, allocator, lib):
    torch = setup(allocator, lib or None)
    y = q.get(timeout=120)
    q.put(float(y.sum()))
    done.wait(60)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def child(case, allocator, lib, out):
    os.environ["CONFORMANCE_ALLOCATOR"] = allocator
    os.environ["CONFORMANCE_LIB"] = lib or ""
    torch = setup(allocator, lib)
    result = {"case": case, "allocator": allocator}
    try:
        note = CASES[case](torch)
        result["status"] = "SKIP" if str(note).startswith("SKIP") else "PASS"
        result["note"] = note
    except BaseException as e:  # noqa: BLE001 - every failure is a result
        result["status"] = "FAIL"
        result["note"] = "%s: %s" % (type(e).__name__, str(e)[:600])
    result["backend"] = torch.cuda.memory.get_allocator_backend()
    with open(out, "w") as f:
        json.dump(result, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="libcudamem_torch.so")
    parser.add_argument("--out", default="conformance")
    parser.add_argument("--allocators", nargs="*", default=list(ALLOCATORS))
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--timeout", type=int, default=180)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.lib or None, args.json)
        return 0
    os.makedirs(args.out, exist_ok=True)
    import torch

    tests = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "test", "test_cuda.py")
    print("PyTorch %s; its test/test_cuda.py: %s" % (
        torch.__version__, tests if os.path.exists(tests) else "not installed (the wheel ships no tests)"))
    results = []
    for case in args.only or list(CASES):
        for allocator in args.allocators:
            out = os.path.join(args.out, "%s.%s.json" % (case, allocator))
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if allocator != "default":
                env["CUDAMEM_POLICY"] = allocator
            started = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", case, allocator,
                                       "--lib", args.lib or "", "--json", out],
                                      env=env, timeout=args.timeout, capture_output=True, text=True)
                if os.path.exists(out):
                    with open(out) as f:
                        r = json.load(f)
                    if proc.returncode != 0 and r["status"] == "PASS":
                        r["status"], r["note"] = "FAIL", "exit %d after passing: %s" % (
                            proc.returncode, (proc.stderr or "")[-300:])
                else:
                    r = {"case": case, "allocator": allocator, "status": "FAIL",
                         "note": "exit %d: %s" % (proc.returncode, (proc.stderr or proc.stdout)[-600:])}
            except subprocess.TimeoutExpired:
                r = {"case": case, "allocator": allocator, "status": "FAIL", "note": "timed out"}
            r["seconds"] = round(time.perf_counter() - started, 1)
            results.append(r)
            print("%-22s %-8s %-4s %s" % (case, allocator, r["status"], str(r["note"]).replace("\n", " | ")[:300]),
                  flush=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    for allocator in args.allocators:
        mine = [r for r in results if r["allocator"] == allocator]
        print("%-8s pass %d, fail %d, skip %d of %d" % (
            allocator, sum(r["status"] == "PASS" for r in mine), sum(r["status"] == "FAIL" for r in mine),
            sum(r["status"] == "SKIP" for r in mine), len(mine)))
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
