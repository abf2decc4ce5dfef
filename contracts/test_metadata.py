"""ForwardMetadata invariants, one test each, against the backend's ``build_forward_metadata``.

Spec: §3.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings

from contracts.checks import metadata as checks
from contracts.result import assert_ok
from contracts.strategies import BatchCase, materialize, request_batches
from kernels.config import FLASH
from kernels.metadata import build_forward_metadata
from pto_pytest.defect import shared
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("build_forward_metadata")  # every contract here calls it, and only it

BATCHES = request_batches()


def _check(backend, case: BatchCase, check) -> None:
    inputs = materialize(case)
    meta = op(backend, "build_forward_metadata")(**inputs)
    assert_ok(check(meta, inputs))


@given(case=BATCHES)
def test_metadata_query_layout(backend, case):
    """query_start_loc starts at 0, never decreases; num_tokens == qsl[-1]; lens and kv pass through."""
    _check(backend, case, checks.check_query_layout)


@given(case=BATCHES)
def test_metadata_token_requests(backend, case):
    """token_to_req_indices agrees with query_start_loc (empty requests own no token)."""
    _check(backend, case, checks.check_token_requests)


@given(case=BATCHES)
def test_metadata_positions(backend, case):
    """positions = kv_seq_len + offset, consecutive within a chunk."""
    _check(backend, case, checks.check_positions)


@given(case=BATCHES)
def test_metadata_window(backend, case):
    """window indices oldest first then -1; window_lens = min(p+1, W); window slot = slot(p)."""
    _check(backend, case, checks.check_window)


@given(case=BATCHES)
def test_metadata_compressed_slots(backend, case):
    """compressed/index slots only where (p+1) % ratio == 0, -1 for inactive state blocks."""
    _check(backend, case, checks.check_compressed_slots)


@given(case=BATCHES)
def test_metadata_compressed_lens(backend, case):
    """causal compressed_lens, compressed_seq_lens and remainders."""
    _check(backend, case, checks.check_compressed_lens)


@given(case=BATCHES)
def test_metadata_compressor_outputs(backend, case):
    """compressor output starts = cumsum; source rows complete their group; group-first positions."""
    _check(backend, case, checks.check_compressor_outputs)


@given(case=BATCHES)
def test_metadata_compressed_rope_positions(backend, case):
    """compressed_rope_position_ids = p+1-ratio or -1."""
    _check(backend, case, checks.check_compressed_rope_positions)


@given(case=BATCHES)
def test_metadata_live_slots_unique_and_owned(backend, case):
    """live slots unique and inside the request's allocated pages."""
    _check(backend, case, checks.check_live_slots)


@given(case=BATCHES)
def test_metadata_logit_rows(backend, case):
    """logit_row_indices = last row of each nonempty request, -1 for empty ones."""
    _check(backend, case, checks.check_logit_rows)


@given(case=BATCHES)
def test_metadata_moe_owners(backend, case):
    """moe_token_owners = arange(T) % TP."""
    _check(backend, case, checks.check_moe_owners)


@given(case=BATCHES)
def test_metadata_state_tables_pass_through(backend, case):
    """state block tables pass through unchanged for exactly the ratio-2 sources."""
    _check(backend, case, checks.check_state_tables)


@given(case=BATCHES)
def test_metadata_field_layout(backend, case):
    """every field has the spec's dtype and shape."""
    _check(backend, case, checks.check_field_layout)


@settings(max_examples=10)
@given(case=request_batches(config=FLASH, max_requests=4, max_kv=5000, max_prefill=200))
def test_metadata_all_invariants_at_flash_dims(backend, case):
    """Every invariant at the real FLASH block size (128) and window (128)."""
    inputs = materialize(case)
    meta = op(backend, "build_forward_metadata")(**inputs)
    for check in checks.ALL_CHECKS:
        assert_ok(check(meta, inputs))


# --- each clause of the checks alone: one field of the reference's metadata corrupted at a time -----------------

_FIXED = BatchCase(config=FLASH, query_lens=(3, 5, 0, 2), kv_lens=(1, 130, 7, 260), padding=3, tp=1,
                   inactive_state=(False,) * 4, spare_pages=1, free_behind_window=False, seed=0)
_TOKEN = ("token_to_req_indices", "moe_token_owners", "position_ids", "window_slots", "window_lens", "window_indices",
          "compressed_slots", "index_slots", "compressed_lens", "compressed_rope_position_ids")
_REQUEST = ("query_start_loc", "query_lens", "logit_row_indices", "kv_seq_lens", "new_kv_seq_lens",
            "compressed_seq_lens", "compressed_seq_remainders", "compressor_output_start_loc")
_OUTPUT = ("compressor_source_token_indices", "compressor_position_ids")
_CORRUPTIONS = ([("position_ids", "request")] + [(f, w) for f in _TOKEN for w in ("active", "padding", "length", "dtype")]
                + [(f, w) for f in _REQUEST for w in ("first", "last", "length", "dtype")]
                + [(f, w) for f in _OUTPUT for w in ("first", "length", "dtype")]
                + [("num_tokens", "value"), ("state_block_tables", "dtype"), ("state_block_tables", "keys")])


_OWNER = {  # the check that holds each field's value rule (its dtype and shape: check_field_layout)
    "token_to_req_indices": "check_token_requests", "moe_token_owners": "check_moe_owners",
    "position_ids": "check_positions", "window_slots": "check_window", "window_lens": "check_window",
    "window_indices": "check_window", "compressed_slots": "check_compressed_slots",
    "index_slots": "check_compressed_slots", "compressed_lens": "check_compressed_lens",
    "compressed_seq_lens": "check_compressed_lens", "compressed_seq_remainders": "check_compressed_lens",
    "compressed_rope_position_ids": "check_compressed_rope_positions", "query_start_loc": "check_query_layout",
    "query_lens": "check_query_layout", "kv_seq_lens": "check_query_layout", "new_kv_seq_lens": "check_query_layout",
    "num_tokens": "check_query_layout", "logit_row_indices": "check_logit_rows",
    "compressor_output_start_loc": "check_compressor_outputs",
    "compressor_source_token_indices": "check_compressor_outputs",
    "compressor_position_ids": "check_compressor_outputs", "state_block_tables": "check_state_tables",
}


def _corrupt(t: torch.Tensor, where: str, active: int) -> torch.Tensor:
    if where == "length":
        return t[:-1].clone()
    if where == "dtype":
        return t.to(torch.int64 if t.dtype == torch.int32 else torch.int32)
    t = t.clone()
    if where == "request":  # request 1's rows (3..7) all one later: still consecutive, each one wrong
        t[3:8] += 1
        return t
    row = {"active": 1, "padding": active + 1, "first": 0, "last": -1}[where]
    t[row] += 1
    return t


@pytest.mark.parametrize("field, where", _CORRUPTIONS, ids=[f"{f}-{w}" for f, w in _CORRUPTIONS])
def test_each_field_corrupted_alone_fails_a_check_naming_it(field, where):
    """The reference's metadata of a fixed batch (an empty request, a request past a page, 3 padding rows) passes
    every check; the same metadata with one field corrupted -- one active row, one padding row, a request's
    positions all shifted (still consecutive), the first or last request entry, one row short, another integer
    dtype, a per-source table missing -- fails a check whose
    violation names that field. Every clause a check holds about a field is shown failing on its own here or in
    the property tests above (tests/mutation/clauses.py). The check that owns the field's rule must be the one
    that fails (check_field_layout for a dtype), so a clause dropped from it is not covered by another check."""
    inputs = materialize(_FIXED)
    meta = build_forward_metadata(**inputs)
    every = checks.ALL_CHECKS
    assert all(c(meta, inputs).ok for c in every)
    active = meta.num_tokens
    value = getattr(meta, field)
    if field == "num_tokens":
        new = value + 1
    elif field == "state_block_tables":
        new = ({k: v.long() for k, v in value.items()} if where == "dtype"
               else {k: v for k, v in list(value.items())[1:]})
    elif isinstance(value, dict):
        src = sorted(value)[0]
        new = {**value, src: _corrupt(value[src], where, active)}
    else:
        new = _corrupt(value, where, active)
    bad = dataclasses.replace(meta, **{field: new})
    verdicts = {}
    for check in every:
        try:
            verdicts[check.__name__] = check(bad, inputs)
        except (IndexError, KeyError) as e:
            raise AssertionError(f"{check.__name__} crashed on {field} ({where}): {e!r}") from e
    owner = "check_field_layout" if where == "dtype" and field != "state_block_tables" else _OWNER[field]
    r = verdicts[owner]
    assert not r.ok and field in r.message(), f"{owner} on {field} ({where}): {r.message()}"
    if where == "length":  # the layout check holds the shape on its own too
        r = verdicts["check_field_layout"]
        assert not r.ok and ".shape" in r.message(), f"check_field_layout on {field} ({where}): {r.message()}"


def test_live_slots_are_unique_owned_and_inside_the_pages_on_their_own():
    """check_live_slots alone, on the fixed batch: a window slot another token writes, a slot on another request's
    page, a window index on a page the request does not own -- each fails naming the clause."""
    inputs = materialize(_FIXED)
    meta = build_forward_metadata(**inputs)
    assert checks.check_live_slots(meta, inputs).ok
    slots = meta.window_slots.clone()
    slots[1] = slots[0]
    r = checks.check_live_slots(dataclasses.replace(meta, window_slots=slots), inputs)
    assert not r.ok and "the same physical row" in r.message(), r.message()
    table = inputs["window_block_table"]
    other = int(table[1][table[1] >= 0][0])  # a page of request 1, written by request 0's token 0
    slots = meta.window_slots.clone()
    slots[0] = other * FLASH.block_size
    r = checks.check_live_slots(dataclasses.replace(meta, window_slots=slots), inputs)
    assert not r.ok and "request 0's pages" in r.message(), r.message()
    idx = meta.window_indices.clone()
    idx[0, 0] = other * FLASH.block_size + 5
    r = checks.check_live_slots(dataclasses.replace(meta, window_indices=idx), inputs)
    assert not r.ok and "window_indices" in r.message() and f"page {other}" in r.message(), r.message()


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("metadata:NEW_KV_NOT_UPDATED", "test_metadata_query_layout", "new_kv_seq_lens"),
    shared("metadata:TOKEN_REQ_SKIPS_EMPTY", "test_metadata_token_requests", "token_to_req_indices"),
    shared("metadata:COMPRESSED_LENS_NOT_CAUSAL", "test_metadata_compressed_lens", "compressed_lens"),
    shared("metadata:COMPRESSOR_SOURCE_FIRST_ROW", "test_metadata_compressor_outputs", "compressor_source_token_indices"),
    shared("metadata:ROPE_POSITION_IS_COMPLETING", "test_metadata_compressed_rope_positions", "compressed_rope_position_ids"),
    shared("metadata:INACTIVE_TO_DUMMY_ROW", "test_metadata_live_slots_unique_and_owned", "compressed_slots"),
    shared("metadata:LOGIT_FIRST_ROW", "test_metadata_logit_rows", "logit_row_indices"),
    shared("metadata:WINDOW_SLOTS_INT32", "test_metadata_field_layout", "window_slots.dtype"),
    shared("metadata:WINDOW_NEWEST_FIRST", "test_metadata_all_invariants_at_flash_dims", "window_indices"),
    shared("metadata:WINDOW_NEWEST_FIRST", "test_metadata_window", "window_indices"),
    shared("metadata:COMPRESSED_SLOT_OFF_BY_ONE", "test_metadata_compressed_slots", "compressed_slots"),
    shared("metadata:INACTIVE_STATE_NOT_FORCED", "test_metadata_compressed_slots", "compressed_slots"),
    shared("metadata:MOE_OWNERS_BY_SLAB", "test_metadata_moe_owners", "moe_token_owners"),
    shared("metadata:STATE_BY_BATCH_ROW", "test_metadata_state_tables_pass_through", "state_block_tables"),
    shared("metadata:IDENTITY_PAGES", "test_metadata_window", "window_"),
    shared("metadata:PADDING_ROWS_ZERO", "test_metadata_positions", "padding row"),
]
