"""Time a PyTorch training step: `cudamem run` against the bare run, side by
side, is the interposer's cost on it.

    python3 torch_step.py loop [STEPS]            torchvision ResNet-50, SGD at batch 32 on
                                                  one random batch: 5 steps of warm-up, then
                                                  STEPS (default 20) timed ones; prints:
                                                  resnet50_loop median_seconds_per_step STEPS checksum
    python3 torch_step.py [WORKLOAD] [SCALE]      one of the repository's workloads
                                                  (scripts/torch/workloads.py): prints
                                                  WORKLOAD seconds_per_step steps checksum"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))


def loop(steps):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (32,), device="cuda")
    times, checksum = [], 0.0
    for step in range(5 + steps):
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = float(loss.item())  # synchronizes
        if step >= 5:
            times.append(time.perf_counter() - start)
            checksum += value
    return statistics.median(times), checksum


if len(sys.argv) > 1 and sys.argv[1] == "loop":
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    if steps <= 0:
        sys.exit("torch_step.py loop: STEPS must be positive")
    seconds, checksum = loop(steps)
    print(f"resnet50_loop {seconds:.6f} {steps} {checksum:.6f}")
else:
    import workloads  # noqa: E402

    name = sys.argv[1] if len(sys.argv) > 1 else "resnet50_train"
    scale = sys.argv[2] if len(sys.argv) > 2 else "full"
    checksum, seconds, steps = workloads.run(name, scale)
    print(f"{name} {seconds:.6f} {steps} {checksum:.6f}")
