"""dspark's Markov head (``markov_head``): each id's rank-R embedding row copied, and the full-vocabulary logits bias
embed · w2ᵀ in FP32. The logits are judged against an FP64 sum written here element by element; the rule is pinned
by a hand vector of small integers (exact in every dtype) that separates it from the plausible slips. Its golden
case and bad calls come from its record (``kernels/v4/markov_head.py``). Spec: §8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from contracts.tensors import byte_rows
from contracts.tolerances import LOGITS_TOL
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("markov_head")


def _tables(vocab: int, rank: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(vocab, rank, generator=g) / rank**0.5).to(torch.bfloat16) for _ in range(2))


@given(vocab=st.integers(1, 40), rank=st.integers(1, 24), ids=st.data(), seed=st.integers(0, 2**31))
def test_the_embedding_is_copied_and_the_bias_is_its_product_with_w2(backend, vocab, rank, ids, seed):
    """Any vocabulary, rank and ids inside the vocabulary (INT64 or INT32; repeats, 0, the last id): markov_embed[t] is w1's row
    ids[t] byte for byte (BF16), and logits_bias[t, v] is Σ_r embed[t, r] · w2[v, r] (FP64 here, element by element)
    within the logits bound on every element, [T, vocab] FP32."""
    dtype = ids.draw(st.sampled_from([torch.int64, torch.int32]), label="ids dtype")
    token_ids = torch.tensor(ids.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12), label="ids"),
                             dtype=dtype)
    w1, w2 = _tables(vocab, rank, seed)
    out = op(backend, "markov_head")(token_ids, w1, w2)
    embed, logits = out["markov_embed"], out["logits_bias"]
    assert embed.dtype == torch.bfloat16 and tuple(embed.shape) == (len(token_ids), rank), \
        f"markov_embed {embed.dtype}{list(embed.shape)}, expected bfloat16[{len(token_ids)}, {rank}] (§8)"
    assert logits.dtype == torch.float32 and tuple(logits.shape) == (len(token_ids), vocab), \
        f"logits_bias {logits.dtype}{list(logits.shape)}, expected float32[{len(token_ids)}, {vocab}] (§8)"
    bad = (byte_rows(embed) != byte_rows(w1[token_ids])).any(1)
    assert not bool(bad.any()), f"markov_embed[{int(bad.nonzero()[0])}] is not w1's row {int(token_ids[bad][0])}"
    atol, rtol = LOGITS_TOL
    for t, i in enumerate(token_ids.tolist()):
        for v in range(vocab):
            want = sum(float(w1[i, r]) * float(w2[v, r]) for r in range(rank))
            assert abs(float(logits[t, v]) - want) <= atol + rtol * abs(want), \
                f"logits_bias[{t}][{v}] = {float(logits[t, v])}, expected {want} = w1[{i}] · w2[{v}] " \
                f"(bound {atol} + {rtol}·|e|; §8)"


def test_a_hand_vector_separates_the_rule_from_its_slips(backend):
    """vocab 3, rank 2, integer tables: ids (2, 0) give embed rows (5, -1) and (1, 2), logits rows (1, 18, -7) and
    (9, -3, 3), exact; separated from the bias taken with w1 instead of w2, from the ids read one row late and from
    the ids ignored; and (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 kept in FP32, separated from a bias rounded to BF16."""
    w1 = torch.tensor([[1.0, 2.0], [3.0, 0.5], [5.0, -1.0]], dtype=torch.bfloat16)
    w2 = torch.tensor([[1.0, 4.0], [3.0, -3.0], [-1.0, 2.0]], dtype=torch.bfloat16)
    ids = torch.tensor([2, 0])
    want = torch.tensor([[1.0, 18.0, -7.0], [9.0, -3.0, 3.0]])
    e = w1[ids].float()
    separates("embed · w2ᵀ", want, with_w1=e @ w1.float().T, one_row_late=w1[(ids + 1) % 3].float() @ w2.float().T,
              ids_ignored=w1[:2].float() @ w2.float().T)
    assert torch.equal(e @ w2.float().T, want), "the hand vector's expected logits are not embed · w2ᵀ"
    out = op(backend, "markov_head")(ids, w1, w2)
    assert torch.equal(out["markov_embed"], w1[ids]), f"markov_embed {out['markov_embed'].tolist()}"
    assert torch.equal(out["logits_bias"], want), f"logits_bias {out['logits_bias'].tolist()}, expected " \
                                                  f"{want.tolist()} (embed · w2ᵀ, exact on integers)"
    fine = torch.tensor([[1.0078125, 0.0]], dtype=torch.bfloat16)  # 1 + 2^-7: its square needs 15 bits
    got = op(backend, "markov_head")(torch.tensor([0]), fine, fine)["logits_bias"]
    want_fine = torch.tensor([1.0 + 2.0**-6 + 2.0**-14])
    separates("an FP32 bias", want_fine, in_bf16=want_fine.to(torch.bfloat16).float())
    assert float(got) == float(want_fine), f"logits_bias {float(got)}: expected {float(want_fine)} kept in FP32 " \
                                           "(not rounded to BF16)"


@pytest.mark.parametrize("bad_id", [-1, 3, 2**40])
def test_an_id_outside_the_vocabulary_is_refused_naming_its_row(backend, bad_id):
    """No clamp and no wrap: the id at row 1 is named with the vocabulary's range."""
    w1, w2 = _tables(3, 4, 1)
    with pytest.raises(ContractInputError) as exc:
        op(backend, "markov_head")(torch.tensor([0, bad_id, 1]), w1, w2)
    assert exc.value.field == "token_ids" and exc.value.index == (1,), f"refused as {exc.value}"


@pytest.mark.parametrize("case", ["2-D ids", "FP32 ids", "FP32 w1", "1-D w2", "empty vocabulary", "two ranks"])
def test_a_malformed_call_is_refused_naming_its_field(backend, case):
    """Ids must be 1-D integers, both tables BF16 [vocab >= 1, R >= 1] of one shape."""
    w1, w2 = _tables(3, 4, 2)
    ids = torch.tensor([0, 1])
    call, field = {"2-D ids": ((ids[None], w1, w2), "token_ids"), "FP32 ids": ((ids.float(), w1, w2), "token_ids"),
                   "FP32 w1": ((ids, w1.float(), w2), "markov_w1"), "1-D w2": ((ids, w1, w2[0]), "markov_w2"),
                   "empty vocabulary": ((ids[:0], w1[:0], w2[:0]), "markov_w1"),
                   "two ranks": ((ids, w1, w2[:, :3]), "markov_w2")}[case]
    with pytest.raises(ContractInputError) as exc:
        op(backend, "markov_head")(*call)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


def _with_w1(token_ids, markov_w1, markov_w2):
    from kernels.v4.markov_head import markov_head

    return markov_head(token_ids, markov_w1, markov_w1)


def _bf16_logits(token_ids, markov_w1, markov_w2):
    from kernels.v4.markov_head import markov_head

    out = dict(markov_head(token_ids, markov_w1, markov_w2))
    out["logits_bias"] = out["logits_bias"].to(torch.bfloat16).float()
    return out


def _clamped(token_ids, markov_w1, markov_w2):
    from kernels.v4.markov_head import markov_head

    return markov_head(token_ids.clamp(0, markov_w1.shape[0] - 1), markov_w1, markov_w2)


def _embed_last_row_zero(token_ids, markov_w1, markov_w2):
    from kernels.v4.markov_head import markov_head

    out = dict(markov_head(token_ids, markov_w1, markov_w2))
    out["markov_embed"] = out["markov_embed"].clone()
    out["markov_embed"][-1] = 0
    return out


SEEDED_DEFECTS = [
    SeededDefect("markov-head:bias-with-w1", "markov_head", _with_w1,
                 "test_a_hand_vector_separates_the_rule_from_its_slips", "logits_bias"),
    SeededDefect("markov-head:bf16-bias", "markov_head", _bf16_logits,
                 "test_a_hand_vector_separates_the_rule_from_its_slips", "kept in FP32"),
    SeededDefect("markov-head:ids-clamped", "markov_head", _clamped,
                 "test_an_id_outside_the_vocabulary_is_refused_naming_its_row", "DID NOT RAISE"),
    SeededDefect("markov-head:embed-row-dropped", "markov_head", _embed_last_row_zero,
                 "test_the_embedding_is_copied_and_the_bias_is_its_product_with_w2", "is not w1's row"),
]
