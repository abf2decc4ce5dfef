"""The Engram block (``engram``, ``engram_tp``): the gated n-gram lookup V4.1 adds to every hyper-connection
stream before layers 1 and 14. Each rule is checked on inputs that separate it from the plausible port: the
signed square root inside the sigmoid, the key / value split (a key per stream, one value shared), the key's
own RMS normalisation, the folded q·k weight; the row-sharded TP lookup equals the single-rank lookup bit for
bit on every rank; bad ids, shard counts and windows are refused naming the field.

Spec: §1; upstream_checks HC-13, HC-14.
"""

from __future__ import annotations

import pytest
import torch

from contracts.checks.precision import check_ratio_allclose
from contracts.tolerances import ENGRAM_TOL
from kernels.config import FLASH_TINY
from kernels.errors import ContractInputError
from kernels.reference.engram import ENGRAM_TP_WINDOW, hash_columns
from pto_pytest.defect import shared
from pto_pytest.plugin import op

C = FLASH_TINY
HC, D, HD, COLS = C.hc_mult, C.hidden_size, C.engram_head_dim, hash_columns(C)


def _case(seed: int, tokens: int = 6, rows: int = 64, value_scale: float = 1.0, dot_scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    wkv = torch.randn(COLS * HD, (HC + 1) * D, generator=g) / (COLS * HD) ** 0.5
    wkv[:, :HC * D] *= dot_scale
    wkv[:, HC * D:] *= value_scale
    return (torch.randint(0, rows, (tokens, COLS), generator=g, dtype=torch.int32),
            torch.randn(rows, HD, generator=g).to(torch.bfloat16), wkv.to(torch.bfloat16),
            torch.rand(HC, D, generator=g) * 1.5 + 0.25, torch.randn(tokens, HC, D, generator=g).to(torch.bfloat16))


def _independent(ids, table, wkv, weight, x, *, sqrt=True, key_norm=True, use_weight=True, value_last=True):
    """The released formula in FP64, with one rule switchable to its plausible alternative."""
    kv = table[ids.long()].flatten(1).double() @ wkv.double()
    key, value = (kv[:, :HC * D], kv[:, HC * D:]) if value_last else (kv[:, D:], kv[:, :D])
    key = key.unflatten(-1, (HC, D))
    h = x.double()
    eps = C.rms_norm_eps
    rstd = torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    if key_norm:
        rstd = rstd * torch.rsqrt(key.square().mean(-1, keepdim=True) + eps)
    w = weight.double()[None] if use_weight else 1.0
    dot = (h * w * key).sum(-1, keepdim=True) * rstd * D**-0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot) if sqrt else dot)
    return h + gate * value[:, None, :]


@pytest.mark.operators("engram")
def test_the_engram_output_is_the_released_formula_within_its_budget(backend):
    """Against an independent FP64 evaluation the output is within ratio_allclose(1e-3, 1e-2) (HC-14) and BF16.
    The inputs separate each rule: a large shared value and small |dot| make sigmoid(dot) without the signed
    square root, a value taken from the first D columns, a key without its own RMS norm, or a gate without the
    folded q·k weight each fall outside the budget. Spec: HC-13, HC-14."""
    case = _case(3, value_scale=8.0, dot_scale=0.05)
    out = op(backend, "engram")(*case, config=C)
    assert out.dtype == torch.bfloat16 and out.shape == (6, HC, D)
    atol, rtol = ENGRAM_TOL
    r = check_ratio_allclose(out.double(), _independent(*case), atol=atol, rtol=rtol, name="engram")
    assert r.ok, r.message()
    for rule in ("sqrt", "value_last", "key_norm", "use_weight"):
        alt = _independent(*case, **{rule: False})
        assert not check_ratio_allclose(alt.to(torch.bfloat16).double(), _independent(*case), atol=atol,
                                        rtol=rtol).ok, f"the inputs do not separate the {rule} rule"


@pytest.mark.operators("engram")
def test_the_operands_are_bf16_and_the_math_fp32(backend):
    """Table rows and wkv enter the projection as BF16 (an FP32 table or wkv gives the output of its BF16
    rounding); x enters the statistics as FP32: against an FP64 evaluation at most 2 % of the BF16 outputs
    differ, and by one step at most, where statistics taken in BF16 move far more. Spec: HC-13."""
    ids, table, wkv, weight, x = _case(11, value_scale=8.0, dot_scale=0.05)
    run = op(backend, "engram")
    out = run(ids, table, wkv, weight, x, config=C)
    g = torch.Generator().manual_seed(2)
    fine_table = table.float() + torch.rand(table.shape, generator=g) * 1e-3 * table.float().abs()
    fine_wkv = wkv.float() + torch.rand(wkv.shape, generator=g) * 1e-3 * wkv.float().abs()
    assert not torch.equal(fine_table.to(torch.bfloat16).float(), fine_table)
    want = run(ids, fine_table.to(torch.bfloat16), fine_wkv.to(torch.bfloat16), weight, x, config=C)
    assert torch.equal(run(ids, fine_table, fine_wkv, weight, x, config=C).view(torch.int16), want.view(torch.int16))
    exact = _independent(ids, table, wkv, weight, x).to(torch.bfloat16)
    steps = (out.view(torch.int16).int() - exact.view(torch.int16).int()).abs()
    assert int(steps.max()) <= 1 and float((steps > 0).float().mean()) <= 0.02, \
        f"{float((steps > 0).float().mean()):.3%} of the outputs differ from the FP64 evaluation"


@pytest.mark.operators("engram")
def test_the_gate_clamp_and_the_norm_epsilons_show_on_sentinel_rows(backend):
    """Token 0 has x = 0 (so dot = 0 and the gate is sigmoid(sqrt(1e-6)) = 0.50025) and a value of 2.00699 in
    column 0 and 2.00671 in column 1: 0.50025 · value rounds to 1.0078125 and 1.0 in BF16, where a gate without
    the clamp (0.5) gives 1.0 in column 0 and a clamp of 2e-6 gives 1.0078125 in column 1. Token 1 gathers an
    all-zero table row: key and value are zero and the output is x exactly (the eps inside both RMS terms keeps
    it finite). Spec: HC-13."""
    cols_k = COLS * HD
    table = torch.zeros(2, HD, dtype=torch.bfloat16)
    table[0, 0] = 1.0
    wkv = torch.zeros(cols_k, (HC + 1) * D, dtype=torch.bfloat16)
    wkv[0, HC * D] = wkv[0, HC * D + 1] = 2.0
    wkv[HD, HC * D] = 0.007  # BF16 0.006988525390625
    wkv[HD, HC * D + 1] = 0.0067  # BF16 0.0067138671875
    ids = torch.stack((torch.zeros(COLS, dtype=torch.int32), torch.ones(COLS, dtype=torch.int32)))
    x = torch.zeros(2, HC, D, dtype=torch.bfloat16)
    x[1] = torch.randn(HC, D, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = op(backend, "engram")(ids, table, wkv, torch.ones(HC, D), x, config=C)
    assert out[0, :, 0].tolist() == [1.0078125] * HC and out[0, :, 1].tolist() == [1.0] * HC, out[0, :, :2].tolist()
    assert torch.equal(out[1].view(torch.int16), x[1].view(torch.int16)), "a zero lookup must leave x unchanged"


@pytest.mark.operators("engram")
def test_each_stream_has_its_own_gate_and_every_stream_adds_the_same_value(backend):
    """Four streams holding the same x but different weight rows get different gates; (out - x) / value is one
    gate per stream and token row (within BF16 rounding), so the value is shared and the gate is per stream.
    Spec: HC-13."""
    ids, table, wkv, weight, x = _case(5, value_scale=4.0, dot_scale=0.2)
    x = x[:, :1].expand(-1, HC, -1).contiguous()
    out = op(backend, "engram")(ids, table, wkv, weight, x, config=C).double()
    value = (table[ids.long()].flatten(1).double() @ wkv.double())[:, HC * D:]
    big = value.abs() > value.abs().amax(-1, keepdim=True) / 4  # columns where BF16 rounding is small
    gates = []
    for c in range(HC):
        ratio = ((out[:, c] - x[:, c].double()) / value)
        for t in range(ratio.shape[0]):
            sel = ratio[t][big[t]]
            assert float(sel.max() - sel.min()) < 0.05, f"token {t} stream {c}: not one gate over the value"
        gates.append(torch.stack([ratio[t][big[t]].median() for t in range(ratio.shape[0])]))
    gates = torch.stack(gates)
    assert float((gates - gates[0]).abs().max()) > 0.01, "every stream got the same gate"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.operators("engram", "engram_tp")
def test_the_sharded_lookup_equals_the_single_rank_lookup_on_every_rank(backend, tp):
    """The table row-sharded over tp ranks (hash ids hitting every shard, some rows repeated): every rank's
    output equals the single-rank output bit for bit, each in its own buffer. Spec: HC-14."""
    ids, table, wkv, weight, x = _case(tp, tokens=9, rows=64)
    ids[0] = torch.arange(COLS) % 3
    single = op(backend, "engram")(ids, table, wkv, weight, x, config=C)
    outs = op(backend, "engram_tp")(ids, list(table.chunk(tp)), wkv, weight, x, tp=tp, config=C)
    assert len(outs) == tp and len({o.data_ptr() for o in outs}) == tp, "ranks share one output buffer"
    for rank, out in enumerate(outs):
        assert torch.equal(out.view(torch.int16), single.view(torch.int16)), f"rank {rank} differs"


@pytest.mark.operators("engram", "engram_tp")
def test_engram_inputs_are_refused_naming_the_field(backend):
    """A hash id outside the table names its (token, column); the wrong column count, x shape or weight shape
    name the field; TP needs one of (1, 2, 4, 8), one shard per rank of equal size, and at most 256 token rows
    (the lookup window). Spec: HC-13, HC-14."""
    ids, table, wkv, weight, x = _case(1)
    bad = ids.clone()
    bad[2, 3] = 64
    with pytest.raises(ContractInputError, match=r"hash_ids\[2\]\[3\]: expected a table row in \[0, 64\)"):
        op(backend, "engram")(bad, table, wkv, weight, x, config=C)
    with pytest.raises(ContractInputError, match="hash_ids"):
        op(backend, "engram")(ids[:, :-1], table, wkv, weight, x, config=C)
    with pytest.raises(ContractInputError, match="x"):
        op(backend, "engram")(ids, table, wkv, weight, x[:-1], config=C)
    with pytest.raises(ContractInputError, match="engram weights"):
        op(backend, "engram")(ids, table, wkv, weight[:-1], x, config=C)
    tp = op(backend, "engram_tp")
    for bad_tp in (3, True):
        with pytest.raises(ContractInputError, match=r"^tp: expected one of"):
            tp(ids, list(table.chunk(2)), wkv, weight, x, tp=bad_tp, config=C)
    with pytest.raises(ContractInputError, match="one per rank"):
        tp(ids, list(table.chunk(4)), wkv, weight, x, tp=2, config=C)
    with pytest.raises(ContractInputError, match="equal shards"):
        tp(ids, [table[:40], table[40:]], wkv, weight, x, tp=2, config=C)
    full = torch.zeros(ENGRAM_TP_WINDOW, COLS, dtype=torch.int32)
    tp(full, list(table.chunk(2)), wkv, weight, torch.zeros(ENGRAM_TP_WINDOW, HC, D), tp=2, config=C)  # the edge
    many = torch.zeros(ENGRAM_TP_WINDOW + 1, COLS, dtype=torch.int32)
    with pytest.raises(ContractInputError, match="at most 256 token rows"):
        tp(many, list(table.chunk(2)), wkv, weight, torch.zeros(ENGRAM_TP_WINDOW + 1, HC, D), tp=2, config=C)


@pytest.mark.operators("engram")
def test_the_engram_comparator_judges_every_rank_and_the_budget():
    """The golden comparator ``engram``: ratio_allclose(1e-3, 1e-2) just inside passes and just outside fails;
    on the sharded tree a rank whose output differs from rank 0 by one bit fails as replicas. Spec: HC-14."""
    from contracts.compare import Context, engram

    atol, rtol = ENGRAM_TOL
    e = torch.full((2, 3, HC, D), 2.0)
    ctx = Context({}, {}, {}, {}, wiring="sharded")
    edge = atol + rtol * 2.0
    assert engram("out", e + edge * (1 - 1e-4), e, ctx).ok
    assert not engram("out", e + edge * (1 + 1e-4), e, ctx).ok
    odd = e.clone()
    odd[1, 0, 0, 0] = torch.nextafter(torch.tensor(2.0), torch.tensor(3.0))
    r = engram("out", odd, e, ctx)
    assert not r.ok and r.check == "check_replicas_identical", r.message()


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("engram:GATE_WITHOUT_SQRT", "test_the_engram_output_is_the_released_formula_within_its_budget", "engram"),
    shared("engram:VALUE_FIRST", "test_the_engram_output_is_the_released_formula_within_its_budget", "engram"),
    shared("engram:TP_UNMASKED", "test_the_sharded_lookup_equals_the_single_rank_lookup_on_every_rank", "differs"),
]
