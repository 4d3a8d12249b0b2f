"""A deterministic PyTorch training loop for `cudamem pause`'s GPU check.

usage: torch_train.py STEPS [default|expandable]
Prints "pid PID ready" after the first steps, sleeps a little each step (room for a
pause to arrive mid-run), and ends with a checksum of the parameters, which
depends on nothing but the arguments."""
import hashlib
import os
import sys
import time

mode = sys.argv[2] if len(sys.argv) > 2 else "default"
if mode == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
steps = int(sys.argv[1])
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 10),
).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
gen = torch.Generator(device="cuda").manual_seed(1)
for step in range(steps):
    x = torch.randn(512, 1024, device="cuda", generator=gen)
    y = torch.randint(0, 10, (512,), device="cuda", generator=gen)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step == 5:
        torch.cuda.synchronize()
        print(f"pid {os.getpid()} ready", flush=True)
    time.sleep(0.02)
digest = hashlib.sha256()
for p in model.parameters():
    digest.update(p.detach().cpu().numpy().tobytes())
print("checksum", digest.hexdigest()[:16])
