"""The per-row RMS/peak bound check (``check_row_precision``) on a [4096, 5120] BF16 pair, as a ratio
against a floor measured in the same run on the same data: ``(a.float() - b.float()).pow(2).sum(-1)``.

Run: .venv/bin/python benchmarks/precision.py [--repeats N]. Goal (the attention issue): ratio (floor time / check
time) >= 0.5.
"""

from __future__ import annotations

import argparse

import torch
from _common import interleaved, keep_heap_warm, report

from contracts.checks.precision import check_row_precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default-heap", action="store_true", help="leave glibc's heap policy alone")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    args = parser.parse_args()
    heap = "default heap" if args.default_heap else keep_heap_warm()
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    b = torch.randn((4096, 5120), generator=g).to(torch.bfloat16)
    a = (b.float() + torch.randn((4096, 5120), generator=g) * 1e-3).to(torch.bfloat16)
    floor_name = "floor: (a.float()-b.float()).pow(2).sum(-1)"
    ops = {floor_name: lambda: (a.float() - b.float()).pow(2).sum(-1),
           "check_row_precision": lambda: check_row_precision(a, b)}
    assert ops["check_row_precision"]().ok
    samples = interleaved(ops, args.repeats)
    print(f"input 2 x [4096, 5120] bf16, torch threads {torch.get_num_threads()}, {heap}, {args.repeats} "
          "interleaved runs; ratio = floor time / operation time (median, and best-of)")
    report(samples, floor_name)

if __name__ == "__main__":
    main()
