"""Teacher-forced mHC comparators (upstream_checks HC-09, HC-10): a stage judged against the reference re-run
on the device's own inputs. Each is shown to pass a device whose upstream stage drifted (where judging against
the reference chain would fail it, computed here), and each clause to fail alone just outside its bound.
Spec: contracts/checks/teacher.py."""

from __future__ import annotations

import pytest
import torch

from contracts.checks.teacher import check_hc_mixes_forced, check_hc_post_forced
from contracts.tolerances import MIX_ROW_TOL, POST_REL_L2
from kernels.config import FLASH_TINY
from kernels.reference import mhc

C = FLASH_TINY


def _weights(seed: int = 0, tokens: int = 4):
    g = torch.Generator().manual_seed(seed)
    hc, d = C.hc_mult, C.hidden_size
    mix = (2 + hc) * hc
    x = torch.randn(tokens, hc, d, generator=g)
    function = torch.randn(mix, hc * d, generator=g) * (hc * d) ** -0.5
    scale = torch.tensor([0.5, 0.5, 0.5])
    base = torch.randn(mix, generator=g) * 0.1
    return x, function, scale, base


@pytest.mark.operators("hc_mixes")
def test_the_mixes_are_judged_on_the_devices_own_residual_stream():
    """The device's residual stream drifted 5 % from the reference chain's (an upstream stage's error): its
    mixes, exact on that stream, pass; the same mixes judged against the reference chain's stream fail the
    5e-3 row bound (computed), which is what teacher forcing takes out of this stage's verdict."""
    x, function, scale, base = _weights()
    drifted = x * 1.05 + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    device = mhc.hc_mixes(drifted, function, scale, base, config=C)
    r = check_hc_mixes_forced(drifted, [device, device], function, scale, base, config=C)
    assert r.ok, r.message()
    chain = mhc.hc_mixes(x, function, scale, base, config=C)
    plain = max(float((getattr(device, n) - getattr(chain, n)).abs().max()) for n in ("pre", "post", "residual"))
    assert plain > MIX_ROW_TOL, f"the drift moves the mixes by only {plain}: the input does not separate"


@pytest.mark.operators("hc_mixes")
def test_each_mixes_clause_fails_alone():
    """One residual coefficient of token row 2 off by 0.9 x the bound passes, by 1.1 x fails naming row 2; a
    second replica one ULP off in one pre coefficient fails naming the replica (replica 0 is exact)."""
    x, function, scale, base = _weights(1)
    exact = mhc.hc_mixes(x, function, scale, base, config=C)
    for factor, ok in ((0.9, True), (1.1, False)):
        off = mhc.Mixes(exact.pre.clone(), exact.post.clone(), exact.residual.clone())
        off.residual[2, 1, 0] += factor * MIX_ROW_TOL
        r = check_hc_mixes_forced(x, [off], function, scale, base, config=C)
        assert r.ok is ok, r.message()
        if not ok:
            assert "residual[2]" in r.message(), r.message()
    replica = mhc.Mixes(exact.pre.clone(), exact.post, exact.residual)
    replica.pre[0, 0] = torch.nextafter(replica.pre[0, 0], torch.tensor(2.0))
    r = check_hc_mixes_forced(x, [exact, replica], function, scale, base, config=C)
    assert not r.ok and "replica 1 pre" in r.message(), r.message()


@pytest.mark.operators("hc_mixes", "hc_post")
def test_hc_post_is_judged_on_the_devices_own_sublayer_output():
    """The device's attention output is 20 % off the reference chain's: its expanded stream, exact for that
    sublayer output, passes; judged against the chain's own hc_post it is far past 1 % (computed)."""
    x, function, scale, base = _weights(2)
    mixes = mhc.hc_mixes(x, function, scale, base, config=C)
    g = torch.Generator().manual_seed(4)
    sublayer = torch.randn(x.shape[0], x.shape[2], generator=g).to(torch.bfloat16)
    device_sublayer = (sublayer.float() * 1.2).to(torch.bfloat16)
    device_out = mhc.hc_post(device_sublayer, x, mixes.post, mixes.residual)
    r = check_hc_post_forced(device_out, device_sublayer, x, mixes.post, mixes.residual)
    assert r.ok, r.message()
    chain = mhc.hc_post(sublayer, x, mixes.post, mixes.residual)
    plain = float((device_out - chain).double().norm() / chain.double().norm())
    assert plain > POST_REL_L2, f"the sublayer drift moves the stream by only {plain}: the input does not separate"


@pytest.mark.operators("hc_mixes", "hc_post")
def test_the_hc_post_budget_fails_just_outside_it():
    """A uniform relative error of 0.9 % of the stream passes; 1.1 % fails, naming the bound; a NaN fails."""
    x, function, scale, base = _weights(3)
    mixes = mhc.hc_mixes(x, function, scale, base, config=C)
    sublayer = torch.randn(x.shape[0], x.shape[2], generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    exact = mhc.hc_post(sublayer, x, mixes.post, mixes.residual)
    for factor, ok in ((0.9, True), (1.1, False)):
        r = check_hc_post_forced(exact * (1 + factor * POST_REL_L2), sublayer, x, mixes.post, mixes.residual)
        assert r.ok is ok, r.message()
    assert "relative L2" in r.message()
    broken = exact.clone()
    broken[1, 0, 3] = float("nan")
    r = check_hc_post_forced(broken, sublayer, x, mixes.post, mixes.residual)
    assert not r.ok and "x_hc_out[1][0][3]" in r.message(), r.message()


@pytest.mark.operators("hc_mixes")
def test_the_mixes_structure_clauses_fail_alone():
    """No replica at all fails (nothing ran is a failure); a replica whose post mix lost its last column fails on
    the layout, naming it; a NaN residual coefficient fails as non-finite (the row bound, NaN > tol being
    False, would pass it). Each on mixes that are otherwise the exact ones."""
    x, function, scale, base = _weights(6)
    exact = mhc.hc_mixes(x, function, scale, base, config=C)
    r = check_hc_mixes_forced(x, [], function, scale, base, config=C)
    assert not r.ok and "no replica" in r.message(), r.message()
    short = mhc.Mixes(exact.pre, exact.post[:, :-1], exact.residual)
    r = check_hc_mixes_forced(x, [short], function, scale, base, config=C)
    assert not r.ok and "post.layout" in r.message(), r.message()
    nan = mhc.Mixes(exact.pre, exact.post, exact.residual.clone())
    nan.residual[1, 0, 0] = float("nan")
    r = check_hc_mixes_forced(x, [nan], function, scale, base, config=C)
    assert not r.ok and "residual[1]" in r.message() and "non-finite" in r.message(), r.message()


@pytest.mark.operators("hc_mixes", "hc_post")
def test_an_expanded_stream_of_the_wrong_layout_fails_on_it():
    """The device's stream with one stream fewer than hc_mult fails on x_hc_out.layout, before any bound."""
    x, function, scale, base = _weights(7)
    mixes = mhc.hc_mixes(x, function, scale, base, config=C)
    sublayer = torch.randn(x.shape[0], x.shape[2], generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    exact = mhc.hc_post(sublayer, x, mixes.post, mixes.residual)
    assert check_hc_post_forced(exact, sublayer, x, mixes.post, mixes.residual).ok
    r = check_hc_post_forced(exact[:, :-1], sublayer, x, mixes.post, mixes.residual)
    assert not r.ok and "x_hc_out.layout" in r.message(), r.message()


def _gathered_case():
    from contracts.half_layer_inputs import HalfLayerCase, build
    from kernels.config import LayerKind

    case = HalfLayerCase(LayerKind.C1A_FULL, "decode", "sharded", 2)
    return case, build(case)


@pytest.mark.operators("attention_half_layer")
def test_a_sharded_selection_is_judged_by_the_scores_of_the_devices_own_gather():
    """IX-13. A sharded C1A FULL call whose device gathered token 0's row negated (a mis-mapped gather, which the
    gather's own clause fails) and selected exactly the Top-K of what it gathered: through the replay comparator
    (contracts.compare.half_layer) its Top-K verdict passes, because the cutoff rule rebuilds the scores from the
    device's gather. The same selection judged by the reference's scores (the stored slabs) fails: computed here,
    so rebuilding from the stored inputs instead is caught."""
    from contracts.checks.attention import judge_half_layer
    from contracts.checks.teacher import forced_index_input
    from contracts.compare import Context, half_layer
    from kernels.reference.attention_layer import attention_half_layer, with_reference_scores

    case, inputs = _gathered_case()
    call = dict(kind=case.kind, phase=case.phase, wiring=case.wiring, tp=case.tp, config=case.config)
    expected, ref_scores = with_reference_scores(inputs, **call)
    device_gather = expected["gathered"].clone()
    device_gather[0] = -device_gather[0]
    forced = forced_index_input(inputs, {"gathered": device_gather}, wiring="sharded", tp=case.tp)
    assert not torch.equal(forced["x"], inputs["x"])
    device = attention_half_layer(forced, **call)
    assert not torch.equal(device["topk_indices"], expected["topk_indices"]), "the gather moves no selection"
    ctx = Context(inputs, device, expected, {"kind": case.kind.value, "phase": case.phase, "tp": case.tp,
                                             "preset": "flash-tiny"}, wiring="sharded")
    r = half_layer("topk_indices", device["topk_indices"], expected["topk_indices"], ctx)
    assert r.ok, r.message()
    plain = judge_half_layer(device, expected, inputs, kind=case.kind, phase=case.phase, wiring="sharded",
                             tp=case.tp, block_size=case.config.block_size, scores=ref_scores, only="topk_indices")
    assert not plain.ok and "cutoff swap" in plain.message(), plain.message()
    r = half_layer("gathered", device["gathered"], expected["gathered"], ctx)
    assert not r.ok, "the mis-mapped gather passed its own clause"


@pytest.mark.operators("attention_half_layer", "hc_mixes", "hc_post")
def test_the_stage_is_judged_on_the_devices_own_input_and_reports_the_chain():
    """AP-12 on a decode Block (C1A FULL): the backend's attention input drifted 3 % from the reference collapse
    (an mHC stage's error, which bf16_stage judges) and its attention is exact on that input: the
    ``attention_forced`` comparator passes its attention_hidden. Judged against the chain's expected output by the
    same FP8 budget it fails (computed): that is the error teacher forcing keeps out of the attention's verdict.
    The same output 25 % off the forced reference fails, and the cause reports the end-to-end difference."""
    from contracts.compare import Context, attention_forced, fp8_budget
    from goldens.cases import get_case
    from kernels.reference.attention_layer import attention_half_layer
    from kernels.reference.mhc import hc_mixes, hc_post

    case = get_case("block_c1a_full")
    inputs = case.build_inputs(0, "replicated")
    expected = case.reference(inputs, "replicated")
    g = torch.Generator().manual_seed(3)
    drifted = (expected["attention_input"].float() * 1.03 + 0.03 * torch.randn(
        expected["attention_input"].shape, generator=g)).to(torch.bfloat16)
    p = case.params
    attn = hc_mixes(inputs["x_hc"], inputs["attn_function"], inputs["attn_scale"], inputs["attn_base"], config=C)
    out = attention_half_layer({**inputs, "x": drifted}, kind=p["kind"], phase="decode", wiring="replicated",
                               tp=p["tp"], config=C)
    hidden = hc_post(out["output"][0], inputs["x_hc"], attn.post, attn.residual)
    actual = {**expected, "attention_input": drifted, "attention_hidden": hidden}
    ctx = Context(inputs, actual, expected, p)
    r = attention_forced("attention_hidden", hidden, expected["attention_hidden"], ctx)
    assert r.ok, r.message()
    plain = fp8_budget("attention_hidden", hidden, expected["attention_hidden"], ctx)
    assert not plain.ok, "the drift does not move the attention past its budget: the input does not separate"
    off = hidden + 0.25 * (hidden - hc_post(torch.zeros_like(out["output"][0]), inputs["x_hc"], attn.post,
                                            attn.residual))
    r = attention_forced("attention_hidden", off, expected["attention_hidden"], ctx)
    assert not r.ok and "end-to-end relative L2" in r.message() and "not gated" in r.message(), r.message()
