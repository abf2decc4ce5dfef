"""The hyper-connection mixes (HC-01) evaluated here in FP64 from the spec text, not by the reference:
logits = (flatten(x_hc) · functionᵀ) · rsqrt(mean(flatten(x_hc)²) + eps); pre = sigmoid(logits[:hc] · s0 + b[:hc])
+ hc_eps; post = 2 · sigmoid(logits[hc:2hc] · s1 + b[hc:2hc]); the residual mix the Sinkhorn of softmax over the
last axis of (logits[2hc:] · s2 + b[2hc:]) viewed [hc (in), hc (out)] + hc_eps, a column normalisation, then
(iters - 1) rounds of row, column, each sum offset by hc_eps. Inputs with three distinct scales and residual logits
far from symmetric, so each lane, scale, factor and axis decides values; each slip the issue names (post 1.5 ·
sigmoid, pre with s1, post with s0, the residual logits transposed) computed here and shown to move them.
Spec: HC-01, §1."""

from __future__ import annotations

import pytest
import torch

from contracts.separation import separates
from contracts.tolerances import HC_MIXES_FP64_TOL as TOL
from kernels.config import FLASH_TINY, V4_FLASH_TINY
from pto_pytest.defect import SeededDefect, reference_edit
from pto_pytest.plugin import op

CONFIGS = [pytest.param(FLASH_TINY, id="v41-tiny"), pytest.param(V4_FLASH_TINY, id="v4-flash-tiny")]


def inputs(config, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    hc, d = config.hc_mult, config.hidden_size
    mix = (2 + hc) * hc
    x = torch.randn(5, hc, d, generator=g)
    x[0] *= 1e-4  # a row whose mean square is near the RMS epsilon of V4 (1e-6)
    function = torch.randn(mix, hc * d, generator=g) / (hc * d) ** 0.5
    scale = torch.tensor([0.7, 1.6, 0.45])
    base = torch.randn(mix, generator=g) * 0.5
    return x, function, scale, base


def fp64_mixes(config, x, function, scale, base, *, post_factor=2.0, pre_scale=0, post_scale=1, transpose=False):
    """HC-01 in FP64 (module docstring); the keywords give the slips, computed the same way."""
    hc = config.hc_mult
    eps = config.hc_eps
    flat = x.double().reshape(x.shape[0], -1)
    logits = (flat @ function.double().t()) / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps)
    s, b = scale.double(), base.double()
    pre = torch.sigmoid(logits[:, :hc] * s[pre_scale] + b[:hc]) + eps
    post = post_factor * torch.sigmoid(logits[:, hc:2 * hc] * s[post_scale] + b[hc:2 * hc])
    res = (logits[:, 2 * hc:] * s[2] + b[2 * hc:]).reshape(-1, hc, hc)
    if transpose:
        res = res.transpose(1, 2)
    m = torch.exp(res - res.amax(-1, keepdim=True))
    m = m / m.sum(-1, keepdim=True) + eps
    m = m / (m.sum(-2, keepdim=True) + eps)
    for _ in range(config.hc_sinkhorn_iters - 1):
        m = m / (m.sum(-1, keepdim=True) + eps)
        m = m / (m.sum(-2, keepdim=True) + eps)
    return pre, post, m


@pytest.mark.operators("hc_mixes")
@pytest.mark.parametrize("config", CONFIGS)
def test_the_mixes_are_their_fp64_rule(backend, config):
    """pre, post and the residual mix of five rows (one of mean square 1e-8) equal the FP64 evaluation of HC-01
    within 2e-5, lane by lane; each slip #47 names (post 1.5 · sigmoid, pre with s1, post with s0, the residual logits transposed)
    is off by far more on these inputs."""
    x, function, scale, base = inputs(config)
    rule = fp64_mixes(config, x, function, scale, base)
    slips = {"post 1.5 sigmoid": (1, {"post_factor": 1.5}), "pre with s1": (0, {"pre_scale": 1}),
             "post with s0": (1, {"post_scale": 0}), "residual transposed": (2, {"transpose": True})}
    for slip, (k, edit) in slips.items():  # each slip #47 names is off the rule by far more than the bound
        other = fp64_mixes(config, x, function, scale, base, **edit)[k]
        separates(slip, (rule[k] / TOL).round(), slip=(other / TOL).round())
        assert float((other - rule[k]).abs().max()) > 100 * TOL, f"{slip} is within {100 * TOL} of the rule"
    m = op(backend, "hc_mixes")(x, function, scale, base, config=config)
    for name, got, want in zip(("pre", "post", "residual"), (m.pre, m.post, m.residual),
                               rule, strict=True):
        assert got.shape == want.shape, f"{name} {list(got.shape)}, expected {list(want.shape)}"
        off = (got.double() - want).abs() > TOL
        if bool(off.any()):
            idx = tuple(int(v) for v in off.nonzero()[0])
            raise AssertionError(f"{name}{list(idx)} = {float(got[idx]):.7g}, the FP64 rule gives {float(want[idx]):.7g} "
                                 f"(bound {TOL}; HC-01)")


# --- seeded defects: the edits #47 names, made to the reference ------------------------------------------------

_MIXES = "kernels.reference.mhc:hc_mixes"
_EDITS = (  # (defect, the reference's text, the edit, what the failure names)
    ("post-1.5", "post = 2 * _sigmoid", "post = 1.5 * _sigmoid", "post"),
    ("pre-s1", "logits[:, :hc] * s[0]", "logits[:, :hc] * s[1]", "pre"),
    ("post-s0", "logits[:, hc:2 * hc] * s[1]", "logits[:, hc:2 * hc] * s[0]", "post"),
    ("residual-transposed", ".reshape(tokens, hc, hc)", ".reshape(tokens, hc, hc).transpose(1, 2)", "residual"),
)
SEEDED_DEFECTS = [SeededDefect(f"hc-mixes-fp64:{name}", "hc_mixes", reference_edit(_MIXES, old, new),
                               "test_the_mixes_are_their_fp64_rule", mentions) for name, old, new, mentions in _EDITS]
