"""A small PyTorch job for `cudamem run`: a few allocations and a small
model's training steps on one allocator backend, then, with --oom, a request
larger than what is free.

    python3 torch_alloc.py default|expandable|async [--oom]

The backend is chosen before torch is imported: PyTorch's caching allocator
(default), its expandable segments, or cudaMallocAsync."""

import os
import sys

CONF = {
    "default": None,
    "expandable": "expandable_segments:True",
    "async": "backend:cudaMallocAsync",
}
mode = sys.argv[1] if len(sys.argv) > 1 else "default"
if mode not in CONF:
    sys.exit(f"usage: torch_alloc.py {'|'.join(CONF)} [--oom]")
if CONF[mode]:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = CONF[mode]

import torch  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(5):
    x = torch.randn(512 * (step + 1), 4096, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
big = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
del big[::2]
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(
    f"{mode}: allocated {torch.cuda.memory_allocated() / 2**20:.1f} MiB, "
    f"reserved {torch.cuda.memory_reserved() / 2**20:.1f} MiB, free {free / 2**30:.2f} GiB of {total / 2**30:.2f}"
)
if "--oom" in sys.argv:
    try:
        torch.empty(free + (1 << 30), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as err:
        print(f"{mode}: out of memory as expected: {str(err).splitlines()[0]}")
        sys.exit(3)
    sys.exit("the oversized request did not fail")
