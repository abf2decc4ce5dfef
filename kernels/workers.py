"""The one small thread pool the block-parallel host code shares (MX quantization blocks, row-bound blocks).

Two workers at most (the CI machines have two cores); a task never submits to the pool and waits on it, so
sharing it cannot deadlock.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

_POOL: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1)), thread_name_prefix="blocks")
    return _POOL
