"""V4's Q/KV LoRA projection with RoPE (spec §8; upstream qkv_proj_rope.py), for decode and prefill rows of an
attention-normalized input x [T, hidden] BF16.

Query low-rank path, and the INT8 ``qr`` the CSA indexer reads:

1. qr = x · wq_a (BF16 operands, FP32 result) [T, Q_LORA];
2. inv = rsqrt(mean(qr²) + eps) (FP32); the INT8 row: amax = max(inv · max|qr · γ_cq|, 1e-4), quant = 127 / amax
   (a true division), codes = round-half-even((qr · inv) · γ_cq · quant), ``qr_scale`` = 1 / quant;
3. q = (codes · wq_b in exact integers) · qr_scale[t] · wq_b_scale[c] (FP32) -- the query is built from the INT8
   codes, not from the FP32 normalised row;
4. per head, an RMSNorm **without a weight**: inv_h = rsqrt(mean over head_dim(q²) + eps); the nope dims are
   BF16(q · inv_h); the last ``qk_rope_head_dim`` dims are normalised first and then rotated (adjacent pairs,
   forward: (a, b) -> (a·cos - b·sin, a·sin + b·cos) with the token's row, the first rope/2 columns of
   ``rope_cos`` / ``rope_sin`` [T, rope]), then rounded to BF16.

KV path: kv = x · wkv (FP32); inv = rsqrt(mean(kv²) + eps); n = kv · inv · γ_ckv -- the weight applied
**before** the rotation (γ does not commute with it); nope dims BF16(n), rope dims BF16(rotate(n)).

Arithmetic is FP32 at the kernel's rounding points; the reductions (matmuls, sums of squares) are evaluated in
FP64 and rounded to FP32 once, so a device's accumulation order moves the result by FP32 rounding only.

Spec: §8; docs/coverage.md, V4 section.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, generator, in_all_folders, int8_codes, replaced

SPEC = "§8"
ROUNDING_VERSION = "v4-qkv-1"


def _rsqrt_mean_sq(x: torch.Tensor, eps: float) -> torch.Tensor:
    """rsqrt(mean(x²) + eps) over the last dim: the mean in FP32 (from an FP64 sum), the rsqrt at high precision."""
    mean = (x.double().pow(2).sum(-1, keepdim=True).float() * (1.0 / x.shape[-1])).float()
    return torch.rsqrt((mean + eps).double()).float()


def _rotate(n: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Forward adjacent-pair rotation in FP32 of the last 2·cos.shape[-1] dims (cos / sin broadcast to n)."""
    a, b = n[..., 0::2], n[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def check_v4_qkv_proj_rope(x: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                           wkv: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor, gamma_cq: torch.Tensor,
                           gamma_ckv: torch.Tensor, *, config) -> None:
    """The caller's side of ``v4_qkv_proj_rope``: shapes and dtypes against the preset."""
    hidden, lora, heads = config.hidden_size, config.q_lora_rank, config.num_attention_heads
    dim, rope = config.head_dim, config.qk_rope_head_dim
    if x.ndim != 2 or x.shape[1] != hidden:
        raise ContractInputError("x", None, f"[T, {hidden}]", list(x.shape), SPEC)
    tokens = x.shape[0]
    for name, t, shape in (("wq_a", wq_a, (hidden, lora)), ("wkv", wkv, (hidden, dim)), ("gamma_cq", gamma_cq, (lora,)),
                           ("gamma_ckv", gamma_ckv, (dim,)), ("wq_b_scale", wq_b_scale, (heads * dim,))):
        if tuple(t.shape) != shape:
            raise ContractInputError(name, None, list(shape), list(t.shape), SPEC)
    if wq_b.dtype != torch.int8 or wq_b.shape != (lora, heads * dim):
        raise ContractInputError("wq_b", None, f"INT8 [{lora}, {heads * dim}]", f"{wq_b.dtype}{list(wq_b.shape)}", SPEC)
    for name, table in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
        if table.ndim != 2 or table.shape[0] != tokens or table.shape[1] < rope // 2:
            raise ContractInputError(name, None, f"[{tokens}, {rope}]", list(table.shape), SPEC)
    for name, t in (("x", x), ("wq_a", wq_a), ("wkv", wkv), ("gamma_cq", gamma_cq), ("gamma_ckv", gamma_ckv)):
        if t.dtype != torch.bfloat16:
            raise ContractInputError(name, None, "BF16", str(t.dtype), SPEC)


def q_before_rounding(codes: torch.Tensor, qr_scale: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                      rope_cos: torch.Tensor, rope_sin: torch.Tensor, *, config) -> torch.Tensor:
    """q [T, H, head_dim] in FP32, just before its BF16 rounding: the INT8 qr codes times wq_b (exact integers),
    dequantized, each head RMS-normed (no weight), its last qk_rope_head_dim columns rotated. Shared by the
    reference and the comparator that judges a kernel's BF16 q against these values (contracts.compare.q_bf16)."""
    heads, dim, rope, eps = config.num_attention_heads, config.head_dim, config.qk_rope_head_dim, config.rms_norm_eps
    cos, sin = rope_cos[:, : rope // 2].float(), rope_sin[:, : rope // 2].float()
    acc = codes.to(torch.int64) @ wq_b.to(torch.int64)  # exact
    q = (acc.to(torch.float32) * qr_scale * wq_b_scale.float()).reshape(codes.shape[0], heads, dim)
    inv_h = _rsqrt_mean_sq(q, eps)  # [T, H, 1], no weight
    return torch.cat((q[..., : dim - rope] * inv_h, _rotate(q[..., dim - rope:] * inv_h, cos[:, None, :],
                                                             sin[:, None, :])), dim=-1)


@operator(returns='{q [T,H,hd] BF16, kv [T,hd] BF16, qr [T,Q_LORA] INT8, qr_scale [T,1] FP32}: '
                   "V4's Q/KV LoRA projection with RoPE",
          spec='§8')
def v4_qkv_proj_rope(x: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                     wkv: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor, gamma_cq: torch.Tensor,
                     gamma_ckv: torch.Tensor, *, config) -> dict[str, torch.Tensor]:
    """-> {"q" [T, H, head_dim] BF16, "kv" [T, head_dim] BF16, "qr" [T, Q_LORA] INT8, "qr_scale" [T, 1] FP32}.
    Spec: §8."""
    check_v4_qkv_proj_rope(x, wq_a, wq_b, wq_b_scale, wkv, rope_cos, rope_sin, gamma_cq, gamma_ckv, config=config)
    eps = config.rms_norm_eps
    qr = (x.double() @ wq_a.double()).float()
    inv = _rsqrt_mean_sq(qr, eps)
    g_cq = gamma_cq.float()
    amax = torch.clamp(inv * (qr * g_cq).abs().amax(-1, keepdim=True), min=config.int8_amax_eps)
    quant = torch.full_like(amax, config.int8_scale_max) / amax
    codes = torch.round((qr * inv) * g_cq * quant).to(torch.int8)
    qr_scale = torch.reciprocal(quant)

    q = q_before_rounding(codes, qr_scale, wq_b, wq_b_scale, rope_cos, rope_sin, config=config)

    kv_out = kv_branch(x, wkv, gamma_ckv, rope_cos, rope_sin, config=config)
    return {"q": q.to(torch.bfloat16), "kv": kv_out, "qr": codes, "qr_scale": qr_scale}


def kv_branch(x: torch.Tensor, wkv: torch.Tensor, gamma_ckv: torch.Tensor, rope_cos: torch.Tensor,
              rope_sin: torch.Tensor, *, config) -> torch.Tensor:
    """The KV path (module docstring) alone: kv [T, head_dim] BF16 of x [T, hidden] with the rows' RoPE
    (the first qk_rope_head_dim/2 columns of ``rope_cos`` / ``rope_sin`` [T, >= rope/2]). Shared with dspark's
    context KV (kernels/v4/dspark_context_kv.py)."""
    dim, rope, eps = config.head_dim, config.qk_rope_head_dim, config.rms_norm_eps
    cos, sin = rope_cos[:, : rope // 2].float(), rope_sin[:, : rope // 2].float()
    kv = (x.double() @ wkv.double()).float()
    n = kv * _rsqrt_mean_sq(kv, eps) * gamma_ckv.float()
    return torch.cat((n[:, : dim - rope].to(torch.bfloat16), _rotate(n[:, dim - rope:], cos, sin).to(torch.bfloat16)),
                     dim=-1)


# --- the record ----------------------------------------------------------------------------------------------

def _qkv_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """8 tokens at ``config``'s widths, RoPE angles up to 300 radians, BF16 weights scaled by 1/sqrt(fan-in)."""
    g = generator(seed)
    hidden, lora, h, d, rope = config.hidden_size, config.q_lora_rank, config.num_attention_heads, config.head_dim, \
        config.qk_rope_head_dim
    tokens = 8
    angle = torch.rand(tokens, 1, generator=g) * 300 * torch.rand(rope, generator=g)
    return {"x": torch.randn(tokens, hidden, generator=g).to(torch.bfloat16),
            "wq_a": (torch.randn(hidden, lora, generator=g) / hidden**0.5).to(torch.bfloat16),
            "wq_b": int8_codes((lora, h * d), g), "wq_b_scale": torch.rand(h * d, generator=g) / 127 + 1e-3,
            "wkv": (torch.randn(hidden, d, generator=g) / hidden**0.5).to(torch.bfloat16),
            "rope_cos": torch.cos(angle).to(torch.bfloat16), "rope_sin": torch.sin(angle).to(torch.bfloat16),
            "gamma_cq": (torch.rand(lora, generator=g) + 0.5).to(torch.bfloat16),
            "gamma_ckv": (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16)}


RECORD = Record(
    operator="v4_qkv_proj_rope",
    call=lambda fn, i, config: fn(**i, config=config),
    # qr_scale: the QR RMS summed over chunks in another FP32 order upstream; q at Pro: 7168-term sums land either
    # side of a BF16 midpoint
    outputs={"q": "exact", "kv": "exact", "qr": "exact", "qr_scale": "fp32_ulps"},
    outputs_at={"pro": {"q": "q_bf16"}},
    cases=(CaseSpec("v4_qkv_proj_rope", "V4 Q/KV LoRA projection with RoPE: INT8 qr codes and their scale, per-head "
                    "RMS of q, KV RMSNorm then rotation", _qkv_inputs, geometries=("tiny", "pro")),),
    bad_calls=(BadCall("x of another width", "v4_qkv_proj_rope", replaced(x=lambda i: i["x"][:, :-1]), "x"),
               BadCall("FP32 wq_b", "v4_qkv_proj_rope", replaced(wq_b=lambda i: i["wq_b"].float()), "wq_b")),
    bindings=in_all_folders(golden="qkv_proj_rope.py::golden_qkv_proj_rope", entry="qkv_proj_rope.py::qkv_proj_rope_test"),
)
