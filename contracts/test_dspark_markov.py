"""dspark's sequential Markov sampler (``dspark_markov_sample``): each request's W drafts, step s greedy over the
base logits of its own row plus the Markov bias of the token drafted just before it (the anchor for step 0), ties
to the lowest id. Judged against the scores evaluated here in FP64 from the spec along the backend's own chain; a
worked-out integer hand vector pins the chain, the step's row and the tie rule. Golden case and bad calls: the
record in ``kernels/v4/dspark_markov.py``. Spec: §8.

The vocabularies here stay within 8 ids and every step has a positive best score: upstream's golden reads only the
first 8 ids and asserts a positive maximum, so these contracts run on it too."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from contracts.tolerances import DSPARK_MARKOV_TIE_TOL
from kernels.config import V4_FLASH_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("dspark_markov_sample")
C = V4_FLASH_TINY


def _spec_scores(normed_row: torch.Tensor, head: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                 prev: int) -> torch.Tensor:
    """One step's scores in FP64: normed · headᵀ + w1[prev] · w2ᵀ."""
    return head.double() @ normed_row.double() + w2.double() @ w1[prev].double()


@given(batch=st.integers(1, 3), width=st.integers(1, 5), d=st.integers(1, 8), vocab=st.integers(2, 8),
       rank=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_each_draft_is_the_first_best_of_its_steps_scores_along_the_chain(backend, batch, width, d, vocab, rank, seed):
    """Any batch, block width, D, vocabulary (up to 8 ids) and rank: draft_token_ids [B, W] INT32, and each draft
    is the best id of its step's FP64 scores (base row s of the request, the Markov bias of draft s-1, the anchor's
    at s = 0), the lowest such id unless another lies within 2^-16 of the best (FP32 order). Id 0's head row is
    small and positive and its w2 row zero, so every step's best is positive."""
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.rand(batch, width, d, generator=g) + 0.1).to(torch.bfloat16)
    norm_w = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16)
    head = torch.randn(vocab, d, generator=g)
    head[0] = (torch.rand(d, generator=g) + 0.1) * 0.01
    w1 = torch.randn(vocab, rank, generator=g)
    w2 = torch.randn(vocab, rank, generator=g)
    w2[0] = 0.0
    head, w1, w2 = (t.to(torch.bfloat16) for t in (head, w1, w2))
    anchors = torch.randint(0, vocab, (batch,), generator=g)
    got = op(backend, "dspark_markov_sample")(hidden, norm_w, head, anchors, w1, w2, config=C)
    assert got.dtype == torch.int32 and tuple(got.shape) == (batch, width), \
        f"draft_token_ids {got.dtype}{list(got.shape)}, expected int32[{batch}, {width}] (§8)"
    h = hidden.double()
    normed = (h * norm_w.double() / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + C.rms_norm_eps)).float() \
        .to(torch.bfloat16)
    for b in range(batch):
        prev = int(anchors[b])
        for s in range(width):
            pick = int(got[b, s])
            scores = _spec_scores(normed[b, s], head, w1, w2, prev)
            best = float(scores.max())
            near = (scores >= best - DSPARK_MARKOV_TIE_TOL * abs(best)).nonzero().flatten().tolist()
            assert pick in near and (len(near) > 1 or pick == near[0]), \
                f"draft_token_ids[{b}][{s}] = {pick} (score {float(scores[pick]) if 0 <= pick < vocab else 'n/a'}), " \
                f"expected {near[0]}: the first best of base row {s} plus the Markov bias of token {prev} " \
                f"(best {best:.9g}; §8)"
            prev = pick


def _chain(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, anchors, *, row_of=lambda s: s,
           prev_of=lambda prev, anchor: prev, bias=True, last_of_ties=False) -> torch.Tensor:
    """The hand vector's drafts under the rule or one of its slips, in FP64: base [W, V], rank-1 tables a, b."""
    out = torch.zeros(len(anchors), base.shape[0], dtype=torch.int32)
    for r, anchor in enumerate(anchors):
        prev = anchor
        for s in range(base.shape[0]):
            scores = base[row_of(s)] + (a[prev_of(prev, anchor)] * b if bias else 0.0)
            ties = (scores == scores.max()).nonzero().flatten()
            prev = int(ties[-1] if last_of_ties else ties[0])
            out[r, s] = prev
    return out


def test_a_hand_vector_pins_the_chain_the_row_and_the_tie(backend):
    """D 4, W 3, vocabulary 4, rank 1. Each request's rows are ±1 vectors, (1,1,1,1), (1,1,-1,-1), (1,-1,1,-1),
    normalised to themselves (weight 1); head rows (0,-1,1,1), (1,0,-1,0), (0,-1,0,-1), (0,1,0,-1) give base rows
    (1, 0, -2, 0), (-3, 2, 0, 2), (1, 0, 2, 0). w1 = (0, -2, 2, 2), w2 = (2, 2, -2, -1): the bias of token p is
    w1[p] · w2. Anchor 1: step 0 scores (-3, -4, 2, 2), a tie, id 2; then (1, 6, -4, 0) -> 1; (-3, -4, 6, 2) -> 2.
    Anchor 0 (no bias): (1, 0, -2, 0) -> 0; (-3, 2, 0, 2), a tie, id 1; (-3, -4, 6, 2) -> 2. Drafts [[2, 1, 2],
    [0, 1, 2]]. Separated from ties to the highest id, the anchor's bias at every step, step 0's base row at every
    step and the bias left out. Every best is positive (upstream's golden asserts it)."""
    bf = torch.bfloat16
    rows = torch.tensor([[1.0, 1, 1, 1], [1, 1, -1, -1], [1, -1, 1, -1]])
    head = torch.tensor([[0.0, -1, 1, 1], [1, 0, -1, 0], [0, -1, 0, -1], [0, 1, 0, -1]])
    a, b = torch.tensor([0.0, -2, 2, 2]), torch.tensor([2.0, 2, -2, -1])
    anchors = [1, 0]
    base = rows.double() @ head.double().T
    assert base.tolist() == [[1, 0, -2, 0], [-3, 2, 0, 2], [1, 0, 2, 0]], "the worked-out base rows"
    want = torch.tensor([[2, 1, 2], [0, 1, 2]], dtype=torch.int32)
    assert torch.equal(_chain(base, a, b, anchors), want), "the worked-out drafts are not the rule's"
    separates("greedy Markov chain, ties to the lowest id", want,
              ties_to_highest=_chain(base, a, b, anchors, last_of_ties=True),
              anchor_bias_every_step=_chain(base, a, b, anchors, prev_of=lambda prev, anchor: anchor),
              step_0_row_every_step=_chain(base, a, b, anchors, row_of=lambda s: 0),
              no_bias=_chain(base, a, b, anchors, bias=False))
    got = op(backend, "dspark_markov_sample")(rows.expand(2, 3, 4).to(bf), torch.ones(4, dtype=bf), head.to(bf),
                                              torch.tensor(anchors), a[:, None].to(bf), b[:, None].to(bf), config=C)
    assert torch.equal(got, want), f"draft_token_ids {got.tolist()}, expected {want.tolist()}: step s greedy over " \
                                   "base row s plus the bias of draft s-1 (the anchor's at s = 0), ties to the " \
                                   "lowest id (§8)"


def test_the_base_logits_are_fp32_before_the_bias(backend):
    """One request, one draft, D 4: the row (1, 1, 1, 1) normalises to itself; head rows (1/4, 1/4, 1/4, 1/4) and
    (1/2, 1/2, 2^-30, 0) give base logits 1 and 1 + 2^-30, which are one FP32 number: a tie, so id 0 (the first).
    Separated from base logits kept in FP64 (id 1). The bias is 0 (w2 zero) and the best score positive."""
    bf = torch.bfloat16
    head = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 2.0**-30, 0.0], [0, 0, 0, 0], [0, 0, 0, 0]])
    base = torch.ones(4, dtype=torch.float64) @ head.double().T
    assert base[1] - base[0] == 2.0**-30 and float(base[1].float()) == float(base[0].float()), "worked-out base"
    want = torch.tensor([[0]], dtype=torch.int32)
    separates("FP32 base logits", want, fp64_base=base.argmax().reshape(1, 1).to(torch.int32))
    w = torch.zeros(4, 1, dtype=bf)
    got = op(backend, "dspark_markov_sample")(torch.ones(1, 1, 4, dtype=bf), torch.ones(4, dtype=bf), head.to(bf),
                                              torch.tensor([2]), w, w, config=C)
    assert torch.equal(got, want), f"draft_token_ids {got.tolist()}, expected [[0]]: base logits 1 and 1 + 2^-30 " \
                                   "are one FP32 number, a tie to the lowest id (§8)"


@pytest.mark.parametrize("case, field", [("2-D block", "head_hidden"), ("empty block", "head_hidden"),
                                         ("no request", "head_hidden"), ("1-D w1", "markov_w1"),
                                         ("head of another vocabulary", "lm_head_weight"),
                                         ("head of another width", "lm_head_weight"),
                                         ("one anchor short", "anchor_token_ids"),
                                         ("float anchors", "anchor_token_ids"),
                                         ("anchor past the vocabulary", "token_ids")])
def test_a_malformed_call_is_refused_naming_its_field(backend, case, field):
    """A [B >= 1, W >= 1, D] block, a head [V, D] of the tables' vocabulary, one integer anchor per request inside
    the vocabulary (no clamp, no wrap)."""
    bf = torch.bfloat16
    h, nw, head = torch.ones(2, 3, 4, dtype=bf), torch.ones(4, dtype=bf), torch.ones(5, 4, dtype=bf)
    w, anchors = torch.ones(5, 2, dtype=bf), torch.tensor([0, 4])
    if case == "1-D w1":
        with pytest.raises(ContractInputError) as exc:
            op(backend, "dspark_markov_sample")(h, nw, head[:1], anchors[:2] * 0, w[:1, 0], w[:1], config=C)
        assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}: {exc.value}"
        return
    call = {"2-D block": (h[0], nw, head, anchors), "empty block": (h[:, :0], nw, head, anchors),
            "no request": (h[:0], nw, head, anchors[:0]),
            "head of another vocabulary": (h, nw, head[:4], anchors), "head of another width": (h, nw, head[:, :3],
                                                                                                anchors),
            "one anchor short": (h, nw, head, anchors[:1]), "float anchors": (h, nw, head, anchors.float()),
            "anchor past the vocabulary": (h, nw, head, anchors + 1)}[case]
    with pytest.raises(ContractInputError) as exc:
        op(backend, "dspark_markov_sample")(*call, w, w, config=C)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


# --- seeded defects ------------------------------------------------------------------------------------------

def _with(**change):
    def impl(head_hidden, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1, markov_w2, *, config,
             ops=None):
        from kernels.v4.dspark_markov import dspark_markov_sample

        return dspark_markov_sample(head_hidden, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1,
                                    markov_w2, config=config, ops={**(ops or {}), **change})
    return impl


def _pick_last(scores):
    best = scores.max(dim=1, keepdim=True).values
    return (scores.shape[1] - 1 - (scores == best).flip(1).to(torch.int8).argmax(dim=1)).to(torch.int32)


def _anchor_every_step(head_hidden, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1, markov_w2, *,
                       config, ops=None):
    from kernels.v4.dspark_markov import dspark_markov_sample

    cols = [dspark_markov_sample(head_hidden[:, s:s + 1], final_norm_weight, lm_head_weight, anchor_token_ids,
                                 markov_w1, markov_w2, config=config) for s in range(head_hidden.shape[1])]
    return torch.cat(cols, dim=1)


def _fp64_base(head_hidden, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1, markov_w2, *, config,
               ops=None):
    from kernels.reference.lm_head import final_norm, greedy_pick
    from kernels.v4.markov_head import markov_head

    b, w, d = head_hidden.shape
    base = (final_norm(head_hidden.reshape(b * w, d), final_norm_weight, config=config).double()
            @ lm_head_weight.double().T).reshape(b, w, -1)
    prev, out = anchor_token_ids.long(), []
    for s in range(w):
        prev = greedy_pick(base[:, s] + markov_head(prev, markov_w1, markov_w2)["logits_bias"].double()).long()
        out.append(prev)
    return torch.stack(out, 1).to(torch.int32)


def _row_shifted(head_hidden, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1, markov_w2, *, config,
                 ops=None):
    from kernels.v4.dspark_markov import dspark_markov_sample

    shifted = torch.cat((head_hidden[:, :1], head_hidden[:, :-1]), dim=1)  # step s reads row s-1
    return dspark_markov_sample(shifted, final_norm_weight, lm_head_weight, anchor_token_ids, markov_w1, markov_w2,
                                config=config)


SEEDED_DEFECTS = [
    SeededDefect("dspark-markov:ties-to-highest", "dspark_markov_sample", _with(greedy_pick=_pick_last),
                 "test_a_hand_vector_pins_the_chain_the_row_and_the_tie", "ties to the lowest id"),
    SeededDefect("dspark-markov:anchor-every-step", "dspark_markov_sample", _anchor_every_step,
                 "test_each_draft_is_the_first_best_of_its_steps_scores_along_the_chain", "draft_token_ids["),
    SeededDefect("dspark-markov:row-shifted", "dspark_markov_sample", _row_shifted,
                 "test_each_draft_is_the_first_best_of_its_steps_scores_along_the_chain", "draft_token_ids["),
    SeededDefect("dspark-markov:fp64-base", "dspark_markov_sample", _fp64_base,
                 "test_the_base_logits_are_fp32_before_the_bias", "one FP32 number"),
    SeededDefect("dspark-markov:no-bias", "dspark_markov_sample",
                 _with(markov_head=lambda ids, w1, w2: {"logits_bias": torch.zeros(len(ids), w2.shape[0])}),
                 "test_each_draft_is_the_first_best_of_its_steps_scores_along_the_chain", "draft_token_ids["),
]
