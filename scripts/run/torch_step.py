"""Time one of the repository's PyTorch workloads (scripts/torch/workloads.py)
and print its median step: `cudamem run` against the bare run is the
interposer's cost on a training step.

    python3 torch_step.py [WORKLOAD] [SCALE]     prints: WORKLOAD seconds_per_step steps checksum"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))

import workloads  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "resnet50_train"
scale = sys.argv[2] if len(sys.argv) > 2 else "full"
checksum, seconds, steps = workloads.run(name, scale)
print(f"{name} {seconds:.6f} {steps} {checksum:.6f}")
