"""V4's MoE experts and combine (``v4_expert``, ``v4_moe``; upstream expert_routed.py / expert_shared.py, the
INT8 W8A8 experts, and moe.py's combine), on V4-Pro and V4-Flash (tiny twins).

An expert row is judged against an FP64 evaluation written here with upstream's MoE row bound (ratio_reldiff
3e-3 with a 2 % quota, worst |Δ| 0.25: ``check_moe_rows``); the SwiGLU limits on inputs that cross them; the
combine bit for bit against the backend's own expert rows (one FP32 sum, shared first, routes in order, one
BF16 rounding); padding rows exactly 0.

Spec: §8; docs/coverage.md, V4 section (V4-15).
"""

from __future__ import annotations

import pytest
import torch

from contracts.checks.moe import check_moe_rows
from contracts.v4_inputs import int8_rows, moe_inputs, v4_expert_weights
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from kernels.v4.moe import V4ExpertWeights
from pto_pytest.defect import SeededDefect, shared
from pto_pytest.plugin import op

MODELS = [V4_PRO_TINY.kernel_preset(), V4_FLASH_TINY.kernel_preset()]
T = 8


def _independent(config, x_i8, x_scale, weight, ew):
    """FP64, written apart: dequantized operands, gate / up clamped at ±limit (gate above only), SiLU · up, the
    hidden row re-coded to INT8 (127 / amax, 1e-4 floor), the routing weight on the row factor, w2, one BF16
    rounding."""
    lim = config.swiglu_limit
    x = x_i8.double() * x_scale.double()
    gate = (x @ (ew.w1.double() * ew.w1_scale.double()[:, None]).T).clamp(max=lim)
    up = (x @ (ew.w3.double() * ew.w3_scale.double()[:, None]).T).clamp(-lim, lim)
    h = gate * torch.sigmoid(gate) * up
    amax = h.abs().amax(1, keepdim=True).clamp_min(1e-4)
    hq = torch.round(h * 127 / amax) * amax / 127
    if weight is not None:
        hq = hq * weight.double()[:, None]
    return (hq @ (ew.w2.double() * ew.w2_scale.double()[:, None]).T).to(torch.bfloat16)


@pytest.mark.parametrize("routed", [True, False], ids=["routed", "shared"])
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("v4_expert")
def test_an_expert_row_matches_an_independent_evaluation(backend, config, routed):
    """A routed expert (weights in (0.1, 1)) and the shared one (no weight) on V4-Pro and V4-Flash tiny: y [8, D]
    BF16 within upstream's MoE row bound of the FP64 evaluation written here. Spec: §8."""
    g = torch.Generator().manual_seed(1)
    ew = v4_expert_weights(config, g)
    x_i8, x_scale = int8_rows(config, g)
    weight = torch.rand(T, generator=g) * 0.9 + 0.1 if routed else None
    y = op(backend, "v4_expert")(x_i8, x_scale, weight, ew, config=config)
    assert y.dtype == torch.bfloat16 and y.shape == (T, config.hidden_size)
    r = check_moe_rows(y, _independent(config, x_i8, x_scale, weight, ew), T, name="y")
    assert r.ok, r.message()


@pytest.mark.operators("v4_expert")
def test_the_swiglu_limits_clamp_gate_above_and_up_on_both_sides(backend):
    """Scales that push gate and up far past ±10 (swiglu_limit): gate is cut at +10 only, up at -10 and +10; the
    rows match the evaluation with exactly those cuts (a port that leaves up's negative side open, or cuts gate
    from below, does not). Spec: §8."""
    config = MODELS[0]
    g = torch.Generator().manual_seed(2)
    ew = v4_expert_weights(config, g, scale=0.5)
    x_i8, x_scale = int8_rows(config, g)
    x_scale = x_scale * 20
    lim = config.swiglu_limit
    x = x_i8.double() * x_scale.double()
    up = x @ (ew.w3.double() * ew.w3_scale.double()[:, None]).T
    gate = x @ (ew.w1.double() * ew.w1_scale.double()[:, None]).T
    assert bool((up < -lim).any()) and bool((up > lim).any()) and bool((gate < -lim).any()), \
        "the case does not cross the limits"
    y = op(backend, "v4_expert")(x_i8, x_scale, None, ew, config=config)
    r = check_moe_rows(y, _independent(config, x_i8, x_scale, None, ew), T, name="y")
    assert r.ok, r.message()


def _moe(backend, config, i, layer_id):
    return op(backend, "v4_moe")(i["x_mixed"], i["norm_w"], i["gate_w"], i["gate_bias"], layer_id, i["num_tokens"],
                                 i["tid2eid"], i["input_ids"], i["routed"], i["shared"], config=config)


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("v4_expert", "v4_gate", "v4_moe")
def test_the_combine_is_one_fp32_sum_rounded_once(backend, config):
    """The MTP layer (score-routed), two padding rows: ffn_out is BF16(FP32(shared) + Σ_k FP32(routed_k)) of the
    backend's own router and expert rows, bit for bit -- no BF16 partial sums -- and the padding rows are 0.
    Spec: §8."""
    i = moe_inputs(config)
    layer = config.num_hidden_layers
    out = _moe(backend, config, i, layer)
    n = i["num_tokens"]
    gt = op(backend, "v4_gate")(i["x_mixed"], i["norm_w"], i["gate_w"], i["gate_bias"], layer, n, i["tid2eid"],
                                i["input_ids"], config=config)
    x_i8, xs = gt["x_norm_i8"][:n], gt["x_norm_scale"][:n]
    acc = op(backend, "v4_expert")(x_i8, xs, None, i["shared"], config=config).float()
    for k in range(config.num_experts_per_tok):
        rows = [op(backend, "v4_expert")(x_i8[t:t + 1], xs[t:t + 1], gt["weights"][t:t + 1, k],
                                         i["routed"][int(gt["indices"][t, k])], config=config) for t in range(n)]
        acc = acc + torch.cat(rows).float()
    assert out["ffn_out"].dtype == torch.bfloat16, f"ffn_out: {out['ffn_out'].dtype}, expected BF16"
    assert torch.equal(out["ffn_out"][:n], acc.to(torch.bfloat16)), "ffn_out is not the FP32 sum rounded once"
    assert bool((out["ffn_out"][n:] == 0).all()), "padding rows are not 0"
    assert torch.equal(out["indices"], gt["indices"]) and torch.equal(out["weights"], gt["weights"])


@pytest.mark.operators("v4_moe")
def test_each_route_reaches_its_own_expert(backend):
    """Zeroing one routed expert's w2 removes exactly the rows routed to it from ffn_out (tokens not routed there
    keep their bytes); on a hash layer, so the routes are tid2eid's. Spec: §8."""
    config = MODELS[0]
    i = moe_inputs(config, 4, num_tokens=T)
    base = _moe(backend, config, i, 0)
    e = int(i["tid2eid"][int(i["input_ids"][0]), 2])
    zeroed = list(i["routed"])
    w = zeroed[e]
    zeroed[e] = V4ExpertWeights(w.w1, w.w1_scale, w.w3, w.w3_scale, torch.zeros_like(w.w2), w.w2_scale)
    out = _moe(backend, config, dict(i, routed=zeroed), 0)
    hit = (i["tid2eid"][i["input_ids"].long()] == e).any(1)
    changed = (out["ffn_out"] != base["ffn_out"]).any(1)
    assert bool(changed[0]) and torch.equal(changed & ~hit, torch.zeros_like(hit)), \
        f"rows changed {changed.tolist()}, rows routed to expert {e}: {hit.tolist()}"


@pytest.mark.operators("v4_expert", "v4_moe")
def test_bad_inputs_name_the_field(backend):
    config = MODELS[0]
    i = moe_inputs(config, 5)
    with pytest.raises(ContractInputError, match="routed"):
        _moe(backend, config, dict(i, routed=i["routed"][:-1]), 0)
    g = torch.Generator().manual_seed(6)
    x_i8, xs = int8_rows(config, g)
    with pytest.raises(ContractInputError, match="x_i8/x_scale"):
        op(backend, "v4_expert")(x_i8.float(), xs, None, i["shared"], config=config)
    w = i["shared"]
    bad = V4ExpertWeights(w.w1, w.w1_scale, w.w3, w.w3_scale, w.w2.float(), w.w2_scale)
    with pytest.raises(ContractInputError, match="w2"):
        op(backend, "v4_expert")(x_i8, xs, None, bad, config=config)


@pytest.mark.operators("v4_expert")
def test_a_zero_row_keeps_the_hidden_amax_floor(backend):
    """A row of zero codes: gate and up are 0, the hidden row is 0 and is re-coded with the 1e-4 amax floor, so y
    is exactly 0 (no NaN from 0 / 0). Spec: §8."""
    config = MODELS[0]
    g = torch.Generator().manual_seed(7)
    ew = v4_expert_weights(config, g)
    x_i8, xs = int8_rows(config, g)
    x_i8[3] = 0
    y = op(backend, "v4_expert")(x_i8, xs, torch.ones(T), ew, config=config)
    assert bool((y[3] == 0).all()), f"zero row: y = {y[3, :4].tolist()}"


@pytest.mark.parametrize("num_tokens", [0, 1])
@pytest.mark.operators("v4_moe")
def test_a_chunk_of_zero_or_one_token(backend, num_tokens):
    """num_tokens 0: ffn_out all 0; num_tokens 1: row 0 is the combine of its routes and every other row is 0.
    Spec: §8."""
    config = MODELS[0]
    i = moe_inputs(config, 8, num_tokens=num_tokens)
    out = _moe(backend, config, i, config.num_hidden_layers)
    assert bool((out["ffn_out"][num_tokens:] == 0).all())
    assert bool((out["ffn_out"][:num_tokens] != 0).any(1).all()), "an active row came back 0"


def _stage_inputs(config, seed=9, num_tokens=6):
    g = torch.Generator().manual_seed(seed)
    hc, dm = config.hc_mult, config.hidden_size
    mix = (2 + hc) * hc
    i = moe_inputs(config, seed, num_tokens=num_tokens)
    del i["x_mixed"]
    return dict(i, x_hc=torch.randn(T, hc, dm, generator=g), hc_fn=torch.randn(mix, hc * dm, generator=g) * 0.05,
                hc_scale=torch.tensor([2.0, 0.02, 0.25]), hc_base=torch.randn(mix, generator=g))


def _stage(backend, config, i, layer_id):
    return op(backend, "v4_moe_stage")(i["x_hc"], i["hc_fn"], i["hc_scale"], i["hc_base"], i["norm_w"], i["gate_w"],
                                       i["gate_bias"], layer_id, i["num_tokens"], i["tid2eid"], i["input_ids"],
                                       i["routed"], i["shared"], config=config)


@pytest.mark.operators("v4_moe_stage")
def test_a_hash_layer_stage_routes_each_row_by_its_token(backend):
    """The MoE stage on a hash layer (layer 0, every row real): zeroing one routed expert's w2 moves exactly the
    rows whose token tid2eid routes to that expert -- they do move -- and no byte of any other row of x_out. So each
    row is routed by its own token id (a row routed by another row's id, or by score, moves others). Spec: §8."""
    config = MODELS[0]
    i = _stage_inputs(config, num_tokens=T)
    base = _stage(backend, config, i, 0)
    e = int(i["tid2eid"][int(i["input_ids"][0]), 2])
    hit = (i["tid2eid"][i["input_ids"].long()] == e).any(1)
    assert bool(hit[0]) and not bool(hit.all()), "the vector routes every row, or not row 0, to the zeroed expert"
    zeroed = list(i["routed"])
    w = zeroed[e]
    zeroed[e] = V4ExpertWeights(w.w1, w.w1_scale, w.w3, w.w3_scale, torch.zeros_like(w.w2), w.w2_scale)
    out = _stage(backend, config, dict(i, routed=zeroed), 0)
    moved = (out["x_out"] != base["x_out"]).reshape(T, -1).any(1)
    assert torch.equal(moved, hit), f"rows moved {moved.nonzero().flatten().tolist()}, rows whose token routes to " \
                                    f"expert {e}: {hit.nonzero().flatten().tolist()} (§8)"


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("hc_post", "hc_pre_fused", "v4_moe", "v4_moe_stage")
def test_the_moe_stage_is_hc_pre_then_the_moe_then_hc_post(backend, config):
    """The MTP layer's MoE stage (two padding rows): x_out equals hc_post(v4_moe(hc_pre(x_hc)), x_hc) with the
    stage's own mixes over every row, chained here from the backend's operators, bit for bit; the collapsed row
    goes to the router unnormalised (v4_gate does the FFN RMSNorm). Spec: §8."""
    i = _stage_inputs(config)
    layer, n = config.num_hidden_layers, i["num_tokens"]
    out = _stage(backend, config, i, layer)
    mixes = op(backend, "hc_pre_fused")(i["x_hc"], i["hc_fn"], i["hc_scale"], i["hc_base"], config=config)
    x = mixes["x_mixed"]  # the mixes and the pre-mixed row in one call, as upstream's hc_pre golden computes them
    moe = op(backend, "v4_moe")(x, i["norm_w"], i["gate_w"], i["gate_bias"], layer, n, i["tid2eid"], i["input_ids"],
                                i["routed"], i["shared"], config=config)
    tokens, hc = mixes["post"].shape
    want = op(backend, "hc_post")(moe["ffn_out"], i["x_hc"], mixes["post"], mixes["comb"].reshape(tokens, hc, hc))
    assert out["x_out"].dtype == torch.float32 and torch.equal(out["x_out"], want), \
        "x_out is not hc_post(v4_moe(hc_pre(x_hc)))"
    assert torch.equal(out["ffn_out"], moe["ffn_out"]) and not bool(out["ffn_out"][n:].any())


def _judge_padding_rows(config, i, out):
    """x_out's padding rows against upstream's rule, computed here in FP64 from the inputs alone: the routed FFN
    is 0 there, so each stream row is Σ_j comb[j, h] · x_hc[j] with comb the Sinkhorn-normalised residual mix of
    that row (``sinkhorn`` on FP64 logits); a 2e-6 relative bound (FP32 against FP64)."""
    from kernels.reference.mhc import sinkhorn

    hc, n = config.hc_mult, i["num_tokens"]
    x = i["x_hc"][n:].double()
    flat = x.reshape(x.shape[0], -1)
    logits = (flat @ i["hc_fn"].double().T) / torch.sqrt(flat.square().mean(-1, keepdim=True) + config.rms_norm_eps)
    res = (logits[:, 2 * hc:] * float(i["hc_scale"][2]) + i["hc_base"].double()[2 * hc:]).reshape(-1, hc, hc)
    comb = sinkhorn(res, iterations=config.hc_sinkhorn_iters, eps=config.hc_eps)
    want = torch.einsum("tjh,tjd->thd", comb, x)
    got = out["x_out"][n:].double()
    err = float(((got - want).abs() / want.abs().amax().clamp_min(1e-30)).max())
    assert err <= 2e-6, f"padding rows {n}..: x_out is not their residual mix (relative error {err:.3g} > 2e-6)"


@pytest.mark.operators("v4_moe_stage")
def test_padding_rows_carry_their_residual_mix(backend):
    """Upstream's MoE stage (moe.py, kernel and golden) mixes and post-mixes every row: a padding row routes
    nowhere (ffn_out 0) but x_out there is its streams' residual mix, hc_post(0, x_hc), not 0 -- upstream's
    comparator checks every row of x_next. Judged from the inputs alone; the former rule (``padding_rows="zero"``,
    kept by name) fails the judge. Spec: §8; docs/upstream.md."""
    config = MODELS[0]
    i = _stage_inputs(config)
    out = _stage(backend, config, i, config.num_hidden_layers)
    n = i["num_tokens"]
    assert bool(out["x_out"][n:].abs().sum((1, 2)).gt(0).all()), "a padding row of x_out is 0"
    _judge_padding_rows(config, i, out)
    from kernels.v4.moe import v4_moe_stage

    zero = v4_moe_stage(i["x_hc"], i["hc_fn"], i["hc_scale"], i["hc_base"], i["norm_w"], i["gate_w"], i["gate_bias"],
                        config.num_hidden_layers, n, i["tid2eid"], i["input_ids"], i["routed"], i["shared"],
                        config=config, padding_rows="zero")
    with pytest.raises(AssertionError, match="residual mix"):
        _judge_padding_rows(config, i, zero)


def _ep_inputs(backend, config, ep, counts, seed=10):
    g = torch.Generator().manual_seed(seed)
    i = moe_inputs(config, seed)
    gates = []
    for r in range(ep):
        x = torch.randn(T, config.hidden_size, generator=g).to(torch.bfloat16)
        gates.append(op(backend, "v4_gate")(x, i["norm_w"], i["gate_w"], i["gate_bias"], config.num_hidden_layers,
                                            counts[r], i["tid2eid"], i["input_ids"], config=config))
    return i, gates


@pytest.mark.parametrize("ep, counts", [(1, [6]), (2, [6, 8]), (4, [8, 0, 5, 8])], ids=["ep1", "ep2", "ep4-idle-rank"])
@pytest.mark.operators("v4_expert", "v4_gate", "v4_moe_ep")
def test_expert_parallel_moe_equals_each_ranks_own_moe(backend, ep, counts):
    """Across EP ranks (uneven token counts, an idle rank at EP4): each rank's ffn_out equals the one-rank MoE of
    its own rows (v4_moe with every expert local), bit for bit -- the transport moves rows and never changes
    them -- and an idle rank's output is 0. Spec: §8."""
    config = MODELS[0]
    i, gates = _ep_inputs(backend, config, ep, counts)
    out = op(backend, "v4_moe_ep")(gates, counts, i["routed"], i["shared"], ep=ep, config=config)
    for r in range(ep):
        n = counts[r]
        want = torch.zeros(T, config.hidden_size, dtype=torch.bfloat16)
        if n:
            g = gates[r]
            acc = op(backend, "v4_expert")(g["x_norm_i8"][:n], g["x_norm_scale"][:n], None, i["shared"],
                                           config=config).float()
            for j in range(config.num_experts_per_tok):
                acc = acc + torch.cat([op(backend, "v4_expert")(
                    g["x_norm_i8"][t:t + 1], g["x_norm_scale"][t:t + 1], g["weights"][t:t + 1, j],
                    i["routed"][int(g["indices"][t, j])], config=config) for t in range(n)]).float()
            want[:n] = acc.to(torch.bfloat16)
        assert out["ffn_out"][r].dtype == torch.bfloat16, f"rank {r}: ffn_out {out['ffn_out'][r].dtype}"
        assert torch.equal(out["ffn_out"][r], want), f"rank {r}: ffn_out differs from its own one-rank MoE"


@pytest.mark.operators("v4_gate", "v4_moe_ep")
def test_each_experts_lanes_are_source_major(backend):
    """EP4: on every rank each local expert's received rows are the INT8 rows routed to it, source rank by source
    rank, tokens in order within a source, routes in order within a token; the counts are the rows sent
    (send_counts summed over sources) and the lanes past them are zero; padding tokens send nothing.
    Spec: §8."""
    config = MODELS[0]
    ep, counts = 4, [8, 3, 6, 8]
    i, gates = _ep_inputs(backend, config, ep, counts, seed=11)
    out = op(backend, "v4_moe_ep")(gates, counts, i["routed"], i["shared"], ep=ep, config=config)
    n_local = config.n_routed_experts // ep
    assert out["send_counts"].dtype == torch.int32 and out["send_counts"].shape == (ep, ep, n_local)
    for dst in range(ep):
        assert out["recv_counts"][dst].dtype == torch.int32 and out["recv_y"][dst].dtype == torch.bfloat16
        assert out["recv_x"][dst].dtype == torch.int8 and out["recv_x"][dst].shape == (n_local, ep * T,
                                                                                      config.hidden_size)
        for loc in range(n_local):
            e = dst * n_local + loc
            want = [gates[s]["x_norm_i8"][t] for s in range(ep) for t in range(counts[s])
                    for j in range(config.num_experts_per_tok) if int(gates[s]["indices"][t, j]) == e]
            n = int(out["recv_counts"][dst][loc])
            assert n == len(want) == int(out["send_counts"][:, dst, loc].sum()), (dst, loc, n, len(want))
            if want:
                assert torch.equal(out["recv_x"][dst][loc, :n], torch.stack(want)), f"rank {dst} expert {loc}: lanes"
            assert bool((out["recv_x"][dst][loc, n:] == 0).all()), f"rank {dst} expert {loc}: a lane past the count"
    assert int(out["send_counts"][1].sum()) == 3 * config.num_experts_per_tok, "padding tokens were dispatched"


@pytest.mark.operators("v4_gate", "v4_moe_ep")
def test_ep_inputs_are_refused_naming_the_field(backend):
    config = MODELS[0]
    i, gates = _ep_inputs(backend, config, 2, [8, 8])
    with pytest.raises(ContractInputError, match="ep"):
        op(backend, "v4_moe_ep")(gates, [8, 8], i["routed"], i["shared"], ep=3, config=config)
    with pytest.raises(ContractInputError, match=r"num_tokens\[1\]"):
        op(backend, "v4_moe_ep")(gates, [8, 9], i["routed"], i["shared"], ep=2, config=config)


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.operators("v4_expert", "v4_moe_ep")
def test_the_ep_combine_sums_shared_then_routed_in_slot_order(backend, config):
    """Through v4_moe_ep at one rank, with a gate given as data: every token routes to experts 0..k-1 in slot
    order with equal weights. Experts 0 and 1 are one expert with W2 scales +2^50 and -2^50 (their outputs are
    exact negatives), expert 2 an ordinary one, the rest the same with W2 scale 0. In slot order the shared
    output is absorbed by slot 0 and slot 1 cancels it, leaving slot 2's output; reversed, slot 2's is absorbed
    and the row is 0. The alternatives are computed from the backend's own v4_expert rows. Spec: §8 (combine)."""
    from dataclasses import replace

    from contracts.separation import running_sum, separates

    g = torch.Generator().manual_seed(31)
    k, n_exp = config.num_experts_per_tok, config.n_routed_experts
    base = v4_expert_weights(config, g)
    big = torch.full_like(base.w2_scale, 2.0**50)
    routed = [replace(base, w2_scale=big), replace(base, w2_scale=-big), v4_expert_weights(config, g)]
    routed += [replace(base, w2_scale=torch.zeros_like(big))] * (n_exp - 3)
    shared = v4_expert_weights(config, g)
    x_i8, xs = int8_rows(config, g, 4)
    gate = {"x_norm_i8": x_i8, "x_norm_scale": xs, "indices": torch.arange(k, dtype=torch.int32).repeat(4, 1),
            "weights": torch.full((4, k), 1.0 / k)}
    s = op(backend, "v4_expert")(x_i8, xs, None, shared, config=config).float()
    r = [op(backend, "v4_expert")(x_i8, xs, gate["weights"][:, j], routed[j], config=config).float()
         for j in range(k)]

    want = separates("V4 combine: shared, then routed in slot order, FP32, one BF16 cast",
                     running_sum(r, s).bfloat16(), reversed_slots=running_sum(r[::-1], s).bfloat16(),
                     routed_before_shared=running_sum([*r[1:], s], r[0]).bfloat16())
    out = op(backend, "v4_moe_ep")([gate], [4], routed, shared, ep=1, config=config)["ffn_out"][0]
    assert torch.equal(out.view(torch.int16), want.view(torch.int16)), \
        f"row 0 {out[0, :4].tolist()}, expected {want[0, :4].tolist()} (slots 0 and 1 cancel, slot 2 remains)"


# defects of tests/defects these contracts must catch (shared with other contract files)
def _ids_of_the_next_row(x_hc, hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid,
                         input_ids, routed, shared, *, config, ops=None, **kw):
    """Wrong: a hash layer routes each row by the next row's token id."""
    from kernels.v4.moe import v4_moe_stage

    return v4_moe_stage(x_hc, hc_fn, hc_scale, hc_base, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid,
                        input_ids.roll(-1), routed, shared, config=config, ops=ops, **kw)


_ids_of_the_next_row.composes_operators = True


SEEDED_DEFECTS = [
    SeededDefect("v4-moe:ids-of-the-next-row", "v4_moe_stage", _ids_of_the_next_row,
                 "test_a_hash_layer_stage_routes_each_row_by_its_token", "rows whose token routes"),
    shared("v4:EXPERT_UP_OPEN_BELOW", "test_the_swiglu_limits_clamp_gate_above_and_up_on_both_sides", "worst"),
    shared("v4:EXPERT_NO_ROUTE_WEIGHT", "test_an_expert_row_matches_an_independent_evaluation", "worst"),
    shared("v4:EXPERT_H_NOT_RECODED", "test_an_expert_row_matches_an_independent_evaluation", "relative"),
    shared("v4:COMBINE_IN_BF16", "test_the_combine_is_one_fp32_sum_rounded_once", "not the FP32 sum rounded once"),
    shared("v4:MOE_STAGE_PRENORMED", "test_the_moe_stage_is_hc_pre_then_the_moe_then_hc_post", "x_out is not hc_post"),
    shared("v4:MOE_STAGE_PADDING_ZERO", "test_padding_rows_carry_their_residual_mix", "padding row of x_out is 0"),
    shared("v4:EP_LANES_TOKEN_MAJOR", "test_each_experts_lanes_are_source_major", "lanes"),
    shared("v4:EP_COMBINE_ROUTE_SHIFTED", "test_expert_parallel_moe_equals_each_ranks_own_moe", "differs from its own one-rank MoE"),
]
