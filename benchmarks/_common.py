"""Shared set-up for the on-demand benchmarks."""

from __future__ import annotations


def keep_heap_warm() -> str:
    """Stop glibc from returning freed 8 MB blocks to the OS between calls, so neither the floor nor the
    codec pays page faults on its temporaries (otherwise the floor alone swings 1 ms <-> 6 ms here)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 30)
        return "warm heap (mallopt)" if ok else "default heap"
    except OSError:
        return "default heap"


def interleaved(ops: dict, repeats: int) -> dict[str, list[float]]:
    """Warm each operation up once, then time them round-robin ``repeats`` times (seconds per call), so
    machine noise hits the baseline and the subject alike."""
    import time

    for fn in ops.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, fn in ops.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return samples


def report(samples: dict[str, list[float]], floor_name: str, *, width: int = 44, mb: float | None = None) -> None:
    """One row per operation: median ms, optional MB/s, and the ratio floor time / operation time (median,
    and best-of as the least noisy estimate)."""
    import statistics

    floor, floor_min = statistics.median(samples[floor_name]), min(samples[floor_name])
    rate = f" {'MB/s':>8}" if mb is not None else ""
    print(f"{'operation':<{width}} {'median ms':>10}{rate} {'ratio (median)':>15} {'ratio (best)':>13}")
    for name, times in samples.items():
        t, best = statistics.median(times), min(times)
        speed = f" {mb / t:8.0f}" if mb is not None else ""
        print(f"{name:<{width}} {t * 1e3:10.3f}{speed} {floor / t:15.3f} {floor_min / best:13.3f}")
