"""A JAX loop for `cudamem pause`'s GPU check: usage jax_job.py STEPS.
Meant to run with XLA_PYTHON_CLIENT_ALLOCATOR=platform (buffers from
cuMemAlloc, which the pool serves). Prints "pid PID ready", sleeps a little
each step, ends with a checksum."""
import hashlib
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

steps = int(sys.argv[1])
key = jax.random.PRNGKey(0)
w = jax.random.normal(key, (2048, 2048), dtype=jnp.float32) * 0.01
x = jax.random.normal(jax.random.PRNGKey(1), (512, 2048), dtype=jnp.float32)


@jax.jit
def step_fn(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * grad, loss


for step in range(steps):
    w, loss = step_fn(w, x)
    if step == 3:
        w.block_until_ready()
        print(f"pid {os.getpid()} ready", flush=True)
    time.sleep(0.02)
print("checksum", hashlib.sha256(np.asarray(w).tobytes()).hexdigest()[:16])
