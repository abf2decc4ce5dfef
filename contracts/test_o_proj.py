"""The attention output projection of a rank (``o_proj``): inverse RoPE, grouped Wo-A with FP32 accumulation
and one BF16 rounding, Wo-B to an FP32 partial. Hand vectors for the BF16 boundary and the rotation
direction; the per-row bound against the reference at tiny and FLASH per-rank geometry (16 heads x 512,
2 groups, O_LORA 1024 at TP4); bad input. Spec: §7.1; upstream_checks RR-12, AP-09, AP-10.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from backends import torch_backend
from contracts.checks.precision import check_row_precision
from pto_pytest.defect import SeededDefect, reference_edit
from pto_pytest.plugin import op

REF = torch_backend()


def _identity_tables(tokens: int, half: int):
    return torch.ones(tokens, half), torch.zeros(tokens, half)


def _bf16(v: torch.Tensor, mode: str) -> torch.Tensor:
    """FP32 -> BF16 values (as FP32) under a rounding ``mode``: even (the device's), away (ties away from zero),
    trunc (toward zero), none (kept FP32). Positive inputs only for away/trunc."""
    if mode == "none":
        return v.float()
    if mode == "even":
        return v.float().to(torch.bfloat16).float()
    bits = v.float().view(torch.int32)
    if mode == "away":
        bits = bits + 0x8000
    return (bits & ~0xFFFF).view(torch.float32)


@pytest.mark.operators("o_proj")
def test_o_proj_rounds_the_grouped_latent_to_bf16(backend):
    """Hand-computed: 2 tokens, 2 heads x 4 dims, one group, O_LORA 2, Wo-B = [[1], [-1]], so the partial is
    BF16(latent 0) - BF16(latent 1) with latent 1 = 1. Latent 0 = 1 + 2^-8 (token 0) and 1 + 3·2^-8 (token 1),
    exact in FP32 and both BF16 ties: half to even gives 1 and 1 + 2^-6, so partials 0 and 2^-6. Computed
    alternatives: no BF16 rounding (2^-8, 3·2^-8), ties away (2^-7, 2^-6), toward zero (0, 2^-7). The partial
    is FP32. Spec: AP-09, AP-10."""
    from contracts.separation import separates

    x = torch.tensor([[[1.0, 2.0**-8, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
                      [[1.0, 3 * 2.0**-8, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]]).to(torch.bfloat16)
    w = torch.zeros(1, 2, 8)
    w[0, 0, 0], w[0, 0, 1], w[0, 1, 0] = 1.0, 1.0, 1.0
    latent0 = torch.tensor([1 + 2.0**-8, 1 + 3 * 2.0**-8])

    def partial(mode):
        return _bf16(latent0, mode) - _bf16(torch.ones(2), mode)

    want = separates("the grouped latent rounded to BF16, ties to even", partial("even"),
                     no_latent_rounding=partial("none"), ties_away=partial("away"), toward_zero=partial("trunc"))
    cos, sin = _identity_tables(2, 1)
    out = op(backend, "o_proj")(x, cos, sin, w.to(torch.bfloat16), torch.tensor([[1.0], [-1.0]]))
    assert out.dtype == torch.float32 and out.shape == (2, 1), f"{out.dtype}{list(out.shape)}"
    assert torch.equal(out[:, 0], want), \
        f"partials {out[:, 0].tolist()}: expected {want.tolist()} (latents 1 + 2^-8, 1 + 3·2^-8 round to BF16 1, 1 + 2^-6)"


@pytest.mark.operators("o_proj")
def test_o_proj_stages_the_latent_in_fp32_before_bf16(backend):
    """Staging that the data reaches: one token whose latent is 1 + 2^-8 + 2^-30 exactly (x = [1, 2^-8, 2^-30, 0],
    all exact in BF16, Wo-A ones), Wo-B = [[1], [-1]] against a latent of 1. The latent accumulates in FP32, where
    2^-30 is below half an ulp of 1: 1 + 2^-8, a BF16 tie, to even 1, so the partial is 0. Computed alternatives:
    the exact sum rounded to BF16 once (above the tie: 1 + 2^-7, partial 2^-7; torch's own FP64 -> BF16
    cast goes through FP32, so the test rounds it with bf16_once) and no BF16 rounding (2^-8 + 2^-30
    in FP32: 2^-8). Spec: AP-09 (the FP32 matmul, then one BF16 cast)."""
    from contracts.separation import bf16_once, separates

    x = torch.tensor([[[1.0, 2.0**-8, 2.0**-30, 0.0], [0.0, 0.0, 0.0, 0.0]]]).to(torch.bfloat16)
    assert x[0, 0, 2].item() == 2.0**-30, "2^-30 is exact in BF16"
    w = torch.zeros(1, 2, 8)
    w[0, 0, :3], w[0, 1, 0] = 1.0, 1.0
    exact = torch.tensor([1 + 2.0**-8 + 2.0**-30], dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    staged = exact.float().to(torch.bfloat16).float() - 1.0
    want = separates("the latent accumulated in FP32, then one BF16 cast", staged,
                     exact_sum_to_bf16=(bf16_once(exact).double() - one).float(),
                     no_bf16=(exact - one).float())
    cos, sin = _identity_tables(1, 1)
    out = op(backend, "o_proj")(x, cos, sin, w.to(torch.bfloat16), torch.tensor([[1.0], [-1.0]]))
    assert torch.equal(out[:, 0], want), \
        f"partial {out[:, 0].tolist()}: expected {want.tolist()} (FP32 1 + 2^-8, a BF16 tie, rounds to even 1)"


@pytest.mark.operators("o_proj")
def test_o_proj_applies_the_inverse_rotation(backend):
    """Inputs rotated forward by 90 degrees (exact: (a, b) -> (-b, a)) with tables (cos 0, sin 1) give exactly the
    output of the unrotated inputs with identity tables; a forward rotation would give (-a, -b). Spec: RR-12."""
    g = torch.Generator().manual_seed(2)
    tokens, heads, dim, half = 3, 4, 16, 4
    x = torch.randn(tokens, heads, dim, generator=g).to(torch.bfloat16)
    rotated = x.clone()
    tail = x[..., -2 * half:].unflatten(-1, (-1, 2))
    rotated[..., -2 * half:] = torch.stack((-tail[..., 1], tail[..., 0]), dim=-1).flatten(-2)
    wo_a = torch.randn(2, 8, heads * dim // 2, generator=g).to(torch.bfloat16)
    wo_b = torch.randn(16, 32, generator=g)
    proj = op(backend, "o_proj")
    want = proj(x, *_identity_tables(tokens, half), wo_a, wo_b)
    got = proj(rotated, torch.zeros(tokens, half), torch.ones(tokens, half), wo_a, wo_b)
    assert torch.equal(got, want), "rotating the inputs by 90 degrees and undoing it changed the partial"


def _bound_case(backend, geometry, seed, tokens):
    heads, dim, groups, lora, hidden = geometry
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, heads, dim, generator=g).to(torch.bfloat16)
    angles = torch.rand(tokens, 32, generator=g) * 6.3
    wo_a = (torch.randn(groups, lora, heads * dim // groups, generator=g) * (heads * dim / groups) ** -0.5)
    wo_b = torch.randn(groups * lora, hidden, generator=g) * (groups * lora) ** -0.5
    args = (x, angles.cos(), angles.sin(), wo_a.to(torch.bfloat16), wo_b)
    got, want = op(backend, "o_proj")(*args), REF.get("o_proj")(*args)
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    result = check_row_precision(got, want, name="o_proj")
    assert result.ok, result.message()


@given(seed=st.integers(0, 2**31), tokens=st.integers(1, 3))
@pytest.mark.operators("check_row_precision", "o_proj")
def test_o_proj_within_the_row_bound_of_the_reference(backend, seed, tokens):
    """At tiny geometry (4 heads x 64, 2 groups): the FP32 partial of every token within the per-row RMS/peak
    bound of the reference, with real rotations at random positions. Spec: §6, §7.1."""
    _bound_case(backend, (4, 64, 2, 32, 96), seed, tokens)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.operators("check_row_precision", "o_proj")
def test_o_proj_within_the_row_bound_at_flash_geometry(backend, seed):
    """The same at FLASH per-rank geometry for TP4: 16 heads x 512, 2 groups of 4096, O_LORA 1024, hidden 5120."""
    _bound_case(backend, (16, 512, 2, 1024, 5120), seed, 2)


@pytest.mark.parametrize("what", ["fp32 attended", "table rows", "wo_a groups", "wo_b rows", "table wider than a head",
                                  "groups not dividing the heads"])
@pytest.mark.operators("o_proj")
def test_o_proj_rejects_bad_input(backend, what):
    """Bad shapes and dtypes raise a ValueError naming the field. Spec: §7.1."""
    x = torch.zeros(2, 4, 16, dtype=torch.bfloat16)
    cos, sin = _identity_tables(2, 4)
    wo_a, wo_b = torch.zeros(2, 8, 32, dtype=torch.bfloat16), torch.zeros(16, 8)
    args = [x, cos, sin, wo_a, wo_b]
    field = {"fp32 attended": 0, "table rows": 1, "wo_a groups": 3, "wo_b rows": 4, "table wider than a head": 1,
             "groups not dividing the heads": 3}[what]
    name = ["attended", "rope_cos", "rope_sin", "wo_a", "wo_b"][field]
    args[field] = {"fp32 attended": x.float(), "table rows": cos[:1], "wo_a groups": torch.zeros(3, 8, 32),
                   "wo_b rows": wo_b[:15], "table wider than a head": torch.ones(2, 9),
                   "groups not dividing the heads": torch.zeros(3, 8, 21, dtype=torch.bfloat16)}[what]
    if what == "table wider than a head":
        args[2] = torch.zeros(2, 9)
    with pytest.raises(ValueError, match=name):
        op(backend, "o_proj")(*args)


@pytest.mark.operators("o_proj")
def test_o_proj_rounds_the_unrotated_heads_to_bf16(backend):
    """Hand-computed: the rope pair (1, 0) under cos 0.6, sin 0.8 un-rotates to (0.6, -0.8), which the device
    stores as BF16 (0.6015625, -0.80078125); a Wo-A row summing both gives exactly -0.19921875. Summing the
    FP32 values instead gives -0.2 and BF16 -0.2001953125. Spec: RR-12, AP-09 (BF16 unrotated heads)."""
    from contracts.separation import separates

    x = torch.tensor([[[0.0, 0.0, 1.0, 0.0]]]).to(torch.bfloat16)  # one head, D 4, the rope pair is dims 2..3
    w = torch.tensor([[[0.0, 0.0, 1.0, 1.0]]]).to(torch.bfloat16)  # one group, O_LORA 1
    c, s_ = torch.tensor(0.6), torch.tensor(0.8)

    def latent(pair, heads_mode):  # the one latent (= the partial, Wo-B = [[1]]): BF16(head sum)
        return _bf16(_bf16(pair[0], heads_mode) + _bf16(pair[1], heads_mode), "even").reshape(1, 1)

    inverse, forward = (c, -s_), (c, s_)  # (1, 0) rotated back, and forward
    want = separates("BF16 unrotated heads", latent(inverse, "even"), heads_kept_fp32=latent(inverse, "none"),
                     forward_rotation=latent(forward, "even"))
    out = op(backend, "o_proj")(x, torch.tensor([[0.6]]), torch.tensor([[0.8]]), w, torch.tensor([[1.0]]))
    assert out.item() == want.item() == -0.19921875, \
        f"partial {out.item()!r}: expected -0.19921875 (BF16 unrotated heads)"


def test_the_qkv_projection_is_an_fp32_gemm_with_one_bf16_cast():
    """The half-layer's Q / KV / compressor projection (``project``): products and sums in full precision,
    rounded once to FP32, and the caller rounds to BF16 once at the boundary. Hand vector: x = [1, 2^-9,
    2^-9, 2^-9] against a column of ones gives exactly 1 + 3·2^-9 in FP32 and 1 + 2^-7 after the one BF16
    cast; a GEMM accumulating in BF16 (each partial sum rounded) stays at 1.0. Spec: AP-10."""
    from kernels.reference.compressor import project

    x = torch.tensor([[1.0, 2.0**-9, 2.0**-9, 2.0**-9]])
    w = torch.ones(4, 1)
    out = project(x, w)
    assert out.dtype == torch.float32 and out.item() == 1 + 3 * 2.0**-9
    assert out.to(torch.bfloat16).item() == 1 + 2.0**-7
    from contracts.separation import separates

    acc = torch.zeros((), dtype=torch.bfloat16)
    for v in x[0]:
        acc = (acc + v.to(torch.bfloat16)).to(torch.bfloat16)
    separates("an FP32 GEMM, one BF16 cast", out.to(torch.bfloat16).reshape(()), bf16_accumulating_gemm=acc)


SEEDED_DEFECTS = [
    SeededDefect("o-proj:latent-rounded-once", "o_proj",
                 reference_edit("kernels.reference.o_proj:o_proj",
                                'torch.einsum("tgk,gnk->tgn", x, wo_a.to(torch.float64)).to(torch.float32)',
                                '__import__("contracts.separation", fromlist=["bf16_once"]).bf16_once('
                                'torch.einsum("tgk,gnk->tgn", x, wo_a.to(torch.float64)))'),
                 "test_o_proj_stages_the_latent_in_fp32_before_bf16", "FP32 1 + 2^-8"),
]
