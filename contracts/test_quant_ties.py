"""``mtp_out`` and ``q_bf16`` excuse exactly the rounding steps another FP32 order may take, nothing else (§8).

Hand vectors at the V4-Pro tiny preset: an embedding element placed a hair off an INT8 rounding tie (the case
real kernels meet: docs/a5sim.md, mtp_projection at Pro geometry), one placed exactly on an FP32 tie, and
outputs that step one code there, one code elsewhere, two codes, or change eps; a q element near a BF16
midpoint (qkv_proj_rope at Pro geometry) stepped by one BF16 ulp, one far from any midpoint, two ulps. Each
alternative is shown to give other bytes than the reference before it is judged.
"""

from __future__ import annotations

import pytest
import torch

from contracts.compare import Context, fp32_ulps, mtp_out
from kernels.config import V4_PRO_TINY as C
from kernels.v4 import mtp

NAMES = ("hidden", "prev", "enorm", "hnorm", "e_proj", "e_scale", "e_smooth", "h_proj", "h_scale", "h_smooth")


def _inputs(seed: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, hc, t = C.hidden_size, C.hc_mult, 4
    return {"hidden": torch.randn(t, d, generator=g).to(torch.bfloat16), "prev": torch.randn(t, hc, d, generator=g),
            "enorm": torch.rand(d, generator=g) + 0.5, "hnorm": torch.rand(d, generator=g) + 0.5,
            "e_proj": torch.randint(-127, 128, (d, d), generator=g, dtype=torch.int8),
            "e_scale": torch.rand(d, generator=g) * 1e-3 + 1e-4, "e_smooth": torch.rand(d, generator=g) + 0.5,
            "h_proj": torch.randint(-127, 128, (d, d), generator=g, dtype=torch.int8),
            "h_scale": torch.rand(d, generator=g) * 1e-3 + 1e-4, "h_smooth": torch.rand(d, generator=g) + 0.5}


def _scaled(i: dict) -> torch.Tensor:
    """The reference's FP32 v · quant of the embedding rows."""
    v = mtp._rms(i["hidden"], i["enorm"], C.rms_norm_eps) * i["e_smooth"].float()
    amax = v.abs().amax(-1, keepdim=True).clamp_min(C.int8_amax_eps)
    return v * (torch.full_like(amax, C.int8_scale_max) / amax)


def _free_element(i: dict) -> int:
    """An element of row 0 that is not the row's amax and scales to about ±20."""
    s = _scaled(i)[0]
    order = (s.abs() - 20).abs().argsort()
    return int(next(k for k in order if s[k].abs() < 100))


def _place(i: dict, k: int, target: float, *, exact: bool) -> dict:
    """e_smooth[k] moved so that row 0's scaled element k is ``target`` exactly in FP32 (``exact``), else a few
    FP32 ulps below it (another FP32 order may land on the other side); the RMS and amax do not move."""
    i = {n: t.clone() for n, t in i.items()}
    s = float(_scaled(i)[0, k])
    i["e_smooth"][k] = i["e_smooth"][k] * abs(target) / abs(s)
    for _ in range(400):
        f = float(_scaled(i)[0, k].abs())
        if (f == abs(target)) if exact else (abs(target) * (1 - 2.0 ** -21) < f < abs(target)):
            return i
        up = f < abs(target) if exact else f <= abs(target) * (1 - 2.0 ** -21)
        i["e_smooth"][k] = torch.nextafter(i["e_smooth"][k], torch.tensor(float("inf") if up else 0.0))
    raise AssertionError(f"could not place element {k} at {target}")


def _with_code_step(i: dict, k: int, step: int) -> torch.Tensor:
    """The projection with row 0's embedding code k stepped by ``step`` (everything else the reference's)."""
    v = mtp._rms(i["hidden"], i["enorm"], C.rms_norm_eps) * i["e_smooth"].float()
    codes, factor = mtp.quantize_rows_int8(v, scale_max=C.int8_scale_max, amax_eps=C.int8_amax_eps)
    codes = codes.clone()
    codes[0, k] += step
    e = mtp.int8_matmul(codes, i["e_proj"]) * factor * i["e_scale"].float()
    h = mtp._linear_int8(mtp._rms(i["prev"], i["hnorm"], C.rms_norm_eps) * i["h_smooth"].float(), i["h_proj"],
                         i["h_scale"], C)
    return (e[:, None, :] + h).to(torch.float32)


def _ref(i: dict, **kw) -> torch.Tensor:
    cfg = C if not kw else C.__class__(**{**C.__dict__, **kw})
    return mtp.mtp_projection(*(i[n] for n in NAMES), config=cfg)


def _judge(i: dict, actual: torch.Tensor, expected: torch.Tensor):
    ctx = Context(i, {"out": actual}, {"out": expected}, {"preset": C.name})
    return mtp_out("out", actual, expected, ctx), fp32_ulps("out", actual, expected, ctx)


@pytest.mark.operators("mtp_projection")
def test_a_code_step_at_a_near_tie_is_excused_and_fp32_ulps_would_not():
    base = _inputs()
    k = _free_element(base)
    i = _place(base, k, 18.5, exact=False)  # a few FP32 ulps below 18.5: the reference's code is 18
    ref = _ref(i)
    assert int(mtp.quantize_rows_int8(mtp._rms(i["hidden"], i["enorm"], C.rms_norm_eps) * i["e_smooth"].float(),
                                      scale_max=127.0, amax_eps=1e-4)[0][0, k].abs()) == 18
    stepped = _with_code_step(i, k, 1 if float(_scaled(i)[0, k]) > 0 else -1)  # 19: another order's code
    assert not torch.equal(stepped, ref)
    ok, strict = _judge(i, stepped, ref)
    assert ok.ok, ok.message()
    assert not strict.ok  # the step is thousands of FP32 ulps: fp32_ulps alone cannot hold a real kernel
    assert _judge(i, ref, ref)[0].ok
    wrong_way = _with_code_step(i, k, -1 if float(_scaled(i)[0, k]) > 0 else 1)  # 17: no order rounds 18.49.. there
    assert not _judge(i, wrong_way, ref)[0].ok


@pytest.mark.operators("mtp_projection")
def test_the_same_step_away_from_a_tie_fails():
    i = _inputs()
    k = _free_element(i)
    stepped = _with_code_step(i, k, 1)
    assert not torch.equal(stepped, _ref(i))
    res, _ = _judge(i, stepped, _ref(i))
    assert not res.ok and res.worst.index[0] == 0, res.message()
    assert "near-tie" in res.message()


@pytest.mark.operators("mtp_projection")
def test_an_exact_fp32_tie_is_excused_either_way():
    # the reference's FP32 value exactly on the tie: another order lands it on either side, so this comparator
    # cannot pin half to even there (2 of the 12 q steps measured on a5sim were such points); the tie rule is
    # pinned by vectors every order takes to the same tie
    base = _inputs()
    k = _free_element(base)
    i = _place(base, k, 18.5, exact=True)
    assert float(_scaled(i)[0, k].abs()) == 18.5
    ref = _ref(i)
    away = _with_code_step(i, k, 1 if float(_scaled(i)[0, k]) > 0 else -1)
    assert not torch.equal(away, ref)
    assert _judge(i, away, ref)[0].ok
    assert not _judge(i, _with_code_step(i, k, -1 if float(_scaled(i)[0, k]) > 0 else 1), ref)[0].ok  # 17: no


@pytest.mark.operators("mtp_projection")
def test_a_wrong_eps_is_not_excused():
    i = _inputs()
    i["hidden"][1] = (i["hidden"][1].float() * 1e-3).to(torch.bfloat16)  # a small row: eps matters
    wrong = _ref(i, rms_norm_eps=1e-5)
    assert not torch.equal(wrong, _ref(i))
    res, _ = _judge(i, wrong, _ref(i))
    assert not res.ok, res.message()


def _qkv_inputs(seed: int = 3) -> dict[str, torch.Tensor]:
    from kernels.config import V4_PRO_TINY
    from kernels.v4.qkv_proj import _qkv_inputs

    return _qkv_inputs(seed, "replicated", V4_PRO_TINY.kernel_preset())


def _q_judge(i, out, actual_q):
    from contracts.compare import q_bf16

    ctx = Context(i, {**out, "q": actual_q}, out, {"preset": C.name})
    return q_bf16("q", actual_q, out["q"], ctx)


def _bf16_step(q: torch.Tensor, flat: int, by: int) -> torch.Tensor:
    bits = q.clone().contiguous().view(torch.int16).reshape(-1)
    bits[flat] += by
    return bits.view(torch.bfloat16).reshape(q.shape)


@pytest.mark.operators("v4_qkv_proj_rope")
def test_q_one_bf16_step_is_excused_only_near_a_midpoint():
    from contracts.checks.quant_ties import bf16_near_midpoints, bf16_neighbours
    from contracts.compare import exact
    from kernels.v4.qkv_proj import q_before_rounding, v4_qkv_proj_rope

    i = _qkv_inputs()
    out = v4_qkv_proj_rope(**i, config=C)
    pre = q_before_rounding(out["qr"], out["qr_scale"], i["wq_b"], i["wq_b_scale"], i["rope_cos"], i["rope_sin"],
                            config=C)
    near = bf16_near_midpoints(pre).reshape(-1)
    assert bool(near.any()) and not bool(near.all()), "the vector needs elements near and far from a midpoint"
    k_near, k_far = int(near.nonzero()[0]), int((~near).nonzero()[0])
    down, up = bf16_neighbours(pre.reshape(-1)[k_near:k_near + 1])
    have = int(out["q"].reshape(-1)[k_near:k_near + 1].view(torch.int16).int())
    other = int(up) if have == int(down) else int(down)
    stepped = _bf16_step(out["q"], k_near, other - have)
    assert not torch.equal(stepped, out["q"])
    assert _q_judge(i, out, stepped).ok
    assert not exact("q", stepped, out["q"], Context({}, {}, {}, {})).ok
    assert not _q_judge(i, out, _bf16_step(out["q"], k_far, 1)).ok
    res = _q_judge(i, out, _bf16_step(out["q"], k_near, 2 * (other - have)))
    assert not res.ok and "not a BF16 neighbour" in res.message()
    assert not _q_judge(i, out, _bf16_step(out["q"], k_near, have - other)).ok  # the step away from the midpoint
    assert _q_judge(i, out, out["q"]).ok


@pytest.mark.operators("mtp_projection")
def test_a_tree_without_the_inputs_fails_naming_them_and_non_finite_must_match():
    from contracts.compare import q_bf16

    i = _inputs()
    ref = _ref(i)
    no_prev = {k: v for k, v in i.items() if k != "prev"}
    res = mtp_out("out", ref, ref, Context(no_prev, {}, {}, {}))
    assert not res.ok and "'prev'" in res.message()
    res = q_bf16("q", torch.zeros(1, 1, 2, dtype=torch.bfloat16), torch.zeros(1, 1, 2, dtype=torch.bfloat16),
                 Context({}, {}, {}, {}))
    assert not res.ok and "'wq_b'" in res.message()
    nan = ref.clone()
    nan[0, 0, 0] = float("nan")
    assert not mtp_out("out", ref, nan, Context(i, {}, {}, {"preset": C.name})).ok
    assert mtp_out("out", nan, nan, Context(i, {}, {}, {"preset": C.name})).ok


def test_rms_scale_holds_another_summation_order_and_nothing_more():
    from contracts.compare import rms_scale

    g = torch.Generator().manual_seed(11)
    for d in (64, 7168):
        x = torch.randn(8, d, generator=g)
        ctx = Context({"x_mixed": x.to(torch.bfloat16)}, {}, {}, {})
        sq = x.double().pow(2)
        exact = torch.rsqrt((sq.sum(-1, keepdim=True) / d).float() + 1e-6)
        seq = torch.zeros(8, 1)
        for k in range(d):  # one FP32 order: left to right, one term at a time
            seq += x[:, k:k + 1].pow(2)
        other = torch.rsqrt(seq / d + 1e-6)
        assert rms_scale("s", other, exact, ctx).ok
        wrong = torch.rsqrt((sq.sum(-1, keepdim=True) / (d - 1)).float() + 1e-6)  # a mean over D - 1
        assert not torch.equal(wrong, exact)
        res = rms_scale("s", wrong, exact, ctx)
        assert res.ok == (d > 4096), (d, res.message())  # at Pro width the rule hides under the order bound
        edge = exact * (1 + (d - 1) * 2.0 ** -24 / 2 * 1.01) + 1e-30
        assert not rms_scale("s", edge + 8 * (torch.nextafter(exact, torch.tensor(1.0)) - exact), exact, ctx).ok


def _projection_setup():
    """o [2, 8, 64] (tiny Pro), head 0's element 0 of token 0 exactly on the BF16 midpoint 1 + 2^-8 (round to
    nearest even gives 1.0, the other neighbour is 1 + 2^-7), and a wo_a whose group 0 reads that element only into
    latent 5, with the weight -0.78125 that puts latent 5 on one side of an INT8 tie at 1.0 and on the other at
    1 + 2^-7 (the group's amax unchanged)."""
    g = torch.Generator().manual_seed(3)
    t, h, d, groups, lora, hidden = 2, C.num_attention_heads, C.head_dim, C.o_groups, C.o_lora_rank, C.hidden_size
    o = torch.randn(t, h, d, generator=g) * 0.5
    cos = torch.cos(torch.rand(t, C.qk_rope_head_dim, generator=g))
    sin = torch.sin(torch.rand(t, C.qk_rope_head_dim, generator=g))
    wo_a = (torch.randn(groups, lora, h * d // groups, generator=g) * 0.1).to(torch.bfloat16)
    wo_b = torch.randint(-127, 128, (hidden, groups * lora), generator=g, dtype=torch.int8)
    ws = torch.rand(hidden, generator=g) * 1e-3 + 1e-4
    o[0, 0, 0] = 1 + 2**-8
    wo_a[0, :, 0] = 0
    wo_a[0, 5, 0] = -0.78125
    return o, cos, sin, wo_a, wo_b, ws


@pytest.mark.operators("v4_output_projection")
def test_attn_out_explains_a_bf16_head_flip_through_its_latent_code_and_nothing_else():
    """attention_code_flips + explain_rows (attn_out_v4 at V4-Pro geometry, §8): the output of o whose midpoint
    head value took its other BF16 neighbour moves latent 5's code by one and fails upstream's ratio_allclose on
    its own, and is explained by that one code; the same output when the head value was not on a midpoint (1 +
    2^-9: only 1.0 is a rounding of it), and one code flipped where no head value reaches, are not."""
    from contracts.checks.precision import check_ratio_allclose
    from contracts.checks.quant_ties import attention_code_flips, explain_rows
    from kernels.v4.sparse_attention import v4_output_projection

    o, cos, sin, wo_a, wo_b, ws = _projection_setup()
    expected = v4_output_projection(o, cos, sin, wo_a, wo_b, ws, config=C)
    flipped = o.clone()
    flipped[0, 0, 0] = 1 + 2**-7
    actual = v4_output_projection(flipped, cos, sin, wo_a, wo_b, ws, config=C)
    bound = lambda e: 1e-4 + e.abs() / 128  # noqa: E731
    assert not check_ratio_allclose(actual, expected, atol=1e-4, rtol=1 / 128).ok, "the vector must move the output"
    y, moves = attention_code_flips(o, cos, sin, wo_a, wo_b, ws, config=C)
    assert torch.equal(y.float().to(torch.bfloat16), expected), "y is the reference's output before its BF16 cast"
    bad, used = explain_rows(actual, y, moves, bound)
    assert not bool(bad.any()) and used == [1, 0], (int(bad.sum()), used)
    bad, used = explain_rows(expected, y, moves, bound)
    assert not bool(bad.any()) and used == [0, 0], "the reference itself needs no flip"

    off = o.clone()
    off[0, 0, 0] = 1 + 2**-9  # rounds to 1.0 in any order: no other neighbour is a rounding of it
    y_off, moves_off = attention_code_flips(off, cos, sin, wo_a, wo_b, ws, config=C)
    assert torch.equal(v4_output_projection(off, cos, sin, wo_a, wo_b, ws, config=C), expected)
    bad, _used = explain_rows(actual, y_off, moves_off, bound)
    assert bool(bad[0].any()), "a head value off its midpoint must not excuse the flip"

    lora = C.o_lora_rank
    latent = torch.einsum("tgk,gnk->tgn", o.to(torch.bfloat16).reshape(2, C.o_groups, -1).double(),
                          wo_a.double()).float()
    factor = latent.abs().amax(-1).clamp_min(C.int8_amax_eps)[0, 1] / C.int8_scale_max
    far = y[0] + float(factor) * wo_b.double()[:, 1 * lora + 3] * ws.double()  # group 1's code 3 up by one
    bad, _used = explain_rows(torch.stack((far, y[1])).float().to(torch.bfloat16), y, moves, bound)
    assert bool(bad[0].any()), "a code no head value reaches must stay unexplained"


def test_norm_bf16_allows_the_other_neighbour_only_at_a_midpoint():
    """norm_bf16 (final_norm at V4-Pro width, §8): a weight chosen to put row 0's element 3 within an FP32 ulp
    or two of the BF16 midpoint 1 + 2^-8 -- the other BF16 neighbour there passes, the other neighbour at an
    element far from any midpoint fails, and two steps fail."""
    from contracts.checks.quant_ties import bf16_near_midpoints
    from contracts.compare import norm_bf16
    from kernels.config import V4_PRO
    from kernels.reference.compressor import rms_norm

    g = torch.Generator().manual_seed(7)
    eps = V4_PRO.rms_norm_eps
    hidden = torch.randn(2, 64, generator=g).to(torch.bfloat16)
    weight = torch.ones(64)
    inv = torch.rsqrt(hidden.float().pow(2).mean(-1) + eps)
    weight[3] = (1 + 2**-8) / (float(hidden[0, 3]) * float(inv[0]))
    pre = rms_norm(hidden.float(), weight, eps).float()
    near = bf16_near_midpoints(pre)
    assert bool(near[0, 3]), float(pre[0, 3])
    expected = pre.to(torch.bfloat16)
    ctx = Context({"hidden": hidden, "weight": weight}, {}, {}, {"preset": V4_PRO.name}, "replicated")

    def stepped(r, c, steps=1):
        out = expected.clone()
        bits = out.view(torch.int16)
        other = 1 if float(pre[r, c]) > float(expected[r, c]) else -1
        bits[r, c] += other * steps
        return out

    far = next((r, c) for r in range(2) for c in range(64) if not bool(near[r, c]))
    assert norm_bf16("x_normed", expected, expected, ctx).ok
    assert norm_bf16("x_normed", stepped(0, 3), expected, ctx).ok
    assert not norm_bf16("x_normed", stepped(*far), expected, ctx).ok
    assert not norm_bf16("x_normed", stepped(0, 3, 2), expected, ctx).ok
