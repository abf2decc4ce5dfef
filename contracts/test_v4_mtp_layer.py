"""V4's MTP layer end to end (``v4_mtp_layer``, upstream decode_mtp.py; ``v4_prefill_mtp_layer``, upstream
prefill_mtp.py) and its head mix (``v4_head_mix``), on V4-Pro and V4-Flash (tiny twins).

The head mix is judged against an FP64 evaluation written here; the layer bit for bit against the chain of the
backend's own operators (projection -> SWA attention stage -> MoE stage -> head mix -> hc_head -> RMSNorm),
with the next step's streams taken after the MoE stage.

Spec: §8; docs/coverage.md, V4 section (V4-15).
"""

from __future__ import annotations

import pytest
import torch

from contracts.v4_inputs import mtp_layer_inputs, prefill_mtp_layer_inputs
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import SeededDefect, shared
from pto_pytest.plugin import op

MODELS = [V4_PRO_TINY.kernel_preset(), V4_FLASH_TINY.kernel_preset()]


def _prefill_layer(backend, config, i):
    return op(backend, "v4_prefill_mtp_layer")(i["hidden"], i["prev"], i["projection"], i["attention"], i["moe"],
                                               i["head"], i["num_tokens"], config=config)


def _layer(backend, config, i):
    return op(backend, "v4_mtp_layer")(i["hidden"], i["prev"], i["projection"], i["attention"], i["moe"], i["head"],
                                       config=config)


def _assert_the_chain(backend, config, i, out, att, moe, form):
    """The layer's outputs against the chain's: the head (head mix then hc_head in one call, as upstream's hc_head
    goldens compute it, then the RMSNorm) on the MoE stage's streams computed here with the backend's operators,
    the streams themselves for the next step, the stage's cache."""
    y = op(backend, "hc_head_fused")(moe["x_out"], i["head"]["fn"], i["head"]["scale"], i["head"]["base"],
                                     config=config)["y"]
    want = op(backend, "final_norm")(y, i["head"]["norm_w"], config=config)
    assert out["hidden_out"].dtype == torch.bfloat16 and torch.equal(out["hidden_out"], want), \
        f"{form}hidden_out is not the stages in order"
    assert out["next_pre_hc_hidden"].dtype == torch.float32 and torch.equal(out["next_pre_hc_hidden"], moe["x_out"]), \
        f"the next step does not receive {form or 'the '}MoE stage's streams"
    assert torch.equal(out["kv_cache"], att["kv_cache"]), f"{form or 'the '}kv cache is not the SWA stage's"


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("v4_head_mix")
def test_the_head_mix_matches_an_independent_evaluation(backend, config):
    """pre = sigmoid((x_flat · fn[h]) / rms(x_flat) · scale + base) + hc_eps, within 1e-6 of an FP64 evaluation,
    a row at the RMS epsilon's scale included. Spec: §8."""
    g = torch.Generator().manual_seed(1)
    t, hc, d = 8, config.hc_mult, config.hidden_size
    x = torch.randn(t, hc, d, generator=g)
    x[5] *= 1e-3  # a row whose mean square (1e-6) is the RMS epsilon's size
    fn, scale, base = torch.randn(hc, hc * d, generator=g) * 0.1, torch.tensor([0.7]), torch.randn(hc, generator=g)
    pre = op(backend, "v4_head_mix")(x, fn, scale, base, config=config)
    flat = x.reshape(t, -1).double()
    logit = (flat @ fn.double().T) / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps)
    want = torch.sigmoid(logit * 0.7 + base.double()) + config.hc_eps
    assert pre.dtype == torch.float32 and pre.shape == (t, hc)
    err = float((pre.double() - want).abs().max())
    assert err <= 1e-6, f"head mix off by {err:.3g}"


@pytest.mark.operators("v4_head_mix")
def test_the_head_mix_keeps_hc_eps(backend):
    """A base of -100 drives the sigmoid to 0: that weight is then exactly hc_eps (1e-6), not 0; a base of 0
    gives 0.5 + hc_eps, which separates adding the eps from flooring at it. Spec: §8."""
    config = MODELS[0]
    hc, d = config.hc_mult, config.hidden_size
    x = torch.randn(4, hc, d, generator=torch.Generator().manual_seed(2))
    from contracts.separation import separates

    base = torch.full((hc,), -100.0)
    base[1] = 0.0  # sigmoid 0.5: an eps added moves it, an eps floor does not
    want = separates("sigmoid(mix) + hc_eps", torch.sigmoid(base) + config.hc_eps, no_eps=torch.sigmoid(base),
                     eps_inside_the_sigmoid=torch.sigmoid(base + config.hc_eps),
                     eps_as_a_floor=torch.sigmoid(base).clamp_min(config.hc_eps))
    pre = op(backend, "v4_head_mix")(x, torch.zeros(hc, hc * d), torch.tensor([1.0]), base, config=config)
    assert bool((pre == want).all()), f"{pre.tolist()}: expected sigmoid(base) + hc_eps per stream, {want.tolist()}"
    assert bool((pre[:, 0] == torch.tensor(config.hc_eps, dtype=torch.float32)).all()), pre.tolist()


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("hc_head_fused", "v4_head_mix", "hc_head")
def test_the_fused_head_is_the_head_mix_then_hc_head(backend, config):
    """The final collapse in one call (``hc_head_fused``: upstream's hc_head.py golden and entry, so hc_head is judged
    on upstream on its own) equals v4_head_mix then hc_head within HC-08: on a real head function and base, and on
    streams of 1e4 whose base of -100 drives every sigmoid to 0, so each weight is hc_eps alone -- there the collapse
    with the eps is separated from one without it, and from a mix whose logits are not normalised by the streams'
    RMS. Spec: §8, HC-02, HC-08."""
    from contracts.separation import separates_under
    from contracts.tolerances import HC_OUT_TOL
    from kernels.reference.mhc import hc_head

    hc, d = config.hc_mult, config.hidden_size
    g = torch.Generator().manual_seed(5)
    fn = torch.randn(hc, hc * d, generator=g) / (hc * d) ** 0.5

    def judge(a, b):
        atol, rtol = HC_OUT_TOL
        return bool(((a.float() - b.float()).abs() <= atol + rtol * b.float().abs()).all())

    for case in ("mixing", "eps only"):
        x = torch.randn(4, hc, d, generator=g) * (1e4 if case == "eps only" else 1.0)
        base = torch.full((hc,), -100.0) if case == "eps only" else torch.randn(hc, generator=g)
        args = (x, fn, torch.tensor([1.0]), base)
        got = op(backend, "hc_head_fused")(*args, config=config)["y"]
        want = op(backend, "hc_head")(x, op(backend, "v4_head_mix")(*args, config=config))
        if case == "eps only":
            flat = x.reshape(4, hc * d)
            logits = flat @ fn.T
            inverse_rms = torch.rsqrt(flat.square().mean(-1, keepdim=True) + config.rms_norm_eps)
            separates_under("the head mix with hc_eps, over the RMS-normalised streams", judge, want,
                            no_eps=hc_head(x, torch.sigmoid(logits * inverse_rms + base)),
                            not_rms_normalised=hc_head(x, torch.sigmoid(logits + base) + config.hc_eps))
        bad = ((got.float() - want.float()).abs() > HC_OUT_TOL[0] + HC_OUT_TOL[1] * want.float().abs()).nonzero()
        assert not bad.numel(), f"hc_head_fused y{bad[0].tolist()} = {float(got[tuple(bad[0])])}, expected " \
                                f"{float(want[tuple(bad[0])])} ({case}): not v4_head_mix then hc_head within HC-08 (§8)"


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_head_fused", "mtp_projection", "v4_attention_stage",
                        "v4_moe_stage", "v4_mtp_layer")
def test_the_mtp_layer_is_its_stages_in_order(backend, config):
    """hidden_out = final_norm(hc_head(x, v4_head_mix(x)), mtp_norm_w) with x the MoE stage's streams after the SWA
    attention stage after mtp_projection -- chained here from the backend's own operators, bit for bit -- and the
    next step receives x itself (FP32), the MoE stage routing by score (layer num_hidden_layers). Spec: §8."""
    i = mtp_layer_inputs(config)
    out = _layer(backend, config, i)
    x = op(backend, "mtp_projection")(i["hidden"], i["prev"], **i["projection"], config=config)
    att = op(backend, "v4_attention_stage")("SWA", x, **i["attention"], config=config)
    moe = op(backend, "v4_moe_stage")(att["x_out"], **i["moe"], layer_id=config.num_hidden_layers, config=config)
    _assert_the_chain(backend, config, i, out, att, moe, "")


@pytest.mark.operators("v4_mtp_layer")
def test_a_missing_head_weight_is_named(backend):
    config = MODELS[0]
    i = mtp_layer_inputs(config, 3)
    del i["head"]["norm_w"]
    with pytest.raises(ContractInputError, match="norm_w"):
        _layer(backend, config, i)


@pytest.mark.operators("v4_mtp_layer")
def test_a_decode_row_moves_only_its_own_outputs_and_cache_row(backend):
    """The decode MTP layer is row-local: changing the last row's hidden and prev (its request's newest token, in
    no other row's window) moves that row's hidden_out and next_pre_hc_hidden and its own cache row -- they do
    move -- and no other byte of any output. Spec: §8."""
    config = MODELS[0]
    i = mtp_layer_inputs(config, 5)
    last = i["hidden"].shape[0] - 1
    slot = int(i["attention"]["swa_slot_mapping"][last])
    assert not bool((i["attention"]["window_indices"][:last] == slot).any()), "the vector's last row is read by another"
    ref = _layer(backend, config, i)
    j = mtp_layer_inputs(config, 5)
    j["hidden"][last] = -j["hidden"][last]
    j["prev"][last] = j["prev"][last] * 2
    out = _layer(backend, config, j)
    flat = ref["kv_cache"].shape[-1]  # cache rows of the window pool, [blocks · block_size, head_dim]
    for key in ("hidden_out", "next_pre_hc_hidden"):
        moved = (out[key] != ref[key]).reshape(out[key].shape[0], -1).any(1)
        assert moved.tolist() == [False] * last + [True], f"{key}: rows moved {moved.nonzero().flatten().tolist()}"
    rows = (out["kv_cache"].view(torch.int16) != ref["kv_cache"].view(torch.int16)).reshape(-1, flat).any(1)
    assert rows.nonzero().flatten().tolist() == [slot], f"cache rows moved {rows.nonzero().flatten().tolist()}, " \
                                                         f"the last row's slot is {slot}"


@pytest.mark.operators("v4_head_mix")
def test_the_head_mix_names_a_bad_stream_or_weight(backend):
    config = MODELS[0]
    i = mtp_layer_inputs(config, 3)
    with pytest.raises(ContractInputError, match="x_hc"):
        op(backend, "v4_head_mix")(i["prev"][:, :-1], i["head"]["fn"], i["head"]["scale"], i["head"]["base"],
                                   config=config)
    with pytest.raises(ContractInputError, match="head fn/scale/base"):
        op(backend, "v4_head_mix")(i["prev"], i["head"]["fn"][:, :-1], i["head"]["scale"], i["head"]["base"],
                                   config=config)


@pytest.mark.whole_backend("a stage against its own parts, bit for bit", inputs=("v4_prefill_swa_indices",))
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("final_norm", "hc_head_fused", "mtp_projection", "v4_attention_stage",
                        "v4_moe_stage", "v4_prefill_mtp_layer", "v4_prefill_swa_indices")
def test_the_prefill_mtp_layer_is_its_stages_in_order(backend, config):
    """On one request's prefill chunk (28 of 32 rows real): the window lowered by v4_prefill_swa_indices (the
    reference's on a backend that lowers it inside its prefill stage, as upstream's golden does: integer metadata
    with contracts of its own, fed to the chain), the SWA
    stage in its prefill form rotating with profile 0 of the two-profile tables, the MoE stage with the same
    num_tokens, then the head -- chained here from the backend's own operators, bit for bit; the padding rows of
    hidden_out and next_pre_hc_hidden exactly 0. Spec: §8 (upstream prefill_mtp.py)."""
    i = prefill_mtp_layer_inputs(config)
    n, a = i["num_tokens"], dict(i["attention"])
    out = _prefill_layer(backend, config, i)
    window = op(backend, "v4_prefill_swa_indices")(a["position_ids"], a.pop("block_table"), n, config=config)
    a.update(freqs_cos=a["freqs_cos"][0], freqs_sin=a["freqs_sin"][0], window_indices=window)
    x = op(backend, "mtp_projection")(i["hidden"], i["prev"], **i["projection"], config=config)
    att = op(backend, "v4_attention_stage")("SWA", x, **a, num_tokens=n, config=config)
    moe = op(backend, "v4_moe_stage")(att["x_out"], **i["moe"], num_tokens=n, layer_id=config.num_hidden_layers,
                                      config=config)
    _assert_the_chain(backend, config, i, out, att, moe, "the prefill ")
    assert not bool(out["hidden_out"][n:].any()) and not bool(out["next_pre_hc_hidden"][n:].any()), \
        "padding rows are not 0"


@pytest.mark.operators("v4_prefill_mtp_layer")
def test_a_prefill_chunk_of_padding_and_a_chunk_without_padding(backend):
    """num_tokens = 0: both outputs 0 and the cache untouched; num_tokens = T is accepted (every row real, no
    padding row 0). Spec: §8."""
    config = MODELS[0]
    i = prefill_mtp_layer_inputs(config, 6)
    none = _prefill_layer(backend, config, {**i, "num_tokens": 0})
    assert not bool(none["hidden_out"].any()) and not bool(none["next_pre_hc_hidden"].any())
    assert torch.equal(none["kv_cache"].view(torch.int16), i["attention"]["kv_cache"].view(torch.int16))
    i["attention"]["swa_slot_mapping"][28:] = -1
    every = _prefill_layer(backend, config, {**i, "num_tokens": 32})
    assert bool(every["hidden_out"][28:].abs().sum(-1).gt(0).all()), "a real row's hidden_out is 0"


@pytest.mark.operators("v4_prefill_mtp_layer")
def test_prefill_padding_rows_leave_no_trace(backend):
    """Whatever the padding rows carry (hidden, prev, positions, token ids, a slot of a real row), no output byte
    moves: the real rows, the cache and the zero tail are the same. Spec: §8."""
    config = MODELS[0]
    i = prefill_mtp_layer_inputs(config, 4)
    n = i["num_tokens"]
    ref = _prefill_layer(backend, config, i)
    j = prefill_mtp_layer_inputs(config, 4)
    j["hidden"][n:] = 7.0
    j["prev"][n:] = -3.0
    j["attention"]["position_ids"][n:] = 0
    j["attention"]["swa_slot_mapping"][n:] = j["attention"]["swa_slot_mapping"][n - 1]
    j["moe"]["input_ids"][n:] = 1
    out = _prefill_layer(backend, config, j)
    for key in ("hidden_out", "next_pre_hc_hidden", "kv_cache"):
        assert torch.equal(out[key], ref[key]), f"{key} moved with the padding rows' contents"


@pytest.mark.operators("v4_prefill_mtp_layer")
def test_prefill_mtp_inputs_are_refused_naming_the_field(backend):
    config = MODELS[0]
    i = prefill_mtp_layer_inputs(config, 5)
    bad = {**i, "attention": {**i["attention"], "freqs_cos": i["attention"]["freqs_cos"][0]}}
    with pytest.raises(ContractInputError, match="freqs_cos"):
        _prefill_layer(backend, config, bad)
    bad = {**i, "attention": {k: v for k, v in i["attention"].items() if k != "block_table"}}
    with pytest.raises(ContractInputError, match="block_table"):
        _prefill_layer(backend, config, bad)
    def untouched(*a, **k):
        raise AssertionError("an operator ran before num_tokens was checked")

    guarded = backend.derive("guarded", **{n: untouched for n in ("mtp_projection", "v4_prefill_swa_indices",
                                                                   "v4_attention_stage", "v4_moe_stage")})
    for bad in (33, -1, True):  # refused by the layer itself, before any stage runs
        with pytest.raises(ContractInputError, match=r"num_tokens.*\[0, 32\]"):
            _prefill_layer(guarded, config, {**i, "num_tokens": bad})
    for name in ("freqs_cos", "freqs_sin"):
        three = torch.cat((i["attention"][name], i["attention"][name][:1]))  # [3, positions, rope]
        with pytest.raises(ContractInputError, match=name):
            _prefill_layer(backend, config, {**i, "attention": {**i["attention"], name: three}})
    with pytest.raises(ContractInputError, match="norm_w"):
        _prefill_layer(backend, config, {**i, "head": {k: v for k, v in i["head"].items() if k != "norm_w"}})


def test_the_prefill_mtp_checks_fail_just_outside_each_clause():
    """check_ratio_reldiff (upstream's ratio_reldiff, the prefill MTP tree's comparators v4_prefill_mtp_out and,
    on the written rows, v4_kv_pool): an absolute difference just under diff_thd never counts; at or over it an
    element counts once d / max(|a|, |e|) passes diff_thd (10.2 vs 10 does not, 10.21 does); the quota counts 5
    of 100 such elements in and 6 out; the floor 2^-14 / diff_thd caps the worst ratio against max_diff; NaN in
    either side fails; a padding row must be exactly 0 while its reldiff is not judged. Spec: §8."""
    from contracts.checks.precision import check_owned_rows, check_ratio_reldiff

    def judge(a, e, **kw):
        kw = {"diff_thd": 0.02, "pct_thd": 0.05, **kw}
        return check_ratio_reldiff(torch.tensor(a, dtype=torch.float32), torch.tensor(e, dtype=torch.float32),
                                   **kw).ok

    assert judge([0.0199] * 10, [0.0] * 10), "an absolute difference under diff_thd counted"
    assert not judge([0.0201] * 10, [0.0] * 10), "an absolute difference over diff_thd with |a| small passed"
    assert judge([10.2] * 10, [10.0] * 10) and not judge([10.21] * 10, [10.0] * 10), "the relative clause"
    assert judge([10.201], [10.0]) and judge([10.0], [10.201]), "the denominator is the larger of |a| and |e|"
    assert not judge([0.25], [0.0], diff_thd=0.25, pct_thd=0.0), "a difference of exactly diff_thd is relative"
    base = [10.0] * 100
    assert judge([10.21] * 5 + [10.0] * 95, base) and not judge([10.21] * 6 + [10.0] * 94, base), "the 5 % quota"
    # floor 2^-14 / 0.01 = 0.0061 > max(|a|, |e|) = 0.0051: worst r = 0.0102 / 0.0061 = 1.67, not 0.0102 / 0.0051 = 2
    assert judge([0.0051], [-0.0051], diff_thd=0.01, pct_thd=1.0, max_diff=1.7), "the floor"
    assert not judge([0.0051], [-0.0051], diff_thd=0.01, pct_thd=1.0, max_diff=1.65), "the max_diff cap"
    a32, e32 = (float(torch.tensor(v, dtype=torch.float32)) for v in (0.0051, -0.0051))
    exact = abs(a32 - e32) / (2.0**-14 / 0.01 + 1e-9)  # the worst ratio itself: the cap is exclusive
    assert not judge([0.0051], [-0.0051], diff_thd=0.01, pct_thd=1.0, max_diff=exact), "r == max_diff passed"
    assert not judge([float("nan")] + [1.0] * 99, [1.0] * 100) and not judge([1.0] * 100, [float("nan")] + [1.0] * 99)
    rows = torch.ones(4, 8)
    tail = rows.clone()
    tail[3] = 5.0  # a padding row far off: not judged by reldiff, but not 0
    assert check_ratio_reldiff(torch.cat((rows[:3], torch.zeros(1, 8))), tail, diff_thd=0.02, pct_thd=0.05,
                               valid_rows=3, zero_tail=True).ok
    assert not check_ratio_reldiff(torch.cat((rows[:3], torch.full((1, 8), 1e-30))), tail, diff_thd=0.02,
                                   pct_thd=0.05, valid_rows=3, zero_tail=True).ok, "a nonzero padding row passed"
    before = torch.zeros(6, 8, dtype=torch.bfloat16)
    want = before.clone()
    want[1] = 1.0

    def leaf(x, y, *, name):
        return check_ratio_reldiff(x, y, diff_thd=0.01, pct_thd=0.05, name=name)

    got = want.clone()
    got[4, 0] = torch.finfo(torch.bfloat16).tiny  # a row the reference left alone, moved by one subnormal
    assert check_owned_rows(want.clone(), want, before, leaf=leaf).ok
    assert not check_owned_rows(got, want, before, leaf=leaf).ok, "an unwritten row moved and passed"


# defects of tests/defects these contracts must catch (shared with other contract files)
def _fused_head_without_eps(x_hc, fn, scale, base, *, config, ops=None):
    """The fused head whose mix leaves hc_eps out."""
    from dataclasses import replace

    from kernels.v4.mtp_layer import hc_head_fused

    return hc_head_fused(x_hc, fn, scale, base, config=replace(config, hc_eps=0.0))


SEEDED_DEFECTS = [
    shared("v4:HEAD_MIX_NO_EPS", "test_the_head_mix_keeps_hc_eps", "assert"),
    shared("v4:MTP_NEXT_FROM_ATTENTION", "test_the_mtp_layer_is_its_stages_in_order", "does not receive the MoE stage's streams"),
    shared("v4:MTP_HEAD_UNNORMED", "test_the_mtp_layer_is_its_stages_in_order", "not the stages in order"),
    shared("v4:MTP_HEAD_MIX_OVER_BATCH", "test_a_decode_row_moves_only_its_own_outputs_and_cache_row", "hidden_out: rows moved"),
    shared("v4:PREFILL_MTP_COMPRESSED_PROFILE", "test_the_prefill_mtp_layer_is_its_stages_in_order", "prefill hidden_out is not the stages in order"),
    shared("v4:PREFILL_MTP_ALL_ROWS_REAL", "test_prefill_padding_rows_leave_no_trace", "moved with the padding rows"),
    SeededDefect("mtp:FUSED_HEAD_NO_EPS", "hc_head_fused", _fused_head_without_eps,
                 "test_the_fused_head_is_the_head_mix_then_hc_head", "eps only"),
]
