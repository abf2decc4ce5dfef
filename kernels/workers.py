"""The one small thread pool the block-parallel host code shares (MX quantization blocks, row-bound blocks, the
store's chunk hashing and reads).

As many workers as this process may run on (its CPU affinity), or ``PTO_WORKERS`` when set (a positive integer:
fewer where several processes share the cores, e.g. pytest-xdist workers). A task never submits to the pool and
waits on it, so sharing it cannot deadlock.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

_POOL: ThreadPoolExecutor | None = None


def size() -> int:
    """``PTO_WORKERS`` if it is a positive integer, else the CPUs this process may run on."""
    given = os.environ.get("PTO_WORKERS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=size(), thread_name_prefix="blocks")
    return _POOL
