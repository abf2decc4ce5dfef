"""dspark's drafter output projection (``dspark_output_projection``): the heads' grouped latent staged in BF16, one
INT8 row per token over every group's latent, then the W8A8 wo_b. Judged against the unquantised product worked
out here in FP64 (within the INT8 step the spec allows); a worked-out hand vector separates the per-token row and
the BF16 staging from V4's decode projection (per-group rows, FP32 latent). Golden case and bad calls: the record
in ``kernels/v4/heads_projection.py``. Spec: §8."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import bf16_once, separates
from kernels.config import V4_FLASH_TINY
from kernels.record import int8_codes
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("dspark_output_projection")
C = V4_FLASH_TINY
H, HD, G, LORA, D = C.num_attention_heads, C.head_dim, C.o_groups, C.o_lora_rank, C.hidden_size


def _latent(heads, wo_a) -> torch.Tensor:
    """[T, G·O_LORA] FP64 of the spec's BF16 latent: Σ over the group's inputs, FP32, then BF16."""
    x = heads.double().reshape(heads.shape[0], wo_a.shape[0], -1)
    lat = (x.unsqueeze(2) * wo_a.double().unsqueeze(0)).sum(-1)  # [T, G, O_LORA]
    return lat.float().to(torch.bfloat16).double().reshape(heads.shape[0], -1)


@given(tokens=st.integers(1, 5), seed=st.integers(0, 2**31), scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_x_out_is_the_latent_through_wo_b_within_one_int8_step(backend, tokens, seed, scale):
    """Any row count and head scale: x_out [T, D] BF16, and each element within what the one INT8 row can move it
    from the unquantised Σ_k latent[k] · wo_b[d, k] · wo_b_scale[d] (FP64 here): half a code step (amax/254) per
    term, plus the BF16 rounding (2^-8 relative)."""
    g = torch.Generator().manual_seed(seed)
    heads = (torch.randn(tokens, H, HD, generator=g) * scale).to(torch.bfloat16)
    wo_a = (torch.randn(G, LORA, H // G * HD, generator=g) / (H // G * HD) ** 0.5).to(torch.bfloat16)
    wo_b, wo_b_scale = int8_codes((D, G * LORA), g), torch.rand(D, generator=g) / 127 + 1e-4
    got = op(backend, "dspark_output_projection")(heads, wo_a, wo_b, wo_b_scale, config=C)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (tokens, D), \
        f"x_out {got.dtype}{list(got.shape)}, expected bfloat16[{tokens}, {D}] (§8)"
    lat = _latent(heads, wo_a)
    want = (lat @ wo_b.double().T) * wo_b_scale.double()
    step = lat.abs().amax(-1, keepdim=True).clamp_min(C.int8_amax_eps) / 254
    bound = step * (wo_b.double().abs().sum(-1) * wo_b_scale.double())[None, :] * 1.001 + want.abs() * 2.0**-8
    bad = ~((got.double() - want).abs() <= bound)
    if bool(bad.any()):
        t, d = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"x_out[{t}][{d}] = {float(got[t, d])}, expected {float(want[t, d]):.6g} within "
                             f"{float(bound[t, d]):.3g}: the BF16 latent through wo_b, one INT8 row per token (§8)")


def test_a_hand_vector_separates_the_token_row_and_the_bf16_latent(backend):
    """Two heads of 2 in two groups of one latent, D 2: heads (1, 1 + 2^-7 | 1.5, 0.30078125), wo_a rows
    (0.30078125, 0.75) and (1, 0.296875): latents 1.056640625 and 1.58929443359375 in FP32, staged in BF16 to
    1.0546875 and 1.5859375. One INT8 row: quant 127 / 1.5859375, codes (84, 127); wo_b rows (-1, -1), (2, 3) give
    211 and 549, times 1/quant: -2.6349 -> -2.640625 and 6.8557 -> 6.84375 in BF16. Separated from the FP32 latent
    (6.875) and from one INT8 row per group (V4's decode projection: 6.875)."""
    c = replace(C, num_attention_heads=2, head_dim=2, o_groups=2, o_lora_rank=1, hidden_size=2)
    bf = torch.bfloat16
    heads = torch.tensor([[[1.0, 1.0078125], [1.5, 0.30078125]]], dtype=bf)
    wo_a = torch.tensor([[[0.30078125, 0.75]], [[1.0, 0.296875]]], dtype=bf)
    wo_b, scale = torch.tensor([[-1, -1], [2, 3]], dtype=torch.int8), torch.ones(2)
    lat = torch.tensor([1.056640625, 1.58929443359375], dtype=torch.float64)
    assert torch.equal(torch.einsum("gk,gk->g", heads[0].double(), wo_a[:, 0].double()), lat), "worked-out latents"

    def project(latent, rows):
        out = torch.zeros(2, dtype=torch.float64)
        for cols in rows:  # each INT8 row: its own amax, codes, factor
            v = latent[cols].float()
            quant = torch.tensor(127.0) / v.abs().amax()
            codes = torch.round(v * quant).double()
            out += (wo_b[:, cols].double() @ codes).float() * torch.reciprocal(quant).double()
        return out.float().to(bf)

    staged = lat.float().to(bf).double()
    assert staged.tolist() == [1.0546875, 1.5859375], "worked-out BF16 staging"
    want = torch.tensor([-2.640625, 6.84375], dtype=bf)
    assert torch.equal(project(staged, [[0, 1]]), want), "the worked-out x_out is not the rule's"
    separates("the drafter's output projection", want, fp32_latent=project(lat.float().double(), [[0, 1]]),
              int8_row_per_group=project(staged, [[0], [1]]))
    got = op(backend, "dspark_output_projection")(heads, wo_a, wo_b, scale, config=c)
    assert torch.equal(got[0], want), f"x_out {got.tolist()}, expected {want.tolist()}: the latent staged in BF16, " \
                                      "then one INT8 row per token (§8)"


def test_the_latent_is_rounded_to_fp32_before_bf16(backend):
    """Two heads of 3 in two groups of one latent, D 2: group 0's latent is 1 + 2^-8 + 2^-30 exactly (heads (1,
    2^-8, 2^-15), wo_a (1, 1, 2^-15)), group 1's is 1. The FP32 sum 1 + 2^-8 is a BF16 midpoint and rounds to even,
    1: codes (127, 127), factor 1/127, and wo_b rows (1, 0), (1, 1) give x_out (1, 2). Rounded once from the exact
    sum the latent is 1 + 2^-7, the amax moves and the second code becomes 126: separated."""
    c = replace(C, num_attention_heads=2, head_dim=3, o_groups=2, o_lora_rank=1, hidden_size=2)
    bf = torch.bfloat16
    heads = torch.tensor([[[1.0, 2.0**-8, 2.0**-15], [1.0, 0.0, 0.0]]], dtype=bf)
    wo_a = torch.tensor([[[1.0, 1.0, 2.0**-15]], [[1.0, 0.0, 0.0]]], dtype=bf)
    wo_b, scale = torch.tensor([[1, 0], [1, 1]], dtype=torch.int8), torch.ones(2)
    lat = torch.einsum("gk,gk->g", heads[0].double(), wo_a[:, 0].double())
    assert lat.tolist() == [1 + 2**-8 + 2**-30, 1.0], "the worked-out latents"

    def project(latent):
        v = latent.float()
        quant = torch.tensor(127.0) / v.abs().amax()
        codes = torch.round(v * quant).double()
        return ((wo_b.double() @ codes).float() * torch.reciprocal(quant)).to(bf)

    want = project(lat.float().to(bf))
    assert want.tolist() == [1.0, 2.0], "the worked-out x_out"
    separates("the latent rounded to FP32, then BF16", want, rounded_once=project(bf16_once(lat)))
    got = op(backend, "dspark_output_projection")(heads, wo_a, wo_b, scale, config=c)
    assert torch.equal(got[0], want), f"x_out {got.tolist()}, expected {want.tolist()}: the latent's FP32 sum (a " \
                                      "BF16 midpoint, rounded to even), not the exact sum rounded once (§8)"


# --- seeded defects ------------------------------------------------------------------------------------------

def _per_group(heads, wo_a, wo_b, wo_b_scale, *, config):
    from kernels.v4.heads_projection import project_heads

    return project_heads(heads, wo_a, wo_b, wo_b_scale, config=config, latent="bf16", rows="group")


def _fp32_latent(heads, wo_a, wo_b, wo_b_scale, *, config):
    from kernels.v4.heads_projection import project_heads

    return project_heads(heads, wo_a, wo_b, wo_b_scale, config=config, latent="fp32", rows="token")


def _groups_swapped(heads, wo_a, wo_b, wo_b_scale, *, config):
    from kernels.v4.heads_projection import dspark_output_projection

    return dspark_output_projection(heads, wo_a.flip(0), wo_b, wo_b_scale, config=config)


def _no_channel_scale(heads, wo_a, wo_b, wo_b_scale, *, config):
    from kernels.v4.heads_projection import dspark_output_projection

    return dspark_output_projection(heads, wo_a, wo_b, torch.ones_like(wo_b_scale), config=config)


SEEDED_DEFECTS = [
    SeededDefect("dspark-o-proj:per-group-rows", "dspark_output_projection", _per_group,
                 "test_a_hand_vector_separates_the_token_row_and_the_bf16_latent", "one INT8 row per token"),
    SeededDefect("dspark-o-proj:fp32-latent", "dspark_output_projection", _fp32_latent,
                 "test_a_hand_vector_separates_the_token_row_and_the_bf16_latent", "staged in BF16"),
    SeededDefect("dspark-o-proj:groups-swapped", "dspark_output_projection", _groups_swapped,
                 "test_x_out_is_the_latent_through_wo_b_within_one_int8_step", "x_out["),
    SeededDefect("dspark-o-proj:no-channel-scale", "dspark_output_projection", _no_channel_scale,
                 "test_x_out_is_the_latent_through_wo_b_within_one_int8_step", "x_out["),
]
