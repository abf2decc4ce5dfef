"""V4's decode output projection from the heads (``v4_heads_projection``): the FP32 grouped latent, one INT8 row per
(token, group), the W8A8 wo_b. Judged against the unquantised product worked out here in FP64 (each group's INT8
step); a worked-out hand vector separates the per-group FP32 rule from the BF16 latent and the per-token row (the
drafter's projection); and ``v4_output_projection`` is this projection of ``output_heads``. Golden case and bad
calls: the record in ``kernels/v4/heads_projection.py``. Spec: §8."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.compare import COMPARATORS, Context
from contracts.separation import separates
from kernels.config import V4_FLASH_TINY
from kernels.record import int8_codes
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

C = V4_FLASH_TINY
H, HD, G, LORA, D = C.num_attention_heads, C.head_dim, C.o_groups, C.o_lora_rank, C.hidden_size


def _weights(g: torch.Generator):
    wo_a = (torch.randn(G, LORA, H // G * HD, generator=g) / (H // G * HD) ** 0.5).to(torch.bfloat16)
    return wo_a, int8_codes((D, G * LORA), g), torch.rand(D, generator=g) / 127 + 1e-4


@pytest.mark.operators("v4_heads_projection")
@given(tokens=st.integers(1, 5), seed=st.integers(0, 2**31), scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_attn_out_is_the_fp32_latent_through_wo_b_within_each_groups_int8_step(backend, tokens, seed, scale):
    """Any row count and head scale: attn_out [T, D] BF16, each element within what each group's INT8 row can move
    it from the unquantised Σ_k latent[k] · wo_b[d, k] · wo_b_scale[d] (FP64 here, the latent unrounded): half a
    code step of its group (amax_g / 254) per term, plus the BF16 rounding (2^-8 relative)."""
    g = torch.Generator().manual_seed(seed)
    heads = (torch.randn(tokens, H, HD, generator=g) * scale).to(torch.bfloat16)
    wo_a, wo_b, wo_b_scale = _weights(g)
    got = op(backend, "v4_heads_projection")(heads, wo_a, wo_b, wo_b_scale, config=C)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (tokens, D), \
        f"attn_out {got.dtype}{list(got.shape)}, expected bfloat16[{tokens}, {D}] (§8)"
    x = heads.double().reshape(tokens, G, -1)
    lat = (x.unsqueeze(2) * wo_a.double().unsqueeze(0)).sum(-1)  # [T, G, O_LORA]
    w = wo_b.double().reshape(D, G, LORA)
    want = torch.einsum("tgr,dgr->td", lat, w) * wo_b_scale.double()
    step = lat.abs().amax(-1).clamp_min(C.int8_amax_eps) / 254  # [T, G]
    slack = torch.einsum("tg,dg->td", step, w.abs().sum(-1)) * wo_b_scale.double() * 1.001
    bound = slack + want.abs() * 2.0**-8
    bad = ~((got.double() - want).abs() <= bound)
    if bool(bad.any()):
        t, d = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"attn_out[{t}][{d}] = {float(got[t, d])}, expected {float(want[t, d]):.6g} within "
                             f"{float(bound[t, d]):.3g}: the FP32 latent through wo_b, one INT8 row per (token, "
                             "group) (§8)")


@pytest.mark.operators("v4_heads_projection")
def test_a_hand_vector_separates_the_group_rows_and_the_fp32_latent(backend):
    """Two heads of 2 in two groups of one latent, D 2: heads (1/2, 0.6015625 | 1.5, 1), wo_a rows (1.0078125,
    0.296875) and (0.30078125, -1): latents 0.6824951171875 and -0.548828125 in FP32. One INT8 row per group: each
    latent is its own amax, code ±127, so attn_out = wo_b · latent = (7 · 0.68250 - 3 · 0.54883, 2 · 0.68250 -
    0.54883) = (3.1310, 0.8162) -> (3.125, 0.81640625) in BF16. Separated from the latent staged in BF16 (0.68359375:
    3.140625), and from one INT8 row per token, staged (the drafter's) or not."""
    c = replace(C, num_attention_heads=2, head_dim=2, o_groups=2, o_lora_rank=1, hidden_size=2)
    bf = torch.bfloat16
    heads = torch.tensor([[[0.5, 0.6015625], [1.5, 1.0]]], dtype=bf)
    wo_a = torch.tensor([[[1.0078125, 0.296875]], [[0.30078125, -1.0]]], dtype=bf)
    wo_b, scale = torch.tensor([[7, 3], [2, 1]], dtype=torch.int8), torch.ones(2)
    lat = torch.einsum("gk,gk->g", heads[0].double(), wo_a[:, 0].double())
    assert lat.tolist() == [0.6824951171875, -0.548828125], "the worked-out latents"

    def project(latent, rows):
        out = torch.zeros(2, dtype=torch.float32)
        for cols in rows:
            v = latent[cols].float()
            quant = torch.tensor(127.0) / v.abs().amax()
            out = out + (wo_b[:, cols].double() @ torch.round(v * quant).double()).float() * torch.reciprocal(quant)
        return out.to(bf)

    staged = lat.float().to(bf).double()
    want = torch.tensor([3.125, 0.81640625], dtype=bf)
    assert torch.equal(project(lat, [[0], [1]]), want), "the worked-out attn_out is not the rule's"
    separates("the per-group FP32 projection", want, bf16_latent=project(staged, [[0], [1]]),
              token_row_bf16=project(staged, [[0, 1]]), token_row_fp32=project(lat, [[0, 1]]))
    got = op(backend, "v4_heads_projection")(heads, wo_a, wo_b, scale, config=c)
    assert torch.equal(got[0], want), f"attn_out {got.tolist()}, expected {want.tolist()}: the latent kept in FP32, " \
                                      "one INT8 row per (token, group) (§8)"


@pytest.mark.operators("v4_heads_projection", "v4_output_projection")
def test_the_output_projection_is_this_projection_of_the_rounded_heads(backend):
    """On the backend's own operators: v4_output_projection(o) is v4_heads_projection of o's heads (the nope dims
    rounded, the rope dims inversely rotated with each token's row, then rounded: output_heads), within the
    attention-output bound."""
    from kernels.v4.sparse_attention import output_heads

    g = torch.Generator().manual_seed(11)
    o = torch.randn(6, H, HD, generator=g)
    angle = torch.rand(6, C.qk_rope_head_dim, generator=g) * 6
    cos, sin = torch.cos(angle).to(torch.bfloat16), torch.sin(angle).to(torch.bfloat16)
    wo_a, wo_b, wo_b_scale = _weights(g)
    whole = op(backend, "v4_output_projection")(o, cos, sin, wo_a, wo_b, wo_b_scale, config=C)
    parts = op(backend, "v4_heads_projection")(output_heads(o, cos, sin, config=C), wo_a, wo_b, wo_b_scale, config=C)
    verdict = COMPARATORS["attn_out_v4"]("attn_out", whole, parts, Context(inputs={}, actual_outputs={},
                                                                           expected_outputs={}, params={}))
    assert verdict.ok, f"v4_output_projection is not v4_heads_projection of output_heads: {verdict}"


# --- seeded defects ------------------------------------------------------------------------------------------

def _bf16_latent(heads, wo_a, wo_b, wo_b_scale, *, config):
    from kernels.v4.heads_projection import project_heads

    return project_heads(heads, wo_a, wo_b, wo_b_scale, config=config, latent="bf16", rows="group")


def _wo_b_groups_swapped(heads, wo_a, wo_b, wo_b_scale, *, config):
    from kernels.v4.heads_projection import v4_heads_projection

    swapped = wo_b.reshape(wo_b.shape[0], config.o_groups, -1).flip(1).reshape(wo_b.shape)
    return v4_heads_projection(heads, wo_a, swapped, wo_b_scale, config=config)


SEEDED_DEFECTS = [
    SeededDefect("v4-heads-projection:bf16-latent", "v4_heads_projection", _bf16_latent,
                 "test_a_hand_vector_separates_the_group_rows_and_the_fp32_latent", "kept in FP32"),
    SeededDefect("v4-heads-projection:wo-b-groups-swapped", "v4_heads_projection", _wo_b_groups_swapped,
                 "test_attn_out_is_the_fp32_latent_through_wo_b_within_each_groups_int8_step", "attn_out["),
]


@pytest.mark.operators("v4_heads_projection")
@pytest.mark.parametrize("case, field", [("heads of another head count", "heads"), ("FP32 heads", "heads"),
                                         ("wo_a of another rank", "wo_a"), ("BF16 wo_b", "wo_b"),
                                         ("wo_b_scale short", "wo_b_scale")])
def test_a_malformed_call_is_refused_naming_its_field(backend, case, field):
    """Heads [T, H, hd] BF16, wo_a [G, O_LORA, H/G·hd] BF16, wo_b [D, G·O_LORA] INT8, wo_b_scale [D]."""
    from kernels.errors import ContractInputError

    g = torch.Generator().manual_seed(1)
    wo_a, wo_b, wo_b_scale = _weights(g)
    i = dict(heads=torch.ones(2, H, HD, dtype=torch.bfloat16), wo_a=wo_a, wo_b=wo_b, wo_b_scale=wo_b_scale)
    change = {"heads of another head count": dict(heads=i["heads"][:, 1:]), "FP32 heads": dict(heads=i["heads"].float()),
              "wo_a of another rank": dict(wo_a=wo_a[:, 1:]), "BF16 wo_b": dict(wo_b=wo_b.to(torch.bfloat16)),
              "wo_b_scale short": dict(wo_b_scale=wo_b_scale[1:])}[case]
    with pytest.raises(ContractInputError) as exc:
        op(backend, "v4_heads_projection")(**{**i, **change}, config=C)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"
