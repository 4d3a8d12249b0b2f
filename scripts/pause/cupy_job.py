"""A CuPy loop for `cudamem pause`'s GPU check: usage cupy_job.py STEPS.
Prints "pid PID ready", sleeps a little each step, ends with a checksum."""
import hashlib
import os
import sys
import time

import cupy as cp

steps = int(sys.argv[1])
rs = cp.random.RandomState(seed=0)
arrays = [rs.standard_normal((1024, 1024), dtype=cp.float32) for _ in range(64)]
for step in range(steps):
    for i, a in enumerate(arrays):
        arrays[i] = cp.tanh(a * 0.999 + 0.001 * step)
    if step == 3:
        cp.cuda.Device().synchronize()
        print(f"pid {os.getpid()} ready", flush=True)
    time.sleep(0.02)
digest = hashlib.sha256()
for a in arrays:
    digest.update(cp.asnumpy(a).tobytes())
print("checksum", digest.hexdigest()[:16])
