"""V4-Flash's embedding lookup (``lookup_embedding``): each id's BF16 row bit for bit, in id order, ids outside the
vocabulary refused naming the row (no clamp, unlike V4-Pro's input pack). Its bad calls and its golden case come
from its record (``kernels/v4/lookup_embedding.py``, judged by contracts/test_records.py). Spec: §8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from contracts.tensors import byte_rows
from kernels.config import V4_FLASH_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("lookup_embedding")

CONFIG = V4_FLASH_TINY.kernel_preset()


def _table(vocab: int, seed: int) -> torch.Tensor:
    """A table of arbitrary BF16 bit patterns (subnormals, ±0, infinities, NaN included)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**15), 2**15, (vocab, CONFIG.hidden_size), generator=g, dtype=torch.int16).view(
        torch.bfloat16)


def _first_wrong_row(got: torch.Tensor, want: torch.Tensor) -> int | None:
    bad = (byte_rows(got) != byte_rows(want)).any(1)
    return int(bad.nonzero()[0]) if bool(bad.any()) else None


@given(data=st.data())
def test_each_row_is_its_ids_row_bit_for_bit(backend, data):
    """Any ids inside the vocabulary (repeats, 0, the last id, any order), INT64 or INT32, any BF16 table: row t is
    the table's row ``ids[t]``, byte for byte (a NaN's payload and a -0 included), BF16, [T, D]."""
    vocab = data.draw(st.integers(1, 48), label="vocab")
    ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=16), label="ids")
    dtype = data.draw(st.sampled_from([torch.int64, torch.int32]), label="ids dtype")
    table = _table(vocab, data.draw(st.integers(0, 2**32 - 1), label="table seed"))
    got = op(backend, "lookup_embedding")(torch.tensor(ids, dtype=dtype), table, config=CONFIG)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (len(ids), CONFIG.hidden_size), \
        f"hidden_states: {got.dtype}{list(got.shape)}, expected bfloat16[{len(ids)}, {CONFIG.hidden_size}] (§8)"
    want = table[torch.tensor(ids, dtype=torch.int64)] if ids else table[:0]
    t = _first_wrong_row(got, want)
    assert t is None, f"hidden_states[{t}] is not row {ids[t]} of the table bit for bit (§8)"


def test_the_lookup_is_a_copy_not_a_rounding_or_a_shift(backend):
    """A hand vector whose rows are each one BF16 value: the copy is separated from an FP32 widening (dtype), from a
    row shifted by one, from ids read modulo a smaller table, and from the rows in sorted-id order."""
    vocab = 6
    table = torch.tensor([[v] * CONFIG.hidden_size for v in (1.0, -2.0, 0.5, 3.0, -0.0, 7.0)],
                         dtype=torch.bfloat16)
    ids = torch.tensor([5, 0, 3, 3, 1], dtype=torch.int64)
    want = table[ids]
    separates("the rows of ids, in id order", want[:, 0],
              shifted_by_one=table[(ids + 1) % vocab][:, 0],
              modulo_four=table[ids % 4][:, 0],
              sorted_ids=table[ids.sort().values][:, 0])
    got = op(backend, "lookup_embedding")(ids, table, config=CONFIG)
    assert got.dtype == torch.bfloat16, f"hidden_states: {got.dtype}, expected bfloat16 (a copy, not a widening)"
    t = _first_wrong_row(got, want)
    assert t is None, f"hidden_states[{t}] = {got[t, 0].item()}, expected row {int(ids[t])} = {want[t, 0].item()}"


@pytest.mark.parametrize("bad_id", [-1, 6, 2**31 + 3])
def test_an_id_outside_the_vocabulary_is_refused_naming_its_row(backend, bad_id):
    """No clamp and no wrap: the id at row 2 is named with its value and the vocabulary's range."""
    ids = torch.tensor([0, 5, bad_id, 1], dtype=torch.int64)
    with pytest.raises(ContractInputError) as exc:
        op(backend, "lookup_embedding")(ids, _table(6, 1), config=CONFIG)
    assert exc.value.field == "input_ids" and exc.value.index == (2,), \
        f"refused naming {exc.value.field}{exc.value.index}, expected input_ids at row (2,): {exc.value}"


BAD_CALLS = {  # (ids, table, the field the refusal names)
    "2-D ids": (lambda: torch.zeros(2, 3, dtype=torch.int64), lambda: _table(6, 2), "input_ids"),
    "FP32 ids": (lambda: torch.tensor([0.0, 1.0]), lambda: _table(6, 2), "input_ids"),
    "a 1-D table": (lambda: torch.tensor([0, 1]), lambda: _table(6, 2)[:, 0], "embed_weight"),
    "a table of another width": (lambda: torch.tensor([0, 1]), lambda: _table(6, 2)[:, :-1], "embed_weight"),
    "an FP32 table": (lambda: torch.tensor([0, 1]), lambda: _table(6, 2).float(), "embed_weight"),
    "an empty table": (lambda: torch.tensor([], dtype=torch.int64), lambda: _table(6, 2)[:0], "embed_weight"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_a_malformed_call_is_refused_naming_its_field(backend, case):
    """Each malformed call is refused with ContractInputError naming its field (never accepted, never another
    error): ids must be 1-D INT64/INT32, the table 2-D, BF16, of the model's width and at least one row."""
    ids, table, field = BAD_CALLS[case]
    with pytest.raises(ContractInputError) as exc:
        op(backend, "lookup_embedding")(ids(), table(), config=CONFIG)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


def test_a_one_row_vocabulary_is_a_vocabulary(backend):
    """A table of one row is valid (ids all 0): the lower bound on the vocabulary is one row, not two."""
    table = _table(1, 3)
    try:
        got = op(backend, "lookup_embedding")(torch.zeros(4, dtype=torch.int64), table, config=CONFIG)
    except ContractInputError as exc:
        pytest.fail(f"refused a one-row vocabulary: {exc}")
    assert _first_wrong_row(got, table.expand(4, -1)) is None, "a one-row vocabulary did not give its row"


def _widened(input_ids, embed_weight, *, config):
    return embed_weight.index_select(0, input_ids.to(torch.int64)).float()


def _clamped(input_ids, embed_weight, *, config):
    return embed_weight.index_select(0, input_ids.to(torch.int64).clamp(0, embed_weight.shape[0] - 1))


def _int32_wrap(input_ids, embed_weight, *, config):
    ids = input_ids.to(torch.int32).to(torch.int64) % embed_weight.shape[0]
    return embed_weight.index_select(0, ids)


def _last_row_dropped(input_ids, embed_weight, *, config):
    out = embed_weight.index_select(0, input_ids.to(torch.int64)).clone()
    if len(out):
        out[-1] = 0
    return out


def _unchecked(input_ids, embed_weight, *, config):
    """Only the id range checked: a malformed call goes through (or fails inside torch)."""
    ids = input_ids.reshape(-1).to(torch.int64)
    return embed_weight.reshape(embed_weight.shape[0], -1).index_select(0, ids)


def _two_row_minimum(input_ids, embed_weight, *, config):
    if embed_weight.shape[0] < 2:
        raise ContractInputError("embed_weight", None, "[vocab >= 2, D]", list(embed_weight.shape), "§8")
    return embed_weight.index_select(0, input_ids.to(torch.int64))


SEEDED_DEFECTS = [
    SeededDefect("lookup-embedding:widened", "lookup_embedding", _widened,
                 "test_the_lookup_is_a_copy_not_a_rounding_or_a_shift", "not a widening"),
    SeededDefect("lookup-embedding:clamped", "lookup_embedding", _clamped,
                 "test_an_id_outside_the_vocabulary_is_refused_naming_its_row", "DID NOT RAISE"),
    SeededDefect("lookup-embedding:int32-wrap", "lookup_embedding", _int32_wrap,
                 "test_an_id_outside_the_vocabulary_is_refused_naming_its_row", "DID NOT RAISE"),
    SeededDefect("lookup-embedding:last-row-zero", "lookup_embedding", _last_row_dropped,
                 "test_each_row_is_its_ids_row_bit_for_bit", "is not row"),
    SeededDefect("lookup-embedding:no-shape-checks", "lookup_embedding", _unchecked,
                 "test_a_malformed_call_is_refused_naming_its_field", "DID NOT RAISE"),
    SeededDefect("lookup-embedding:two-row-minimum", "lookup_embedding", _two_row_minimum,
                 "test_a_one_row_vocabulary_is_a_vocabulary", "refused a one-row vocabulary"),
]
