#!/usr/bin/env python3
"""Write a large synthetic PyTorch memory snapshot for read-speed benchmarks.

Plain dicts and lists shaped as torch.cuda.memory._dump_snapshot writes them
(segments, device_traces, allocator_settings), pickled with protocol 4 like
PyTorch's pickle.dump. Every trace entry has a stack of 5 frames, and frames
are shared objects, as PyTorch shares them, so the pickle refers to one frame
dict many times through the memo. No torch needed.

    python3 scripts/torch/make_large_snapshot.py OUT.pickle [--entries 1000000]
"""

import argparse
import pickle
import random

SEGMENT = 20 << 20
BASE = 0x7F00_0000_0000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    # A few hundred distinct frames, combined into a few thousand stacks.
    frames = [
        {"name": f"fn_{i}", "filename": f"/home/user/model/layer_{i % 40}.py", "line": 10 + i}
        for i in range(300)
    ]
    stacks = [[rng.choice(frames) for _ in range(5)] for _ in range(4000)]

    segments_count = 64
    trace = []
    for s in range(segments_count):
        trace.append({"action": "segment_alloc", "addr": BASE + s * SEGMENT, "size": SEGMENT,
                      "stream": 0, "time_us": s, "frames": rng.choice(stacks)})
    live = []  # (addr, size)
    free_slots = [BASE + s * SEGMENT + k * (1 << 20) for s in range(segments_count) for k in range(20)]
    rng.shuffle(free_slots)
    time_us = segments_count
    while len(trace) < args.entries:
        time_us += 1
        stack = rng.choice(stacks)
        if free_slots and (not live or rng.random() < 0.5):
            addr = free_slots.pop()
            size = rng.randrange(512, 1 << 20)
            live.append((addr, size))
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                          "time_us": time_us, "frames": stack})
        else:
            addr, size = live.pop(rng.randrange(len(live)))
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                              "time_us": time_us, "frames": stack})
            free_slots.append(addr)
    trace = trace[: args.entries]
    snapshot = {
        "segments": [],
        "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
        "external_annotations": [],
    }
    with open(args.out, "wb") as out:
        pickle.dump(snapshot, out, protocol=4)


if __name__ == "__main__":
    main()
