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

from backends import torch_backend
from contracts.separation import pairwise_sum, running_sum
from kernels.sequence_parallel import sp_bounds
from pto_pytest.defect import SeededDefect, shared
from pto_pytest.plugin import op

REF = torch_backend()


# the plausible other reductions of FP32 partials to one BF16 tensor (each as the kernel would return it)
def rank_order(parts):  # the rule: FP32 sum in rank order, one cast
    return running_sum(parts).bfloat16()


def reversed_order(parts):
    return rank_order(parts[::-1])


def pairwise_tree(parts):  # a ring/tree all-reduce: ((p0 + p1) + (p2 + p3)) ...
    return pairwise_sum(parts).bfloat16()


def exact_sum(parts):  # FP64 accumulation, one cast
    return torch.stack(parts).double().sum(0).bfloat16()


def cast_each_partial_first(parts):  # BF16 partials on the wire, summed in FP32
    return rank_order([p.bfloat16().float() for p in parts])


def bf16_running_sum(parts):  # the running sum kept in BF16
    total = torch.zeros_like(parts[0], dtype=torch.bfloat16)
    for p in parts:
        total = (total.float() + p).bfloat16()
    return total


ALTERNATIVES = (reversed_order, pairwise_tree, exact_sum, cast_each_partial_first, bf16_running_sum)


@pytest.mark.operators("tp_all_reduce")
def test_all_reduce_casts_once_after_the_fp32_sum_in_rank_order(backend):
    """Hand vectors, each computed under every plausible other reduction (``separates``):
    [1 + 2^-8, -1]: the rule gives 2^-8 (exact in FP32 and BF16); casting each partial first gives
    BF16(1 + 2^-8) - 1 = 0; a BF16 running sum gives 0 too.
    [1, 1e8, -1e8, 2^-8]: in rank order 1 + 1e8 rounds to 1e8, so the sum is 2^-8; reversed it is 1;
    pairwise (1 + 1e8) + (-1e8 + 2^-8) is 0; the exact sum 1 + 2^-8 rounds to BF16 1 (tie to even).
    Spec: §7.1, AP-08."""
    from contracts.separation import separates

    reduce = op(backend, "tp_all_reduce")
    one = [torch.tensor([[1.0 + 2.0**-8]]), torch.tensor([[-1.0]])]
    want = separates("one BF16 cast after the FP32 sum", rank_order(one), **{
        f.__name__: f(one) for f in (cast_each_partial_first, bf16_running_sum)})
    assert want.item() == 2.0**-8
    out = reduce(one)
    assert out.dtype == torch.bfloat16 and out.item() == 2.0**-8, f"{out.item()!r}: expected 2^-8 (one BF16 cast)"
    four = [torch.tensor([[v]]) for v in (1.0, 1e8, -1e8, 2.0**-8)]
    want = separates("FP32 sum in rank order", rank_order(four), **{
        f.__name__: f(four) for f in (reversed_order, pairwise_tree, exact_sum)})
    out = reduce(four)
    assert out.item() == want.item() == 2.0**-8, \
        f"{out.item()!r}: expected 2^-8 (rank order 1 + 1e8 - 1e8 + 2^-8 in FP32; reversed gives 1, pairwise 0)"


def test_cancelling_partials_separate_every_other_reduction():
    """The strategy the byte-exact property below draws from can tell the rule from each alternative: on its
    cancelling kind, every alternative gives other bytes on most examples (the normal kind rarely does)."""
    from contracts.separation import separating_fraction
    from contracts.strategies import reduction_partials

    for ways in (4, 8):
        g = torch.Generator().manual_seed(ways)
        examples = [reduction_partials("cancelling", ways, (4, 8), g) for _ in range(20)]
        fractions = separating_fraction(examples, rank_order, *ALTERNATIVES)
        assert all(f >= 0.5 for f in fractions.values()), (ways, fractions)


@given(seed=st.integers(0, 2**31), tp=st.sampled_from([1, 2, 4, 8]), data=st.data())
@pytest.mark.operators("sp_bounds", "tp_all_reduce", "tp_reduce_scatter")
def test_reduce_scatter_is_the_all_reduce_split_into_owner_slabs(backend, seed, tp, data):
    """Every rank's slab holds exactly the all-reduced bytes of the rows it owns and exact zeros after them,
    with the physical width ceil(capacity/TP): T < TP, padding-only ranks, capacity > active. The replicated
    all-reduce equals the reference's byte for byte, on partials that cancel across ranks too (where another
    summation order gives other bytes). Spec: §7.1, SP-05, SP-09."""
    from contracts.strategies import PARTIAL_KINDS, reduction_partials

    capacity = data.draw(st.integers(1, 24), label="capacity")
    active = data.draw(st.integers(0, capacity), label="active_tokens")
    kind = data.draw(st.sampled_from(PARTIAL_KINDS), label="partials")
    g = torch.Generator().manual_seed(seed)
    partials = reduction_partials(kind, tp, (capacity, 8), g)
    full = op(backend, "tp_all_reduce")(partials)
    assert torch.equal(full.view(torch.int16), REF.get("tp_all_reduce")(partials).view(torch.int16)), \
        "the all-reduce differs from the reference's bytes"
    slabs = op(backend, "tp_reduce_scatter")(partials, active_tokens=active, capacity=capacity)
    bounds = sp_bounds(active, tp, capacity)
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
@pytest.mark.operators("tp_all_reduce", "tp_reduce_scatter")
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


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("attention:CAST_FIRST", "test_all_reduce_casts_once_after_the_fp32_sum_in_rank_order", "one BF16 cast"),
    shared("attention:REVERSED_RANKS", "test_all_reduce_casts_once_after_the_fp32_sum_in_rank_order", "rank order"),
    shared("attention:PAIRWISE_TREE", "test_all_reduce_casts_once_after_the_fp32_sum_in_rank_order", "pairwise 0"),
    shared("attention:REVERSED_RANKS", "test_reduce_scatter_is_the_all_reduce_split_into_owner_slabs", "differs from the reference's bytes"),
    shared("attention:PAIRWISE_TREE", "test_reduce_scatter_is_the_all_reduce_split_into_owner_slabs", "differs from the reference's bytes"),
    shared("attention:STALE_PADDING", "test_reduce_scatter_is_the_all_reduce_split_into_owner_slabs", "not exactly zero"),
]


@pytest.mark.operators("tp_reduce_scatter")
@pytest.mark.parametrize("tp", [2, 4])
def test_full_owner_slabs_are_the_rank_order_sum_cast_once(backend, tp):
    """Every row active and an equal share per rank (3 rows each, width 8): each rank's slab is its rows of the FP32
    sum of the partials in rank order, cast to BF16 once, byte for byte, on partials that cancel across the ranks
    (where a cast per partial gives other bytes, and at TP4 another order too: separated for the reversed order, a
    pairwise tree and the exact sum). Spec: §7.1, SP-05."""
    from contracts.separation import separates
    from contracts.strategies import reduction_partials

    g = torch.Generator().manual_seed(tp)
    partials = reduction_partials("cancelling", tp, (3 * tp, 8), g)
    others = {"cast_each_partial_first": cast_each_partial_first(partials)}
    if tp > 2:  # two FP32 partials sum to the same bytes in either order, as a tree, and (here) exactly
        others.update(reversed_order=reversed_order(partials), pairwise_tree=pairwise_tree(partials),
                      exact_sum=exact_sum(partials))
    want = separates(f"FP32 sum in rank order, cast once (TP{tp})", rank_order(partials), **others)
    slabs = op(backend, "tp_reduce_scatter")(partials, active_tokens=3 * tp, capacity=3 * tp)
    assert len(slabs) == tp, f"{len(slabs)} slabs for TP{tp}"
    for r, slab in enumerate(slabs):
        bad = (slab.view(torch.int16) != want[3 * r:3 * r + 3].view(torch.int16)).any(1) if slab.shape == (3, 8) \
            else None
        assert bad is not None and slab.dtype == torch.bfloat16, f"rank {r}: {slab.dtype}{list(slab.shape)}, " \
                                                                 "expected bf16[3, 8]"
        assert not bool(bad.any()), f"rank {r}: row {3 * r + int(bad.nonzero()[0])} is not the rank-order FP32 sum " \
                                    "cast once (§7.1)"


def _scatter_of(reduce):
    """A reduce-scatter whose all-reduce is ``reduce`` (one of the plausible other reductions)."""
    def scatter(partials, *, active_tokens, capacity=None):
        total = reduce(list(partials))
        return [total[b.first:b.first + b.width].clone() for b in sp_bounds(active_tokens, len(partials), capacity)]

    return scatter


SEEDED_DEFECTS += [  # the full-slab contract's own (the shared ones above replace the all-reduce it does not call)
    SeededDefect("tp:scatter-reversed-ranks", "tp_reduce_scatter", _scatter_of(reversed_order),
                 "test_full_owner_slabs_are_the_rank_order_sum_cast_once", "rank-order FP32 sum"),
    SeededDefect("tp:scatter-cast-each-partial", "tp_reduce_scatter", _scatter_of(cast_each_partial_first),
                 "test_full_owner_slabs_are_the_rank_order_sum_cast_once", "rank-order FP32 sum"),
]
