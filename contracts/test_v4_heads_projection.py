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
from kernels.errors import ContractInputError
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


def _ranks(heads, wo_a, wo_b, tp: int):
    """The full call's heads, wo_a and wo_b cut into tp ranks' group shares (heads packed by group)."""
    local, lora = G // tp, LORA
    packed = heads.reshape(heads.shape[0], G, -1).transpose(0, 1)
    return [(packed[r * local:(r + 1) * local].contiguous(), wo_a[r * local:(r + 1) * local].contiguous(),
             wo_b[:, r * local * lora:(r + 1) * local * lora].contiguous()) for r in range(tp)]


@pytest.mark.operators("v4_heads_projection_partial", "v4_heads_projection")
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_ranks_partials_sum_to_the_projection(backend, tp):
    """Tensor parallelism over the output groups (dspark's decode_o_proj.py): each rank's FP32 partial of its groups
    [T, D], summed over the ranks and rounded once, is the whole projection within the attention-output bound; a
    rank's partial is within its groups' INT8 steps of their unquantised product worked out here (FP64), and
    another rank's groups' product lies beyond that (separates_under)."""
    from contracts.separation import separates_under

    g = torch.Generator().manual_seed(tp)
    heads = torch.randn(6, H, HD, generator=g).to(torch.bfloat16)
    wo_a, wo_b, wo_b_scale = _weights(g)
    shares = _ranks(heads, wo_a, wo_b, tp)
    partial = op(backend, "v4_heads_projection_partial")
    parts = [partial(h, a, b, wo_b_scale, config=C) for h, a, b in shares]
    for p in parts:
        assert p.dtype == torch.float32 and tuple(p.shape) == (6, D), f"o_partial {p.dtype}{list(p.shape)}"

    def product(h, a, b):
        lat = torch.einsum("gtk,gnk->tgn", h.double(), a.double())
        return torch.einsum("tgn,dgn->td", lat, b.double().reshape(D, h.shape[0], LORA)) * wo_b_scale.double(), lat

    def judge(candidate, h, a, b):
        want, lat = product(h, a, b)
        step = lat.abs().amax(-1).clamp_min(C.int8_amax_eps) / 254
        slack = torch.einsum("tg,dg->td", step, b.double().abs().reshape(D, h.shape[0], LORA).sum(-1))
        return bool(((candidate.double() - want).abs() <= slack * wo_b_scale.double() * 1.001 + 1e-6).all())

    h0, a0, b0 = shares[0]
    if tp > 1:
        other = product(*shares[1])[0].float()
        separates_under("rank 0's partial of its own groups", lambda c, e: judge(c, h0, a0, b0), product(h0, a0, b0)[0],
                        another_ranks_groups=other)
    for r, ((h, a, b), p) in enumerate(zip(shares, parts, strict=True)):
        assert judge(p, h, a, b), f"rank {r}'s o_partial is not its groups' product within their INT8 steps (§8)"
    whole = op(backend, "v4_heads_projection")(heads, wo_a, wo_b, wo_b_scale, config=C)
    summed = torch.stack(parts).double().sum(0).float().to(torch.bfloat16)
    verdict = _attn_out(summed, whole)
    assert verdict.ok, f"the {tp} ranks' partials do not sum to the projection: {verdict}"


def _attn_out(a, e):
    return COMPARATORS["attn_out_v4"]("attn_out", a, e, Context(inputs={}, actual_outputs={}, expected_outputs={},
                                                                params={}))


def _partial_of_the_next_ranks_wo_b(heads, wo_a, wo_b, wo_b_scale, *, config):
    from kernels.v4.heads_projection import v4_heads_projection_partial

    return v4_heads_projection_partial(heads, wo_a, wo_b.roll(LORA, 1), wo_b_scale, config=config)


SEEDED_DEFECTS.append(SeededDefect("v4-heads-projection:partial-groups-shifted", "v4_heads_projection_partial",
                                   _partial_of_the_next_ranks_wo_b, "test_the_ranks_partials_sum_to_the_projection",
                                   "INT8 steps"))


@pytest.mark.operators("v4_heads_projection_partial")
@pytest.mark.parametrize("case, field", [("2-D heads", "heads"), ("no group", "heads"), ("more groups than the model's",
                                                                                       "heads"),
                                         ("heads of another width", "heads"), ("FP32 heads", "heads"),
                                         ("wo_a of other groups", "wo_a"), ("FP32 wo_a", "wo_a"),
                                         ("wo_b of other groups", "wo_b"), ("BF16 wo_b", "wo_b"),
                                         ("wo_b_scale short", "wo_b_scale")])
def test_a_malformed_share_is_refused_naming_its_field(backend, case, field):
    """A rank's share: heads [1 .. G groups, T, H/G·hd] BF16, wo_a and wo_b of the same groups (BF16, INT8), a
    channel scale [D]; one group and every group are well formed."""
    g = torch.Generator().manual_seed(2)
    heads = torch.randn(3, H, HD, generator=g).to(torch.bfloat16)
    wo_a, wo_b, wo_b_scale = _weights(g)
    h, a, b = _ranks(heads, wo_a, wo_b, 2)[0]
    partial = op(backend, "v4_heads_projection_partial")
    for tp in (1, G):  # the edges: every group, one group
        partial(*_ranks(heads, wo_a, wo_b, tp)[0], wo_b_scale, config=C)
    i = {"heads": h, "wo_a": a, "wo_b": b, "wo_b_scale": wo_b_scale}
    change = {"2-D heads": dict(heads=h[0]), "no group": dict(heads=h[:0], wo_a=a[:0], wo_b=b[:, :0]),
              "more groups than the model's": dict(heads=torch.cat((h,) * 3), wo_a=torch.cat((a,) * 3),
                                                   wo_b=torch.cat((b,) * 3, 1)),
              "heads of another width": dict(heads=h[..., 1:]), "FP32 heads": dict(heads=h.float()),
              "wo_a of other groups": dict(wo_a=a[:1]), "FP32 wo_a": dict(wo_a=a.float()),
              "wo_b of other groups": dict(wo_b=b[:, :LORA]), "BF16 wo_b": dict(wo_b=b.to(torch.bfloat16)),
              "wo_b_scale short": dict(wo_b_scale=wo_b_scale[1:])}[case]
    with pytest.raises(ContractInputError) as exc:
        partial(**{**i, **change}, config=C)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"


@pytest.mark.operators("v4_heads_projection")
@pytest.mark.parametrize("case, field", [("2-D heads", "heads"), ("heads of another width", "heads"),
                                         ("fewer heads", "heads"), ("FP32 heads", "heads"),
                                         ("wo_a of other groups", "wo_a"), ("FP32 wo_a", "wo_a"),
                                         ("wo_b of another width", "wo_b"), ("BF16 wo_b", "wo_b"),
                                         ("wo_b_scale short", "wo_b_scale")])
def test_a_malformed_projection_call_is_refused_naming_its_field(backend, case, field):
    """The whole projection's caller side: heads [T, H, hd] BF16, wo_a [G, O_LORA, H/G·hd] BF16, wo_b
    [D, G·O_LORA] INT8, wo_b_scale [D]; each field wrong in one way alone (its shape or its dtype) is refused
    naming it, and the well-formed call runs."""
    g = torch.Generator().manual_seed(3)
    heads = torch.randn(3, H, HD, generator=g).to(torch.bfloat16)
    wo_a, wo_b, wo_b_scale = _weights(g)
    project = op(backend, "v4_heads_projection")
    project(heads, wo_a, wo_b, wo_b_scale, config=C)
    i = {"heads": heads, "wo_a": wo_a, "wo_b": wo_b, "wo_b_scale": wo_b_scale}
    change = {"2-D heads": dict(heads=heads[0]), "heads of another width": dict(heads=heads[..., 1:]),
              "fewer heads": dict(heads=heads[:, 1:]), "FP32 heads": dict(heads=heads.float()),
              "wo_a of other groups": dict(wo_a=wo_a[:1]), "FP32 wo_a": dict(wo_a=wo_a.float()),
              "wo_b of another width": dict(wo_b=wo_b[:, 1:]), "BF16 wo_b": dict(wo_b=wo_b.to(torch.bfloat16)),
              "wo_b_scale short": dict(wo_b_scale=wo_b_scale[1:])}[case]
    with pytest.raises(ContractInputError) as exc:
        project(**{**i, **change}, config=C)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}, not {field!r}: {exc.value}"
