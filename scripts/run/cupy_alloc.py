"""A small CuPy job for `cudamem run`: arrays through CuPy's memory pool,
some freed (the pool keeps them), a reduction.

    python3 cupy_alloc.py"""

import cupy as cp

arrays = [cp.random.random((1 << 20,), dtype=cp.float32) for _ in range(16)]
total = sum(float(a.sum()) for a in arrays)
del arrays[::2]
big = cp.zeros((256 << 20) // 4, dtype=cp.float32)
pool = cp.get_default_memory_pool()
print(f"cupy: sum {total:.1f}, pool used {pool.used_bytes() / 2**20:.1f} MiB, held {pool.total_bytes() / 2**20:.1f} MiB")
del big
