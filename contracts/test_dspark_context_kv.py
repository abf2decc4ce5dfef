"""dspark's drafter context KV (``dspark_context_kv``): each row's KV (projection, RMSNorm times gamma, the rope
dims rotated by its position's angle) written at its slot of the stage's cache; -1 writes nothing, a later token
wins a shared slot, nothing else moves. Judged against the KV path evaluated here in FP64 from the spec; a
worked-out hand vector pins the rotation's direction, the position's table row, gamma before the rotation and the
write order. Golden case and bad calls: the record in ``kernels/v4/dspark_context_kv.py``. Spec: §8."""

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

pytestmark = pytest.mark.operators("dspark_context_kv")
C = V4_FLASH_TINY
HD, ROPE = C.head_dim, C.qk_rope_head_dim
NOPE = HD - ROPE


def _spec_kv(x, wkv, gamma, cos, sin) -> torch.Tensor:
    """FP64: n = (x·wkv) / sqrt(mean((x·wkv)²) + eps) · gamma; the last ROPE dims' adjacent pairs rotated forward by
    (cos, sin) [T, ROPE/2]."""
    kv = x.double() @ wkv.double()
    n = kv / torch.sqrt(kv.pow(2).mean(-1, keepdim=True) + C.rms_norm_eps) * gamma.double()
    a, b = n[:, NOPE::2], n[:, NOPE + 1::2]
    c, s = cos.double(), sin.double()
    return torch.cat((n[:, :NOPE], torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)), -1)


def _tables(positions: int, g: torch.Generator):
    angle = torch.arange(positions, dtype=torch.float64)[:, None] * torch.rand(ROPE, generator=g, dtype=torch.float64)
    return torch.cos(angle).to(torch.bfloat16), torch.sin(angle).to(torch.bfloat16)


@given(tokens=st.integers(1, 8), pages=st.integers(1, 3), data=st.data(), seed=st.integers(0, 2**31),
       four_d=st.booleans())
def test_each_row_lands_at_its_slot_and_nothing_else_moves(backend, tokens, pages, data, seed, four_d):
    """Any row count, cache of 1-3 pages ([blocks, page, hd] or [blocks, page, 1, hd]), any positions, slots drawn
    with repeats and -1: each slot written holds the KV of its last token within 2^-8 of its FP64 value (half a BF16
    step), every other cache row keeps its bytes, and the cache keeps its shape and dtype."""
    g = torch.Generator().manual_seed(seed)
    rows = pages * C.block_size
    slots = torch.tensor(data.draw(st.lists(st.integers(-1, rows - 1), min_size=tokens, max_size=tokens),
                                   label="slots"), dtype=torch.int64)
    pos = torch.tensor(data.draw(st.lists(st.integers(0, 63), min_size=tokens, max_size=tokens), label="positions"),
                       dtype=torch.int32)
    x = torch.randn(tokens, C.hidden_size, generator=g).to(torch.bfloat16)
    wkv = (torch.randn(C.hidden_size, HD, generator=g) / C.hidden_size**0.5).to(torch.bfloat16)
    gamma = (torch.rand(HD, generator=g) + 0.5).to(torch.bfloat16)
    cos, sin = _tables(64, g)
    cache = torch.randn(pages, C.block_size, *((1,) if four_d else ()), HD, generator=g).to(torch.bfloat16)
    before_call = cache.clone()
    got = op(backend, "dspark_context_kv")(x, wkv, gamma, cos, sin, pos, slots, cache, config=C)
    assert torch.equal(byte_rows(cache.reshape(-1, HD)), byte_rows(before_call.reshape(-1, HD))), \
        "the input kv_cache was modified: the operator returns a new cache (§8)"
    assert got.dtype == torch.bfloat16 and got.shape == cache.shape, \
        f"kv_cache {got.dtype}{list(got.shape)}, expected the input's bfloat16{list(cache.shape)} (§8)"
    want = _spec_kv(x, wkv, gamma, cos[pos.long(), : ROPE // 2], sin[pos.long(), : ROPE // 2])
    flat, before = got.reshape(rows, HD), cache.reshape(rows, HD)
    last = {s: t for t, s in enumerate(slots.tolist()) if s >= 0}
    for r in range(rows):
        if r not in last:
            assert torch.equal(byte_rows(flat[r:r + 1]), byte_rows(before[r:r + 1])), \
                f"kv_cache row {r} moved: no token's slot is {r} (slots {slots.tolist()}; §8)"
            continue
        t = last[r]
        err = (flat[r].double() - want[t]).abs()
        bound = want[t].abs() * 2.0**-8 * (1 + 2.0**-10)
        bad = ~(err <= bound)
        if bool(bad.any()):
            j = int(bad.nonzero()[0])
            raise AssertionError(f"kv_cache row {r}[{j}] = {float(flat[r, j])}, expected {float(want[t, j]):.9g} "
                                 f"within {float(bound[j]):.3g}: the KV of token {t} (position {int(pos[t])}), the "
                                 f"last to name slot {r} (§8)")


def test_a_hand_vector_pins_the_rotation_the_row_the_norm_weight_and_the_write_order(backend):
    """Four tokens. Token 0 (position 2) and tokens 1, 2 (position 0) project to rows of ±1 (one x column each
    times a ±1 row of wkv), so the norm scales them by 1 / sqrt(1 + eps) only and gamma scales them: gamma is 1 on the first
    rope pair's first dim and 2 on its second. Table row 2 holds (cos, sin) = (0.6015625, 0.80078125), row 0 the
    identity. Token 0's first rope pair (1, 2) rotates forward to (1·c - 2·s, 1·s + 2·c) = (-1.0, 2.00390625),
    rounded to (-1, 2) in BF16.
    Slots: token 0 -> 1, tokens 1 and 2 -> 6 (token 2, later, wins), token 3 -> -1. Separated from the inverse
    rotation, from table row t instead of the position's, from gamma after the rotation, from the first writer
    winning a shared slot, and from -1 written as the last row."""
    bf = torch.bfloat16
    d = C.hidden_size
    x = torch.zeros(4, d)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = 1.0, 1.0, 1.0, 1.0
    wkv = torch.zeros(d, HD)
    wkv[0] = 1.0
    wkv[1] = torch.tensor([1.0, -1.0]).repeat(HD // 2)
    wkv[2] = -1.0
    wkv[3] = 1.0
    gamma = torch.ones(HD)
    gamma[NOPE + 1] = 2.0
    cos, sin = torch.ones(4, ROPE), torch.zeros(4, ROPE)
    cos[2], sin[2] = 0.6015625, 0.80078125
    pos = torch.tensor([2, 0, 0, 1], dtype=torch.int32)
    slots = torch.tensor([1, 6, 6, -1])
    cache = torch.full((2, C.block_size, HD), 0.5)
    args = [t.to(bf) for t in (x, wkv, gamma, cos, sin)]

    def kv_of(rows, row_angles, *, inverse=False, gamma_after=False):
        kv = rows.double() @ wkv.double()
        kv = kv / torch.sqrt(kv.pow(2).mean(-1, keepdim=True) + C.rms_norm_eps)  # rows of ±1: 1 / sqrt(1 + eps)
        n = kv if gamma_after else kv * gamma.double()
        a, b = n[:, NOPE::2], n[:, NOPE + 1::2]
        c, s = cos[row_angles, : ROPE // 2].double(), sin[row_angles, : ROPE // 2].double() * (-1 if inverse else 1)
        out = torch.cat((n[:, :NOPE], torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)), -1)
        return (out * gamma.double() if gamma_after else out).float().to(bf)

    def cache_of(kv, order=range(4), minus_one_last=False):
        out = cache.clone().to(bf).reshape(-1, HD)
        for t in order:
            if int(slots[t]) >= 0 or minus_one_last:
                out[int(slots[t])] = kv[t]
        return out.reshape(cache.shape)

    rule = kv_of(x, pos.long())
    assert rule[0, NOPE:NOPE + 2].tolist() == [-1.0, 2.0], "the worked-out rotation of token 0's first pair"
    want = cache_of(rule)
    separates("the context KV written at its slots", want, inverse_rotation=cache_of(kv_of(x, pos.long(), inverse=True)),
              table_row_t=cache_of(kv_of(x, torch.arange(4))),
              gamma_after_rotation=cache_of(kv_of(x, pos.long(), gamma_after=True)),
              first_writer_wins=cache_of(rule, order=(0, 2, 1, 3)), minus_one_written_last=cache_of(rule,
                                                                                                  minus_one_last=True))
    got = op(backend, "dspark_context_kv")(*args, pos, slots, cache.to(bf), config=C)
    bad = (byte_rows(got.reshape(-1, HD)) != byte_rows(want.reshape(-1, HD))).any(1)
    assert not bool(bad.any()), \
        f"kv_cache row {int(bad.nonzero()[0])} is {got.reshape(-1, HD)[int(bad.nonzero()[0])][NOPE:NOPE + 4].tolist()}" \
        f"..., expected {want.reshape(-1, HD)[int(bad.nonzero()[0])][NOPE:NOPE + 4].tolist()}...: the forward " \
        "rotation by the position's row, gamma before it, the later token winning slot 6, nothing at -1 (§8)"


@pytest.mark.parametrize("case, field", [("x of another width", "main_x"), ("FP32 x", "main_x"),
                                         ("wkv of another head dim", "wkv"), ("gamma short", "gamma_ckv"),
                                         ("narrow cos table", "freqs_cos"), ("cos table one column short", "freqs_cos"),
                                         ("empty cos table", "freqs_cos"), ("positions short", "position_ids"),
                                         ("position past the table", "position_ids"),
                                         ("slot past the cache", "slot_mapping"), ("slot -2", "slot_mapping"),
                                         ("float slots", "slot_mapping"), ("cache of another head dim", "kv_cache"),
                                         ("cache with 2 heads", "kv_cache")])
def test_a_malformed_call_is_refused_naming_its_field(backend, case, field):
    """Shapes and dtypes against the preset; RoPE tables of at least one row and rope/2 columns (the rows' first
    half is read); positions inside the tables; slots -1 or inside the cache (no clamp, no wrap). The last cache row,
    the last position, tables of exactly rope/2 columns and of one row are accepted."""
    bf = torch.bfloat16
    d = C.hidden_size
    i = dict(main_x=torch.ones(2, d, dtype=bf), wkv=torch.ones(d, HD, dtype=bf), gamma_ckv=torch.ones(HD, dtype=bf),
             freqs_cos=torch.ones(8, ROPE, dtype=bf), freqs_sin=torch.zeros(8, ROPE, dtype=bf),
             position_ids=torch.tensor([0, 7], dtype=torch.int32), slot_mapping=torch.tensor([-1, 2 * C.block_size - 1]),
             kv_cache=torch.zeros(2, C.block_size, HD, dtype=bf))
    op(backend, "dspark_context_kv")(**i, config=C)  # the edges are accepted: the last row and position
    op(backend, "dspark_context_kv")(**{**i, "freqs_cos": i["freqs_cos"][:, : ROPE // 2],
                                        "freqs_sin": i["freqs_sin"][:, : ROPE // 2]}, config=C)  # rope/2 columns
    op(backend, "dspark_context_kv")(**{**i, "freqs_cos": i["freqs_cos"][:1], "freqs_sin": i["freqs_sin"][:1],
                                        "position_ids": i["position_ids"] * 0}, config=C)  # a table of one row
    change = {"x of another width": dict(main_x=i["main_x"][:, 1:]), "FP32 x": dict(main_x=i["main_x"].float()),
              "wkv of another head dim": dict(wkv=i["wkv"][:, 1:]), "gamma short": dict(gamma_ckv=i["gamma_ckv"][1:]),
              "narrow cos table": dict(freqs_cos=i["freqs_cos"][:, :1]),
              "cos table one column short": dict(freqs_cos=i["freqs_cos"][:, : ROPE // 2 - 1]),
              "empty cos table": dict(freqs_cos=i["freqs_cos"][:0], freqs_sin=i["freqs_sin"][:0]),
              "positions short": dict(position_ids=i["position_ids"][:1]),
              "position past the table": dict(position_ids=i["position_ids"] + 1),
              "slot past the cache": dict(slot_mapping=i["slot_mapping"] + 1),
              "slot -2": dict(slot_mapping=i["slot_mapping"] - 1),
              "float slots": dict(slot_mapping=i["slot_mapping"].float()),
              "cache of another head dim": dict(kv_cache=i["kv_cache"][..., 1:]),
              "cache with 2 heads": dict(kv_cache=torch.zeros(2, C.block_size, 2, HD, dtype=bf))}[case]
    with pytest.raises(ContractInputError) as exc:
        op(backend, "dspark_context_kv")(**{**i, **change}, config=C)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


# --- seeded defects ------------------------------------------------------------------------------------------

def _inverse_rotation(main_x, wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids, slot_mapping, kv_cache, *, config):
    from kernels.v4.dspark_context_kv import dspark_context_kv

    return dspark_context_kv(main_x, wkv, gamma_ckv, freqs_cos, -freqs_sin, position_ids, slot_mapping, kv_cache,
                             config=config)


def _first_writer_wins(main_x, wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids, slot_mapping, kv_cache, *,
                       config):
    from kernels.v4.dspark_context_kv import dspark_context_kv

    rev = torch.arange(main_x.shape[0] - 1, -1, -1)
    return dspark_context_kv(main_x[rev], wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids[rev], slot_mapping[rev],
                             kv_cache, config=config)


def _rows_by_token_index(main_x, wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids, slot_mapping, kv_cache, *,
                         config):
    from kernels.v4.dspark_context_kv import dspark_context_kv

    return dspark_context_kv(main_x, wkv, gamma_ckv, freqs_cos, freqs_sin,
                             torch.arange(main_x.shape[0], dtype=position_ids.dtype), slot_mapping, kv_cache,
                             config=config)


def _cache_zeroed(main_x, wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids, slot_mapping, kv_cache, *, config):
    from kernels.v4.dspark_context_kv import dspark_context_kv

    return dspark_context_kv(main_x, wkv, gamma_ckv, freqs_cos, freqs_sin, position_ids, slot_mapping,
                             torch.zeros_like(kv_cache), config=config)


SEEDED_DEFECTS = [
    SeededDefect("dspark-context-kv:inverse-rotation", "dspark_context_kv", _inverse_rotation,
                 "test_each_row_lands_at_its_slot_and_nothing_else_moves", "the KV of token"),
    SeededDefect("dspark-context-kv:first-writer-wins", "dspark_context_kv", _first_writer_wins,
                 "test_a_hand_vector_pins_the_rotation_the_row_the_norm_weight_and_the_write_order", "slot 6"),
    SeededDefect("dspark-context-kv:row-by-token-index", "dspark_context_kv", _rows_by_token_index,
                 "test_each_row_lands_at_its_slot_and_nothing_else_moves", "the KV of token"),
    SeededDefect("dspark-context-kv:cache-zeroed", "dspark_context_kv", _cache_zeroed,
                 "test_each_row_lands_at_its_slot_and_nothing_else_moves", "moved"),
]
