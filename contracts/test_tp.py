"""Tensor-parallel reduction of FP32 output partials: one BF16 cast after an FP32 sum in rank order
(replicated wiring), and owner slabs with exactly zero padding (sharded wiring). Hand vectors separate the
rule from casting each partial first and from summing in another order. Spec: §7.1; upstream_checks
AP-08, SP-05, SP-09.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.backends import torch_backend
from contracts.plugin import op
from kernels.sequence_parallel import sequence_parallel_bounds

REF = torch_backend()


def test_all_reduce_casts_once_after_the_fp32_sum(backend):
    """Hand-computed. (1 + 2^-8) + (-1) = 2^-8 in FP32, exact in BF16; casting each partial first would give
    BF16(1 + 2^-8) = 1 and a zero sum. In rank order 1 + 1e8 - 1e8 = 0 in FP32 (1e8 + 1 rounds to 1e8); the
    reversed order gives 1. Spec: §7.1, AP-08."""
    reduce = op(backend, "tp_all_reduce")
    out = reduce([torch.tensor([[1.0 + 2.0**-8]]), torch.tensor([[-1.0]])])
    assert out.dtype == torch.bfloat16 and out.item() == 2.0**-8, f"{out.item()!r}: expected 2^-8 (one BF16 cast)"
    out = reduce([torch.tensor([[1.0]]), torch.tensor([[1e8]]), torch.tensor([[-1e8]])])
    assert out.item() == 0.0, f"{out.item()!r}: expected 0 (FP32 sum in rank order: 1 + 1e8 - 1e8)"
    out = reduce([torch.tensor([[-1e8]]), torch.tensor([[1e8]]), torch.tensor([[1.0]])])
    assert out.item() == 1.0, f"{out.item()!r}: expected 1 (rank order -1e8 + 1e8 + 1)"


@given(seed=st.integers(0, 2**31), tp=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_reduce_scatter_is_the_all_reduce_split_into_owner_slabs(backend, seed, tp, data):
    """Every rank's slab holds exactly the all-reduced bytes of the rows it owns and exact zeros after them,
    with the physical width ceil(capacity/TP): T < TP, padding-only ranks, capacity > active. The replicated
    all-reduce equals the reference's byte for byte. Spec: §7.1, SP-05, SP-09."""
    capacity = data.draw(st.integers(1, 24))
    active = data.draw(st.integers(0, capacity))
    g = torch.Generator().manual_seed(seed)
    partials = [torch.randn((capacity, 8), generator=g) * 3 for _ in range(tp)]
    full = op(backend, "tp_all_reduce")(partials)
    assert torch.equal(full.view(torch.int16), REF.get("tp_all_reduce")(partials).view(torch.int16)), \
        "the all-reduce differs from the reference's bytes"
    slabs = op(backend, "tp_reduce_scatter")(partials, active_tokens=active, capacity=capacity)
    bounds = sequence_parallel_bounds(active, tp, capacity)
    assert len(slabs) == tp, f"{len(slabs)} slabs for TP{tp}"
    for rank, (slab, b) in enumerate(zip(slabs, bounds, strict=True)):
        assert slab.dtype == torch.bfloat16 and tuple(slab.shape) == (b.width, 8), \
            f"rank {rank}: {slab.dtype}{list(slab.shape)}, expected bf16[{b.width}, 8]"
        want = full[b.first:b.first + b.count]
        assert torch.equal(slab[: b.count].view(torch.int16), want.view(torch.int16)), \
            f"rank {rank}: owned rows differ from the all-reduced rows {b.first}..{b.first + b.count - 1}"
        pad = slab[b.count:]
        assert bool((pad == 0).all()), f"rank {rank}: padding row {b.count + int((pad != 0).any(1).nonzero()[0, 0])} " \
                                       "is not exactly zero"


@pytest.mark.parametrize("what", ["no partial", "a BF16 partial", "a partial of another shape", "active past T"])
def test_tp_reduction_rejects_bad_input(backend, what):
    """Bad partials raise a ValueError naming the rank. Spec: §7.1."""
    p = [torch.zeros(4, 8), torch.zeros(4, 8)]
    if what == "no partial":
        call, match = lambda: op(backend, "tp_all_reduce")([]), "partials"
    elif what == "a BF16 partial":
        call, match = lambda: op(backend, "tp_all_reduce")([p[0], p[1].bfloat16()]), r"partials\[1\]"
    elif what == "a partial of another shape":
        call, match = lambda: op(backend, "tp_all_reduce")([p[0], torch.zeros(5, 8)]), r"partials\[1\]"
    else:
        call, match = lambda: op(backend, "tp_reduce_scatter")(p, active_tokens=5), "active_tokens"
    with pytest.raises(ValueError, match=match):
        call()
