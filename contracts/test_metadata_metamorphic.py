"""Metamorphic ForwardMetadata contracts: relabelling pages, reordering requests and appending padding
change exactly what they must and nothing else. Spec: §3, §2.1.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.strategies import materialize, request_batches
from pto_pytest.defect import shared
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("build_forward_metadata")  # every contract here calls it, and only it

BATCHES = request_batches()
PER_REQUEST = ("query_lens", "kv_seq_lens", "new_kv_seq_lens")
PER_REQUEST_SRC = ("compressed_seq_lens", "compressed_seq_remainders")
PER_TOKEN = ("position_ids", "window_slots", "window_indices", "window_lens")
PER_TOKEN_SRC = ("compressed_slots", "index_slots", "compressed_lens", "compressed_rope_position_ids")


def _equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{name}: {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}")
    if not torch.equal(got, want):
        diff = (got != want).nonzero()[0].tolist()
        raise AssertionError(f"{name}{diff}: got {got[tuple(diff)].tolist()}, expected {want[tuple(diff)].tolist()}")


def _relabel(slots: torch.Tensor, perm: torch.Tensor, block: int, name: str = "slots") -> torch.Tensor:
    s = slots.to(torch.int64)
    pages = s.clamp_min(0) // block
    outside = (s >= 0) & (pages >= perm.numel())
    if bool(outside.any()):
        i = outside.nonzero()[0].tolist()
        raise AssertionError(f"{name}{i} = {int(s[tuple(i)])} lies on page {int(pages[tuple(i)])}, which no input "
                             f"table maps (tables hold pages < {perm.numel()})")
    mapped = perm[(s.clamp_min(0) // block)] * block + s.clamp_min(0) % block
    return torch.where(s >= 0, mapped, s).to(slots.dtype)


@given(case=BATCHES, seed=st.integers(0, 2**32 - 1))
def test_metadata_page_permutation_moves_slots_only_through_the_table(backend, case, seed):
    """Relabel physical pages by a permutation pi: every slot s becomes pi[s//bs]*bs + s%bs; all else equal."""
    build = op(backend, "build_forward_metadata")
    inputs = materialize(case)
    base = build(**inputs)
    bs = case.config.block_size
    rng = random.Random(seed)

    def perm_for(table: torch.Tensor) -> torch.Tensor:
        ids = list(range(int(table.max().clamp_min(0)) + 1))
        rng.shuffle(ids)
        return torch.tensor(ids, dtype=torch.int64)

    wperm = perm_for(inputs["window_block_table"])
    permuted = dict(inputs)
    wt = inputs["window_block_table"]
    permuted["window_block_table"] = torch.where(wt >= 0, wperm[wt.clamp_min(0).long()].to(wt.dtype), wt)
    cperm: dict[int, torch.Tensor] = {}
    tables = {}
    for src, table in inputs["compressed_block_tables"].items():
        ratio = case.config.compress_ratios[src]
        if ratio not in cperm:
            cperm[ratio] = perm_for(table)
        tables[src] = torch.where(table >= 0, cperm[ratio][table.clamp_min(0).long()].to(table.dtype), table)
    permuted["compressed_block_tables"] = tables
    moved = build(**permuted)
    _equal("window_slots", moved.window_slots, _relabel(base.window_slots, wperm, bs, "window_slots"))
    _equal("window_indices", moved.window_indices, _relabel(base.window_indices, wperm, bs, "window_indices"))
    for src in base.compressed_slots:
        p = cperm[case.config.compress_ratios[src]]
        _equal(f"compressed_slots[{src}]", moved.compressed_slots[src],
               _relabel(base.compressed_slots[src], p, bs, f"compressed_slots[{src}]"))
        _equal(f"index_slots[{src}]", moved.index_slots[src], _relabel(base.index_slots[src], p, bs, f"index_slots[{src}]"))
    for name, value in base.as_dict().items():
        if name in ("window_slots", "window_indices", "compressed_slots", "index_slots"):
            continue
        other = getattr(moved, name)
        if isinstance(value, dict):
            for src in value:
                _equal(f"{name}[{src}]", other[src], value[src])
        elif isinstance(value, torch.Tensor):
            _equal(name, other, value)
        else:
            assert other == value, f"{name}: {other} != {value}"


@given(case=BATCHES, data=st.data())
def test_metadata_request_reorder_permutes_per_request_fields_only(backend, case, data):
    """Reorder requests (rows of every input table move with them): per-request fields permute,
    per-token fields move with their tokens, token_to_req follows the new rows; nothing else changes."""
    build = op(backend, "build_forward_metadata")
    inputs = materialize(case)
    base = build(**inputs)
    batch = len(case.query_lens)
    sigma = data.draw(st.permutations(range(batch)), label='sigma')  # new row j holds old request sigma[j]
    idx = torch.tensor(sigma, dtype=torch.long)
    qlens = torch.tensor(case.query_lens)[idx]
    reordered = dict(inputs)
    reordered["query_start_loc"] = torch.cat((torch.zeros(1, dtype=torch.int32), qlens.cumsum(0).to(torch.int32)))
    reordered["kv_seq_lens"] = inputs["kv_seq_lens"][idx]
    reordered["window_block_table"] = inputs["window_block_table"][idx]
    reordered["compressed_block_tables"] = {s: t[idx] for s, t in inputs["compressed_block_tables"].items()}
    reordered["state_block_tables"] = {s: t[idx] for s, t in inputs["state_block_tables"].items()}
    moved = build(**reordered)

    old_qsl, new_qsl = base.query_start_loc.tolist(), moved.query_start_loc.tolist()
    token_map = {}  # old token -> new token
    for j, r in enumerate(sigma):
        for i in range(old_qsl[r + 1] - old_qsl[r]):
            token_map[old_qsl[r] + i] = new_qsl[j] + i
    old_tokens = torch.tensor(sorted(token_map), dtype=torch.long)
    new_tokens = torch.tensor([token_map[t] for t in sorted(token_map)], dtype=torch.long)

    for name in PER_REQUEST:
        _equal(name, getattr(moved, name), getattr(base, name)[idx])
    for name in PER_REQUEST_SRC:
        for src, value in getattr(base, name).items():
            _equal(f"{name}[{src}]", getattr(moved, name)[src], value[idx])
    for src, value in base.state_block_tables.items():
        _equal(f"state_block_tables[{src}]", moved.state_block_tables[src], value[idx])
    want_logits = torch.tensor([token_map[int(base.logit_row_indices[r])] if base.logit_row_indices[r] >= 0 else -1
                                for r in sigma], dtype=torch.int32)
    _equal("logit_row_indices", moved.logit_row_indices, want_logits)
    for name in PER_TOKEN:
        _equal(name, getattr(moved, name)[new_tokens], getattr(base, name)[old_tokens])
    for name in PER_TOKEN_SRC:
        for src, value in getattr(base, name).items():
            _equal(f"{name}[{src}]", getattr(moved, name)[src][new_tokens], value[old_tokens])
    inverse = {r: j for j, r in enumerate(sigma)}
    want_req = torch.tensor([inverse[int(base.token_to_req_indices[t])] for t in old_tokens.tolist()],
                            dtype=torch.int32)
    _equal("token_to_req_indices", moved.token_to_req_indices[new_tokens], want_req)
    _equal("moe_token_owners", moved.moe_token_owners, base.moe_token_owners)
    _equal("padding rows", moved.position_ids[base.num_tokens:], base.position_ids[base.num_tokens:])
    for src in base.compressor_output_start_loc:
        o_start, n_start = base.compressor_output_start_loc[src].tolist(), moved.compressor_output_start_loc[src].tolist()
        for j, r in enumerate(sigma):
            old_seg = slice(o_start[r], o_start[r + 1])
            new_seg = slice(n_start[j], n_start[j + 1])
            _equal(f"compressor_position_ids[{src}] (request {r} -> {j})",
                   moved.compressor_position_ids[src][new_seg], base.compressor_position_ids[src][old_seg])
            want_rows = torch.tensor([token_map[t] for t in base.compressor_source_token_indices[src][old_seg].tolist()],
                                     dtype=torch.int32)
            _equal(f"compressor_source_token_indices[{src}] (request {r} -> {j})",
                   moved.compressor_source_token_indices[src][new_seg], want_rows)


@given(case=BATCHES, extra=st.integers(1, 9))
def test_metadata_trailing_padding_changes_no_active_field(backend, case, extra):
    """Growing the token capacity appends neutral padding rows and leaves every active field unchanged."""
    build = op(backend, "build_forward_metadata")
    inputs = materialize(case)
    base = build(**inputs)
    padded = build(**{**inputs, "capacity": case.capacity + extra})
    n = base.num_tokens
    assert padded.num_tokens == n
    for name, value in base.as_dict().items():
        other = getattr(padded, name)
        if isinstance(value, dict):
            for src, v in value.items():
                per_token = name in PER_TOKEN_SRC
                _equal(f"{name}[{src}]", other[src][:n] if per_token else other[src], v[:n] if per_token else v)
        elif isinstance(value, torch.Tensor):
            per_token = name in PER_TOKEN or name in ("token_to_req_indices", "moe_token_owners")
            _equal(name, other[:n] if per_token else other, value[:n] if per_token else value)
    assert padded.capacity == case.capacity + extra


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("metadata:IDENTITY_PAGES", "test_metadata_page_permutation_moves_slots_only_through_the_table", "window_slots"),
    shared("metadata:STATE_BY_BATCH_ROW", "test_metadata_request_reorder_permutes_per_request_fields_only", "state_block_tables"),
    shared("metadata:MOE_OWNERS_BY_SLAB", "test_metadata_trailing_padding_changes_no_active_field", "moe_token_owners"),
]
