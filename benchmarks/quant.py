"""Quantize + pack throughput of the MX codecs on a [4096, 512] BF16 tensor, as a ratio against a floor
measured in the same run on the same data: ``x.float().abs().amax(-1)``.

Run: .venv/bin/python benchmarks/quant.py [--repeats N]. Goal: ratio (floor time / codec time) >= 0.25.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernels.quant import mx_quantize


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    x = (torch.randn((4096, 512), generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    floor = _time(lambda: x.float().abs().amax(-1), args.repeats)
    mb = x.numel() * x.element_size() / 1e6
    print(f"input [4096, 512] bf16 ({mb:.1f} MB), torch threads {torch.get_num_threads()}, median of {args.repeats}")
    print(f"{'operation':<34} {'ms':>8} {'MB/s':>9} {'ratio vs floor':>15}")
    print(f"{'floor: x.float().abs().amax(-1)':<34} {floor * 1e3:8.3f} {mb / floor:9.0f} {1.0:15.3f}")
    for rule in ("window", "compressed", "index"):
        t = _time(lambda rule=rule: mx_quantize(x, rule), args.repeats)
        print(f"{'quantize+pack ' + rule:<34} {t * 1e3:8.3f} {mb / t:9.0f} {floor / t:15.3f}")


if __name__ == "__main__":
    main()
