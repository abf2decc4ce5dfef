"""RoPE tables, adjacent-pair rotation and row materialization.

Spec: §4.2 (tables, profiles, ``materialize_rope_rows``), upstream_checks RR-01..RR-05.
"""

from __future__ import annotations

import math

import torch

from kernels.config import FLASH, V41Config
from kernels.errors import ContractInputError, is_int
from kernels.operators import operator

SPEC = "§4.2"
# Bump when the arithmetic or a rounding rule changes on purpose: goldens recorded before go stale.
ROUNDING_VERSION = "rope-1"


def rope_frequencies(compressed: bool, config: V41Config = FLASH) -> torch.Tensor:
    """FP32 [rope/2] frequencies: base ``compress_rope_theta`` + YaRN for compressed, else ``rope_theta``."""
    dim = config.qk_rope_head_dim
    base = config.compress_rope_theta if compressed else config.rope_theta
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if not compressed:
        return freqs

    def corrected(rotations: float) -> float:
        return dim * math.log(config.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corrected(config.beta_fast)), 0)
    high = min(math.ceil(corrected(config.beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    smooth = 1 - ramp
    return freqs / config.rope_factor * (1 - smooth) + freqs * smooth


def precompute_rope_tables(length: int, compressed: bool, config: V41Config = FLASH
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 cos/sin tables [length, rope/2] for adjacent-pair rotation. Spec: §4.2."""
    if not is_int(length) or length <= 0:
        raise ContractInputError("length", None, "a positive int", repr(length), SPEC)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), rope_frequencies(compressed, config))
    # cos/sin of the FP32 angles by the C library in FP64, rounded once to FP32: torch's vectorized cos
    # (FP32 and FP64 alike) gave a different last bit in some processes than in others with 2 threads (3 of
    # 10 runs here), so recorded inputs and expected outputs varied from run to run.
    flat = angles.double().reshape(-1).tolist()
    cos = torch.tensor([math.cos(a) for a in flat], dtype=torch.float64).to(torch.float32).reshape(angles.shape)
    sin = torch.tensor([math.sin(a) for a in flat], dtype=torch.float64).to(torch.float32).reshape(angles.shape)
    return cos, sin


def rope_interleave(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of the last 2*len(cos) dims in FP32; returns x's dtype.

    ``x`` [..., D], ``cos``/``sin`` [..., rope/2] broadcastable to x's rows. Spec: §4.2.
    """
    width = cos.shape[-1] * 2
    head, tail = x[..., :-width], x[..., -width:].float()
    pairs = tail.unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    s = -sin if inverse else sin
    rotated = torch.stack((a * cos - b * s, a * s + b * cos), dim=-1).flatten(-2)
    return torch.cat((head.float(), rotated), dim=-1).to(x.dtype)


def check_rope_rows(freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, position_ids: torch.Tensor, num_tokens: int,
                    rope_cos: torch.Tensor, rope_sin: torch.Tensor, *, dtype: torch.dtype | None = None) -> None:
    """``materialize_rope_rows``' caller-side checks (what every implementation refuses alike): two 2-D tables of
    one shape and dtype (``dtype``, where a device compiles one), 1-D INT32/INT64 positions, output rows of the
    tables' width and dtype, 0 <= num_tokens <= rows, and no active position at or past the table capacity."""
    if freqs_cos.ndim != 2 or freqs_cos.shape != freqs_sin.shape or freqs_cos.dtype != freqs_sin.dtype or \
            (dtype is not None and freqs_cos.dtype != dtype):
        raise ContractInputError("freqs_cos/freqs_sin", None, f"two 2-D {dtype or ''} tables of one shape and dtype",
                                 f"{freqs_cos.dtype}{list(freqs_cos.shape)} / {freqs_sin.dtype}{list(freqs_sin.shape)}",
                                 SPEC)
    if freqs_cos.shape[0] == 0:
        raise ContractInputError("freqs_cos", None, "a nonzero capacity", 0, SPEC)
    if position_ids.dtype not in (torch.int32, torch.int64) or position_ids.ndim != 1:
        raise ContractInputError("position_ids", None, "a 1-D INT32/INT64 tensor",
                                 f"{position_ids.dtype}{list(position_ids.shape)}", SPEC)
    rows = position_ids.shape[0]
    for name, out in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
        if out.shape != (rows, freqs_cos.shape[1]) or out.dtype != freqs_cos.dtype:
            raise ContractInputError(name, None, f"{freqs_cos.dtype}[{rows}, {freqs_cos.shape[1]}]",
                                     f"{out.dtype}{list(out.shape)}", SPEC)
    if not is_int(num_tokens) or not 0 <= num_tokens <= rows:
        raise ContractInputError("num_tokens", None, f"an int in [0, {rows}]", repr(num_tokens), SPEC)
    pos = position_ids[:num_tokens].to(torch.int64)
    bad = pos >= freqs_cos.shape[0]
    if bool(bad.any()):
        t = int(bad.nonzero()[0, 0])
        raise ContractInputError("position_ids", (t,), f"< table capacity {freqs_cos.shape[0]}", int(pos[t]), SPEC)


@operator(returns='None (writes rope_cos/rope_sin rows < num_tokens)', spec='§4.2')
def materialize_rope_rows(freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, position_ids: torch.Tensor,
                          num_tokens: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> None:
    """Write rows t < num_tokens of ``rope_cos``/``rope_sin`` [T, rope/2] in place: table row p for p >= 0,
    the identity rotation (1, 0) for p < 0. Rows >= num_tokens are untouched; num_tokens = 0 does nothing.
    A position >= the table capacity raises (upstream leaves this unchecked: RR-05). Spec: §4.2.
    """
    check_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos, rope_sin)
    if num_tokens == 0:
        return
    pos = position_ids[:num_tokens].to(torch.int64)
    valid = (pos >= 0).unsqueeze(-1)
    idx = pos.clamp_min(0)
    rope_cos[:num_tokens] = torch.where(valid, freqs_cos[idx], torch.ones((), dtype=freqs_cos.dtype))
    rope_sin[:num_tokens] = torch.where(valid, freqs_sin[idx], torch.zeros((), dtype=freqs_sin.dtype))
