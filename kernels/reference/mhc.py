"""Manifold-constrained hyper-connections (mHC): the four residual streams of a V4.1 layer and their mixes.

A layer keeps its hidden state as ``hc = 4`` streams ``x_hc`` [T, hc, D]. Every sublayer (attention, FFN)
reads one collapsed row and writes back an expanded update:

* ``hc_mixes`` projects the flattened stream [T, hc·D] (FP32) with ``function`` [(2+hc)·hc, hc·D] after an
  inverse RMS over the whole flattened row (eps ``rms_norm_eps``), giving three coefficient sets per token:
  ``pre`` = sigmoid(logits·scale[0] + base) + hc_eps (in (hc_eps, 1 + hc_eps)), ``post`` =
  2·sigmoid(logits·scale[1] + base) (in (0, 2)), and ``residual`` [hc, hc]: a row softmax of
  logits·scale[2] + base, plus hc_eps, one column normalisation, then ``iterations - 1`` rounds of (row,
  column) normalisation, each sum offset by hc_eps -- so 20 iterations are 1 + 19 rounds (Sinkhorn). Rows
  ``>= num_tokens`` of all three are written as exact zeros (the device's valid rows + zero tail).
* ``hc_pre`` collapses the streams (FP32 at the ABI) with a pre mix: Σ_i pre[i]·x_hc[i] accumulated in FP32,
  one cast to the activation dtype (BF16 at the ABI). ``identity_pre_mix`` is the first layer's incoming mix: one-hot lane 0.
* ``hc_post`` expands a sublayer output (BF16 at the ABI): out[j] = post[j]·sublayer + Σ_i residual[i, j]·x_hc[i],
  in FP32, returned as FP32 (the ABI; upstream's older golden rounded through the sublayer's dtype first,
  kept as rule ``via-sublayer-dtype``). The residual mix is applied transposed: column j of
  ``residual`` feeds stream j.
* ``hc_head`` is ``hc_pre`` with the last layer's pre mix, returned as BF16.

The delayed pre-mix order through a Block (``kernels.reference.block``): attention collapses with the
incoming mix, FFN with the attention's pre mix, and the Block hands on the FFN's pre mix.

Spec: §1 (hc_mult 4, MIX_HC 24, hc_sinkhorn_iters 20, hc_eps 1e-6, rms_norm_eps 1e-20); upstream_checks
HC-01, HC-02, HC-06, HC-11.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.config import FLASH, V41Config
from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, generator, in_all_folders, is_tiny, replaced
from kernels.reference.rowwise import rowwise_matmul

SPEC = "§1"
ROUNDING_VERSION = "mhc-1"


@dataclass(frozen=True)
class Mixes:
    """One sublayer's coefficients: ``pre`` [T, hc], ``post`` [T, hc], ``residual`` [T, hc, hc], all FP32."""

    pre: torch.Tensor
    post: torch.Tensor
    residual: torch.Tensor

    def as_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        return {f"{prefix}pre": self.pre, f"{prefix}post": self.post, f"{prefix}residual": self.residual}


def _check_stream(name: str, x_hc: torch.Tensor, hc: int) -> None:
    if x_hc.ndim != 3 or x_hc.shape[1] != hc or not x_hc.is_floating_point():
        raise ContractInputError(name, None, f"floating [T, {hc}, D]", f"{x_hc.dtype}{list(x_hc.shape)}", SPEC)


def sinkhorn(logits: torch.Tensor, *, iterations: int, eps: float) -> torch.Tensor:
    """[..., hc, hc] FP32 logits -> the residual mix: row softmax, + eps, one column normalisation, then
    ``iterations - 1`` (row, column) rounds, every sum offset by eps. Spec: HC-01."""
    if iterations < 1:
        raise ContractInputError("iterations", None, ">= 1", iterations, SPEC)
    m = logits.softmax(dim=-1) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m


def _sigmoid(z: torch.Tensor) -> torch.Tensor:
    """FP32 sigmoid evaluated in FP64 and rounded once: torch's FP32 sigmoid takes a SIMD path for whole vectors
    and a scalar path for the tail, which differ by an ulp, so a row's mix would depend on how many rows share the
    call (seen on AVX-512 machines: the sharded Block's slabs against the gathered rows)."""
    return torch.sigmoid(z.double()).float()


@operator(returns='Mixes(pre [T,hc], post [T,hc], residual [T,hc,hc]) FP32, rows >= num_tokens zero',
          spec='§1')
def hc_mixes(x_hc: torch.Tensor, function: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
             num_tokens: int | None = None, config: V41Config = FLASH) -> Mixes:
    """``x_hc`` [T, hc, D]; ``function`` [(2+hc)·hc, hc·D]; ``scale`` [3]; ``base`` [(2+hc)·hc] -> Mixes with
    rows >= ``num_tokens`` (default T) exactly zero. FP32 throughout. Spec: HC-01, HC-11."""
    hc = config.hc_mult
    _check_stream("x_hc", x_hc, hc)
    tokens, _, dim = x_hc.shape
    mix = (2 + hc) * hc
    if function.shape != (mix, hc * dim):
        raise ContractInputError("function", None, f"[{mix}, {hc * dim}]", list(function.shape), SPEC)
    if scale.shape != (3,) or base.shape != (mix,):
        raise ContractInputError("scale/base", None, f"[3] and [{mix}]", [list(scale.shape), list(base.shape)], SPEC)
    active = tokens if num_tokens is None else int(num_tokens)
    if not 0 <= active <= tokens:
        raise ContractInputError("num_tokens", None, f"0..{tokens}", num_tokens, SPEC)
    flat = x_hc.reshape(tokens, hc * dim).float()
    inverse_rms = torch.rsqrt(flat.square().mean(dim=-1, keepdim=True) + config.rms_norm_eps)
    logits = rowwise_matmul(flat, function) * inverse_rms  # FP64, one rounding: rows independent of the batch
    s, b = scale.float(), base.float()
    pre = _sigmoid(logits[:, :hc] * s[0] + b[:hc]) + config.hc_eps
    post = 2 * _sigmoid(logits[:, hc:2 * hc] * s[1] + b[hc:2 * hc])
    residual_logits = (logits[:, 2 * hc:] * s[2] + b[2 * hc:]).reshape(tokens, hc, hc)
    residual = sinkhorn(residual_logits, iterations=config.hc_sinkhorn_iters, eps=config.hc_eps)
    keep = (torch.arange(tokens) < active).to(torch.float32)
    return Mixes(pre * keep[:, None], post * keep[:, None], residual * keep[:, None, None])


@operator(returns="[T, D] in x_hc's dtype: FP32 sum, one cast", spec='§1')
def hc_pre(x_hc: torch.Tensor, pre_mix: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Σ_i pre[i]·x_hc[i] in FP32, one cast to the activation dtype (BF16 at the ABI, whatever the streams'
    dtype -- FP32 streams included): [T, hc, D], [T, hc] -> [T, D]. Spec: HC-02."""
    if x_hc.ndim != 3 or pre_mix.shape != x_hc.shape[:2]:
        raise ContractInputError("pre_mix", None, f"[{x_hc.shape[0]}, {x_hc.shape[1]}] like x_hc's first dims",
                                 list(pre_mix.shape), SPEC)
    return (x_hc.float() * pre_mix.float().unsqueeze(-1)).sum(dim=1).to(dtype)


@operator(returns="{x_mixed [T, D] BF16, post [T, hc] FP32, comb [T, hc·hc] FP32}: hc_mixes then hc_pre in one call "
                  "(upstream's hc_pre goldens and entries)", spec="§1")
def hc_pre_fused(x_hc: torch.Tensor, function: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
                 config=FLASH, ops=None) -> dict[str, torch.Tensor]:
    """The block's entry mix as upstream's hc_pre.py computes it: the mixes (pre, post, the Sinkhorn residual) and
    the pre-mixed activation, one call; the pre mix itself is not an output. Spec: HC-01, HC-02."""
    ops = ops or {}
    mixes = ops.get("hc_mixes", hc_mixes)(x_hc, function, scale, base, config=config)
    x_mixed = ops.get("hc_pre", hc_pre)(x_hc, mixes.pre)
    tokens, hc = mixes.post.shape
    return {"x_mixed": x_mixed, "post": mixes.post, "comb": mixes.residual.reshape(tokens, hc * hc)}


hc_pre_fused.composes_operators = True


POST_RULES = ("fp32", "via-sublayer-dtype")


def check_hc_post(sublayer: torch.Tensor, x_hc: torch.Tensor, post_mix: torch.Tensor, residual_mix: torch.Tensor, *,
                  rule: str = "fp32") -> None:
    """The caller's side of ``hc_post``: a named rule and shapes that agree with the streams."""
    if rule not in POST_RULES:
        raise ContractInputError("rule", None, f"one of {POST_RULES}", rule, SPEC)
    tokens, hc = x_hc.shape[0], x_hc.shape[1]
    if sublayer.shape != (tokens, x_hc.shape[2]):
        raise ContractInputError("sublayer", None, f"[{tokens}, {x_hc.shape[2]}]", list(sublayer.shape), SPEC)
    if post_mix.shape != (tokens, hc) or residual_mix.shape != (tokens, hc, hc):
        raise ContractInputError("post_mix/residual_mix", None, f"[{tokens}, {hc}] and [{tokens}, {hc}, {hc}]",
                                 [list(post_mix.shape), list(residual_mix.shape)], SPEC)


@operator(returns="[T, hc, D] in the sublayer's dtype: post·sublayer + residualᵀ·x_hc in FP32", spec='§1')
def hc_post(sublayer: torch.Tensor, x_hc: torch.Tensor, post_mix: torch.Tensor, residual_mix: torch.Tensor, *,
            rule: str = "fp32") -> torch.Tensor:
    """out[:, j] = post[:, j]·sublayer + Σ_i residual[:, i, j]·x_hc[:, i] in FP32, returned as FP32 (the ABI's
    output dtype, rule ``fp32``; ``via-sublayer-dtype`` -- the older golden -- rounds the sum to the
    sublayer's dtype first, selectable by name): [T, D], [T, hc, D], [T, hc], [T, hc, hc] -> [T, hc, D] FP32.
    Spec: HC-02."""
    check_hc_post(sublayer, x_hc, post_mix, residual_mix, rule=rule)
    update = post_mix.float().unsqueeze(-1) * sublayer.float().unsqueeze(1)
    skip = torch.einsum("tij,tid->tjd", residual_mix.float(), x_hc.float())
    out = update + skip
    return out.to(sublayer.dtype).float() if rule == "via-sublayer-dtype" else out


@operator(returns='[T, D] BF16', spec='§1')
def hc_head(x_hc: torch.Tensor, pre_mix: torch.Tensor) -> torch.Tensor:
    """The final collapse before the LM head: ``hc_pre`` with the last pre mix, as BF16. Spec: HC-02."""
    return hc_pre(x_hc, pre_mix).to(torch.bfloat16)


def identity_pre_mix(x_hc: torch.Tensor) -> torch.Tensor:
    """The incoming mix of the first layer: one-hot on lane 0, FP32 [T, hc]. Spec: HC-06."""
    mix = torch.zeros(x_hc.shape[:2], dtype=torch.float32)
    mix[:, 0] = 1.0
    return mix


# --- the record of hc_post at V4's dims ----------------------------------------------------------------------

def _v4_hc_post_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """A tiny tree's 8 rows, or 4 at V4-Pro's own width (D 7168, the T_TILE hc_post_test is compiled for); comb
    columns that sum to 1, post mixes in [0, 2)."""
    g = generator(seed)
    d, hc, t = config.hidden_size, config.hc_mult, 8 if is_tiny(config) else 4
    comb = torch.rand(t, hc, hc, generator=g)
    return {"sublayer": torch.randn(t, d, generator=g).to(torch.bfloat16), "x_hc": torch.randn(t, hc, d, generator=g),
            "post_mix": 2 * torch.rand(t, hc, generator=g), "residual_mix": comb / comb.sum(1, keepdim=True)}


HC_POST_RECORD = Record(
    operator="hc_post",
    call=lambda fn, i, config: {"x_out": fn(i["sublayer"], i["x_hc"], i["post_mix"], i["residual_mix"])},
    outputs={"x_out": "fp32_ulps"},
    cases=(CaseSpec("v4_hc_post", "V4 hc_post: post·sublayer + combᵀ·x_hc in FP32 over 4 streams",
                    _v4_hc_post_inputs, geometries=("tiny", "pro", "v4-flash")),),
    bad_calls=(BadCall("residual_mix of another width", "v4_hc_post",
                       replaced(residual_mix=lambda i: i["residual_mix"][..., :-1]), "post_mix/residual_mix"),),
    bindings=in_all_folders(golden="hc_post.py::golden_hc_post", entry="hc_post.py::hc_post_test"),
)


def _hc_pre_fused_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """The decode step's rows of 4 FP32 streams with upstream's fixture distribution (function ~ N(0, 1/hc·D),
    scale and base ~ N(0, 1)), one row 8x larger and one 1/8: the entry's mix, collapse and Sinkhorn on real
    mixes."""
    g = generator(seed)
    hc, d, t = config.hc_mult, config.hidden_size, config.decode_tokens
    mix = (2 + hc) * hc
    x = torch.randn(t, hc, d, generator=g)
    x[1] *= 8.0
    x[2] /= 8.0
    return {"x_hc": x, "function": torch.randn(mix, hc * d, generator=g) / (hc * d) ** 0.5,
            "scale": torch.randn(3, generator=g), "base": torch.randn(mix, generator=g)}


HC_PRE_FUSED_RECORD = Record(
    operator="hc_pre_fused",
    call=lambda fn, i, config: dict(fn(i["x_hc"], i["function"], i["scale"], i["base"], config=config)),
    outputs={"x_mixed": "hc_out", "post": "hc_mix", "comb": "hc_mix"},
    cases=(CaseSpec("hc_pre_fused", "the block's entry mix in one call (hc_mixes then hc_pre, as upstream's "
                    "hc_pre.py): 4 FP32 streams of a decode step, the fixture's mix distribution",
                    _hc_pre_fused_inputs, geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(BadCall("a function of another width", "hc_pre_fused",
                       replaced(function=lambda i: i["function"][:, :-1]), "function"),),
    bindings=in_all_folders(golden="hc_pre.py::golden_hc_pre", entry="hc_pre.py::hc_pre_test"),
)
