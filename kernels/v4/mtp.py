"""V4's MTP input projection (spec §8; upstream mtp_projection.py): the MTP layer's residual streams from the
embedding of the sampled token and the main model's last streams.

out[t, c] = e[t] + h[t, c] (FP32), with

* e = linear_int8(RMSNorm(hidden[t], enorm) · e_smooth, e_proj): one row per token, the same for every stream;
* h[t, c] = linear_int8(RMSNorm(prev[t, c], hnorm) · h_smooth, h_proj): one row per token and stream;
* linear_int8(v, W): v quantized per row to INT8 -- amax = max(|v|, 1e-4), quant = 127 / amax (FP32),
  codes = clamp(round(v · quant), ±127) (round half to even) -- times the INT8 weight [out, in] in exact
  integers, then times 1 / quant (upstream's reciprocal, not amax / 127) and the weight's per-output scale.

RMSNorm here: x · rsqrt(mean(x²) + eps) · w in FP32 (eps = rms_norm_eps, 1e-6).

Spec: §8 (INT8_SCALE_MAX 127, INT8_AMAX_EPS 1e-4); docs/coverage.md, V4 section.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, generator, int8_codes, is_tiny, replaced

SPEC = "§8"
ROUNDING_VERSION = "v4-mtp-2"


def quantize_rows_int8(v: torch.Tensor, *, scale_max: float, amax_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row INT8 codes and the dequantization factor ([..., 1]), as the V4 kernels compute them in the row's
    dtype (FP32): quant = scale_max / amax (a true division, as the kernels' div), codes =
    round-half-even(v · quant), factor = 1 / quant -- the reciprocal of the quantization factor, which differs
    from amax / scale_max in the last bit for about a quarter of the amax values. (Upstream's torch goldens
    write ``INT8_SCALE_MAX / amax``, which torch evaluates as 127 · (1 / amax): one more rounding, one ulp at
    most, inside every comparator.)"""
    amax = v.abs().amax(dim=-1, keepdim=True).clamp_min(amax_eps)
    # a true division, as the kernels' div (torch evaluates ``scalar / tensor`` as scalar · (1 / tensor))
    quant = torch.full_like(amax, scale_max) / amax
    codes = torch.clamp(torch.round(v * quant), -scale_max, scale_max).to(torch.int8)
    return codes, torch.reciprocal(quant)


def int8_matmul(codes: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """codes [..., K] INT8 times an out-major INT8 weight [N, K] -> [..., N] FP32: the exact integer sums (the
    kernels' INT32 accumulator; |sum| <= 127 · 127 · K < 2^53, so FP64 holds each one) rounded once to FP32."""
    return (codes.to(torch.float64) @ weight.to(torch.float64).T).to(torch.float32)


def _linear_int8(v: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, config) -> torch.Tensor:
    codes, factor = quantize_rows_int8(v, scale_max=config.int8_scale_max, amax_eps=config.int8_amax_eps)
    return int8_matmul(codes, weight) * factor * weight_scale.float()


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def check_mtp_projection(hidden: torch.Tensor, prev: torch.Tensor, e_proj: torch.Tensor, h_proj: torch.Tensor, *,
                         config) -> None:
    """The call's shapes and INT8 weights (raises ContractInputError). Spec: §8."""
    t, d, hc = hidden.shape[0], config.hidden_size, config.hc_mult
    if hidden.shape != (t, d) or prev.shape != (t, hc, d):
        raise ContractInputError("mtp_projection", None, f"hidden [T, {d}] and prev [T, {hc}, {d}]",
                                 [list(hidden.shape), list(prev.shape)], SPEC)
    for name, w in (("e_proj", e_proj), ("h_proj", h_proj)):
        if w.dtype != torch.int8 or w.shape != (d, d):
            raise ContractInputError(name, None, f"INT8 [{d}, {d}]", f"{w.dtype}{list(w.shape)}", SPEC)


@operator(returns="[T, hc, D] FP32: the embedding half shared by every stream plus each stream's "
                   'own half',
          spec='§8')
def mtp_projection(hidden: torch.Tensor, prev: torch.Tensor, enorm: torch.Tensor, hnorm: torch.Tensor,
                   e_proj: torch.Tensor, e_scale: torch.Tensor, e_smooth: torch.Tensor, h_proj: torch.Tensor,
                   h_scale: torch.Tensor, h_smooth: torch.Tensor, *, config) -> torch.Tensor:
    """hidden [T, D] BF16, prev [T, hc, D] FP32, INT8 projections [D, D] (out-major) with per-output scales
    -> [T, hc, D] FP32. Spec: §8."""
    check_mtp_projection(hidden, prev, e_proj, h_proj, config=config)
    eps = config.rms_norm_eps
    e = _linear_int8(_rms(hidden, enorm, eps) * e_smooth.float(), e_proj, e_scale, config)
    h = _linear_int8(_rms(prev, hnorm, eps) * h_smooth.float(), h_proj, h_scale, config)
    return (e[:, None, :] + h).to(torch.float32)


# --- the record ----------------------------------------------------------------------------------------------

def _mtp_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """8 rows (the tiny tree's, and the one T_TILE a Pro entry takes); projection scales small enough at Pro's
    7168-term sums."""
    g = generator(seed)
    d, hc, t = config.hidden_size, config.hc_mult, config.decode_tokens
    scale = 1e-3 if is_tiny(config) else 1e-4
    return {"hidden": torch.randn(t, d, generator=g).to(torch.bfloat16), "prev": torch.randn(t, hc, d, generator=g),
            "enorm": torch.rand(d, generator=g) + 0.5, "hnorm": torch.rand(d, generator=g) + 0.5,
            "e_proj": int8_codes((d, d), g), "e_scale": torch.rand(d, generator=g) * scale,
            "e_smooth": torch.rand(d, generator=g) + 0.5, "h_proj": int8_codes((d, d), g),
            "h_scale": torch.rand(d, generator=g) * scale, "h_smooth": torch.rand(d, generator=g) + 0.5}


_MTP_NAMES = ("hidden", "prev", "enorm", "hnorm", "e_proj", "e_scale", "e_smooth", "h_proj", "h_scale", "h_smooth")

RECORD = Record(
    operator="mtp_projection",
    call=lambda fn, i, config: {"out": fn(*(i[n] for n in _MTP_NAMES), config=config)},
    outputs={"out": "fp32_ulps"},
    outputs_at={g: {"out": "mtp_out"} for g in ("pro", "v4-flash")},
    cases=(CaseSpec("mtp_projection", "MTP projection: the embedding and previous-stream RMSNorms, smoothed INT8 "
                    "projections, summed into the FP32 streams", _mtp_inputs, geometries=("tiny", "pro", "v4-flash")),),
    bad_calls=(BadCall("prev of another width", "mtp_projection", replaced(prev=lambda i: i["prev"][..., :-1]),
                       "mtp_projection"),
               BadCall("an FP32 e_proj", "mtp_projection", replaced(e_proj=lambda i: i["e_proj"].float()), "e_proj")),
    bindings=(*(Upstream(f, golden="mtp_projection.py::golden_mtp_projection",
                         entry="mtp_projection.py::mtp_projection_test")
                for f in ("deepseek_v4_pro", "deepseek_v4_flash_mtp")),
              Upstream("deepseek_v4_flash_dspark", none="no mtp_projection.py: dspark drafts with its own drafter")),
)
