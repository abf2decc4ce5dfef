"""V4's Q/KV LoRA projection with RoPE (``v4_qkv_proj_rope``), on V4-Pro and V4-Flash (tiny twins).

Against an FP64 evaluation written here, and on inputs that separate each rule from its plausible port: the
query built from the INT8 ``qr`` codes (not from the FP32 normalised row), one weightless RMSNorm per query
head (not across heads), the KV weight applied before the rotation, the eps inside the root.

Spec: §8; docs/coverage.md, V4 section (V4-20).
"""

from __future__ import annotations

import pytest
import torch

from contracts.checks.precision import check_ratio_allclose
from contracts.separation import separates
from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
from kernels.errors import ContractInputError
from pto_pytest.defect import shared
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("v4_qkv_proj_rope")  # every contract here calls it, and only it

MODELS = [V4_PRO_TINY, V4_FLASH_TINY]
ULP = 2.0**-8  # one BF16 step, relative


def _inputs(config, seed: int = 0, *, scale: float = 1.0, q_scale: float = 1.0, tokens: int = 8) -> dict:
    g = torch.Generator().manual_seed(seed)
    hidden, lora, h, d, rope = (config.hidden_size, config.q_lora_rank, config.num_attention_heads, config.head_dim,
                                config.qk_rope_head_dim)
    angle = torch.rand(tokens, 1, generator=g) * 300 * torch.rand(rope, generator=g)
    return dict(
        x=(torch.randn(tokens, hidden, generator=g) * scale).to(torch.bfloat16),
        wq_a=(torch.randn(hidden, lora, generator=g) / hidden**0.5).to(torch.bfloat16),
        wq_b=torch.randint(-127, 128, (lora, h * d), generator=g, dtype=torch.int8),
        wq_b_scale=(torch.rand(h * d, generator=g) / 127 + 1e-3) * q_scale,
        wkv=(torch.randn(hidden, d, generator=g) / hidden**0.5).to(torch.bfloat16),
        rope_cos=torch.cos(angle).to(torch.bfloat16), rope_sin=torch.sin(angle).to(torch.bfloat16),
        gamma_cq=(torch.rand(lora, generator=g) + 0.5).to(torch.bfloat16),
        gamma_ckv=(torch.rand(d, generator=g) + 0.5).to(torch.bfloat16),
    )


def _call(backend, config, inputs):
    return op(backend, "v4_qkv_proj_rope")(**inputs, config=config)


def _independent(config, i):
    """FP64 throughout, rounding only where the ABI rounds (INT8 codes, BF16 outputs)."""
    d, rope, eps, h = config.head_dim, config.qk_rope_head_dim, config.rms_norm_eps, config.num_attention_heads
    x = i["x"].double()
    half = rope // 2
    cos, sin = i["rope_cos"][:, :half].double(), i["rope_sin"][:, :half].double()

    def rot(n, c, s):
        out = n.clone()
        out[..., 0::2], out[..., 1::2] = n[..., 0::2] * c - n[..., 1::2] * s, n[..., 0::2] * s + n[..., 1::2] * c
        return out

    qr = x @ i["wq_a"].double()
    normed = qr / torch.sqrt((qr * qr).mean(-1, keepdim=True) + eps) * i["gamma_cq"].double()
    amax = normed.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    codes = torch.round(normed * 127 / amax)
    q = (codes @ i["wq_b"].double()) * (amax / 127) * i["wq_b_scale"].double()
    q = q.reshape(-1, h, d)
    q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + eps)
    q = torch.cat((q[..., : d - rope], rot(q[..., d - rope:], cos[:, None], sin[:, None])), -1)
    kv = x @ i["wkv"].double()
    n = kv / torch.sqrt((kv * kv).mean(-1, keepdim=True) + eps) * i["gamma_ckv"].double()
    kv = torch.cat((n[:, : d - rope], rot(n[:, d - rope:], cos, sin)), -1)
    return q, kv, codes, amax / 127


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
@pytest.mark.parametrize("scale, q_scale", [(1.0, 1.0), (1e-4, 1.0), (1.0, 1e-7)],
                         ids=["unit", "eps-dominated", "q-eps-dominated"])
def test_the_projection_matches_an_independent_evaluation(backend, config, scale, q_scale):
    """q and kv within one BF16 step of the FP64 evaluation (0.5 % quota), the INT8 qr codes within one code
    (at most 1 % of them off by one) and qr_scale within 1e-6 relative; at input scale 1e-4 the eps inside the
    qr and kv roots dominates, and with wq_b scales of 1e-7 the eps inside each query head's root does (so
    qr_scale no longer cancels in the head norm), and the same holds. Spec: §8."""
    i = _inputs(config, 1, scale=scale, q_scale=q_scale)
    out = _call(backend, config, i)
    q, kv, codes, qr_scale = _independent(config, i)
    assert out["q"].dtype == torch.bfloat16 and out["kv"].dtype == torch.bfloat16 and out["qr"].dtype == torch.int8
    for name, want in (("q", q), ("kv", kv)):
        r = check_ratio_allclose(out[name].double(), want, atol=1e-6, rtol=ULP, name=name)
        assert r.ok, r.message()
    off = (out["qr"].double() - codes).abs()
    assert float(off.max()) <= 1 and float((off > 0).double().mean()) <= 0.01, f"qr codes: {int((off > 0).sum())} off"
    rel = ((out["qr_scale"].double() - qr_scale).abs() / qr_scale).max()
    assert float(rel) <= 1e-6, f"qr_scale off by {float(rel):.3g} relative"


def test_the_query_is_built_from_the_int8_codes(backend):
    """Recomputing q from the returned qr codes and qr_scale (codes · wq_b · scales, weightless per-head RMS, the
    rotation) gives the returned q within one BF16 step everywhere; from the FP32 normalised row instead (the
    port without the INT8 step) it would differ by more in many elements. Spec: §8."""
    config = V4_PRO_TINY
    i = _inputs(config, 2)
    out = _call(backend, config, i)
    h, d, rope, eps = config.num_attention_heads, config.head_dim, config.qk_rope_head_dim, config.rms_norm_eps
    q = (out["qr"].double() @ i["wq_b"].double()) * out["qr_scale"].double() * i["wq_b_scale"].double()
    q = q.reshape(-1, h, d)
    q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + eps)
    half = rope // 2
    c, s = i["rope_cos"][:, None, :half].double(), i["rope_sin"][:, None, :half].double()
    a, b = q[..., d - rope::2].clone(), q[..., d - rope + 1::2].clone()
    q[..., d - rope::2], q[..., d - rope + 1::2] = a * c - b * s, a * s + b * c
    err = (out["q"].double() - q).abs() / q.abs().clamp_min(1e-6)
    assert float((err > ULP).double().mean()) <= 0.005, f"{int((err > ULP).sum())} elements of q are not the INT8 path"
    qr = i["x"].double() @ i["wq_a"].double()
    normed = qr / torch.sqrt((qr * qr).mean(-1, keepdim=True) + eps) * i["gamma_cq"].double()
    direct = ((normed @ i["wq_b"].double()) * i["wq_b_scale"].double()).reshape(-1, h, d)
    direct = direct / torch.sqrt((direct * direct).mean(-1, keepdim=True) + eps)
    gap = (direct[..., : d - rope] - q[..., : d - rope]).abs() / q[..., : d - rope].abs().clamp_min(1e-6)
    assert float((gap > ULP).double().mean()) > 0.05, "the input does not separate the INT8 path from the FP32 one"


def test_each_query_head_is_normalised_on_its_own_without_a_weight(backend):
    """Scaling head 1's wq_b scales by 4 (a power of two) leaves every q bit-identical: each head's RMSNorm
    cancels its own scale, there is no weight, and no other head sees it (a norm across heads would move them
    all). Scaling by 3 leaves head 1 within one BF16 step. Spec: §8."""
    config = V4_FLASH_TINY
    i = _inputs(config, 3)
    base = _call(backend, config, i)
    d = config.head_dim
    for factor, exact in ((4.0, True), (3.0, False)):
        scaled = i["wq_b_scale"].clone()
        scaled[d:2 * d] *= factor
        out = _call(backend, config, dict(i, wq_b_scale=scaled))
        assert torch.equal(out["q"][:, [0] + list(range(2, config.num_attention_heads))],
                           base["q"][:, [0] + list(range(2, config.num_attention_heads))]), \
            f"scaling head 1 by {factor} moved another head: the norm must be per head"
        if exact:
            assert torch.equal(out["q"], base["q"]), "scaling head 1 by 4 must leave it bit-identical (per-head RMS)"
        else:
            err = (out["q"][:, 1].float() - base["q"][:, 1].float()).abs() / base["q"][:, 1].float().abs().clamp_min(1e-6)
            assert float(err.max()) <= 2 * ULP, f"head 1 moved by {float(err.max()):.3g} relative when scaled by 3"
        assert torch.equal(out["kv"], base["kv"]) and torch.equal(out["qr"], base["qr"])


def test_the_kv_weight_applies_before_the_rotation(backend):
    """With cos 0 and sin 1 the rotation maps each kv rope pair (a, b) to (-b, a) exactly: the returned pair is
    (-γ_odd · b̂, γ_even · â) for the normalised pair (â, b̂) -- the weight taken before the rotation; the weight
    taken after would give (-γ_even · b̂, γ_odd · â). γ differs on every pair here. Spec: §8."""
    config = V4_PRO_TINY
    i = _inputs(config, 4)
    d, rope, eps = config.head_dim, config.qk_rope_head_dim, config.rms_norm_eps
    i["rope_cos"] = torch.zeros_like(i["rope_cos"])
    i["rope_sin"] = torch.ones_like(i["rope_sin"])
    gamma = torch.ones(d)
    gamma[d - rope::2], gamma[d - rope + 1::2] = 0.5, 2.0
    i["gamma_ckv"] = gamma.to(torch.bfloat16)
    out = _call(backend, config, i)
    kv = (i["x"].double() @ i["wkv"].double()).float()
    unit = (kv.double() / torch.sqrt((kv.double() ** 2).mean(-1, keepdim=True) + eps))
    a, b = unit[:, d - rope::2], unit[:, d - rope + 1::2]
    got_even, got_odd = out["kv"][:, d - rope::2].double(), out["kv"][:, d - rope + 1::2].double()
    before = ((got_even + 2.0 * b).abs() <= ULP * (2.0 * b).abs() + 1e-6).all() and \
             ((got_odd - 0.5 * a).abs() <= ULP * (0.5 * a).abs() + 1e-6).all()
    assert bool(before), "the kv rope pair must be (-γ_odd·b, γ_even·a): the weight before the rotation"
    after = ((got_even + 0.5 * b).abs() <= ULP * (0.5 * b).abs() + 1e-6).all()
    assert not bool(after), "the input does not separate the weight's place"


def test_bad_projection_inputs_are_refused_naming_the_field(backend):
    """A wrong x width, a float wq_b, a short gamma, a RoPE table of the wrong length or narrower than rope/2, and
    FP32 where the ABI takes BF16 are refused; a table of exactly rope/2 columns is accepted. Spec: §8."""
    config = V4_PRO_TINY
    i = _inputs(config, 5)
    half = config.qk_rope_head_dim // 2
    _call(backend, config, dict(i, rope_cos=i["rope_cos"][:, :half], rope_sin=i["rope_sin"][:, :half]))  # [T, rope/2]
    for name, value in (("x", i["x"][:, :-1]), ("wq_b", i["wq_b"].float()), ("gamma_ckv", i["gamma_ckv"][:-1]),
                        ("rope_cos", i["rope_cos"][:-1]), ("rope_cos", i["rope_cos"][:, : half - 1]),
                        ("wq_a", i["wq_a"][:-1]), ("x", i["x"].float()), ("gamma_cq", i["gamma_cq"].float())):
        with pytest.raises(ContractInputError, match=name):
            _call(backend, config, dict(i, **{name: value}))


def test_a_zero_row_takes_the_amax_floor(backend):
    """A zero input row: qr is zero, its INT8 codes are 0 with qr_scale 1 / (127 / 1e-4) (the amax floor), and
    its q and kv are exactly zero. Spec: §8."""
    config = V4_PRO_TINY
    i = _inputs(config, 6)
    i["x"][2] = 0
    out = _call(backend, config, i)
    floor = (1.0 / (torch.tensor(127.0) / torch.tensor(1e-4))).item()
    assert bool((out["qr"][2] == 0).all()) and out["qr_scale"][2, 0].item() == floor, \
        f"zero row: qr_scale {out['qr_scale'][2, 0].item()} != {floor} (the 1e-4 amax floor)"
    assert bool((out["q"][2] == 0).all()) and bool((out["kv"][2] == 0).all())


@pytest.mark.parametrize("config", MODELS, ids=lambda c: c.name)
def test_the_qr_codes_round_half_to_even(backend, config):
    """Token 0's latent qr (x one-hot into row 0 of wq_a, gamma 1) is 2032, 40, -8, 2024, 56, twenty-four 1024s
    and 16, 256, 304: its mean square is 2^20 exactly, so the RMS factor is 2^-10, the amax 2032 · 2^-10 =
    127/64 and the quantization factor 64, and each code is qr / 16 with no rounding before the last step. The
    codes 2.5, -0.5, 126.5 and 3.5 round half to even (2, 0, 126, 4); computed alternatives: half away from zero
    (3, -1, 127, 4), toward zero (2, 0, 126, 3). Spec: §8 (INT8 latent codes)."""
    from contracts.separation import separates

    lora = config.q_lora_rank
    row = torch.tensor([2032.0, 40.0, -8.0, 2024.0, 56.0] + [1024.0] * 24 + [16.0, 256.0, 304.0])
    assert lora == row.numel(), f"the vector is built for q_lora_rank 32, this preset has {lora}: rebuild it"
    assert float((row.double() ** 2).mean()) == 2.0**20
    i = _inputs(config, 5)
    x = i["x"].clone()
    x[0] = 0
    x[0, 0] = 1.0
    wq_a = i["wq_a"].clone()
    wq_a[0] = row.to(torch.bfloat16)
    i.update(x=x, wq_a=wq_a, gamma_cq=torch.ones_like(i["gamma_cq"]))
    y = row / 16
    want = separates("INT8 latent codes round half to even", torch.round(y).to(torch.int8),
                     half_away=(y.sign() * (y.abs() + 0.5).floor()).to(torch.int8),
                     toward_zero=y.trunc().to(torch.int8))
    out = _call(backend, config, i)
    assert torch.equal(out["qr"][0], want), f"token 0 codes {out['qr'][0, :5].tolist()}, expected {want[:5].tolist()}"
    assert out["qr_scale"][0].item() == 1 / 64


def test_the_kv_projection_is_staged_in_fp32_before_the_norm_and_the_rotation(backend):
    """The KV projection is rounded to FP32 once, then normalised (the mean of squares in FP32 from an FP64 sum,
    the rsqrt at high precision) and rotated in FP32, then cast to BF16. Seed 47 of the V4-Pro twin's inputs is
    a vector where the other staging -- the projection kept in FP64 through the norm and the rotation -- gives
    another BF16 rope element (computed here); the operator's kv is the FP32-staged bytes exactly. Spec: §8
    (upstream's golden: (x @ wkv).float())."""
    config = V4_PRO_TINY
    d, rope, eps = config.head_dim, config.qk_rope_head_dim, config.rms_norm_eps
    i = _inputs(config, 47)
    cos, sin = i["rope_cos"][:, : rope // 2].float(), i["rope_sin"][:, : rope // 2].float()

    def staged(kv):
        mean = (kv.double().pow(2).sum(-1, keepdim=True).float() * (1.0 / d)).float()
        n = kv * torch.rsqrt((mean + eps).double()).float() * i["gamma_ckv"].float()
        a, b = n[:, d - rope::2], n[:, d - rope + 1::2]
        rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        return torch.cat((n[:, : d - rope].to(torch.bfloat16), rotated.to(torch.bfloat16)), dim=-1)

    kv64 = i["x"].double() @ i["wkv"].double()
    want = separates("§8 the kv projection staged in FP32", staged(kv64.float()), fp64_staging=staged(kv64))
    got = _call(backend, config, i)["kv"]
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), \
        f"{int((got != want).sum())} kv elements differ from the FP32-staged bytes"


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:Q_FROM_FP32_QR", "test_the_query_is_built_from_the_int8_codes", "not the INT8 path"),
    shared("v4:Q_NORM_ACROSS_HEADS", "test_each_query_head_is_normalised_on_its_own_without_a_weight", "the norm must be per head"),
    shared("v4:KV_GAMMA_AFTER_ROPE", "test_the_kv_weight_applies_before_the_rotation", "the weight before the rotation"),
]
