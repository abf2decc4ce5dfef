"""Sink-augmented sparse attention (the core of every attention mode) against the backend's
``sparse_attention``: the per-row RMS/peak bound against the reference on edge-aimed inputs, hand vectors
for the sink, the all-invalid token, invariance to the order of the selected rows, and bad input.
Run it on the device-arithmetic twin with ``--backend emulated``. Spec: §5.3, §6; upstream_checks AP-05..07.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from backends import torch_backend
from contracts.checks.precision import check_row_precision
from contracts.separation import separates
from kernels.reference.attention import sparse_attention as reference_attention
from pto_pytest.defect import shared
from pto_pytest.plugin import op

REF = torch_backend()


def _case(data, *, tokens: int, heads: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w_rows, c_rows = data.draw(st.sampled_from([1, 40, 300]), label='w_rows'), data.draw(st.sampled_from([1, 33, 500]), label='c_rows')
    width = data.draw(st.sampled_from([0, 1, 31, 32, 33, 128]), label='width')  # around the 32-key tile
    topk = data.draw(st.sampled_from([0, 1, 32, 70]), label='topk')
    q = (torch.randn(tokens, heads, dim, generator=g) * data.draw(st.sampled_from([0.1, 1.0, 4.0]), label='q scale')).to(torch.bfloat16)
    wkv = (torch.randn(w_rows, dim, generator=g) * 0.5).to(torch.bfloat16)
    ckv = (torch.randn(c_rows, dim, generator=g) * 0.5).to(torch.bfloat16)
    wi = torch.randint(0, w_rows, (tokens, width), generator=g, dtype=torch.int32)
    ci = torch.randint(0, c_rows, (tokens, topk), generator=g, dtype=torch.int32)
    for t in range(tokens):  # trailing -1 padding, holes, and tokens with no row at all
        kind = data.draw(st.sampled_from(["full", "tail", "holes", "none"]), label='kind')
        if kind == "tail":
            wi[t, width // 2:] = -1
            ci[t, topk // 3:] = -1
        elif kind == "holes":
            wi[t, ::3] = -1
            ci[t, 1::2] = -1
        elif kind == "none":
            wi[t], ci[t] = -1, -1
    sink = torch.randn(heads, generator=g) * data.draw(st.sampled_from([0.0, 1.0, 30.0]), label='sink scale')
    return q, wkv, wi, ckv, ci, sink


@given(data=st.data(), tokens=st.integers(1, 3), heads=st.sampled_from([1, 16, 17, 32]),
       dim=st.sampled_from([64, 512]), seed=st.integers(0, 2**31))
@pytest.mark.operators("check_row_precision", "sparse_attention")
def test_sparse_attention_within_the_row_bound_of_the_reference(backend, data, tokens, heads, dim, seed):
    """Every (token, head) row within RMS(a-e) <= 1e-6 + 1%·RMS(e) and max|a-e| <= 1e-5 + 5%·RMS(e) of the
    reference: key counts around the 32-key tile, -1 tails and holes, tokens with no row, 1/16/17/32 heads
    (the 16-head patch groups), FLASH's 512-d and a tiny 64-d head, zero/normal/dominant sinks. Spec: §5.3, §6."""
    args = _case(data, tokens=tokens, heads=heads, dim=dim, seed=seed)
    got = op(backend, "sparse_attention")(*args)
    want = REF.get("sparse_attention")(*args)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"output {got.dtype}{list(got.shape)}, reference {want.dtype}{list(want.shape)}"
    result = check_row_precision(got, want, name="attention")
    assert result.ok, result.message()


@pytest.mark.operators("sparse_attention")
def test_sparse_attention_sink_hand_vectors(backend):
    """Hand-computed: one head, one key orthogonal to the query (score 0) and sink 0: the sink takes half the
    mass, so the output is kv/2; with sink ln 3 it is kv/4; with two equal keys and sink 0, 2/3 of kv.
    Scores scale by D^-0.5: q = k = [2, 0, 0, 0] (D = 4) gives score 2, so weight e^2/(e^2 + 1). Spec: §5.3."""
    attend = op(backend, "sparse_attention")
    kv = torch.tensor([[0.0, 1.0, -2.0, 0.5]]).to(torch.bfloat16)
    q = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]]).to(torch.bfloat16)
    none = torch.full((1, 1), -1, dtype=torch.int32)
    one = torch.zeros((1, 1), dtype=torch.int32)
    cases = [((one, none), 0.0, 0.5), ((one, none), math.log(3.0), 0.25), ((none, one), 0.0, 0.5)]
    for (wi, ci), sink, weight in cases:
        out = attend(q, kv, wi, kv, ci, torch.tensor([sink]))
        want = (kv.float() * weight).to(torch.bfloat16)
        assert torch.equal(out[0, 0], want[0]), f"sink {sink}: {out[0, 0].tolist()}, hand {want[0].tolist()}"
    out = attend(q, kv, one, kv, one, torch.tensor([0.0]))  # the same row from both sources, sink 0
    assert torch.equal(out[0, 0], (kv.float() * (2 / 3)).to(torch.bfloat16)[0]), out[0, 0].tolist()
    k2 = torch.tensor([[2.0, 0.0, 0.0, 0.0]]).to(torch.bfloat16)
    from contracts.separation import separates

    def outputs(sink_in_softmax=True, sink_scale=1.0, score_scale=0.5):  # the five hand cases, one stacked row
        rows = []
        for value, scores, sink in ((kv, [0.0], 0.0), (kv, [0.0], math.log(3.0)), (kv, [0.0, 0.0], 0.0),
                                    (k2, [4.0 * score_scale], 0.0)):
            e = [math.exp(sc) for sc in scores]
            denominator = sum(e) + (math.exp(sink * sink_scale) if sink_in_softmax else 0.0)
            rows.append((value.float() * (sum(e) / denominator)).to(torch.bfloat16)[0])
        return torch.stack(rows)

    separates("softmax over the scores (· D^-0.5) and the sink logit", outputs(), sink_ignored=outputs(False),
              sink_scaled_like_a_score=outputs(sink_scale=0.5), scores_not_scaled=outputs(score_scale=1.0))
    out = attend(k2.unsqueeze(0), k2, one, k2, none, torch.tensor([0.0]))
    w = math.exp(2.0) / (math.exp(2.0) + 1.0)  # score = (2*2) * 4^-0.5 = 2
    assert torch.equal(out[0, 0], (k2.float() * w).to(torch.bfloat16)[0]), \
        f"score-2 key: {out[0, 0].tolist()}, hand {(k2.float() * w).to(torch.bfloat16)[0].tolist()} (weight {w:.6f})"


@pytest.mark.operators("sparse_attention")
def test_sparse_attention_with_no_row_is_exactly_zero(backend):
    """A token whose window and compressed indices are all -1 outputs exactly zero in every head (the sink
    takes all the mass), whatever the sink. Spec: §5.3, AP-07."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 16, 64, generator=g).to(torch.bfloat16)
    kv = torch.randn(8, 64, generator=g).to(torch.bfloat16)
    wi = torch.tensor([[-1] * 40, [3] + [-1] * 39], dtype=torch.int32)
    ci = torch.full((2, 5), -1, dtype=torch.int32)
    sink = torch.randn(16, generator=g) * 10
    out = op(backend, "sparse_attention")(q, kv, wi, kv, ci, sink)
    assert bool((out[0] == 0).all()), "a token with no selected row has a non-zero output"
    # separates the rule from a -1 read as row 0 or as the last row, and from a softmax without the sink (0/0)
    separates("AP-07 no row gives exactly zero", torch.zeros_like(out[0]),
              clamps_to_row_0=reference_attention(q, kv, wi.clamp(min=0), kv, ci.clamp(min=0), sink)[0],
              wraps_to_last_row=reference_attention(q, kv, torch.where(wi < 0, 7, wi), kv,
                                                    torch.where(ci < 0, 7, ci), sink)[0],
              sink_left_out=torch.full_like(out[0], float("nan")))
    assert bool((out[1] != 0).any()), "a token with one selected row has an all-zero output"


@pytest.mark.operators("sparse_attention")
def test_sparse_attention_never_reads_unselected_rows(backend):
    """Cache rows no index selects (the last row included, which a -1 read would wrap to) may hold NaN -- a
    poisoned MX group decodes to NaN -- and must not reach the output; INT64 indices give the INT32 result.
    Spec: §5.3 (-1 = no row), §2.2 (NaN groups)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 16, 64, generator=g).to(torch.bfloat16)
    kv = torch.randn(12, 64, generator=g).to(torch.bfloat16)
    kv[0], kv[5], kv[11] = float("nan"), float("nan"), float("nan")  # never selected: first, middle, last
    wi = torch.tensor([[4, 3, -1, -1], [-1, 7, 2, -1]], dtype=torch.int32)
    ci = torch.tensor([[1, -1], [-1, -1]], dtype=torch.int32)
    sink = torch.randn(16, generator=g)
    attend = op(backend, "sparse_attention")
    out = attend(q, kv, wi, kv, ci, sink)
    assert bool(torch.isfinite(out).all()), "an unselected (NaN) cache row reached the output"
    # the vector separates "-1 is no row" from a -1 read as a row: wrapped to the last (NaN) row, or clamped to
    # row 0 (NaN too), computed with the reference attention
    separates("§5.3 -1 selects no row", reference_attention(q, kv, wi, kv, ci, sink),
              wraps_to_last_row=reference_attention(q, kv, torch.where(wi < 0, 11, wi), kv,
                                                    torch.where(ci < 0, 11, ci), sink),
              clamps_to_row_0=reference_attention(q, kv, wi.clamp(min=0), kv, ci.clamp(min=0), sink))
    clean = kv.clone()
    clean[0], clean[5], clean[11] = 0.0, 0.0, 0.0
    assert torch.equal(out, attend(q, clean, wi, clean, ci, sink)), "unselected rows changed the output"
    assert torch.equal(out, attend(q, kv, wi.long(), kv, ci.long(), sink)), "INT64 indices changed the output"


@given(seed=st.integers(0, 2**31), heads=st.sampled_from([16, 32]))
@pytest.mark.operators("check_row_precision", "sparse_attention")
def test_sparse_attention_ignores_the_order_of_selected_rows(backend, seed, heads):
    """Permuting a token's selected rows (and where its -1 holes sit) changes every output row by no more than
    the per-row bound: attention is a set function of the selection. Spec: §5.3 (selection in any order)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, 64, generator=g).to(torch.bfloat16)
    kv = torch.randn(200, 64, generator=g).to(torch.bfloat16)
    wi = torch.randint(-1, 200, (2, 70), generator=g, dtype=torch.int32)
    ci = torch.randint(-1, 200, (2, 40), generator=g, dtype=torch.int32)
    sink = torch.randn(heads, generator=g)
    attend = op(backend, "sparse_attention")
    base = attend(q, kv, wi, kv, ci, sink)
    perm_w, perm_c = torch.randperm(70, generator=g), torch.randperm(40, generator=g)
    moved = attend(q, kv, wi[:, perm_w], kv, ci[:, perm_c], sink)
    result = check_row_precision(moved, base, name="attention (rows permuted)")
    assert result.ok, result.message()


@pytest.mark.parametrize("what", ["index below -1", "index past the cache", "sink per token", "2-D query",
                                  "kv width", "index rows", "float indices", "1-D indices"])
@pytest.mark.operators("sparse_attention")
def test_sparse_attention_rejects_bad_input(backend, what):
    """Bad input raises a ValueError naming the field (and the token and slot of a bad index)."""
    q = torch.zeros(2, 4, 8)
    kv = torch.zeros(10, 8)
    wi, ci, sink = torch.zeros((2, 3), dtype=torch.int32), torch.zeros((2, 2), dtype=torch.int32), torch.zeros(4)
    args = {"query": q, "window_kv": kv, "window_indices": wi, "compressed_kv": kv, "compressed_indices": ci,
            "sink": sink}
    field = {"index below -1": ("window_indices", r"window_indices\[1\]\[2\]"),
             "index past the cache": ("compressed_indices", r"compressed_indices\[0\]\[1\]"),
             "sink per token": ("sink", "sink"), "2-D query": ("query", "query"),
             "kv width": ("compressed_kv", "compressed_kv"), "index rows": ("window_indices", "window_indices"),
             "float indices": ("window_indices", "window_indices"),
             "1-D indices": ("compressed_indices", "compressed_indices")}[what]
    if what == "index below -1":
        wi = wi.clone()
        wi[1, 2] = -2
        args["window_indices"] = wi
    elif what == "index past the cache":
        ci = ci.clone()
        ci[0, 1] = 10
        args["compressed_indices"] = ci
    elif what == "sink per token":
        args["sink"] = torch.zeros(2, 4)
    elif what == "2-D query":
        args["query"] = q[:, 0]
    elif what == "kv width":
        args["compressed_kv"] = torch.zeros(10, 9)
    elif what == "index rows":
        args["window_indices"] = wi[:1]
    elif what == "float indices":
        args["window_indices"] = wi.float()
    else:
        args["compressed_indices"] = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=field[1]):
        op(backend, "sparse_attention")(**args)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("attention:SINK_IGNORED", "test_sparse_attention_sink_hand_vectors", "sink 0"),
    shared("attention:SINK_IGNORED", "test_sparse_attention_within_the_row_bound_of_the_reference", "attention"),
    shared("attention:SCALE_576", "test_sparse_attention_sink_hand_vectors", "weight"),
    shared("attention:WINDOW_ONLY", "test_sparse_attention_within_the_row_bound_of_the_reference", "attention row"),
]
