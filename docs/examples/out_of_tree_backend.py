"""A complete out-of-tree backend: the sequence-parallel slab bounds of spec §7.1, written from scratch, and
everything else taken from the Torch reference (``torch_backend().derive``), so the contracts judge only what
this file implements. Load it by module or by file path:

    pytest contracts/test_slabs.py --backend-module docs/examples/out_of_tree_backend.py:BACKEND
    goldens replay sp_slabs --backend-module docs/examples/out_of_tree_backend.py:make_backend

A binding of your own kernels looks the same: one callable per operator, with the signature and return
convention ``docs/backends.md`` gives for it. Raise ``ValueError`` (``ContractInputError`` is one) naming the
field for input the operator does not accept: the caller-contract tests check that.
"""

from __future__ import annotations

from backends import torch_backend
from contracts.operators import Backend
from kernels.errors import ContractInputError
from kernels.sequence_parallel import SlabBounds


def slab_bounds(active_tokens: int, tp: int, capacity: int | None = None) -> tuple[SlabBounds, ...]:
    """Per-rank (first, count, width): width = ceil(capacity / tp) over the physical capacity."""
    for name, value in (("active_tokens", active_tokens), ("capacity", capacity)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ContractInputError(name, None, "a non-negative int", repr(value), "§7.1")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ContractInputError("tp", None, "a positive int", repr(tp), "§7.1")
    capacity = active_tokens if capacity is None else capacity
    if capacity < active_tokens:
        raise ContractInputError("capacity", None, f">= active_tokens={active_tokens}", capacity, "§7.1")
    width = (capacity + tp - 1) // tp
    out = []
    for rank in range(tp):
        first = min(rank * width, active_tokens)
        out.append(SlabBounds(rank, first, max(0, min(width, active_tokens - first)), width))
    return tuple(out)


def make_backend() -> Backend:
    return torch_backend().derive("example-out-of-tree", description="docs/examples: own slab bounds",
                                  sp_bounds=slab_bounds)


BACKEND = make_backend()
