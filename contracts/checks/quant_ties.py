"""INT8 re-quantization after an FP32 reduction: which codes another FP32 order may legitimately flip.

A V4 projection quantizes an RMS-normed row to INT8 (``codes = round(v · 127 / amax)``) and multiplies the codes
by an INT8 weight. The row's RMS is a sum over D terms, and a kernel sums them in another FP32 order than a
reference. That moves ``v · 127 / amax`` by a few FP32 ulps, which is nothing, except at an element whose exact
value lies that close to a rounding tie (k + 0.5): there the two sides round to neighbouring codes, and the
output moves by one code times the weight's column, thousands of FP32 ulps. At D 7168 about one row in five has
such an element (measured on the a5 simulator: ``mtp_projection`` at V4-Pro geometry, row 0, element 1409,
``v · quant`` = 19.5000008 exactly, 19.4999981 in the reference's FP32: the kernel rounded to 20, the reference
to 19; docs/a5sim.md).

So a comparator of such an output adds, per output element, the effect of one code step at every input element
whose exact (FP64) scaled value is within ``TIE_WINDOW`` (relative) of a tie, and nothing elsewhere: a code off
anywhere else, a wrong scale, eps, smooth factor or clamp still fails. The window is 2^-18 relative (64 FP32
ulps), far above the reassociation error measured (under one ulp) and far below a rule change. An element whose
reference FP32 value is exactly on a tie is in the window too: another order lands it on either side (2 of the 12
BF16 steps measured on a5sim were at such points), so these comparators cannot pin the tie rule; the hand
vectors that pin it use inputs every summation order takes to the same tie. Spec: §7.3, §8.
"""

from __future__ import annotations

import torch

from contracts.result import Bound
from contracts.tolerances import BF16_MIDPOINT_ULPS, RMS_SUM_REL_PER_TERM

TIE_WINDOW = 2.0 ** -18


def near_ties(v: torch.Tensor, *, scale_max: float, amax_eps: float, window: float = TIE_WINDOW) -> torch.Tensor:
    """Bool [..., K]: the elements of the rows ``v`` (evaluated in FP64) whose scaled value ``v · scale_max /
    amax`` lies within ``window`` (relative, at least ``window`` absolute) of k + 0.5."""
    v = v.double()
    amax = v.abs().amax(-1, keepdim=True).clamp_min(amax_eps)
    s = (v * (scale_max / amax)).abs()
    dist = (s - s.floor() - 0.5).abs()
    return dist <= window * s.clamp_min(1.0)


def int8_linear_slack(v: torch.Tensor, codes: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *,
                      scale_max: float, amax_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(low [..., N], high [..., N] FP64, near [..., K] bool) for ``linear_int8(v, weight [N, K], weight_scale [N])``
    whose reference rounded ``v`` to ``codes``: how far each output element may move down and up if every
    near-tie code of its row took its other neighbour (the side of the tie the exact value is on, or the reference
    is not on), and no other code moved."""
    near = near_ties(v, scale_max=scale_max, amax_eps=amax_eps)
    v = v.double()
    amax = v.abs().amax(-1, keepdim=True).clamp_min(amax_eps)
    s = v * (scale_max / amax)
    other = torch.where(s > codes.double(), 1.0, -1.0).double() * near  # the step to the tie's other side
    # only the columns with a near tie in some row can move anything (the others' steps are all 0): the
    # products are taken over those alone, not over the whole FP64 copy of the weight (Pro: 7168 columns)
    cols = near.reshape(-1, near.shape[-1]).any(0).nonzero().squeeze(1)
    w = weight[:, cols].double()
    up, down = other[..., cols].clamp_min(0), (-other[..., cols]).clamp_min(0)
    wp, wn = w.clamp_min(0).T, (-w).clamp_min(0).T
    factor = (amax / scale_max) * weight_scale.double().abs()
    return -(up @ wn + down @ wp) * factor, (up @ wp + down @ wn) * factor, near


def bf16_neighbours(pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two BF16 bit patterns (int32, sign-extended like ``view(torch.int16)``) around each FP32 value: its
    truncation and the next one away from zero; round to nearest picks one of them."""
    low = pre.float().contiguous().view(torch.int32) >> 16
    return low, low + 1


def bf16_near_midpoints(pre: torch.Tensor, *, ulps: int = BF16_MIDPOINT_ULPS) -> torch.Tensor:
    """Bool, same shape: FP32 values within ``ulps`` FP32 ulps of a BF16 rounding midpoint (the low 16 bits of
    their FP32 pattern within ``ulps`` of 0x8000), the midpoints themselves included. Another FP32 order of the sum before the rounding (an RMS over a head) may land such a value on
    the midpoint's other side: one BF16 ulp, and nothing else, moves. Measured on the a5 simulator:
    ``qkv_proj_rope`` at V4-Pro geometry, 12 of 524288 q elements, each within 4 FP32 ulps (docs/a5sim.md)."""
    low = pre.float().contiguous().view(torch.int32) & 0xFFFF
    dist = (low - 0x8000).abs()
    return (dist <= ulps) & torch.isfinite(pre)


# --- V4's attention output: a BF16 head value on the other side of its rounding, carried into INT8 latent codes ---
# The fused decode attention rounds each head value of o (after the inverse RoPE) to BF16, multiplies each group of
# heads by wo_a in FP32, quantizes each (token, group) latent row to INT8, and projects the codes with the INT8
# wo_b. o itself is an FP32 tile walk whose order is the kernel's: measured against the FP64 reference, upstream's
# FP32 golden moves o by at most 2.5e-7 of its head's peak at V4-Pro geometry, and that puts about one head value
# per token row (of 65536) on the other side of a BF16 rounding midpoint; its group's latents move by that BF16 step
# times a column of wo_a, and 1 to 5 latent codes land on the neighbouring integer, which moves the whole output row
# by about 1e-3 of its norm (docs/a5sim.md: upstream's golden against the reference, 389 of 57344 elements past
# ratio_allclose's per-element bound, over its 0.5 % quota). Nothing else of that arithmetic moves more than FP32
# rounding. So ``attention_output_slack`` bounds, per output element, what those flips can do, and nothing more.
HEAD_WINDOW = 2.0 ** -18  # of the head's peak: 15x the 2.5e-7 measured, far below any rule change
HEAD_FLIPS = 2  # of a (token, group)'s 4096 head values: measured 1 per token row (all groups)
ROW_CODE_FLIPS = 8  # latent codes on their neighbour per token row: measured 1 to 5


def _pos_neg(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t.clamp_min(0), (-t).clamp_min(0)


def attention_code_flips(o: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, wo_a: torch.Tensor,
                         wo_b: torch.Tensor, wo_b_scale: torch.Tensor, *, config, head_window: float = HEAD_WINDOW,
                         flips: int = HEAD_FLIPS) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(y [T, hidden] FP64: the reference's output before its BF16 rounding, per token row the moves [n, hidden]
    FP64 of each INT8 latent code that may land on its neighbour) for ``v4_output_projection(o, ...)``. A code may
    when its latent is within ``TIE_WINDOW`` of a tie (another FP32 order of its sum) or within reach of one, where
    reach is the ``flips`` largest moves in each direction that head values of its group, each within
    ``head_window`` of its head's peak from a BF16 rounding midpoint, make by taking the other BF16 neighbour. The
    groups' dequantization factors are the reference's (the amax element moving is not modelled). Spec: §8."""
    from kernels.reference.rope import rope_interleave
    from kernels.v4.mtp import int8_matmul, quantize_rows_int8

    tokens, heads, dim = o.shape
    groups, lora, rope = config.o_groups, config.o_lora_rank, config.qk_rope_head_dim
    smax, aeps = config.int8_scale_max, config.int8_amax_eps
    cos = freqs_cos[:, : rope // 2].float().unsqueeze(1)
    sin = freqs_sin[:, : rope // 2].float().unsqueeze(1)
    pre = rope_interleave(o.float(), cos, sin, inverse=True)  # FP32, before the BF16 rounding
    chosen = pre.to(torch.bfloat16)
    low, high = bf16_neighbours(pre)
    bits = chosen.view(torch.int16).to(torch.int32)
    other = torch.where(bits == low, high, low).to(torch.int16).view(torch.bfloat16)
    c64, other64 = chosen.double(), other.double()
    peak = pre.double().abs().amax(-1, keepdim=True)
    near = ((pre.double() - (c64 + other64) / 2).abs() <= head_window * peak) & torch.isfinite(other64)
    step = torch.where(near, other64 - c64, torch.zeros_like(c64)).reshape(tokens, groups, -1)
    wa = wo_a.double()
    latent = torch.einsum("tgk,gnk->tgn", c64.reshape(tokens, groups, -1), wa).float().double()  # the reference's
    reach_lo = torch.zeros_like(latent)
    reach_hi = torch.zeros_like(latent)
    for t in range(tokens):
        for g in range(groups):
            k = step[t, g].nonzero().flatten()
            if k.numel():
                moves = wa[g][:, k] * step[t, g, k]  # [O_LORA, near]
                m = min(flips, k.numel())
                reach_hi[t, g] = moves.clamp_min(0).topk(m, dim=-1).values.sum(-1)
                reach_lo[t, g] = -(-moves).clamp_min(0).topk(m, dim=-1).values.sum(-1)
    order = TIE_WINDOW * latent.abs()
    amax = latent.abs().amax(-1, keepdim=True).clamp_min(aeps)
    quant = smax / amax
    codes = torch.clamp(torch.round(latent * quant), -smax, smax)
    c_lo = torch.clamp(torch.ceil((latent + reach_lo - order) * quant - 0.5), -smax, smax)
    c_hi = torch.clamp(torch.floor((latent + reach_hi + order) * quant + 0.5), -smax, smax)
    w = wo_b.double().reshape(-1, groups, lora)  # [hidden, G, O_LORA]
    ws = wo_b_scale.double()
    factor = amax / smax
    # the reference's own FP32 arithmetic (kernels.v4.sparse_attention.v4_output_projection), before the BF16 cast
    codes8, factor32 = quantize_rows_int8(latent.float(), scale_max=smax, amax_eps=aeps)
    y32 = torch.zeros(tokens, w.shape[0], dtype=torch.float32)
    for g in range(groups):
        y32 = y32 + int8_matmul(codes8[:, g], wo_b.reshape(-1, groups, lora)[:, g]) * factor32[:, g]
    y = (y32 * wo_b_scale.float()).double()
    moves = []
    for t in range(tokens):
        rows = []
        for c_other in (c_lo[t], c_hi[t]):
            for g, n in (c_other != codes[t]).nonzero().tolist():
                rows.append((c_other[g, n] - codes[t, g, n]) * factor[t, g, 0] * w[:, g, n] * ws)
        moves.append(torch.stack(rows) if rows else torch.zeros(0, y.shape[1], dtype=torch.float64))
    return y, moves


def explain_rows(actual: torch.Tensor, y: torch.Tensor, moves: list[torch.Tensor], bound, *,
                 max_flips: int = ROW_CODE_FLIPS) -> tuple[torch.Tensor, list[int]]:
    """(bad [T, hidden] bool, code flips used per row): each token row of ``actual`` (BF16) against BF16(y + the
    moves of at most ``max_flips`` of its row's candidate code flips), chosen greedily, each flip the one that
    leaves the fewest elements outside ``bound(expected)`` (an elementwise tolerance); a row that needs none uses
    none, and a flip that does not reduce the count is not taken."""
    a = actual.double()
    bad_rows, used = [], []
    for t in range(a.shape[0]):
        cur = y[t].clone()

        def outside(v, _t=t):
            e = v.to(torch.float32).to(torch.bfloat16).double()
            return ((a[_t] - e).abs() > bound(e)) | ~torch.isfinite(a[_t])

        bad = outside(cur)
        n = 0
        cand = moves[t]
        while bool(bad.any()) and n < max_flips and cand.shape[0]:
            trial = cur.unsqueeze(0) + cand  # [n_candidates, hidden]
            e = trial.to(torch.float32).to(torch.bfloat16).double()
            counts = ((a[t].unsqueeze(0) - e).abs() > bound(e)).sum(1)
            j = int(counts.argmin())
            if int(counts[j]) >= int(bad.sum()):
                break
            cur = trial[j]
            cand = torch.cat((cand[:j], cand[j + 1:]))
            bad, n = outside(cur), n + 1
        bad_rows.append(bad)
        used.append(n)
    return torch.stack(bad_rows), used


def _bounds() -> tuple[Bound, ...]:
    from contracts.tolerances import FP32_ULPS

    return (
        Bound("mtp_out", "fp32_ulps, plus one INT8 code step at every input element within a hair of a rounding tie",
              {"ulps": FP32_ULPS, "tie_window": TIE_WINDOW}),
        Bound("rms_scale", "fp32_ulps plus the worst-case FP32 error of a sum of D squares",
              {"ulps": FP32_ULPS, "sum_rel_per_term": RMS_SUM_REL_PER_TERM}),
        Bound("q_bf16", "the reference's bytes, or its other BF16 neighbour where the FP32 value before the rounding "
              "lies near a BF16 midpoint", {"midpoint_fp32_ulps": BF16_MIDPOINT_ULPS}),
        Bound("norm_bf16", "as q_bf16, for the RMSNorm's BF16 output", {"midpoint_fp32_ulps": BF16_MIDPOINT_ULPS}),
    )


BOUNDS = _bounds()
