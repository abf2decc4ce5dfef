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
ulps), far above the reassociation error measured (under one ulp) and far below a rule change. An element
exactly on a tie in FP32 is left out of the window: the tie rule (half to even) is pinned there, not excused.
Spec: §7.3, §8.
"""

from __future__ import annotations

import torch

TIE_WINDOW = 2.0 ** -18


def near_ties(v: torch.Tensor, *, scale_max: float, amax_eps: float, fp32_scaled: torch.Tensor | None = None,
              window: float = TIE_WINDOW) -> torch.Tensor:
    """Bool [..., K]: the elements of the rows ``v`` (evaluated in FP64) whose scaled value ``v · scale_max /
    amax`` lies within ``window`` (relative, at least ``window`` absolute) of k + 0.5, excluding those whose FP32
    scaled value ``fp32_scaled`` (the reference's) is exactly a tie."""
    v = v.double()
    amax = v.abs().amax(-1, keepdim=True).clamp_min(amax_eps)
    s = (v * (scale_max / amax)).abs()
    dist = (s - s.floor() - 0.5).abs()
    near = dist <= window * s.clamp_min(1.0)
    if fp32_scaled is not None:
        f = fp32_scaled.float().abs()
        near &= (f - f.floor()) != 0.5
    return near


def int8_linear_slack(v: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *, scale_max: float,
                      amax_eps: float, fp32_scaled: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(slack [..., N] FP64, near [..., K] bool) for ``linear_int8(v, weight [N, K], weight_scale [N])``: the
    largest move of each output element if every near-tie code of its row stepped by one."""
    near = near_ties(v, scale_max=scale_max, amax_eps=amax_eps, fp32_scaled=fp32_scaled)
    factor = v.double().abs().amax(-1, keepdim=True).clamp_min(amax_eps) / scale_max
    slack = (near.double() @ weight.double().abs().T) * factor * weight_scale.double().abs()
    return slack, near
