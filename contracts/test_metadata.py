"""ForwardMetadata invariants, one test each, against the backend's ``build_forward_metadata``.

Spec: §3.
"""

from __future__ import annotations

from hypothesis import given, settings

from contracts.checks import metadata as checks
from contracts.plugin import op
from contracts.result import assert_ok
from contracts.strategies import BatchCase, materialize, request_batches
from kernels.config import FLASH

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
