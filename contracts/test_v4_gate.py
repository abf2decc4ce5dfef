"""V4's MoE router at decode (``v4_gate``, upstream gate.py): the FFN RMSNorm, the INT8 activation dispatched to
the experts, sqrt-softplus scores, hash routes on the first layers and biased top-k routes after, weights from
the unbiased scores; on V4-Pro and V4-Flash (tiny twins).

Judged against an FP64 evaluation written here, and on inputs that separate each rule from its plausible port:
the bias choosing but not weighing, the hash layers routing by token id, the dispatch scale (amax · 1/127 ·
inv_rms, not the reciprocal of the quantization factor), the softplus tail, the padding rows.

Spec: §8; docs/coverage.md, V4 section (V4-15).
"""

from __future__ import annotations

import pytest
import torch

from contracts.separation import separates, separates_under
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from kernels.v4.gate import GATE_M_TILE, v4_gate
from pto_pytest.defect import shared
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("v4_gate")  # every contract here calls it, and only it

MODELS = [V4_PRO_TINY.kernel_preset(), V4_FLASH_TINY.kernel_preset()]
T, VOCAB_ROWS = 8, 32


def _inputs(config, seed=0, *, num_tokens=6):
    g = torch.Generator().manual_seed(seed)
    d, e, k = config.hidden_size, config.n_routed_experts, config.num_experts_per_tok
    return dict(
        x_mixed=torch.randn(T, d, generator=g).to(torch.bfloat16),
        norm_w=(1 + 0.2 * torch.randn(d, generator=g)).to(torch.bfloat16),
        gate_w=torch.randn(e, d, generator=g) / d**0.5,
        gate_bias=torch.randn(e, generator=g) * 0.1,
        num_tokens=num_tokens,
        tid2eid=torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(VOCAB_ROWS)]).to(torch.int32),
        input_ids=torch.cat((torch.zeros(1, dtype=torch.int64), torch.randint(0, VOCAB_ROWS, (T - 1,), generator=g))),
    )


def _call(backend, config, i, layer_id):
    return op(backend, "v4_gate")(i["x_mixed"], i["norm_w"], i["gate_w"], i["gate_bias"], layer_id,
                                  i["num_tokens"], i["tid2eid"], i["input_ids"], config=config)


def _independent(config, i, layer_id):
    """FP64, written apart: xg = x·γ, inv_rms of the raw row, codes round(xg · 127 / max(|xg|, 1e-4)), scale
    amax / 127 · inv_rms, logits inv_rms · xg·Wᵀ, scores sqrt(log(1 + e^l)), hash or biased top-k (stable), weights
    from the unbiased scores times the routed scale; padding rows zero."""
    n, k = i["num_tokens"], config.num_experts_per_tok
    every = i["x_mixed"].double() * i["norm_w"].double()
    scaled = every * 127 / every.abs().amax(-1, keepdim=True).clamp_min(1e-4)  # every row, padding included
    x = i["x_mixed"][:n].double()
    xg = x * i["norm_w"].double()
    inv_rms = 1 / torch.sqrt((x * x).mean(-1, keepdim=True) + config.rms_norm_eps)
    amax = xg.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    logits = inv_rms * (xg @ i["gate_w"].double().T)
    scores = torch.sqrt(torch.log1p(torch.exp(logits)))
    if layer_id < config.num_hash_layers:
        routes = i["tid2eid"][i["input_ids"][:n].long()].long()
    else:
        routes = torch.argsort(-(scores + i["gate_bias"].double()), dim=-1, stable=True)[:, :k]
    picked = torch.gather(scores, 1, routes)
    return dict(scaled=scaled, scale=amax / 127 * inv_rms, routes=routes,
                weights=picked / picked.sum(-1, keepdim=True) * config.routed_scaling_factor,
                biased=scores + i["gate_bias"].double())


def active_rows(num_tokens: int, tokens: int) -> int:
    """Upstream's gate_active_rows: num_tokens rounded up to the gate's 16-row M-tile, capped at T. The rows of
    x_norm_i8 below it are checked (padding rows inside the tile hold their own codes); the rows past it are not."""
    return min(tokens, -(-num_tokens // GATE_M_TILE) * GATE_M_TILE)


def _judge(config, out, want, i):
    n = i["num_tokens"]
    for name, dtype in (("x_norm_i8", torch.int8), ("x_norm_scale", torch.float32), ("indices", torch.int32),
                        ("weights", torch.float32)):
        assert out[name].dtype == dtype, f"{name}: {out[name].dtype}, expected {dtype}"
    tile = active_rows(n, out["x_norm_i8"].shape[0])
    codes = out["x_norm_i8"][:tile].double()
    scaled = want["scaled"][:tile]
    off = (codes - scaled).abs()
    near_tie = ((scaled - scaled.floor()) - 0.5).abs() < 1e-4
    bad = (off > 0.5 + 1e-4) | ((off > 0.5 - 1e-4) & ~near_tie)
    if bool(bad.any()):
        r = int(bad.any(1).nonzero()[0])
        where = "a real row" if r < n else f"a padding row inside the active tile (rows < {tile} are coded)"
        raise AssertionError(f"x_norm_i8 row {r} ({where}): codes off the round-half-even rule")
    rel = ((out["x_norm_scale"][:n].double() - want["scale"]).abs() / want["scale"]).max()
    assert float(rel) <= 1e-6, f"x_norm_scale off by {float(rel):.3g} relative"
    assert torch.equal(out["indices"][:n].long(), want["routes"]), \
        f"routes {out['indices'][:n].tolist()} != {want['routes'].tolist()}"
    rel = ((out["weights"][:n].double() - want["weights"]).abs() / want["weights"]).max()
    assert float(rel) <= 1e-5, f"weights off by {float(rel):.3g} relative"
    for name in ("x_norm_scale", "indices", "weights"):
        assert bool((out[name][n:] == 0).all()), f"{name}: padding rows are not zero"


@pytest.mark.parametrize("layer", ["hash", "mtp"], ids=["hash-layer-1", "mtp-layer"])
@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
def test_the_router_matches_an_independent_evaluation(backend, config, layer):
    """A hash layer and the MTP layer (score-routed) on V4-Pro and V4-Flash tiny, two padding rows: codes, scale,
    routes and weights against the FP64 evaluation written here (the biased scores of the score layer are at
    least 1e-4 apart at the top-k boundary, so the routes are exact). Spec: §8."""
    layer_id = 1 if layer == "hash" else config.num_hidden_layers  # the MTP layer comes after the backbone
    i = _inputs(config, 3)
    want = _independent(config, i, layer_id)
    if layer_id >= config.num_hash_layers:
        top = want["biased"].sort(-1, descending=True).values
        k = config.num_experts_per_tok
        assert float((top[:, k - 1] - top[:, k]).min()) > 1e-4, "the case has a near tie at the boundary"
    _judge(config, _call(backend, config, i, layer_id), want, i)


def test_the_bias_chooses_but_does_not_weigh(backend):
    """A bias of +10 on experts 3 and 11 routes every row to them; their weights still come from their unbiased
    scores: weight ratios equal score ratios and each row's weights sum to the routed scale (2.5).
    Spec: §8."""
    config = MODELS[0]
    i = _inputs(config, 4)
    i["gate_bias"] = torch.zeros(config.n_routed_experts)
    i["gate_bias"][[3, 11]] = 10.0
    out = _call(backend, config, i, 61)
    want = _independent(config, i, 61)
    n = i["num_tokens"]
    assert bool((out["indices"][:n, :2].sort(-1).values == torch.tensor([3, 11], dtype=torch.int32)).all())
    _judge(config, out, want, i)
    # separated from weights taken from the biased scores (the bias would then weigh as well as choose), and from
    # biased weights left unnormalized; judged within 1e-4 of the rule's weights
    biased = torch.gather(want["biased"], 1, want["routes"])
    unbiased = torch.gather(want["biased"] - i["gate_bias"].double(), 1, want["routes"])
    separates_under("§8 the bias chooses, the unbiased scores weigh",
                    lambda c, e: bool(((c.double() - e).abs() <= 1e-4).all()), want["weights"],
                    biased_weights=biased / biased.sum(-1, keepdim=True) * config.routed_scaling_factor,
                    unnormalized=unbiased * config.routed_scaling_factor)
    sums = out["weights"][:n].double().sum(-1)
    assert bool(((sums - config.routed_scaling_factor).abs() < 1e-5).all()), f"weights sum to {sums.tolist()}"


@pytest.mark.parametrize("layer_id, hashed", [(0, True), (2, True), (3, False)])
def test_the_first_layers_route_by_token_id(backend, layer_id, hashed):
    """Layers 0 .. num_hash_layers - 1 take tid2eid[input_ids] whatever the scores; layer 3 ranks the scores.
    Spec: §8."""
    config = MODELS[0]
    i = _inputs(config, 5)
    out = _call(backend, config, i, layer_id)
    n = i["num_tokens"]
    by_id = torch.equal(out["indices"][:n], i["tid2eid"][i["input_ids"][:n].long()])
    assert by_id is hashed, f"layer {layer_id}: routes by token id = {by_id}, expected {hashed}"
    _judge(config, out, _independent(config, i, layer_id), i)


def _exact_square_sum_rows(config, i, seed, rows):
    """``i`` with ``rows`` rows of small integers times a power of two per row (every row's amax 15 · 2^e): every
    square and every partial sum of squares is exact in FP32, so inv_rms is the same bits in any summation order
    (upstream sums in two FP32 stages, this reference in FP64) and the rows pin the dispatch-factor rule alone."""
    g = torch.Generator().manual_seed(seed)
    ints = torch.randint(-15, 16, (rows, config.hidden_size), generator=g).float()
    ints[:, 0] = 15.0
    return dict(i, x_mixed=(ints * 2.0 ** torch.randint(-3, 4, (rows, 1), generator=g).float()).to(torch.bfloat16),
                input_ids=torch.zeros(rows, dtype=torch.int64), num_tokens=rows)


def _factor_rules(config, i) -> dict[str, torch.Tensor]:
    """Each factor rule computed here: "product" amax · fl(1/127) · inv_rms, "reciprocal" 1 / (127 / amax) ·
    inv_rms, "rounded-reciprocal" 1 / (fl(1/amax) · 127) · inv_rms; each asserted to differ from the others on some
    row."""
    x = i["x_mixed"].float()
    amax = (x * i["norm_w"].float()).abs().amax(-1, keepdim=True)
    inv_rms = torch.rsqrt((x.double().pow(2).sum(-1, keepdim=True) / x.shape[1]).float() + config.rms_norm_eps)
    rules = {"product": amax * torch.tensor(1 / 127, dtype=torch.float32) * inv_rms,
             "reciprocal": torch.reciprocal(torch.full_like(amax, 127.0) / amax) * inv_rms,
             "rounded-reciprocal": torch.reciprocal(torch.reciprocal(amax) * 127.0) * inv_rms}
    for a in rules:
        for b in rules:
            assert a == b or bool((rules[a] != rules[b]).any()), f"no row separates the {a!r} and {b!r} rules"
    return rules


def test_the_dispatch_scale_is_amax_over_127_times_the_rms(backend):
    """The dispatched row's factor is amax · (1/127) · inv_rms, every step in FP32: a row and the same row times
    4 (exact in BF16) give the same codes and the same factor up to eps (the RMS divides out); over 512 rows whose
    sums of squares are exact in FP32 in any order (so inv_rms does not depend on the summation order), among them
    rows whose amax makes 1 / (127 / amax) and amax · (1/127) differ in FP32, the factor is the latter bit for
    bit. Spec: §8."""
    config = MODELS[0]
    i = _inputs(config, 6, num_tokens=T)
    x4 = dict(i, x_mixed=(i["x_mixed"].float() * 4).to(torch.bfloat16))
    a, b = _call(backend, config, i, 61), _call(backend, config, x4, 61)
    assert torch.equal(a["x_norm_i8"], b["x_norm_i8"]), "scaling the row by 4 moved its codes"
    assert torch.allclose(a["x_norm_scale"], b["x_norm_scale"], rtol=1e-6, atol=0), \
        "scaling the row by 4 moved its factor (the RMS must divide out, up to eps)"
    i = _exact_square_sum_rows(config, i, 60, 512)
    a = _call(backend, config, i, 61)
    rules = _factor_rules(config, i)
    # upstream's kernel computes the product, upstream's goldens a reciprocal (V4-Pro's of a true division, the
    # Flash folders' of a rounded one): a backend that follows a golden says so (Backend.variants) and is judged by
    # that named rule, bit for bit
    rule = backend.variants.get("v4_gate", {}).get("dequant_factor", "product")
    assert torch.equal(a["x_norm_scale"], rules[rule]), \
        f"x_norm_scale is not the {rule!r} rule of DEQUANT_FACTOR ({FORMULAS[rule]})"
    assert not any(torch.equal(a["x_norm_scale"], v) for k, v in rules.items() if k != rule)


FORMULAS = {"product": "amax · (1/127) · inv_rms", "reciprocal": "1 / (127 / amax) · inv_rms",
            "rounded-reciprocal": "1 / (fl(1/amax) · 127) · inv_rms"}


@pytest.mark.parametrize("rule", ["product", "reciprocal", "rounded-reciprocal"])
def test_each_named_dispatch_factor_rule_is_its_formula(backend, rule):
    """``dequant_factor`` selects the factor by name: "product" amax · (1/127) · inv_rms (upstream's kernel),
    "reciprocal" 1 / (127 / amax) · inv_rms (V4-Pro's golden), "rounded-reciprocal" 1 / (fl(1/amax) · 127) · inv_rms
    (the V4-Flash folders' golden), each bit for bit on rows that separate it from the others (sums of squares exact
    in FP32, as in the test above). A backend with one rule only skips the others. Spec: §8."""
    config = MODELS[0]
    i = _exact_square_sum_rows(config, _inputs(config, 6, num_tokens=T), 61, 256)
    out = op(backend, "v4_gate")(i["x_mixed"], i["norm_w"], i["gate_w"], i["gate_bias"], 61, 256, i["tid2eid"],
                                 i["input_ids"], config=config, dequant_factor=rule)

    rules = _factor_rules(config, i)
    separates(f"dequant factor {rule!r}", rules[rule], **{k.replace("-", "_"): v for k, v in rules.items() if k != rule})
    assert torch.equal(out["x_norm_scale"], rules[rule]), f"dequant_factor={rule!r} is not its formula ({FORMULAS[rule]})"


def test_the_softplus_keeps_its_negative_tail(backend):
    """Logits of -20 and -30 (a row with one nonzero entry, the gate column set for them) on a hash layer that
    routes to those experts: their scores are sqrt(e^l) = 4.5e-5 and 3.1e-7, not the 0 a naive
    log(1 + e^l) gives in FP32, so their weights are positive and match the FP64 evaluation. Spec: §8."""
    config = MODELS[0]
    d = config.hidden_size
    i = _inputs(config, 7, num_tokens=1)
    x = torch.zeros(T, d)
    x[0, 0] = 1.0
    i["x_mixed"] = x.to(torch.bfloat16)
    i["norm_w"] = torch.ones(d, dtype=torch.bfloat16)
    w = torch.zeros(config.n_routed_experts, d)
    inv_rms = float(1 / torch.sqrt(torch.tensor(1.0 / d) + config.rms_norm_eps))
    w[:, 0] = torch.tensor([-20.0, -30.0] + [1.0] * (config.n_routed_experts - 2)) / inv_rms
    i["gate_w"] = w
    i["tid2eid"][int(i["input_ids"][0])] = torch.arange(config.num_experts_per_tok, dtype=torch.int32)

    logits = torch.tensor([-20.0, -30.0])
    separates("a softplus that keeps its negative tail", torch.nn.functional.softplus(logits).sqrt(),
              naive_log_one_plus_exp=torch.log(1 + torch.exp(logits)).sqrt(),
              relu=logits.clamp_min(0).sqrt())
    out = _call(backend, config, i, 0)
    assert float(out["weights"][0, 0]) > 0 and float(out["weights"][0, 1]) > 0, \
        f"weights {out['weights'][0, :2].tolist()}: the tail experts scored 0"
    _judge(config, out, _independent(config, i, 0), i)


def test_padding_rows_route_nowhere(backend):
    """num_tokens = 0: scale, routes and weights are zero (x_norm_i8 is unchecked: no tile is active);
    num_tokens = T: no row is. Spec: §8."""
    config = MODELS[0]
    i = _inputs(config, 8, num_tokens=0)
    out = _call(backend, config, i, 61)
    assert all(bool((out[name] == 0).all()) for name in ("x_norm_scale", "indices", "weights"))
    full = _call(backend, config, dict(i, num_tokens=T), 61)
    assert bool((full["x_norm_scale"] > 0).all()) and bool((full["weights"] > 0).all())


@pytest.mark.parametrize("field, change, layer, needle", [
    ("num_tokens", T + 1, 61, "an int in [0, 8]"),
    ("num_tokens", True, 61, "an int in [0, 8]"),
    ("layer_id", 62, 62, "an int in [0, 61]"),
    ("input_ids", torch.tensor([0, 1, 2, VOCAB_ROWS, 4, 5, 6, 7]), 1, "input_ids[3]: expected a token id in [0, 32)"),
    ("input_ids", torch.tensor([0, 1, 2, -1, 4, 5, 6, 7]), 1, "input_ids[3]: expected a token id in [0, 32)"),
    ("tid2eid", "narrow", 1, "tid2eid/input_ids"),
    ("tid2eid", "bad-expert", 1, "expert ids in [0, 16)"),
    ("gate_w", "short", 61, "gate_w/gate_bias"),
    ("norm_w", "short", 61, "x_mixed/norm_w"),
])
def test_bad_inputs_name_the_field(backend, field, change, layer, needle):
    config = MODELS[0]
    i = _inputs(config, 9)
    if change == "narrow":
        i["tid2eid"] = i["tid2eid"][:, :-1]
    elif field == "tid2eid":
        i["tid2eid"] = i["tid2eid"].clone()
        i["tid2eid"][int(i["input_ids"][0]), 0] = config.n_routed_experts
    elif change == "short":
        i[field] = i[field][..., :-1]
    elif field != "layer_id":
        i[field] = change
    with pytest.raises(ContractInputError) as exc:
        _call(backend, config, i, layer)
    assert field in str(exc.value) and needle in str(exc.value), str(exc.value)


def test_a_score_layer_never_reads_the_hash_table(backend):
    """Past the hash layers the token ids and tid2eid are not read: ids out of the table and a table of -1 are
    accepted, and the routes are the scores'. Spec: §8."""
    config = MODELS[0]
    i = _inputs(config, 10)
    want = _independent(config, i, config.num_hash_layers)
    i["tid2eid"] = torch.full_like(i["tid2eid"], -1)
    i["input_ids"] = torch.full((T,), 10**6)
    _judge(config, _call(backend, config, i, config.num_hash_layers), want, i)


def test_a_zero_row_keeps_the_amax_floor(backend):
    """An all-zero row: codes 0 and the factor 1e-4 · (1/127) · inv_rms with inv_rms = 1 / sqrt(eps) -- the 1e-4
    amax floor, not a 0 or a NaN. Spec: §8."""
    config = MODELS[0]
    i = _inputs(config, 11)
    i["x_mixed"] = i["x_mixed"].clone()
    i["x_mixed"][2] = 0
    out = _call(backend, config, i, config.num_hidden_layers)
    want = torch.tensor(1e-4) * torch.tensor(1 / 127, dtype=torch.float32) * torch.rsqrt(torch.tensor(1e-6))
    assert bool((out["x_norm_i8"][2] == 0).all()) and torch.equal(out["x_norm_scale"][2, 0], want), \
        f"zero row: factor {float(out['x_norm_scale'][2, 0])}, expected {float(want)}"


def test_tied_experts_go_to_the_lower_id(backend):
    """Experts 9 and 4 with identical gate rows and biases (exactly tied scores), both inside the top-k: 4 comes
    before 9 in every row. Spec: §8."""
    config = MODELS[0]
    i = _inputs(config, 12)
    i["gate_w"] = i["gate_w"].clone()
    i["gate_w"][9] = i["gate_w"][4]
    i["gate_bias"] = torch.zeros(config.n_routed_experts)
    i["gate_bias"][[4, 9]] = 5.0
    out = _call(backend, config, i, config.num_hidden_layers)
    n = i["num_tokens"]
    assert out["indices"][:n, :2].tolist() == [[4, 9]] * n, out["indices"][:n, :2].tolist()


@pytest.mark.parametrize("num_tokens", [1, 6])
def test_padding_rows_inside_the_active_tile_hold_their_codes(backend, num_tokens):
    """Upstream codes every row of the gate's active 16-row tile and zeroes only the padding rows' scale, routes
    and weights; its comparator checks x_norm_i8 on every row below gate_active_rows. So the padding rows of
    x_norm_i8 (T = 8 < 16: every row) must hold their own codes, not zeros, and the judge tells the two rules
    apart: the former rule (``padding_codes="zero"``, kept by name) fails it. Spec: §8; docs/upstream.md."""
    config = MODELS[0]
    i = _inputs(config, 9, num_tokens=num_tokens)
    want = _independent(config, i, 61)
    out = _call(backend, config, i, 61)
    _judge(config, out, want, i)
    assert bool((out["x_norm_i8"][num_tokens:] != 0).any()), "padding rows of the active tile hold no codes"
    zero = v4_gate(i["x_mixed"], i["norm_w"], i["gate_w"], i["gate_bias"], 61, num_tokens, i["tid2eid"],
                   i["input_ids"], config=config, padding_codes="zero")
    assert bool((zero["x_norm_i8"][num_tokens:] == 0).all()), "the named 'zero' variant codes its padding rows"
    with pytest.raises(AssertionError, match="padding row inside the active tile"):
        _judge(config, zero, want, i)


def test_rows_past_the_active_tile_are_not_judged():
    """With T = 24 and num_tokens = 6 the active tile is rows 0..15: rows 16..23 of x_norm_i8 may hold anything
    (upstream's comparator does not read them), rows 6..15 may not. Spec: §8."""
    config = MODELS[0]
    i = _inputs(config, 10, num_tokens=6)
    g = torch.Generator().manual_seed(11)
    i["x_mixed"] = torch.randn(24, config.hidden_size, generator=g).to(torch.bfloat16)
    i["input_ids"] = torch.zeros(24, dtype=torch.int64)
    want = _independent(config, i, 61)
    out = v4_gate(i["x_mixed"], i["norm_w"], i["gate_w"], i["gate_bias"], 61, 6, i["tid2eid"], i["input_ids"],
                  config=config)
    assert active_rows(6, 24) == 16
    past = {k: v.clone() for k, v in out.items()}
    past["x_norm_i8"][16:] = 7
    _judge(config, past, want, i)
    inside = {k: v.clone() for k, v in out.items()}
    inside["x_norm_i8"][15] = 0
    with pytest.raises(AssertionError, match="row 15"):
        _judge(config, inside, want, i)


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
def test_the_dispatch_codes_round_half_to_even(backend, config):
    """Token 0's normalized row (norm weight 1) holds 127, 2.5, -0.5, 126.5 and 3.5, the rest 0: amax 127 makes
    the quantization factor exactly 1, so the INT8 dispatch codes are the values rounded. Half to even gives
    127, 2, 0, 126, 4; computed alternatives: half away from zero (127, 3, -1, 127, 4), toward zero and floor
    (both 3 for 3.5). Spec: §8 (the dispatch INT8 codes)."""

    i = _inputs(config, 11, num_tokens=T)
    row = torch.tensor([127.0, 2.5, -0.5, 126.5, 3.5])
    x = i["x_mixed"].clone()
    x[0] = 0
    x[0, :5] = row.to(torch.bfloat16)
    i.update(x_mixed=x, norm_w=torch.ones_like(i["norm_w"]))
    want = separates("dispatch codes round half to even", torch.round(row).to(torch.int8),
                     half_away=(row.sign() * (row.abs() + 0.5).floor()).to(torch.int8),
                     toward_zero=row.trunc().to(torch.int8), floor=row.floor().to(torch.int8))
    out = _call(backend, config, i, 0)
    got = out["x_norm_i8"][0, :5]
    assert torch.equal(got, want), f"token 0 codes {got.tolist()}, expected {want.tolist()} (half to even)"
    assert not bool(out["x_norm_i8"][0, 5:].ne(0).any()), "the zero elements code to 0"


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:GATE_BIAS_IN_WEIGHTS", "test_the_bias_chooses_but_does_not_weigh", "weights"),
    shared("v4:GATE_HASH_BY_SCORE", "test_the_first_layers_route_by_token_id", "routes by token id = False"),
    shared("v4:GATE_SCALE_RECIPROCAL", "test_the_dispatch_scale_is_amax_over_127_times_the_rms", "not the 'product' rule"),
    shared("v4:GATE_NAIVE_SOFTPLUS", "test_the_softplus_keeps_its_negative_tail", "the tail experts scored 0"),
    shared("v4:GATE_PADDING_ROUTED", "test_padding_rows_route_nowhere", "assert"),
    shared("v4:GATE_PADDING_CODES_ZERO", "test_padding_rows_inside_the_active_tile_hold_their_codes", "a padding row inside the active tile"),
]
