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
    w = weight.double()
    up, down = other.clamp_min(0), (-other).clamp_min(0)
    wp, wn = w.clamp_min(0).T, (-w).clamp_min(0).T
    factor = (amax / scale_max) * weight_scale.double().abs()
    return -(up @ wn + down @ wp) * factor, (up @ wp + down @ wn) * factor, near


def bf16_neighbours(pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two BF16 bit patterns (int32, sign-extended like ``view(torch.int16)``) around each FP32 value: its
    truncation and the next one away from zero; round to nearest picks one of them."""
    low = pre.float().contiguous().view(torch.int32) >> 16
    return low, low + 1


def bf16_near_midpoints(pre: torch.Tensor, *, ulps: int = 32) -> torch.Tensor:
    """Bool, same shape: FP32 values within ``ulps`` FP32 ulps of a BF16 rounding midpoint (the low 16 bits of
    their FP32 pattern within ``ulps`` of 0x8000), the midpoints themselves included. Another FP32 order of the sum before the rounding (an RMS over a head) may land such a value on
    the midpoint's other side: one BF16 ulp, and nothing else, moves. Measured on the a5 simulator:
    ``qkv_proj_rope`` at V4-Pro geometry, 12 of 524288 q elements, each within 4 FP32 ulps (docs/a5sim.md)."""
    low = pre.float().contiguous().view(torch.int32) & 0xFFFF
    dist = (low - 0x8000).abs()
    return (dist <= ulps) & torch.isfinite(pre)
