"""The MoE FFN: the router (``moe_gate``), the experts (``moe_expert``) and dispatch/combine across EP ranks
(``moe_ep``). What the router must give (valid, unique ids; weights summing to the scaling factor; a bias
that moves the selection and never the weights; ties to the lower id), what an expert must do (the SwiGLU
clamps, the route weight before the BF16 hidden boundary and the down projection), what EP must keep (one
owner per token row, counts and slots in source order, results independent of the EP size and of token
order, padding rows zero, an FP32 combine with one cast), the token-count rules, and the comparators
shown to fail just outside their bounds.

Spec: §1; upstream_checks MO-01..06, MO-09, MD-32.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import torch_backend
from contracts.checks.moe import check_gate_ids, check_gate_weights, check_moe_rows
from kernels.config import FLASH_TINY
from kernels.errors import ContractInputError
from kernels.reference.moe import ExpertWeights, expert_weights
from pto_pytest.defect import SeededDefect, reference_edit, shared
from pto_pytest.plugin import op

REF = torch_backend()
C = FLASH_TINY
E, K, D, INTER = C.n_routed_experts, C.num_experts_per_tok, C.hidden_size, C.moe_intermediate_size


def _experts(g: torch.Generator, n: int = E) -> list[ExpertWeights]:
    return [ExpertWeights(torch.randn(INTER, D, generator=g) / D**0.5, torch.randn(INTER, D, generator=g) / D**0.5,
                          torch.randn(D, INTER, generator=g) / INTER**0.5) for _ in range(n)]


def _router(g: torch.Generator):
    return torch.randn(E, D, generator=g) / D**0.5, torch.randn(E, generator=g) * 0.1


def _tokens(g: torch.Generator, n: int) -> torch.Tensor:
    return torch.randn(n, D, generator=g).to(torch.bfloat16)


def _biased_scores(x, weight, bias):
    logits = (x.double() @ weight.double().T).float()
    scores = torch.nn.functional.softplus(logits / C.gate_temperature).sqrt()
    return scores, scores + bias


# ------------------------------------------------------------------------------------------------ router


@settings(deadline=None)
@given(seed=st.integers(0, 2**16), tokens=st.integers(1, 12))
@pytest.mark.operators("moe_gate")
def test_the_router_gives_valid_ids_and_weights_that_sum_to_the_scaling_factor(backend, seed, tokens):
    """ids INT32 in [0, E), unique per row; weights FP32, > 0, summing to routed_scaling_factor (1.5) within
    2e-5 and equal to the unbiased scores at those ids; ids and weights match the reference. Spec: MO-01,
    MO-03, MO-04."""
    g = torch.Generator().manual_seed(seed)
    x, (w, b) = _tokens(g, tokens), _router(g)
    weights, ids = op(backend, "moe_gate")(x, w, b, config=C)
    ref_w, ref_ids = REF.get("moe_gate")(x, w, b, config=C)
    scores, biased = _biased_scores(x, w, b)
    r = check_gate_ids(ids, ref_ids, biased, n_experts=E)
    assert r.ok, r.message()
    r = check_gate_weights(weights, ids, scores, scale=C.routed_scaling_factor)
    assert r.ok, r.message()


@pytest.mark.operators("moe_gate")
def test_the_correction_bias_moves_the_selection_and_never_the_weights(backend):
    """A bias of +4 on experts 3 and 11 puts them in every row's selection although their scores are the
    lowest; their weights are still their own (small, unbiased) scores, normalised. Spec: MO-01."""
    g = torch.Generator().manual_seed(5)
    x = _tokens(g, 4)
    w = torch.randn(E, D, generator=g) / D**0.5
    w[3] = w[11] = -x.float().mean(0) * 4  # lowest logits for these rows
    bias = torch.zeros(E)
    bias[3] = bias[11] = 4.0
    weights, ids = op(backend, "moe_gate")(x, w, bias, config=C)
    scores, _ = _biased_scores(x, w, bias)
    for t in range(4):
        row = ids[t].tolist()
        assert 3 in row and 11 in row, f"row {t} selected {row}: the bias must move the selection"
        chosen = scores[t, ids[t].long()].double()
        want = chosen / chosen.sum() * C.routed_scaling_factor
        assert torch.allclose(weights[t].double(), want, atol=1e-6), \
            f"row {t} weights {weights[t].tolist()} != unbiased scores normalised {want.tolist()}"


@pytest.mark.operators("moe_gate")
def test_ties_go_to_the_lower_expert_id_and_the_topk_rule_stays_selectable(backend):
    """Every expert with the same logit and bias: the stable rule selects experts 0..k-1 in id order (the CED
    reference's stable argsort); ``topk`` (the decode golden's torch.topk order) stays selectable by name.
    Spec: MO-01."""
    x = torch.ones(2, D, dtype=torch.bfloat16)
    w, b = torch.zeros(E, D), torch.zeros(E)
    weights, ids = op(backend, "moe_gate")(x, w, b, config=C)
    assert ids.tolist() == [list(range(K))] * 2, f"ties: {ids.tolist()}"
    assert torch.allclose(weights, torch.full((2, K), C.routed_scaling_factor / K))
    moe_gate = op(backend, "moe_gate")
    _w, topk_ids = moe_gate(x, w, b, config=C, rule="topk")
    assert topk_ids.shape == (2, K) and all(len(set(r)) == K for r in topk_ids.tolist())
    with pytest.raises(ContractInputError, match="rule"):
        moe_gate(x, w, b, config=C, rule="sorted")


def test_the_gate_comparators_fail_just_outside_their_bounds():
    """check_gate_ids: a swap of two experts whose biased scores differ by less than the score error passes,
    a hair more fails (and ``strict`` fails any swap); check_gate_weights: a row sum off by 2e-5 (less a
    hair) passes, a hair more fails. Spec: MO-03, MO-04."""
    scores = torch.zeros(1, E, dtype=torch.float64)
    scores[0, :K] = 1.0
    expected = torch.arange(K, dtype=torch.int32).reshape(1, K)
    swapped = expected.clone()
    swapped[0, -1] = K  # expert K instead of expert K-1
    err = 2e-4 + 5e-5 * 1.0
    for gap, ok in ((2 * err * (1 - 1e-3), True), (2 * err * (1 + 1e-3), False)):
        s = scores.clone()
        s[0, K] = 1.0 - gap
        assert check_gate_ids(swapped, expected, s, n_experts=E).ok is ok, gap
    assert not check_gate_ids(swapped, expected, scores, n_experts=E, rule="strict").ok
    assert not check_gate_ids(torch.tensor([[0, 0, 1, 2, 3, 4]], dtype=torch.int32), expected, scores,
                              n_experts=E).ok
    assert not check_gate_ids(torch.tensor([[0, 1, 2, 3, 4, E]], dtype=torch.int32), expected, scores,
                              n_experts=E).ok
    uniform = torch.ones(1, E)
    base = torch.full((1, K), 1.5 / K, dtype=torch.float64)
    for delta, ok in ((2e-5 * (1 - 1e-3), True), (2e-5 * (1 + 1e-3), False)):
        w = base.clone()
        w[0, 0] += delta
        assert check_gate_weights(w.float(), expected, uniform, scale=1.5).ok is ok, delta


# ------------------------------------------------------------------------------------------------ expert


@pytest.mark.operators("moe_expert")
def test_the_swiglu_clamps_gate_above_and_up_on_both_sides(backend):
    """Hand vector, one hidden unit, D = 1 direction: gate = 30 is clamped to 10, gate = -30 is not clamped
    (silu(-30) ~ -2.8e-12), up = ±30 is clamped to ±10. Spec: MO-02."""
    x = torch.zeros(4, D, dtype=torch.bfloat16)
    x[:, 0] = torch.tensor([1.0, 1.0, -1.0, 1.0], dtype=torch.bfloat16)
    w1, w3, w2 = torch.zeros(INTER, D), torch.zeros(INTER, D), torch.zeros(D, INTER)
    w1[0, 0], w3[0, 0], w2[0, 0] = 30.0, 30.0, 1.0
    out = op(backend, "moe_expert")(x, ExpertWeights(w1, w3, w2), None, config=C)
    silu10 = float(torch.nn.functional.silu(torch.tensor(10.0)))
    want0 = float(torch.tensor(silu10 * 10.0).to(torch.bfloat16))
    assert out.dtype == torch.float32 and out[0, 0].item() == want0, f"gate and up clamped: {out[0, 0].item()}"
    silu_m30 = float(torch.nn.functional.silu(torch.tensor(-30.0)))
    want2 = float(torch.tensor(silu_m30 * -10.0).to(torch.bfloat16))
    assert out[2, 0].item() == pytest.approx(want2, rel=1e-2) and out[2, 0].item() != 0.0, \
        f"gate -30 must not be clamped from below: {out[2, 0].item()}"
    from contracts.separation import separates

    def unit(**variant):  # rows 0 and 2: gate = up = 30 and -30 (the clamp after the SiLU is the next test's)
        return torch.stack([_swiglu_unit(30.0 * s, 30.0 * s, 10.0, **variant) for s in (1.0, -1.0)])

    want = separates("the SwiGLU limits at 10", unit(), gate_not_clamped=unit(gate_clamp="none"),
                     gate_clamped_both_sides=unit(gate_clamp="both"), up_not_clamped=unit(up_clamp="none"),
                     up_clamped_above_only=unit(up_clamp="above"))
    assert torch.equal(out[[0, 2], 0], want), f"rows 0, 2: {out[[0, 2], 0].tolist()}, expected {want.tolist()}"


def _swiglu_unit(gate: float, up: float, limit: float, *, gate_clamp="above", up_clamp="both",
                 order="clamp-then-silu") -> torch.Tensor:
    """One hidden unit through a W2 of 1: BF16(act(gate) * up), as FP32, under the named placement."""
    silu = torch.nn.functional.silu
    g, u = torch.tensor(gate), torch.tensor(up)
    g = {"above": g.clamp(max=limit), "both": g.clamp(-limit, limit), "none": g}[gate_clamp]
    u = {"both": u.clamp(-limit, limit), "above": u.clamp(max=limit), "none": u}[up_clamp]
    act = silu(g) if order == "clamp-then-silu" else silu(torch.tensor(gate)).clamp(max=limit)
    return (act * u).to(torch.bfloat16).float()


@pytest.mark.operators("moe_expert")
def test_the_swiglu_clamp_placement_is_separated_from_each_alternative(backend):
    """Hand vector at a limit of 2 (at the real limit 10, silu(10) and 10 are one BF16 value, so a clamp after
    the activation could not be told apart): one unit with gate = up = 3x, for x = 1 and x = -1. The rule:
    gate clamped above before the SiLU, up clamped on both sides. Computed alternatives: the gate clamped on
    both sides, or not at all; the clamp after the SiLU; up clamped above only, or not at all. Spec: MO-02."""
    from dataclasses import replace

    from contracts.separation import separates

    limit = 2.0
    x = torch.zeros(2, D, dtype=torch.bfloat16)
    x[:, 0] = torch.tensor([1.0, -1.0], dtype=torch.bfloat16)
    w1, w3, w2 = torch.zeros(INTER, D), torch.zeros(INTER, D), torch.zeros(D, INTER)
    w1[0, 0], w3[0, 0], w2[0, 0] = 3.0, 3.0, 1.0

    def unit(**variant):
        return torch.stack([_swiglu_unit(3.0 * s, 3.0 * s, limit, **variant) for s in (1.0, -1.0)])

    want = separates("gate clamped above, up on both sides, before the SiLU", unit(),
                     gate_clamped_both_sides=unit(gate_clamp="both"), gate_not_clamped=unit(gate_clamp="none"),
                     clamp_after_the_silu=unit(order="silu-then-clamp"), up_clamped_above_only=unit(up_clamp="above"),
                     up_not_clamped=unit(up_clamp="none"))
    out = op(backend, "moe_expert")(x, ExpertWeights(w1, w3, w2), None, config=replace(C, swiglu_limit=limit))
    assert torch.equal(out[:, 0], want), f"unit outputs {out[:, 0].tolist()}, expected {want.tolist()} " \
                                         "(silu(min(3x, 2)) * clamp(3x, -2, 2), one BF16 rounding)"


@pytest.mark.operators("moe_expert")
def test_the_route_weight_multiplies_the_hidden_before_its_bf16_boundary(backend):
    """With a down projection that copies one hidden unit per output (a 0/1 matrix), every output element is
    a BF16 value exactly when the route weight is applied before the hidden is rounded to BF16 and W2 is
    applied after; a route weight of 1.3 applied after W2 (or no BF16 boundary) leaves non-BF16 values.
    Spec: MO-02."""
    g = torch.Generator().manual_seed(8)
    x = _tokens(g, 8)
    w1 = torch.randn(INTER, D, generator=g) / D**0.5
    w3 = torch.randn(INTER, D, generator=g) / D**0.5
    w2 = torch.zeros(D, INTER)
    w2[torch.arange(D), torch.arange(D) % INTER] = 1.0
    route = torch.full((8,), 1.3)
    out = op(backend, "moe_expert")(x, ExpertWeights(w1, w3, w2), route, config=C)
    assert torch.equal(out, out.to(torch.bfloat16).float()), "outputs are not BF16 values: the route weight or " \
        "the BF16 hidden boundary is misplaced"
    ref = REF.get("moe_expert")(x, ExpertWeights(w1, w3, w2), route, config=C)
    assert torch.equal(out, ref)


@settings(deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 10))
@pytest.mark.operators("moe_expert")
def test_an_expert_equals_the_reference_within_the_moe_budget(backend, seed, rows):
    g = torch.Generator().manual_seed(seed)
    x, (ex,) = _tokens(g, rows), _experts(g, 1)
    route = torch.rand(rows, generator=g) * 0.5
    r = check_moe_rows(op(backend, "moe_expert")(x, ex, route, config=C).to(torch.bfloat16),
                       REF.get("moe_expert")(x, ex, route, config=C).to(torch.bfloat16), rows)
    assert r.ok, r.message()


def test_expert_weights_decode_mxfp4_and_the_int8_stand_in():
    """Packed E2M1 (low nibble first) with E8M0 group-32 scales decodes to code value × 2^(s-127); the INT8
    stand-in to int8 × row scale; both selectable, other formats refused. Spec: MO-02, §2.2."""
    from kernels import quant

    codes = torch.zeros(2, 64, dtype=torch.uint8)
    codes[0, 0], codes[0, 1], codes[1, 33] = 2, 9, 7  # +1.0, -0.5, +6.0
    packed = quant.pack_fp4(codes)
    scales = torch.tensor([[127, 128], [126, 130]], dtype=torch.uint8)
    dec = expert_weights("mxfp4", packed, packed, packed, (scales, scales, scales))
    from contracts.separation import separates

    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

    def decode(high_nibble_first=False, bias=127, group=32):  # codes -> values, as a reader could get it wrong
        c = codes.view(2, 32, 2).flip(-1).reshape(2, 64) if high_nibble_first else codes
        v = e2m1[(c & 7).long()] * torch.where(c & 8 != 0, -1.0, 1.0)
        exps = scales.float().repeat_interleave(group, 1)[:, :64] if group == 32 else \
            scales.float().repeat_interleave(group, 1).repeat(1, 2)[:, :64]
        return v * torch.exp2(exps - bias)

    separates("E2M1 low nibble first, E8M0 2^(s - 127) per 32", decode(), high_nibble_first=decode(True),
              scale_bias_128=decode(bias=128), scale_per_16=decode(group=16))
    assert torch.equal(dec.w1, decode()), "the decoded weights are not the rule's"
    assert dec.w1[0, 0].item() == 1.0 and dec.w1[0, 1].item() == -0.5 and dec.w1[1, 33].item() == 6.0 * 8
    assert int((dec.w1 != 0).sum()) == 3
    q = torch.tensor([[1, -2], [3, 127]], dtype=torch.int8)
    s = torch.tensor([0.5, 2.0])
    assert expert_weights("int8", q, q, q, (s, s, s)).w2.tolist() == [[0.5, -1.0], [6.0, 254.0]]
    with pytest.raises(ContractInputError, match="fmt"):
        expert_weights("fp8", q, q, q, (s, s, s))
    with pytest.raises(ContractInputError, match="w1"):
        expert_weights("int8", q.float(), q, q, (s, s, s))


# ----------------------------------------------------------------------------------------------------- EP


def _ep_case(seed: int, ep: int, tokens: int = 12, counts=None):
    g = torch.Generator().manual_seed(seed)
    w, b = _router(g)
    experts, shared = _experts(g), _experts(g, 1)[0]
    x_all = _tokens(g, tokens * 4)
    return g, w, b, experts, shared, x_all


def _run_ep(backend, x_all, w, b, experts, shared, ep, counts):
    """Spread the same token rows over ``ep`` ranks (``counts`` active rows each, padding after)."""
    gate = op(backend, "moe_gate")
    xs, gates, start = [], [], 0
    for n in counts:
        x = torch.zeros(max(counts) + 2, D, dtype=torch.bfloat16)
        x[:n] = x_all[start:start + n]
        start += n
        xs.append(x)
        gates.append(gate(x, w, b, config=C))
    return xs, gates, op(backend, "moe_ep")(xs, gates, experts, shared, ep=ep, num_tokens=counts, config=C)


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**16))
@pytest.mark.operators("moe_ep", "moe_gate")
def test_ep_results_do_not_depend_on_the_ep_size_or_on_token_order(backend, seed):
    """The same 16 token rows on EP2 / EP4 / EP8 (8 / 4 / 2 active rows per rank) give the same output rows
    bit for bit; reversing the rows of every rank reverses its output rows. Spec: MO-09."""
    _g, w, b, experts, shared, x_all = _ep_case(seed, 8)
    rows = {}
    for ep in (2, 4, 8):
        counts = [16 // ep] * ep
        _xs, _gates, res = _run_ep(backend, x_all, w, b, experts, shared, ep, counts)
        rows[ep] = torch.cat([o[:n] for o, n in zip(res.outputs, counts, strict=True)])
    for ep in (4, 8):
        assert torch.equal(rows[ep], rows[2]), f"EP{ep} differs from EP2 at row " \
            f"{int((rows[ep] != rows[2]).any(1).nonzero()[0, 0])}"
    counts = [8, 8]
    _xs, _gates, fwd = _run_ep(backend, x_all, w, b, experts, shared, 2, counts)
    rev = torch.cat([x_all[:8].flip(0), x_all[8:16].flip(0)])
    _xs, _gates, back = _run_ep(backend, rev, w, b, experts, shared, 2, counts)
    for r in range(2):
        assert torch.equal(back.outputs[r][:8], fwd.outputs[r][:8].flip(0)), f"rank {r}: token order moved a row"


@pytest.mark.operators("moe_ep", "moe_gate")
def test_dispatch_counts_slots_and_owners(backend):
    """send_counts[src, dst, local] counts the (token, k) pairs routed to expert dst·n_local + local; each
    destination lays them out by local expert, then source rank, then source order; every active token row
    is combined on its own rank only (one owner), padding rows are exact zeros. Spec: MO-09, MO-11."""
    _g, w, b, experts, shared, x_all = _ep_case(3, 4)
    counts = [5, 0, 7, 3]
    xs, gates, res = _run_ep(backend, x_all, w, b, experts, shared, 4, counts)
    n_local = E // 4
    want = torch.zeros(4, 4, n_local, dtype=torch.int32)
    for src in range(4):
        for e in gates[src][1][: counts[src]].reshape(-1).tolist():
            want[src, e // n_local, e % n_local] += 1
    assert torch.equal(res.send_counts, want), f"send_counts {res.send_counts.tolist()} != {want.tolist()}"
    for dst in range(4):
        slots = res.recv_rows[dst].tolist()
        keys = [(int(gates[s][1][t, k]) % n_local, s, t, k) for s, t, k in slots]
        assert keys == sorted(keys), f"rank {dst}: slots not in (local expert, source rank, source order)"
        assert all(int(gates[s][1][t, k]) // n_local == dst for s, t, k in slots), f"rank {dst} got others' rows"
    for src in range(4):
        assert not bool(res.outputs[src][counts[src]:].view(torch.int16).any()), f"rank {src}: padding not zero"
    ref = REF.get("moe_ep")(xs, gates, experts, shared, ep=4, num_tokens=counts, config=C)
    for src in range(4):
        r = check_moe_rows(res.outputs[src], ref.outputs[src], counts[src])
        assert r.ok, f"rank {src}: {r.message()}"


@pytest.mark.operators("moe_ep", "moe_expert", "moe_gate")
def test_the_combine_sums_in_fp32_and_casts_once(backend):
    """The combined row is shared + Σ_k routed in FP32, cast to BF16 once: recomputed from the backend's own
    expert contributions, bit for bit. Summing in BF16 (or casting each contribution) differs on these rows.
    Spec: MO-09."""
    _g, w, b, experts, shared, x_all = _ep_case(11, 2)
    counts = [6, 6]
    xs, gates, res = _run_ep(backend, x_all, w, b, experts, shared, 2, counts)
    expert = op(backend, "moe_expert")
    for src in range(2):
        n = counts[src]
        weights, ids = gates[src]
        total = expert(xs[src][:n], shared, None, config=C)
        bf16_total = total.to(torch.bfloat16)
        for k in range(K):
            contrib = torch.stack([expert(xs[src][t:t + 1], experts[int(ids[t, k])], weights[t, k:k + 1],
                                          config=C)[0] for t in range(n)])
            total = total + contrib
            bf16_total = bf16_total + contrib.to(torch.bfloat16)
        assert torch.equal(res.outputs[src][:n], total.to(torch.bfloat16)), f"rank {src}: not FP32-sum-then-cast"
        assert not torch.equal(bf16_total, total.to(torch.bfloat16)), "the rows separate the two combines"


@pytest.mark.operators("moe_ep", "moe_gate")
def test_token_counts_follow_md32(backend):
    """num_tokens: one count broadcast to every rank, or exactly EP counts, each in [0, 16] and within the
    rank's rows; anything else names the field and rank. Spec: MD-32."""
    _g, w, b, experts, shared, x_all = _ep_case(1, 2)
    x = torch.zeros(20, D, dtype=torch.bfloat16)
    gates = [REF.get("moe_gate")(x, w, b, config=C)] * 2
    ep = op(backend, "moe_ep")
    res = ep([x, x], gates, experts, shared, ep=2, num_tokens=3, config=C)
    assert [int((o.view(torch.int16) != 0).any(1).sum()) <= 3 for o in res.outputs] == [True, True]
    for bad, where in ((17, r"num_tokens\[0\]"), ([1, 2, 3], "num_tokens"), ([1, -1], r"num_tokens\[1\]")):
        with pytest.raises(ContractInputError, match=where):
            ep([x, x], gates, experts, shared, ep=2, num_tokens=bad, config=C)
    short = x[:5]  # a rank with 5 rows cannot have 6 active tokens
    with pytest.raises(ContractInputError, match=r"num_tokens\[1\]: expected 0..5"):
        ep([x, short], [gates[0], REF.get("moe_gate")(short, w, b, config=C)], experts, shared, ep=2,
           num_tokens=[6, 6], config=C)


@pytest.mark.operators("moe_ep", "moe_expert", "moe_gate")
def test_recv_y_holds_each_local_experts_outputs_in_slot_order(backend):
    """Per destination: recv_expert_count[local] is the number of rows the local expert received (the column
    sum of send_counts) and lies in [0, recv_max]; recv_y[local, :count] are that expert's outputs for its rows
    in slot order (independently: the reference expert on the rows recv_rows names, route weight included);
    every slot past the count is exactly zero. The check fails on a count one off and on one dirty padding
    element. Spec: MO-05."""
    from contracts.checks.moe import check_recv_y

    _g, w, b, experts, shared, x_all = _ep_case(5, 4)
    counts = [6, 2, 0, 5]
    xs, gates, res = _run_ep(backend, x_all, w, b, experts, shared, 4, counts)
    n_local, recv_max = E // 4, 4 * 16
    for dst in range(4):
        got = res.recv_expert_count[dst]
        assert got.dtype == torch.int32 and torch.equal(got, res.send_counts[:, dst].sum(0)), \
            f"recv_expert_count rank {dst}: {got.tolist()}"
        assert res.recv_y[dst].shape == (n_local, recv_max, D)
        slots = res.recv_rows[dst].tolist()
        want = torch.zeros(n_local, recv_max, D)
        for local in range(n_local):
            mine = [(s, t, k) for s, t, k in slots if int(gates[s][1][t, k]) == dst * n_local + local]
            if mine:
                rows = torch.stack([xs[s][t] for s, t, _k in mine])
                route = torch.stack([gates[s][0][t, k] for s, t, k in mine])
                want[local, :len(mine)] = REF.get("moe_expert")(rows, experts[dst * n_local + local], route,
                                                                config=C)
        r = check_recv_y(res.recv_y[dst], want, got, res.send_counts[:, dst].sum(0), recv_max=recv_max)
        assert r.ok, f"rank {dst}: {r.message()}"
    dst = 0
    busy = int(res.recv_expert_count[dst].argmax())
    n = int(res.recv_expert_count[dst][busy])
    off = res.recv_expert_count[dst].clone()
    off[busy] += 1
    r = check_recv_y(res.recv_y[dst], res.recv_y[dst], off, res.recv_expert_count[dst], recv_max=recv_max)
    assert not r.ok and f"recv_expert_count[{busy}]" in r.message(), r.message()
    dirty = res.recv_y[dst].clone()
    dirty[busy, n, 3] = 1e-30
    r = check_recv_y(dirty, res.recv_y[dst], res.recv_expert_count[dst], res.recv_expert_count[dst],
                     recv_max=recv_max)
    assert not r.ok and "padding row" in r.message(), r.message()
    over = res.recv_expert_count[dst].clone()
    over[busy] = recv_max + 1
    assert not check_recv_y(res.recv_y[dst], res.recv_y[dst], over, over, recv_max=recv_max).ok


@pytest.mark.operators("moe_ep")
def test_a_destination_over_its_receive_capacity_is_an_error(backend):
    """A local expert receiving more than recv_max rows is an error naming the destination and the expert that
    is over: expert 0 receives exactly 2 rows (accepted at recv_max 2), expert 1 receives 3, so the error names
    [0][1], not the first expert at the limit. Spec: MO-05."""
    _g, w, b, experts, shared, x_all = _ep_case(2, 2)
    xs = [x_all[:8], x_all[8:16]]
    k = C.num_experts_per_tok
    rows = [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [1, 6, 7, 8, 9, 10]]
    ids = torch.tensor([r[:k] for r in rows], dtype=torch.int32)
    gate = (torch.full(ids.shape, C.routed_scaling_factor / k), ids)
    other = (gate[0], torch.tensor([[11, 12, 13, 14, 15, 10][:k]] * 3, dtype=torch.int32))
    moe_ep = op(backend, "moe_ep")
    with pytest.raises(ContractInputError, match=r"recv_max\[0\]\[1\]: expected <= 2 rows received by local "
                                                 r"expert 1, got 3"):
        moe_ep([xs[0][:3], xs[1][:3]], [gate, other], experts, shared, ep=2, num_tokens=[3, 1], recv_max=2, config=C)
    res = moe_ep([xs[0][:3], xs[1][:3]], [gate, other], experts, shared, ep=2, num_tokens=[3, 1], recv_max=3, config=C)
    assert res.recv_expert_count[0][:2].tolist() == [2, 3]


def test_the_moe_row_comparator_fails_just_outside_each_clause():
    """check_moe_rows: 2 % of the active elements over relative diff 3e-3 pass, one more fails; a worst |Δ| of
    0.25 passes, a hair more fails; a padding row one bit off fails. Spec: MO-05, MO-06."""
    e = torch.ones(10, 50, dtype=torch.float64) * 4.0
    a = e.clone()
    flat = a.reshape(-1)
    flat[:10] *= 1 + 3e-3 * 1.01  # 10 of 500 = 2 %
    assert check_moe_rows(a, e, 10).ok
    flat[10] *= 1 + 3e-3 * 1.01
    assert not check_moe_rows(a, e, 10).ok
    b = e.clone()
    b[0, 0] += 0.25
    assert check_moe_rows(b, e, 10).ok
    b[0, 0] += 1e-9
    assert not check_moe_rows(b, e, 10).ok
    z = torch.zeros(4, 8, dtype=torch.bfloat16)
    y = z.clone()
    y[3, 2] = torch.tensor([1], dtype=torch.int16).view(torch.bfloat16)
    r = check_moe_rows(y, z, 2)
    assert not r.ok and "padding row" in r.message() and "[3][2]" in r.message()


@pytest.mark.operators("moe_ep", "moe_gate")
def test_the_ep4_fixture_bias_keeps_topk_far_from_ties_and_forces_cross_rank_traffic(backend):
    """The moe_ep4 golden uses upstream's fixture routing bias (+4 on 6 spread experts, -1 elsewhere): the 6th
    and 7th biased scores of every row are more than 1 apart (no near-tie can flip a selection) and every
    active rank sends rows to every other rank. Spec: MO-10."""
    from goldens.cases import get_case

    inputs = get_case("moe_ep4").build_inputs(17, "replicated")
    bias = inputs["bias"]
    assert sorted(bias.tolist()).count(4.0) == K and sorted(bias.tolist()).count(-1.0) == E - K
    counts = inputs["num_tokens"].tolist()
    gates = [op(backend, "moe_gate")(x, inputs["router"], bias, config=C) for x in inputs["xs"]]
    for r, x in enumerate(inputs["xs"]):
        _scores, biased = _biased_scores(x[: counts[r]], inputs["router"], bias)
        top = biased.sort(dim=1, descending=True).values
        assert bool((top[:, K - 1] - top[:, K] > 1.0).all()), f"rank {r}: a near-tie at the k-th expert"
    from kernels.reference.moe import ExpertWeights

    experts = [ExpertWeights(torch.zeros(INTER, D), torch.zeros(INTER, D), torch.zeros(D, INTER))] * E
    res = op(backend, "moe_ep")(list(inputs["xs"]), gates, experts, experts[0], ep=4, num_tokens=counts, config=C)
    sent = res.send_counts.sum(-1)
    for src in (r for r in range(4) if counts[r]):
        assert all(int(sent[src, dst]) > 0 for dst in range(4) if dst != src), f"rank {src} sends {sent[src]}"


@pytest.mark.operators("moe_gate")
def test_the_router_temperature_divides_the_logits(backend):
    """scores = sqrt(softplus(logits / gate_temperature)): at temperature 2 the weights are those of the halved
    logits (FLASH uses 1.0, where multiplying and dividing agree). Spec: MO-01."""
    from dataclasses import replace

    g = torch.Generator().manual_seed(21)
    x, (w, b) = _tokens(g, 5), _router(g)
    hot = replace(C, gate_temperature=2.0)
    weights, ids = op(backend, "moe_gate")(x, w * 3, b, config=hot)
    logits = (x.double() @ (w * 3).double().T).float()
    scores = torch.nn.functional.softplus(logits / 2.0).sqrt()
    chosen = scores.gather(1, ids.long())
    assert torch.allclose(weights, chosen / chosen.sum(1, keepdim=True) * C.routed_scaling_factor, atol=1e-6)


@pytest.mark.operators("moe_expert")
def test_the_bf16_projection_rule_rounds_each_projection(backend):
    """``bf16-proj`` (the decode golden) rounds gate and up to BF16 before the SwiGLU: an up projection of
    1 + 2^-8 (a BF16 tie) becomes 1.0 and the hidden silu(10)·1 rounds to 10.0, while ``fp32-proj`` keeps
    1 + 2^-8 and the hidden rounds to 10.0625; the decode golden's expert output (its recv_y) is BF16 as well,
    where fp32-proj keeps the FP32 contribution. Spec: MO-02 (the older rule kept by name)."""
    moe_expert = op(backend, "moe_expert")
    x = torch.zeros(1, D, dtype=torch.bfloat16)
    x[0, 0] = 1.0
    w1, w3, w2 = torch.zeros(INTER, D), torch.zeros(INTER, D), torch.zeros(D, INTER)
    w1[0, 0], w3[0, 0], w2[0, 0] = 20.0, 1 + 2.0**-8, 1.0
    ex = ExpertWeights(w1, w3, w2)
    fp32 = moe_expert(x, ex, None, config=C)[0, 0].item()
    bf16 = moe_expert(x, ex, None, config=C, rule="bf16-proj")[0, 0].item()
    assert (fp32, bf16) == (10.0625, 10.0), (fp32, bf16)
    # the down projection's output too: hidden 10 · (1 + 2^-9) stays so in FP32 and is 10.0 in BF16
    w1[0, 0], w3[0, 0] = 20.0, 1.0
    w2[0, 0], w2[1, 0] = 1 + 2.0**-9, 1.0
    ex = ExpertWeights(w1, w3, w2)
    hidden = torch.nn.functional.silu(torch.tensor(C.swiglu_limit)).to(torch.bfloat16).item()  # gate clamped
    fp32 = moe_expert(x, ex, None, config=C)
    bf16 = moe_expert(x, ex, None, config=C, rule="bf16-proj")
    assert fp32.dtype == bf16.dtype == torch.float32
    assert fp32[0, 0].item() == hidden * (1 + 2.0**-9) and bf16[0, 0].item() == hidden, (fp32[0, 0], bf16[0, 0])
    assert torch.equal(bf16, bf16.to(torch.bfloat16).float()), "a bf16-proj contribution holds BF16 values"


@pytest.mark.operators("moe_expert")
def test_the_bf16_projection_rule_keeps_the_swiglu_in_fp32(backend):
    """``bf16-proj`` rounds the projections to BF16 and then evaluates silu(gate)·up in FP32 with one BF16 cast of
    the hidden: gate 2^-6 and up 1.5 (exact in BF16, so the projections' rounding is a no-op and only the SwiGLU's
    staging decides) give BF16(silu(2^-6)·1.5) = 0.01177978515625. Computed alternative: silu and the product in
    BF16 (the projection kept BF16, each op rounding): BF16(BF16(silu(2^-6))·1.5) = 0.0118408203125.
    Spec: MO-02 (the older rule kept by name)."""
    from contracts.separation import separates

    moe_expert = op(backend, "moe_expert")
    gate, up = torch.tensor([2.0**-6]), torch.tensor([1.5])
    silu = torch.nn.functional.silu(gate.double())
    want = separates("bf16-proj: SwiGLU in FP32, one BF16 cast", (silu * up.double()).float().to(torch.bfloat16).float(),
                     swiglu_in_bf16=(silu.float().to(torch.bfloat16).float() * up).to(torch.bfloat16).float())
    x = torch.zeros(1, D, dtype=torch.bfloat16)
    x[0, 0] = 1.0
    w1, w3, w2 = torch.zeros(INTER, D), torch.zeros(INTER, D), torch.zeros(D, INTER)
    w1[0, 0], w3[0, 0], w2[0, 0] = float(gate), float(up), 1.0
    got = moe_expert(x, ExpertWeights(w1, w3, w2), None, config=C, rule="bf16-proj")[0, :1]
    assert torch.equal(got, want), f"bf16-proj contribution {got.item()!r}, expected {want.item()!r} (FP32 SwiGLU)"


@pytest.mark.operators("moe_ep", "moe_expert", "moe_gate")
def test_the_moe_operators_refuse_bad_calls_naming_the_field(backend):
    """Every shape clause alone, the id range at its edges (E refused, E-1 accepted), the receive capacity at
    its edge (exactly recv_max accepted), and the documented output dtypes. Spec: MO-03, MO-09, MD-32."""
    g = torch.Generator().manual_seed(4)
    x, (w, b) = _tokens(g, 4), _router(g)
    gate = op(backend, "moe_gate")
    for args in ((x[0], w, b), (x, w[:, :-1], b), (x, w, b[:-1])):
        with pytest.raises(ContractInputError, match="gate"):
            gate(*args, config=C)
    (ex,) = _experts(g, 1)
    expert = op(backend, "moe_expert")
    for bad in (ExpertWeights(ex.w1[:, :-1], ex.w3, ex.w2), ExpertWeights(ex.w1, ex.w3[:-1], ex.w2),
                ExpertWeights(ex.w1, ex.w3, ex.w2[:, :-1])):
        with pytest.raises(ContractInputError, match="expert"):
            expert(x, bad, None, config=C)
    with pytest.raises(ContractInputError, match="route_weight"):
        expert(x, ex, torch.ones(3), config=C)
    experts, shared = _experts(g), _experts(g, 1)[0]
    ep = op(backend, "moe_ep")
    gates = [gate(x, w, b, config=C)] * 2
    with pytest.raises(ContractInputError, match="xs/gates"):
        ep([x], gates, experts, shared, ep=2, num_tokens=4, config=C)
    with pytest.raises(ContractInputError, match="xs/gates"):
        ep([x, x], gates[:1], experts, shared, ep=2, num_tokens=4, config=C)
    with pytest.raises(ContractInputError, match="experts"):
        ep([x, x], gates, experts[:-1], shared, ep=2, num_tokens=4, config=C)
    with pytest.raises(ContractInputError, match="experts"):  # 16 experts do not split over 3 ranks
        ep([x, x, x], gates + gates[:1], experts, shared, ep=3, num_tokens=4, config=C)
    for bad_id, ok in ((E, False), (-1, False), (E - 1, True)):
        ids = gates[0][1].clone()
        ids[2, 3] = bad_id
        ids[2, :3] = torch.tensor([0, 1, 2]) if bad_id != E - 1 else ids[2, :3]
        call = lambda i=ids: ep([x, x], [(gates[0][0], i)] * 2, experts, shared, ep=2, num_tokens=4, config=C)  # noqa: E731
        if ok:
            call()
        else:
            with pytest.raises(ContractInputError, match=r"ids\[0\]\[2\]\[3\]"):
                call()
    res = ep([x, x], gates, experts, shared, ep=2, num_tokens=4, config=C)
    assert res.send_counts.dtype == torch.int32 and all(r.dtype == torch.int32 for r in res.recv_rows)
    assert all(o.dtype == torch.bfloat16 for o in res.outputs)
    counts = torch.stack(res.recv_expert_count)
    most = int(counts.max())
    ep([x, x], gates, experts, shared, ep=2, num_tokens=4, recv_max=most, config=C)
    dst, local = (int(v) for v in (counts > most - 1).nonzero()[0])
    with pytest.raises(ContractInputError, match=rf"recv_max\[{dst}\]\[{local}\]: expected <= {most - 1} rows "
                                                 rf"received by local expert {local}, got {most}"):
        ep([x, x], gates, experts, shared, ep=2, num_tokens=4, recv_max=most - 1, config=C)


@pytest.mark.operators("moe_ep", "moe_gate")
def test_prefill_rows_have_one_owner_per_tp_group_and_the_group_sum_restores_the_moe(backend):
    """Prefill layer on TP4 (card 5, group 4..7): token t is owned by card 4 + t % 4 -- one owner per row in
    the group; each card keeps its owned rows of the MoE result and zeros the others; the group's FP32 sum cast
    once is the MoE result bit for bit and every card of the group holds it. check_ffn_owned passes on that and
    fails when a card writes a row it does not own, or an owned row drifts beyond the MoE budget. Spec: MO-11."""
    from contracts.checks.moe import check_ffn_owned
    from kernels.reference.moe import group_sum, owned_rows, prefill_token_owners

    _g, w, b, experts, shared, x_all = _ep_case(7, 2)
    xs, gates, res = _run_ep(backend, x_all, w, b, experts, shared, 2, [6, 6])
    full = res.outputs[0]
    owners = prefill_token_owners(full.shape[0], rank=5, tp=4)
    assert owners.tolist()[:6] == [4, 5, 6, 7, 4, 5] and owners.dtype == torch.int32
    assert prefill_token_owners(3, rank=1, tp=1).tolist() == [1, 1, 1]
    owned = owned_rows(full, owners, group_base=4, tp=4)
    assert ((owned != 0).any(-1).sum(0) <= 1).all(), "a row with two owners"
    assert torch.equal(group_sum(owned).view(torch.int16), full.view(torch.int16)), "the group sum"
    r = check_ffn_owned(owned, full, owners, 6, group_base=4)
    assert r.ok, r.message()
    intruder = owned.clone()
    intruder[1, 0] = full[0]  # card 5 writes row 0, owned by card 4
    r = check_ffn_owned(intruder, full, owners, 6, group_base=4)
    assert not r.ok and "card 5 row" in r.message() and "owned by card 4" in r.message(), r.message()
    drift = owned.clone()
    drift[2, 2] = full[2] * 1.5
    assert not check_ffn_owned(drift, full, owners, 6, group_base=4).ok
    with pytest.raises(ContractInputError, match="token owners"):
        prefill_token_owners(4, rank=0, tp=3)


@pytest.mark.operators("moe_ep", "moe_expert", "moe_gate")
def test_the_combine_sums_shared_then_routed_in_slot_order(backend):
    """Hand vector: every routed expert shares W1 and W3 and the router is zero (equal route weights), the bias
    puts experts 0..5 in slots 0..5. Expert 0's W2 is +2^40 (all ones), expert 1's -2^40, expert 2's small,
    3..5 zero. In slot order the shared output S is absorbed by slot 0's 2^40·Σh and slot 1 cancels it exactly,
    so the row is slot 2's C; in reversed slot order C is absorbed instead and the row is 0. Computed
    alternatives: reversed slots, routed before shared, a pairwise tree over the slots. Spec: MO-09 (shared +
    Σ_k routed in FP32, one BF16 cast)."""
    from contracts.separation import pairwise_sum, running_sum, separates

    g = torch.Generator().manual_seed(21)
    d, inter, e = C.hidden_size, C.moe_intermediate_size, C.n_routed_experts
    w1, w3 = torch.randn(inter, d, generator=g) / d**0.5, torch.randn(inter, d, generator=g) / d**0.5
    big = torch.ones(d, inter) * 2.0**40
    small = torch.randn(d, inter, generator=g) * 0.01
    w2s = [big, -big, small] + [torch.zeros(d, inter)] * (e - 3)
    experts = [ExpertWeights(w1, w3, w2) for w2 in w2s]
    shared = ExpertWeights(w1 * 0.5, w3, torch.randn(d, inter, generator=g) * 0.01)
    x = torch.randn(4, d, generator=g).to(torch.bfloat16)
    bias = torch.arange(e, 0, -1, dtype=torch.float32)
    weights, ids = REF.get("moe_gate")(x, torch.zeros(e, d), bias, config=C)
    assert ids[:, :3].tolist() == [[0, 1, 2]] * 4 and bool((weights == weights[0, 0]).all())
    s = REF.get("moe_expert")(x, shared, None, config=C)
    r = [REF.get("moe_expert")(x, experts[int(ids[0, j])], weights[:, j], config=C) for j in range(ids.shape[1])]

    want = separates("shared, then routed in slot order, FP32, one BF16 cast", running_sum(r, s).bfloat16(),
                     reversed_slots=running_sum(r[::-1], s).bfloat16(),
                     routed_before_shared=running_sum([*r[1:], s], r[0]).bfloat16(),
                     pairwise_slots=(s + pairwise_sum(r)).bfloat16())
    assert bool(want.ne(0).any())
    got = op(backend, "moe_ep")([x], [(weights, ids)], experts, shared, ep=1, num_tokens=4, config=C).outputs[0]
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), \
        f"row 0 {got[0, :4].tolist()}, expected {want[0, :4].tolist()} (slot 2's output: slots 0 and 1 cancel " \
        "after absorbing the shared output)"


# defects of tests/defects these contracts must catch (shared with other contract files)
def _swiglu_in_bf16():
    """bf16-proj's projections left in BF16, so silu and the product round in BF16 (the #47 staging edit)."""
    expert = reference_edit("kernels.reference.moe:moe_expert", "limit = config.swiglu_limit",
                            "limit = config.swiglu_limit")
    expert.__globals__["_project"] = reference_edit("kernels.reference.moe:_project", "y.to(torch.bfloat16).float()",
                                                    "y.to(torch.bfloat16)")
    return expert


SEEDED_DEFECTS = [
    shared("moe:BIAS_IN_WEIGHTS", "test_the_correction_bias_moves_the_selection_and_never_the_weights", "unbiased scores normalised"),
    shared("moe:TIES_TO_LAST", "test_ties_go_to_the_lower_expert_id_and_the_topk_rule_stays_selectable", "ties:"),
    SeededDefect("moe:swiglu-in-bf16", "moe_expert", _swiglu_in_bf16(),
                 "test_the_bf16_projection_rule_keeps_the_swiglu_in_fp32", "FP32 SwiGLU"),
    shared("moe:ROUTE_AFTER_DOWN", "test_the_route_weight_multiplies_the_hidden_before_its_bf16_boundary", "outputs are not BF16 values"),
    shared("moe:SYMMETRIC_GATE_CLAMP", "test_the_swiglu_clamp_placement_is_separated_from_each_alternative", "one BF16 rounding"),
    shared("moe:CLAMP_AFTER_SILU", "test_the_swiglu_clamp_placement_is_separated_from_each_alternative", "one BF16 rounding"),
    shared("moe:SYMMETRIC_GATE_CLAMP", "test_the_swiglu_clamps_gate_above_and_up_on_both_sides", "must not be clamped from below"),
    shared("moe:NEIGHBOUR_RANK", "test_dispatch_counts_slots_and_owners", "send_counts"),
    shared("moe:NEIGHBOUR_RANK", "test_ep_results_do_not_depend_on_the_ep_size_or_on_token_order", "differs from"),
    shared("moe:COMBINE_IN_BF16", "test_the_combine_sums_in_fp32_and_casts_once", "not FP32-sum-then-cast"),
    shared("moe:COUNT_FIRST_SOURCE", "test_recv_y_holds_each_local_experts_outputs_in_slot_order", "recv_expert_count rank 0"),
    shared("moe:RECV_UNCHECKED", "test_a_destination_over_its_receive_capacity_is_an_error", "DID NOT RAISE"),
]
