"""Sequence-parallel owner slabs. Spec: §7.1."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.strategies import slab_cases
from contracts.tensors import byte_rows
from pto_pytest.defect import shared
from pto_pytest.plugin import op

SPEC_EXAMPLES = [
    ((5, 4, None), [(0, 2, 2), (2, 2, 2), (4, 1, 2), (5, 0, 2)]),
    ((2, 4, None), [(0, 1, 1), (1, 1, 1), (2, 0, 1), (2, 0, 1)]),
    ((4, 4, 8), [(0, 2, 2), (2, 2, 2), (4, 0, 2), (4, 0, 2)]),
    ((1, 4, None), [(0, 1, 1), (1, 0, 1), (1, 0, 1), (1, 0, 1)]),
    ((0, 4, 0), [(0, 0, 0)] * 4),
]


@pytest.mark.parametrize("args, expected", SPEC_EXAMPLES, ids=[str(a) for a, _ in SPEC_EXAMPLES])
@pytest.mark.operators("sp_bounds")
def test_slab_bounds_spec_examples(backend, args, expected):
    """(T=5,TP=4), (2,4), (4,4,capacity 8) exactly as the spec lists them."""
    active, tp, capacity = args
    got = [(b.first, b.count, b.width) for b in op(backend, "sp_bounds")(active, tp, capacity)]
    assert got == expected, f"sp_bounds{args} = {got}, expected {expected} (§7.1)"


@given(case=slab_cases())
@pytest.mark.operators("sp_bounds")
def test_slab_every_active_row_has_exactly_one_owner(backend, case):
    """width = ceil(capacity/TP) on every rank; the owned ranges tile [0, active) once, in rank order."""
    bounds = op(backend, "sp_bounds")(case.active, case.tp, case.capacity)
    width = -(-case.capacity // case.tp) if case.capacity else 0
    assert len(bounds) == case.tp
    owners = [0] * case.active
    for rank, b in enumerate(bounds):
        assert b.width == width, f"rank {rank}: width {b.width}, expected ceil({case.capacity}/{case.tp}) = {width}"
        assert 0 <= b.count <= b.width
        for row in range(b.first, b.first + b.count):
            owners[row] += 1
            assert row // width == rank, f"row {row} owned by rank {rank}, physical slab says {row // width}"
    bad = [row for row, n in enumerate(owners) if n != 1]
    assert not bad, f"active row {bad[0]} has {owners[bad[0]]} owners (expected exactly 1)"


@given(case=slab_cases())
@pytest.mark.operators("sp_gather", "sp_shard")
def test_slab_gather_of_shard_is_byte_exact(backend, case):
    """gather(shard(x)) returns x, token ids and positions byte for byte, in order."""
    x, tokens, positions = case.tensors()
    slabs = op(backend, "sp_shard")(x, tokens, positions, tp=case.tp, capacity=case.capacity)
    gx, gt, gp = op(backend, "sp_gather")(slabs, active_tokens=case.active, capacity=case.capacity)
    assert gx.dtype == x.dtype and gx.shape == x.shape, f"gathered {gx.dtype}{list(gx.shape)}"
    xb, gb = byte_rows(x), byte_rows(gx)
    if not torch.equal(xb, gb):
        row = int((xb != gb).any(dim=1).nonzero()[0, 0])
        raise AssertionError(f"gathered row {row} differs from input row {row}")
    assert torch.equal(gt.to(torch.int64), tokens.to(torch.int64)), f"token ids {gt.tolist()} != {tokens.tolist()}"
    assert torch.equal(gp.to(torch.int64), positions.to(torch.int64)), "positions reordered"


@given(case=slab_cases())
@pytest.mark.operators("sp_bounds", "sp_shard")
def test_slab_padding_contract_on_every_rank(backend, case):
    """Every rank publishes ``width`` rows; rows past its count are zero, token_id -1, position -1, invalid."""
    x, tokens, positions = case.tensors()
    slabs = op(backend, "sp_shard")(x, tokens, positions, tp=case.tp, capacity=case.capacity)
    bounds = op(backend, "sp_bounds")(case.active, case.tp, case.capacity)
    assert len(slabs) == case.tp
    for rank, (slab, b) in enumerate(zip(slabs, bounds, strict=True)):
        assert slab.payload.shape[0] == b.width, f"rank {rank}: {slab.payload.shape[0]} rows, expected {b.width}"
        for row in range(b.count, b.width):
            where = f"rank {rank} padding row {row}"
            assert not bool(slab.payload[row].ne(0).any()), f"{where}: payload not zero"
            assert int(slab.token_ids[row]) == -1, f"{where}: token_id {int(slab.token_ids[row])}, expected -1"
            assert int(slab.positions[row]) == -1, f"{where}: position {int(slab.positions[row])}, expected -1"
            assert not bool(slab.valid[row]), f"{where}: valid mask True"
        assert bool(slab.valid[: b.count].all()), f"rank {rank}: an owned row is marked invalid"


@given(case=slab_cases(), data=st.data())
@pytest.mark.operators("sp_bounds", "sp_gather", "sp_shard")
def test_slab_gather_rejects_a_padding_breach(backend, case, data):
    """A padding row with a non-zero payload, a token id, a position or a set mask is refused, naming the rank."""
    x, tokens, positions = case.tensors()
    slabs = op(backend, "sp_shard")(x, tokens, positions, tp=case.tp, capacity=case.capacity)
    bounds = op(backend, "sp_bounds")(case.active, case.tp, case.capacity)
    padded = [b for b in bounds if b.count < b.width]
    if not padded:
        return
    b = data.draw(st.sampled_from(padded), label='b')
    row = data.draw(st.integers(b.count, b.width - 1), label='row')
    field = data.draw(st.sampled_from(("payload", "token_ids", "positions", "valid")), label='field')
    slab = slabs[b.rank]
    value = getattr(slab, field).clone()
    value[row] = {"payload": 13.0, "token_ids": 7, "positions": 3, "valid": True}[field]
    slabs[b.rank] = type(slab)(**{**slab.__dict__, field: value})
    with pytest.raises(ValueError, match=rf"rank{b.rank}\.\w+"):
        op(backend, "sp_gather")(slabs, active_tokens=case.active, capacity=case.capacity)


@pytest.mark.parametrize("args", [(-1, 4, None), (5, 0, None), (5, 4, 3)], ids=["neg-active", "tp0", "cap<active"])
@pytest.mark.operators("sp_bounds")
def test_slab_bounds_reject_bad_arguments(backend, args):
    with pytest.raises(ValueError, match="active_tokens|tp|capacity"):
        op(backend, "sp_bounds")(*args)


@given(case=slab_cases())
@pytest.mark.operators("sp_bounds")
def test_slab_owner_matches_the_bounds(case):
    """slab_owner(row, width) names the rank whose bounds hold the row; width 0 owns nothing. Spec: §7.1."""
    from kernels.sequence_parallel import slab_owner, sp_bounds

    bounds = sp_bounds(case.active, case.tp, case.capacity)
    for b in bounds:
        for row in range(b.first, b.first + b.count):
            assert slab_owner(row, b.width) == b.rank
    with pytest.raises(ValueError, match="width"):
        slab_owner(0, 0)


def test_dp_token_counts_give_one_count_per_group_within_the_call():
    """--dp-tokens of a prefill call: one int per DP group, each in [0, tokens] (an empty group allowed);
    a missing or extra group, a count over tokens, a negative count or a bool is refused naming the group.
    Spec: CH-07."""
    from kernels.errors import ContractInputError
    from kernels.sequence_parallel import dp_token_counts

    assert dp_token_counts([0, 7, 3], tokens=7, dp=3) == (0, 7, 3)
    for counts, field in (([7, 7], "one count per DP group"), ([1, 2, 3, 4], "one count per DP group"),
                          ([1, 8, 0], r"dp_tokens\[1\]"), ([1, -1, 0], r"dp_tokens\[1\]"),
                          ([True, 1, 1], r"dp_tokens\[0\]"), ([1, 1, 1.0], r"dp_tokens\[2\]")):
        with pytest.raises(ContractInputError, match=field):
            dp_token_counts(counts, tokens=7, dp=3)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("slabs:WIDTH_FROM_ACTIVE", "test_slab_bounds_spec_examples", "(4, 4, 8)"),
    shared("slabs:WIDTH_FROM_ACTIVE", "test_slab_every_active_row_has_exactly_one_owner", "width"),
    shared("slabs:SHARD_STALE_PADDING", "test_slab_padding_contract_on_every_rank", "payload not zero"),
    shared("slabs:GATHER_REVERSED", "test_slab_gather_of_shard_is_byte_exact", "differs"),
    shared("slabs:GATHER_UNCHECKED", "test_slab_gather_rejects_a_padding_breach", "DID NOT RAISE"),
    shared("slabs:LENIENT_BOUNDS", "test_slab_bounds_reject_bad_arguments", "DID NOT RAISE"),
]
