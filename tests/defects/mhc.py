"""Seeded defects of the mHC operators (spec §1; upstream_checks HC-01, HC-02, HC-11): realistic one-bug
ports, each a backend built from the reference with one operator replaced."""

from __future__ import annotations

from dataclasses import replace

import torch

from backends import torch_backend
from kernels.reference import mhc

_base = torch_backend()


def _sinkhorn_early(x_hc, function, scale, base, *, num_tokens=None, config=None):
    """Wrong: the Sinkhorn loop runs one iteration fewer (19 instead of 20)."""
    config = config or mhc.FLASH
    return mhc.hc_mixes(x_hc, function, scale, base, num_tokens=num_tokens,
                        config=replace(config, hc_sinkhorn_iters=config.hc_sinkhorn_iters - 1))


def _tail_kept(x_hc, function, scale, base, *, num_tokens=None, config=None):
    """Wrong: the rows past num_tokens keep their computed coefficients instead of the zero tail."""
    return mhc.hc_mixes(x_hc, function, scale, base, config=config or mhc.FLASH)


def _products_in_bf16(x_hc, pre_mix, *, dtype=torch.bfloat16):
    """Wrong: each weighted stream is rounded to BF16 before the sum."""
    return (x_hc.float() * pre_mix.float().unsqueeze(-1)).to(torch.bfloat16).float().sum(dim=1).to(dtype)


def _residual_not_transposed(sublayer, x_hc, post_mix, residual_mix, **kw):
    """Wrong: stream j receives Σ_i residual[j, i]·x_hc[i] (the mix applied untransposed)."""
    return mhc.hc_post(sublayer, x_hc, post_mix, residual_mix.transpose(1, 2), **kw)


def _post_through_bf16(sublayer, x_hc, post_mix, residual_mix, **kw):
    """Wrong: the FP32 result is rounded through the sublayer's BF16 before it is returned as FP32."""
    return mhc.hc_post(sublayer, x_hc, post_mix, residual_mix, rule="via-sublayer-dtype")


SINKHORN_EARLY = _base.derive("defect:sinkhorn-one-iteration-early", hc_mixes=_sinkhorn_early)
TAIL_KEPT = _base.derive("defect:mix-tail-kept", hc_mixes=_tail_kept)
PRODUCTS_IN_BF16 = _base.derive("defect:hc-pre-products-in-bf16", hc_pre=_products_in_bf16)
RESIDUAL_NOT_TRANSPOSED = _base.derive("defect:hc-post-untransposed", hc_post=_residual_not_transposed)
POST_THROUGH_BF16 = _base.derive("defect:hc-post-through-bf16", hc_post=_post_through_bf16)


def _per_stream_rms(x_hc, function, scale, base, *, num_tokens=None, config=None):
    """Wrong: each stream is normalised by its own RMS instead of one inverse RMS over the flattened row."""
    x = x_hc.float()
    x = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-20) * x.square().mean(dim=(1, 2), keepdim=True).sqrt()
    return mhc.hc_mixes(x, function, scale, base, num_tokens=num_tokens, config=config or mhc.FLASH)


def _softmax_only(x_hc, function, scale, base, *, num_tokens=None, config=None):
    """Wrong: the residual mix stops after the softmax and one column normalisation (no Sinkhorn rounds)."""
    config = config or mhc.FLASH
    return mhc.hc_mixes(x_hc, function, scale, base, num_tokens=num_tokens, config=replace(config, hc_sinkhorn_iters=1))


PER_STREAM_RMS = _base.derive("defect:mhc-per-stream-rms", hc_mixes=_per_stream_rms)
SOFTMAX_ONLY = _base.derive("defect:mhc-softmax-only", hc_mixes=_softmax_only)
