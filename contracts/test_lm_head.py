"""The model boundary: the token-embedding pack into the hyper-connection streams (``embed_pack``), the LM head
with its vocabulary shards (``lm_head``) and the greedy pick (``greedy_pick``). The SC-23 layout rules as
errors, every logit against the reference (AP-17, no outlier allowance), shards that concatenate to the
unsharded logits, greedy ids that are the first maximum of the logits they come from (AP-18), clamped ids
read bit-exact rows (CQ-26), and the comparators shown failing just outside their bounds.

The boundary chain embed_pack -> hc_head -> final_norm with the backbone skipped (AP-19).

Spec: §1; upstream_checks SC-23, AP-17, AP-18, AP-19, CQ-26.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import torch_backend
from contracts.checks.precision import check_greedy, check_logits
from contracts.separation import separates
from contracts.tolerances import LOGITS_TOL
from kernels.config import FLASH_TINY
from kernels.errors import ContractInputError
from kernels.reference.lm_head import lm_head_layout
from pto_pytest.defect import shared
from pto_pytest.plugin import op

REF = torch_backend()
C = FLASH_TINY
V, D = C.vocab_size, C.hidden_size


def _weight(g: torch.Generator) -> torch.Tensor:
    return (torch.randn(V, D, generator=g) / D**0.5).to(torch.bfloat16)


def test_the_lm_head_layout_rules_are_errors_naming_the_field():
    assert lm_head_layout(vocab=129280, tp=8, dp=8) == 16160 and lm_head_layout(vocab=256, tp=4, dp=4) == 64
    for kw, field in ((dict(tp=3), "tp"), (dict(tp=True), "tp"), (dict(dp=16), "dp"), (dict(tp=4, dp=2), "dp"),
                      (dict(vocab=129281, tp=8, dp=8), "divisible by tp=8"), (dict(vocab=129280 + 8, tp=8, dp=8), "divisible by 256"),
                      (dict(group_logit_rows=24), "group_logit_rows")):
        args = {"vocab": 129280, "tp": 1, "dp": 1, **kw}
        with pytest.raises(ContractInputError, match=field):
            lm_head_layout(**args)


@settings(deadline=None)
@given(seed=st.integers(0, 2**16), tokens=st.integers(1, 6), tp=st.sampled_from([1, 2, 4, 8]))
@pytest.mark.operators("lm_head")
def test_the_vocab_shards_concatenate_to_the_reference_logits(backend, seed, tokens, tp):
    """Rank r's shard is logits[:, r·V/tp : (r+1)·V/tp]: the shards in rank order equal the unsharded
    reference logits within 1e-3 + 1e-3·|e| on every element, and equal the backend's own unsharded logits
    bit for bit. Spec: SC-23, AP-17."""
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(tokens, D, generator=g).to(torch.bfloat16), _weight(g)
    head = op(backend, "lm_head")
    shards = head(hidden, weight, tp=tp)
    assert len(shards) == tp and all(s.shape == (tokens, V // tp) and s.dtype == torch.float32 for s in shards)
    got = torch.cat(shards, dim=1)
    (want,) = REF.get("lm_head")(hidden, weight, tp=1)
    r = check_logits(got, want, tp=tp)
    assert r.ok, r.message()
    assert torch.equal(got, torch.cat(head(hidden, weight, tp=1), dim=1)), "sharding moved a logit"


@pytest.mark.operators("lm_head")
def test_a_shard_boundary_is_exact(backend):
    """A weight whose row v is v·e_0 makes logit v of a token with x = e_0 equal to v: every shard must start
    at its own first vocabulary row (an off-by-one shard shows as v ± 1). Spec: SC-23."""
    weight = torch.zeros(V, D)
    weight[:, 0] = torch.arange(V, dtype=torch.float32)
    x = torch.zeros(1, D, dtype=torch.bfloat16)
    x[0, 0] = 1.0
    for tp in (2, 4, 8):
        shards = op(backend, "lm_head")(x, weight.to(torch.bfloat16), tp=tp)
        for r, s in enumerate(shards):
            first = r * V // tp
            assert s[0, 0].item() == first and s[0, -1].item() == first + V // tp - 1, \
                f"TP{tp} shard {r} holds vocab rows {s[0, 0].item():g}..{s[0, -1].item():g}"


@pytest.mark.operators("greedy_pick")
def test_greedy_ids_are_the_first_maximum(backend):
    """Ties go to the first (lowest) vocabulary id; -inf rows still pick their maximum; a NaN row is an error
    naming the row. Spec: AP-18."""
    logits = torch.zeros(3, 10)
    logits[0, 3] = logits[0, 7] = 5.0
    logits[1] = -float("inf")
    logits[1, 9] = -1.0
    logits[2, :] = 2.0
    ids = op(backend, "greedy_pick")(logits)
    assert ids.dtype == torch.int32 and ids.tolist() == [3, 9, 0], ids.tolist()
    logits[1, 4] = float("nan")
    with pytest.raises(ContractInputError, match=r"logits\[1\]"):
        op(backend, "greedy_pick")(logits)


@settings(deadline=None)
@given(seed=st.integers(0, 2**16), tokens=st.integers(1, 6))
@pytest.mark.operators("greedy_pick", "lm_head")
def test_greedy_ids_agree_with_the_logits_they_come_from(backend, seed, tokens):
    """Self-consistency on real logits with forced ties (two identical vocabulary rows): the ids are the first
    maximum of the backend's own logits. Spec: AP-18."""
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(tokens, D, generator=g).to(torch.bfloat16), _weight(g)
    best = (hidden.float() @ weight.float().T).argmax(1)
    weight[V - 1] = weight[best[0]]  # a tie between best[0] and the last id for token 0
    logits = torch.cat(op(backend, "lm_head")(hidden, weight, tp=2), dim=1)
    r = check_greedy(op(backend, "greedy_pick")(logits), logits)
    assert r.ok, r.message()


@pytest.mark.operators("embed_pack")
def test_the_embedding_pack_clamps_ids_and_copies_rows_bit_exact(backend):
    """Ids -1, vocab and vocab + 7 read rows 0, vocab-1 and vocab-1; every stream holds the row bit for bit.
    Spec: CQ-26."""
    g = torch.Generator().manual_seed(4)
    emb = torch.randn(V, D, generator=g).to(torch.bfloat16)
    ids = torch.tensor([5, -1, V, V + 7, 0], dtype=torch.int64)
    x = op(backend, "embed_pack")(ids, emb, config=C)
    assert x.shape == (5, C.hc_mult, D) and x.dtype == emb.dtype

    def rows(ids_read):  # every stream holding the rows read
        return emb[ids_read][:, None].expand(-1, C.hc_mult, -1)

    # clamping both ends, separated from ids taken modulo the vocabulary and from a -1 that indexes from the end
    separates("CQ-26 ids clamp to [0, vocab)", rows([5, 0, V - 1, V - 1, 0]).view(torch.int16),
              modulo=rows([5, V - 1, 0, 7, 0]).view(torch.int16),
              negative_from_the_end=rows([5, V - 1, V - 1, V - 1, 0]).view(torch.int16))
    for t, row in enumerate([5, 0, V - 1, V - 1, 0]):
        for lane in range(C.hc_mult):
            assert torch.equal(x[t, lane].view(torch.int16), emb[row].view(torch.int16)), \
                f"token {t} (id {int(ids[t])}) lane {lane}: expected vocabulary row {row}"


def test_the_logit_and_greedy_comparators_fail_just_outside_their_bounds():
    """check_logits: every element within 1e-3 + 1e-3·|e| -- one element a hair over fails (no quota), and the
    message names the shard; check_greedy: the last of two tied maxima fails. Spec: AP-17, AP-18."""
    atol, rtol = LOGITS_TOL
    e = torch.tensor([[0.0, 10.0, -10.0, 3.0]], dtype=torch.float64).repeat(2, 1)
    edge = atol + rtol * e.abs()
    assert check_logits(e + edge * (1 - 1e-9), e).ok and check_logits(e - edge * (1 - 1e-9), e).ok
    for col in range(4):
        a = e + edge * (1 - 1e-9)
        a[1, col] = e[1, col] + edge[1, col] * (1 + 1e-6)
        r = check_logits(a, e, tp=2)
        assert not r.ok and f"row[1][{col}]" in r.message() and f"vocab shard {col // 2} column {col % 2}" in \
            r.message(), r.message()
    logits = torch.tensor([[1.0, 7.0, 7.0]])
    assert check_greedy(torch.tensor([1], dtype=torch.int32), logits).ok
    r = check_greedy(torch.tensor([2], dtype=torch.int32), logits)
    assert not r.ok and "first maximum" in r.message()


@pytest.mark.operators("embed_pack", "greedy_pick", "lm_head")
def test_the_boundary_operators_refuse_bad_calls(backend):
    """lm_head: a TP outside (1, 2, 4, 8) or True, a hidden / weight mismatch; greedy_pick: a 1-D or empty
    row; embed_pack: float ids, a 1-D embedding. The default lm_head is one shard. Spec: SC-23, AP-18, CQ-26."""
    g = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(2, D, generator=g).to(torch.bfloat16), _weight(g)
    head = op(backend, "lm_head")
    assert len(head(hidden, weight)) == 1
    for tp in (3, True, 16):
        with pytest.raises(ContractInputError, match="tp"):
            head(hidden, weight, tp=tp)
    for h, w in ((hidden[0], weight), (hidden, weight[:, :-1]), (hidden, weight[0])):
        with pytest.raises(ContractInputError, match="lm_head"):
            head(h, w)
    for bad in (torch.zeros(5), torch.zeros(2, 0)):
        with pytest.raises(ContractInputError, match="logits"):
            op(backend, "greedy_pick")(bad)
    emb = torch.zeros(V, D)
    with pytest.raises(ContractInputError, match="ids"):
        op(backend, "embed_pack")(torch.zeros(3), emb, config=C)
    with pytest.raises(ContractInputError, match="ids"):
        op(backend, "embed_pack")(torch.zeros(3, 1, dtype=torch.int64), emb, config=C)
    with pytest.raises(ContractInputError, match="embedding"):
        op(backend, "embed_pack")(torch.zeros(3, dtype=torch.int64), emb[0], config=C)


@pytest.mark.operators("greedy_pick")
def test_a_single_column_of_logits_picks_id_zero(backend):
    assert op(backend, "greedy_pick")(torch.tensor([[3.0], [-1.0]])).tolist() == [0, 0]


@pytest.mark.operators("embed_pack", "final_norm", "hc_head")
def test_the_boundary_chain_embeds_collapses_and_normalizes(backend):
    """embed_pack -> hc_head -> final_norm with the backbone skipped (upstream's id set, two ids past the
    vocabulary) and a non-identity delayed pre-mix: x_hc is the clamped rows in every stream (exact); hidden is
    the pre-mix-weighted sum of the streams, one BF16 rounding; x_normed is the FP32 RMSNorm of hidden times the
    weight, one BF16 rounding; both within ratio_allclose(1e-4, 1/128) of an independent FP64 computation, and
    a norm without its weight or a collapse of stream 0 alone is far outside. Spec: AP-19, CQ-26."""
    from contracts.checks.precision import check_ratio_allclose
    from contracts.tolerances import HC_OUT_TOL

    g = torch.Generator().manual_seed(19)
    emb = torch.randn(V, D, generator=g).to(torch.bfloat16)
    ids = torch.tensor([0, 1, 17, V - 1, V, V + 3, 2, 5])
    mix = torch.rand(8, C.hc_mult, generator=g) + 0.1  # pre-mix rows need not sum to 1 (sigmoid gates)
    w = torch.randn(D, generator=g).to(torch.bfloat16)
    x_hc = op(backend, "embed_pack")(ids, emb, config=C).float()
    hidden = op(backend, "hc_head")(x_hc, mix)
    normed = op(backend, "final_norm")(hidden, w, config=C)
    rows = emb[ids.clamp(0, V - 1)].double()
    assert torch.equal(x_hc, rows[:, None].expand(-1, C.hc_mult, -1).float()), "x_hc"
    want_hidden = (mix.double()[:, :, None] * rows[:, None]).sum(1)
    h = hidden.double()
    want_normed = h / (h.pow(2).mean(1, keepdim=True) + C.rms_norm_eps).sqrt() * w.double()
    atol, rtol = HC_OUT_TOL
    for name, got, want in (("hidden", hidden, want_hidden), ("x_normed", normed, want_normed)):
        assert got.dtype == torch.bfloat16, name
        r = check_ratio_allclose(got.double(), want, atol=atol, rtol=rtol, name=name)
        assert r.ok, r.message()
    assert not check_ratio_allclose(h / (h.pow(2).mean(1, keepdim=True)).sqrt(), want_normed, atol=atol,
                                    rtol=rtol).ok, "the inputs separate a norm without its weight"
    assert not check_ratio_allclose(rows, want_hidden, atol=atol, rtol=rtol).ok, \
        "the inputs separate the weighted collapse from stream 0"
    with pytest.raises(ContractInputError, match="final_norm"):
        op(backend, "final_norm")(hidden, w[:-1], config=C)


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("lm_head:GREEDY_TIES_TO_LAST", "test_greedy_ids_are_the_first_maximum", "[7, 9, 9]"),
    shared("lm_head:GREEDY_TIES_TO_LAST", "test_greedy_ids_agree_with_the_logits_they_come_from", "first maximum"),
    shared("lm_head:SHARD_OFF_BY_ONE", "test_a_shard_boundary_is_exact", "holds vocab rows"),
    shared("lm_head:IDS_WRAP", "test_the_embedding_pack_clamps_ids_and_copies_rows_bit_exact", "expected vocabulary row 0"),
    shared("lm_head:NORM_WITHOUT_WEIGHT", "test_the_boundary_chain_embeds_collapses_and_normalizes", "x_normed"),
]
