"""V4 attention heads before the output projection (``v4_attention_heads``; dspark's decode attention goldens stop
there and pack the heads by output group). Judged against the pair formulas written here on the backend's own
attention o. Golden case: the record in ``kernels/v4/attention_heads.py``. Spec: §8."""

from __future__ import annotations

import pytest
import torch

from contracts.separation import separates
from kernels.config import V4_FLASH_TINY
from kernels.v4.attention_heads import _heads_inputs
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

C = V4_FLASH_TINY
NAMES = ("q", "ori_kv", "window_indices", "cmp_kv", "cmp_block_table", "position_ids", "attn_sink", "freqs_cos",
         "freqs_sin")


def _pairs(o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, inverse: bool) -> torch.Tensor:
    """Written from the rule: the last rope dims in adjacent pairs (even, odd), rotated in FP32 by each token's first
    rope/2 table columns (inverse: even*cos + odd*sin, odd*cos - even*sin), every dim then rounded to BF16 once."""
    rope = C.qk_rope_head_dim
    out = o.float().clone()
    c, s = cos[:, None, : rope // 2].float(), sin[:, None, : rope // 2].float()
    even, odd = out[..., -rope::2].clone(), out[..., -rope + 1::2].clone()
    sign = 1.0 if inverse else -1.0
    out[..., -rope::2] = even * c + sign * odd * s
    out[..., -rope + 1::2] = odd * c - sign * even * s
    return out.to(torch.bfloat16)


def _within(candidate, expected):
    """Upstream's compare_fn for the packed heads: ratio_allclose(1e-4, 1/128) with its 0.5 % quota."""
    from contracts.checks.precision import check_ratio_allclose
    from contracts.tolerances import V4_ATTN_OUT_TOL

    return check_ratio_allclose(candidate.float(), expected.float(), atol=V4_ATTN_OUT_TOL[0], rtol=V4_ATTN_OUT_TOL[1],
                                name="heads")


@pytest.mark.whole_backend("the heads against the same backend's own attention o, bit for bit")
@pytest.mark.operators("v4_attention_heads", "v4_sparse_attention")
def test_the_heads_are_the_attention_inversely_rotated_and_rounded_once(backend):
    """A decode SWA step (short windows on every third row): the heads are the pair formula's inverse rotation of
    the backend's own attention o, rounded once -- separated from the forward rotation and from rounding o to BF16
    before rotating it, both computed here."""
    i = _heads_inputs(3, "replicated", C)
    o = op(backend, "v4_sparse_attention")(i["q"], i["ori_kv"], i["window_indices"], i["cmp_kv"],
                                           i["cmp_block_table"], torch.zeros(C.decode_tokens, 0, dtype=torch.int32),
                                           i["attn_sink"], seq=C.decode_seq)
    want = separates("heads inversely rotated in FP32, rounded once", _pairs(o, i["freqs_cos"], i["freqs_sin"],
                                                                            inverse=True),
                     forward_rotation=_pairs(o, i["freqs_cos"], i["freqs_sin"], inverse=False),
                     rounded_before_rotating=_pairs(o.to(torch.bfloat16).float(), i["freqs_cos"], i["freqs_sin"],
                                                    inverse=True))
    got = op(backend, "v4_attention_heads")("SWA", *(i[n] for n in NAMES[:5]), None, *(i[n] for n in NAMES[5:]),
                                            config=C)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape, f"heads: {got.dtype}{list(got.shape)}"
    diff = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
    assert diff.numel() == 0, f"heads{tuple(diff[0].tolist())} = {float(got[tuple(diff[0])])}, expected " \
                              f"{float(want[tuple(diff[0])])} (the inverse pair rotation of o, one BF16 rounding)"


@pytest.mark.operators("v4_attention_heads", "v4_sparse_attention")
def test_the_heads_are_within_upstreams_bound_of_the_formula(backend):
    """Any backend (an upstream golden runs its attention in FP32 and may round a head value to the other BF16
    neighbour): the heads within upstream's ratio_allclose(1e-4, 1/128), 0.5 % quota, of the pair formula on the
    reference attention's o; the forward rotation lies beyond that bound on this step."""
    from contracts.separation import separates_under
    from kernels.v4.sparse_attention import v4_sparse_attention

    i = _heads_inputs(3, "replicated", C)
    o = v4_sparse_attention(i["q"], i["ori_kv"], i["window_indices"], i["cmp_kv"], i["cmp_block_table"],
                            torch.zeros(C.decode_tokens, 0, dtype=torch.int32), i["attn_sink"], seq=C.decode_seq)

    want = separates_under("heads inversely rotated", _within, _pairs(o, i["freqs_cos"], i["freqs_sin"], inverse=True),
                           forward_rotation=_pairs(o, i["freqs_cos"], i["freqs_sin"], inverse=False))
    got = op(backend, "v4_attention_heads")("SWA", *(i[n] for n in NAMES[:5]), None, *(i[n] for n in NAMES[5:]),
                                            config=C)
    verdict = _within(got, want)
    assert verdict.ok, f"the heads are not the inverse pair rotation of the attention within the bound: {verdict}"


def _formula(q, ori_kv, window, cmp_kv, table, sink, cos, sin):
    """The heads by the pair formula on the reference attention over the window and the given compressed slots."""
    from kernels.v4.sparse_attention import v4_sparse_attention

    def heads(cmp_slots):
        o = v4_sparse_attention(q, ori_kv, window, cmp_kv, table, cmp_slots, sink, seq=C.decode_seq)
        return _pairs(o, cos, sin, inverse=True)
    return heads


def _step(i, g, table, compressed, pos):
    """A decode step's arguments of v4_attention_heads: ``i``'s query, window cache and RoPE rows, a random BF16
    compressed pool of as many pages as ``table`` names, paged through it, and the compressed slots given."""
    table = torch.tensor(table, dtype=torch.int32)
    cmp_kv = (torch.rand(int(table.max()) + 1, C.block_size, 1, C.head_dim, generator=g) - 0.5).to(torch.bfloat16)
    return (i["q"], i["ori_kv"], i["window_indices"], cmp_kv, table, compressed, pos, i["attn_sink"], i["freqs_cos"],
            i["freqs_sin"])


def _hca_step():
    """A decode batch at positions around the compressed closes (127 | 128, 130, 300, 700): each row's HCA slots the
    first min((pos + 1) // 128, 8) compressed positions (its deterministic top-k), pages through shuffled tables."""
    i = _heads_inputs(6, "replicated", C)
    g = torch.Generator().manual_seed(6)
    pos = torch.tensor([300, 301, 130, 131, 700, 701, 127, 128], dtype=torch.int32)
    slots = torch.full((C.decode_tokens, 8), -1, dtype=torch.int32)
    for r, p in enumerate(pos.tolist()):
        slots[r, :min((p + 1) // 128, 8)] = torch.arange(min((p + 1) // 128, 8))
    return _step(i, g, [[2, 0], [1, 2], [0, 1], [2, 1]], slots, pos)


@pytest.mark.operators("v4_attention_heads", "v4_sparse_attention")
def test_an_hca_step_attends_its_first_compressed_positions(backend):
    """HCA decode (dspark's decode_sparse_attn_hca.py golden on --backend upstream): the heads within upstream's
    bound of the formula on the reference attention over the window and each row's compressed slots; the heads of
    the window alone (the compressed slots dropped) lie beyond it."""
    from contracts.separation import separates_under

    q, ori_kv, window, cmp_kv, table, slots, pos, sink, cos, sin = _hca_step()
    formula = _formula(q, ori_kv, window, cmp_kv, table, sink, cos, sin)

    want = separates_under("HCA heads over the window and the compressed slots", _within, formula(slots),
                           window_only=formula(torch.full_like(slots, -1)))
    got = op(backend, "v4_attention_heads")("HCA", q, ori_kv, window, cmp_kv, table, slots, pos, sink, cos, sin,
                                            config=C)
    verdict = _within(got, want)
    assert verdict.ok, f"the HCA heads are not the formula's over the window and the compressed slots: {verdict}"


def _csa_step():
    """A decode batch at positions 302, 301, 130, 131, 702, 701, 6, 4 (compressed rows existing: (pos + 1) // 4 = 75,
    75, 32, 33, 175, 175, 1, 1; every other row at pos = 2 mod 4, where (pos + 2) // 4 is one more): each row's raw
    indexer top-k of index_topk slots mixes slots inside that range, its edges (the last existing row and the first
    one past it), slots past it (rows of the pool that exist but are not yet the row's) and -1; the compressed pool
    pages through shuffled tables, every row of it live."""
    i = _heads_inputs(7, "replicated", C)
    g = torch.Generator().manual_seed(7)
    pos = torch.tensor([302, 301, 130, 131, 702, 701, 6, 4], dtype=torch.int32)
    raw = torch.randint(0, 200, (C.decode_tokens, C.index_topk), generator=g, dtype=torch.int32)
    raw[:, ::5] = -1
    edge = (pos.long() + 1) // 4
    raw[:, 1], raw[:, 2] = edge.to(torch.int32), (edge - 1).to(torch.int32)
    return _step(i, g, [[3, 0], [1, 2], [2, 3], [0, 1]], raw, pos)


@pytest.mark.operators("v4_attention_heads", "v4_sparse_attention")
def test_a_csa_step_attends_the_indexers_slots_that_exist(backend):
    """CSA decode (dspark's decode_sparse_attn_csa.py golden on --backend upstream): the heads within upstream's
    bound of the formula on the reference attention over the window and the raw top-k slots kept where
    0 <= raw < (pos + 1) // 4 -- the filter written here -- and beyond it when the raw slots are read unfiltered
    (rows past the position's compressed range), with the range one row too long ((pos + 2) // 4), or dropped."""
    from contracts.separation import separates_under

    q, ori_kv, window, cmp_kv, table, raw, pos, sink, cos, sin = _csa_step()
    bound = ((pos.long() + 1) // 4)[:, None]
    kept = torch.where((raw >= 0) & (raw < bound), raw, torch.full_like(raw, -1))
    formula = _formula(q, ori_kv, window, cmp_kv, table, sink, cos, sin)

    one_late = torch.where((raw >= 0) & (raw < bound + ((pos.long() + 2) % 4 == 0)[:, None]), raw,
                           torch.full_like(raw, -1))  # (pos + 2) // 4: the range one row too long at pos = 2 mod 4
    want = separates_under("CSA heads over the window and the existing top-k slots", _within, formula(kept),
                           unfiltered=formula(raw), range_one_late=formula(one_late),
                           window_only=formula(torch.full_like(raw, -1)))
    got = op(backend, "v4_attention_heads")("CSA", q, ori_kv, window, cmp_kv, table, raw, pos, sink, cos, sin,
                                            config=C)
    verdict = _within(got, want)
    assert verdict.ok, f"the CSA heads are not the formula's over the window and the existing slots: {verdict}"


@pytest.mark.operators("v4_attention_heads")
def test_a_padding_row_has_no_heads_and_a_short_table_is_refused(backend):
    """Prefill form: rows from num_tokens on are exactly 0; RoPE rows that are not one per token are refused."""
    from kernels.errors import ContractInputError

    i = _heads_inputs(4, "replicated", C)
    heads = op(backend, "v4_attention_heads")
    t = C.decode_tokens
    args = [i[n] for n in NAMES[:5]] + [None] + [i[n] for n in NAMES[5:]]
    args[4] = torch.zeros(1, 1, dtype=torch.int32)
    out = heads("SWA", *args, config=C, seq=t, num_tokens=5)
    assert bool((out[5:] == 0).all()) and bool(out[:5].ne(0).any()), "rows 5.. must be 0, rows ..4 attend"
    six = [a[:6] if n in ("q", "window_indices", "position_ids", "freqs_cos", "freqs_sin") else a
           for n, a in zip((*NAMES[:5], "compressed", *NAMES[5:]), args, strict=True)]
    assert heads("SWA", *six, config=C, seq=6, num_tokens=6).shape[0] == 6, "a chunk of 6 rows (fewer than heads)"
    for at, short in ((-2, i["freqs_cos"][:-1]), (-1, i["freqs_sin"][:-1])):
        bad = list(args)
        bad[at] = short
        with pytest.raises(ContractInputError, match="freqs_cos"):
            heads("SWA", *bad, config=C, seq=t, num_tokens=5)


@pytest.mark.operators("v4_attention_heads")
def test_the_prefill_form_tiles_the_gathered_keys(backend):
    """An HCA prefill chunk whose short windows share a tile with compressed keys once gathered: the prefill form's
    heads are the gathered walk's (upstream's prefill goldens), which differ from the column walk's here; the
    decode form's are the column walk's."""
    i = _heads_inputs(6, "replicated", C)
    t, bs, d = C.decode_tokens, C.block_size, C.head_dim
    g = torch.Generator().manual_seed(6)
    args = [i[n] for n in NAMES[:5]] + [None] + [i[n] for n in NAMES[5:]]
    args[3] = (torch.rand(2, bs, 1, d, generator=g) - 0.5).to(torch.bfloat16)
    args[4] = torch.tensor([[1, 0]], dtype=torch.int32)
    args[5] = torch.randint(0, 2 * bs, (t, 16), generator=g, dtype=torch.int32)
    heads = op(backend, "v4_attention_heads")
    walks = {k: heads("HCA", *args, config=C, seq=t, key_tiles=k) for k in ("gathered", "columns")}
    separates("the prefill form's gathered key tiles", walks["gathered"], column_tiles=walks["columns"])
    assert torch.equal(heads("HCA", *args, config=C, seq=t, num_tokens=t), walks["gathered"]), \
        "the prefill form must walk the gathered keys"
    assert torch.equal(heads("HCA", *args, config=C, seq=t), walks["columns"]), "the decode form walks the columns"


def _forward(*args, **kwargs):
    """Wrong: the heads rotated forward (the query's rotation) instead of back."""
    from kernels.v4.sparse_attention import attention_indices, v4_sparse_attention

    path, q, ori_kv, window, cmp_kv, table, compressed, pos, sink, cos, sin = args
    config = kwargs["config"]
    w, c = attention_indices(path, q, window, compressed, pos, num_tokens=kwargs.get("num_tokens"), config=config)
    o = v4_sparse_attention(q, ori_kv, w, cmp_kv, table, c, sink, seq=kwargs.get("seq") or config.decode_seq)
    return _pairs(o, cos, sin, inverse=False)


def _window_only(path, q, ori_kv, window, cmp_kv, table, compressed, *rest, **kwargs):
    """Wrong: the compressed slots never read."""
    from kernels.v4.attention_heads import v4_attention_heads

    none = None if compressed is None else torch.full_like(compressed, -1)
    return v4_attention_heads(path, q, ori_kv, window, cmp_kv, table, none, *rest, **kwargs)


def _csa_unfiltered(path, *args, **kwargs):
    from kernels.v4.attention_heads import v4_attention_heads

    return v4_attention_heads("HCA" if path == "CSA" else path, *args, **kwargs)  # the raw slots taken as given


SEEDED_DEFECTS = [
    SeededDefect("attention-heads:csa-unfiltered", "v4_attention_heads", _csa_unfiltered,
                 "test_a_csa_step_attends_the_indexers_slots_that_exist", "existing slots"),
    SeededDefect("attention-heads:forward-rotation", "v4_attention_heads", _forward,
                 "test_the_heads_are_the_attention_inversely_rotated_and_rounded_once", "inverse pair rotation"),
    SeededDefect("attention-heads:forward-rotation-in-bound", "v4_attention_heads", _forward,
                 "test_the_heads_are_within_upstreams_bound_of_the_formula", "inverse pair rotation"),
    SeededDefect("attention-heads:hca-window-only", "v4_attention_heads", _window_only,
                 "test_an_hca_step_attends_its_first_compressed_positions", "compressed slots"),
]
