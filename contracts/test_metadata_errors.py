"""Bad engine input raises a ValueError naming the field, the request row and the offending value.
Spec: §3 (input rules, allocation check, state tables, paged_slots G2), §1 (TP).
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from contracts.separation import separates
from contracts.strategies import materialize, request_batches
from pto_pytest.defect import shared
from pto_pytest.plugin import op

BATCHES = request_batches(min_requests=2)


def _active(case) -> list[int]:
    return [r for r, q in enumerate(case.query_lens) if q > 0]


def _raises(build, inputs, pattern: str) -> None:
    try:
        build(**inputs)
    except ValueError as exc:
        assert re.search(pattern, str(exc)), f"error {str(exc)!r} does not name {pattern!r}"
    else:
        pytest.fail(f"accepted bad input: expected a ValueError naming {pattern!r}")


def _with(inputs: dict, key: str, index: tuple, value: int) -> dict:
    """``inputs`` with a copy of tensor ``key`` whose element ``index`` is ``value``."""
    t = inputs[key].clone()
    t[index] = value
    return {**inputs, key: t}


@given(case=BATCHES, data=st.data())
@pytest.mark.operators("build_forward_metadata")
def test_metadata_rejects_decreasing_query_start_loc(backend, case, data):
    build = op(backend, "build_forward_metadata")
    active = _active(case)
    assume(active)
    r = data.draw(st.sampled_from(active), label='r')
    inputs = materialize(case)
    inputs = _with(inputs, "query_start_loc", (r + 1,), int(inputs["query_start_loc"][r]) - 1)
    _raises(build, inputs, rf"query_start_loc\[{r + 1}\]")


@given(case=BATCHES, data=st.data(), value=st.integers(-5000, -1))
@pytest.mark.operators("build_forward_metadata")
def test_metadata_rejects_negative_kv_length(backend, case, data, value):
    build = op(backend, "build_forward_metadata")
    r = data.draw(st.integers(0, len(case.query_lens) - 1), label='r')
    inputs = _with(materialize(case), "kv_seq_lens", (r,), value)
    _raises(build, inputs, rf"kv_seq_lens\[{r}\].*{value}")


@given(case=BATCHES, data=st.data())
@pytest.mark.operators("build_forward_metadata")
def test_metadata_rejects_unmapped_window_page_in_visible_range(backend, case, data):
    """The page holding a token's own position is -1 (page -1 in a visible range)."""
    build = op(backend, "build_forward_metadata")
    active = _active(case)
    assume(active)
    r = data.draw(st.sampled_from(active), label='r')
    pos = case.kv_lens[r] + data.draw(st.integers(0, case.query_lens[r] - 1), label='offset in request')
    page = pos // case.config.block_size
    inputs = _with(materialize(case), "window_block_table", (r, page), -1)
    _raises(build, inputs, rf"window_block_table\[{r}\]\[{page}\].*-1")


@given(case=BATCHES, data=st.data())
@pytest.mark.operators("build_forward_metadata")
def test_metadata_rejects_missing_visible_compressed_page(backend, case, data):
    """A visible compressed page of an active request is -1 ("missing visible compressed pages")."""
    build = op(backend, "build_forward_metadata")
    c = case.config
    ratio = data.draw(st.sampled_from((1, 2)), label='ratio')
    candidates = [r for r in _active(case) if (case.kv_lens[r] + case.query_lens[r]) // ratio > 0]
    assume(candidates)
    r = data.draw(st.sampled_from(candidates), label='r')
    visible = (case.kv_lens[r] + case.query_lens[r]) // ratio
    page = data.draw(st.integers(0, (visible - 1) // c.block_size), label='page')
    inputs = materialize(case)
    tables = {}
    for src, t in inputs["compressed_block_tables"].items():
        t = t.clone()
        if c.compress_ratios[src] == ratio:
            t[r, page] = -1
        tables[src] = t
    inputs["compressed_block_tables"] = tables
    _raises(build, inputs, rf"compressed_block_tables\[\d+\]\[{r}\]\[{page}\].*missing visible compressed pages")


@given(case=BATCHES, data=st.data())
@pytest.mark.operators("build_forward_metadata")
def test_metadata_rejects_duplicate_state_block(backend, case, data):
    build = op(backend, "build_forward_metadata")
    batch = len(case.query_lens)
    a, b = data.draw(st.lists(st.integers(0, batch - 1), min_size=2, max_size=2, unique=True), label='a, b')
    inputs = materialize(case)
    src = data.draw(st.sampled_from(sorted(inputs["state_block_tables"])), label='src')
    first, second = min(a, b), max(a, b)
    t = inputs["state_block_tables"][src].clone()
    t[first, 0] = 1000 if t[first, 0] < 0 else t[first, 0]
    t[second, 0] = t[first, 0]
    inputs["state_block_tables"] = {**inputs["state_block_tables"], src: t}
    _raises(build, inputs, rf"state_block_tables\[{src}\]\[{second}\]\[0\].*distinct.*got {int(t[first, 0])}")


@given(case=BATCHES, data=st.data(), value=st.integers(-100, -2))
@pytest.mark.operators("build_forward_metadata")
def test_metadata_rejects_state_block_below_minus_one(backend, case, data, value):
    build = op(backend, "build_forward_metadata")
    r = data.draw(st.integers(0, len(case.query_lens) - 1), label='r')
    inputs = materialize(case)
    t = inputs["state_block_tables"][2].clone()
    t[r, 0] = value
    inputs["state_block_tables"] = {**inputs["state_block_tables"], 2: t}
    _raises(build, inputs, rf"state_block_tables\[2\]\[{r}\]\[0\].*{value}")


@given(case=BATCHES, tp=st.sampled_from((0, 3, 5, 6, 16, -4)))
@pytest.mark.operators("build_forward_metadata")
def test_metadata_rejects_unsupported_tp(backend, case, tp):
    build = op(backend, "build_forward_metadata")
    _raises(build, {**materialize(case), "tp_size": tp}, rf"tp_size.*{tp}")


@given(case=BATCHES)
@pytest.mark.operators("build_forward_metadata")
def test_metadata_rejects_structural_mistakes(backend, case):
    """Wrong state dtype/shape, diverging same-ratio tables, a missing source table, short capacity; query_start_loc
    and kv_seq_lens not 1-D integer vectors (MD-01)."""
    build = op(backend, "build_forward_metadata")
    inputs = materialize(case)
    states = inputs["state_block_tables"]
    _raises(build, {**inputs, "state_block_tables": {**states, 8: states[8].to(torch.int64)}},
            r"state_block_tables\[8\].*INT32")
    _raises(build, {**inputs, "state_block_tables": {k: v for k, v in states.items() if k != 14}},
            r"state_block_tables\[14\].*missing")
    tables = inputs["compressed_block_tables"]
    _raises(build, {**inputs, "compressed_block_tables": {**tables, 8: tables[8] + 1}},
            r"compressed_block_tables\[8\].*same table as source 2")
    _raises(build, {**inputs, "compressed_block_tables": {k: v for k, v in tables.items() if k != 20}},
            r"compressed_block_tables\[20\].*missing")
    _raises(build, {**inputs, "query_start_loc": inputs["query_start_loc"] + 1}, r"query_start_loc\[0\]")
    _raises(build, {**inputs, "query_start_loc": inputs["query_start_loc"][:-1]}, r"query_start_loc")
    # MD-01: both vectors 1-D integers (a [1, B+1] row or a [B, 1] column is not a batch)
    _raises(build, {**inputs, "query_start_loc": inputs["query_start_loc"][None]}, r"query_start_loc.*1-D")
    _raises(build, {**inputs, "kv_seq_lens": inputs["kv_seq_lens"][:, None]}, r"kv_seq_lens.*1-D")
    _raises(build, {**inputs, "kv_seq_lens": inputs["kv_seq_lens"].float()}, r"kv_seq_lens.*integer")
    _raises(build, {**inputs, "window_block_table": inputs["window_block_table"][:-1]}, r"window_block_table")
    if case.num_tokens:
        _raises(build, {**inputs, "capacity": case.num_tokens - 1}, r"capacity")


def test_paged_slots_reject_bad_requests_and_pages():
    """G2 paged_slots: a request outside the table, a logical page past its width and a page < 0 raise,
    naming the table, row and page (G1 returned negative slots instead: the PR1280 regression); positions and
    request ids that are not matching 1-D integer vectors, a table that is not a 2-D integer table, and a block size
    or divisor of 0 are refused naming them (MD-08)."""
    from kernels.metadata import paged_slots

    table = torch.tensor([[3, -1], [2, 0]])
    pos = torch.tensor([0, 200])
    with pytest.raises(ValueError, match=r"block_table\[2\].*request row in \[0, 2\)"):
        paged_slots(pos[:1], torch.tensor([2]), table, block_size=128)
    with pytest.raises(ValueError, match=r"block_table\[1\]\[2\].*logical page < 2"):
        paged_slots(torch.tensor([300]), torch.tensor([1]), table, block_size=128)
    with pytest.raises(ValueError, match=r"block_table\[0\]\[1\].*physical page >= 0.*got -1"):
        paged_slots(pos, torch.tensor([0, 0]), table, block_size=128)
    # MD-08's argument checks: matching 1-D integer vectors, a 2-D integer table, a block size and divisor > 0
    for args, kw, match in (((pos[None], torch.tensor([[1, 1]]), table), {}, r"positions.*1-D integer"),
                            ((pos.float(), torch.tensor([1, 1]), table), {}, r"positions.*1-D integer"),
                            ((pos, torch.tensor([1]), table), {}, r"request_ids.*one per position"),
                            ((pos, torch.tensor([1.0, 1.0]), table), {}, r"request_ids.*1-D integer"),
                            ((pos, torch.tensor([1, 1]), table[0]), {}, r"block_table.*2-D integer"),
                            ((pos, torch.tensor([1, 1]), table.float()), {}, r"block_table.*2-D integer"),
                            ((pos, torch.tensor([1, 1]), table), {"block_size": 0}, r"block_size/divisor"),
                            ((pos, torch.tensor([1, 1]), table), {"divisor": 0}, r"block_size/divisor")):
        with pytest.raises(ValueError, match=match):
            paged_slots(*args, **{"block_size": 128, **kw})
    want = separates("slot = table[req, p // bs] * bs + p % bs", torch.tensor([2 * 128, 72]),
                     no_table=pos, request_0s_table=torch.tensor([3 * 128, -1]))
    assert paged_slots(pos, torch.tensor([1, 1]), table, block_size=128).tolist() == want.tolist()
    assert paged_slots(torch.tensor([-1, 5]), torch.tensor([0, 0]), table, block_size=128, divisor=2,
                       only_complete=True).tolist() == [-1, 3 * 128 + 2]


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("metadata:NO_STATE_DEDUP", "test_metadata_rejects_duplicate_state_block", "accepted bad input"),
    shared("metadata:CLAMPS_QSL", "test_metadata_rejects_decreasing_query_start_loc", "query_start_loc"),
    shared("metadata:CLAMPS_KV", "test_metadata_rejects_negative_kv_length", "accepted bad input"),
    shared("metadata:UNCHECKED_PAGES", "test_metadata_rejects_unmapped_window_page_in_visible_range", "accepted bad input"),
    shared("metadata:NO_ALLOCATION_CHECK", "test_metadata_rejects_missing_visible_compressed_page", "accepted bad input"),
    shared("metadata:STATE_BELOW_MINUS_ONE_OK", "test_metadata_rejects_state_block_below_minus_one", "accepted bad input"),
    shared("metadata:ANY_TP", "test_metadata_rejects_unsupported_tp", "accepted bad input"),
    shared("metadata:LENIENT_STATE_DTYPE", "test_metadata_rejects_structural_mistakes", "accepted bad input"),
]
