"""Quantize + pack throughput of the MX codecs on a [4096, 512] BF16 tensor, as a ratio against a floor
measured in the same run on the same data: ``x.float().abs().amax(-1)``.

Run: .venv/bin/python benchmarks/quant.py [--repeats N]. Goal: ratio (floor time / codec time) >= 0.25.
"""

from __future__ import annotations

import argparse

import torch
from _common import interleaved, keep_heap_warm, report

from kernels.quant import mx_quantize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default-heap", action="store_true",
                        help="leave glibc's heap policy alone (temporaries may page-fault on every call)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    args = parser.parse_args()
    heap = "default heap" if args.default_heap else keep_heap_warm()
    if args.threads:
        torch.set_num_threads(args.threads)
    x = (torch.randn((4096, 512), generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    ops = {"floor: x.float().abs().amax(-1)": lambda: x.float().abs().amax(-1)}
    for rule in ("window", "compressed", "index"):
        ops[f"quantize+pack {rule}"] = lambda rule=rule: mx_quantize(x, rule)
    samples = interleaved(ops, args.repeats)
    floor_name = "floor: x.float().abs().amax(-1)"
    mb = x.numel() * x.element_size() / 1e6
    print(f"input [4096, 512] bf16 ({mb:.1f} MB), torch threads {torch.get_num_threads()}, {heap}, "
          f"{args.repeats} interleaved runs; ratio = floor time / operation time (median, and best-of as the "
          "least noisy estimate)")
    report(samples, floor_name, width=34, mb=mb)

if __name__ == "__main__":
    main()
