"""A small JAX job for `cudamem run`. By default XLA preallocates 75% of the
device in one allocation at start; run with XLA_PYTHON_CLIENT_PREALLOCATE=false
to see it allocate on demand.

    python3 jax_alloc.py"""

import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (4096, 4096))
y = jnp.tanh(x @ x.T).sum()
print(f"jax: {jax.devices()[0]}, result {float(y):.3f}")
