"""The quantized linears around the attention and the MoE: the MX_B_NN scale order the device's MX matmul
reads, the MXFP8 linear with its output dtype, and the official CED quantized linear.

* ``pack_mx_b_scale`` / ``unpack_mx_b_scale``: logical weight scales [..., K/32, N] (one E8M0 code per 32
  input rows and output column) <-> the MX_B_NN physical order: the output columns in blocks of 16, and within
  a block the k-groups in pairs, each column's two scales adjacent. Needs an even K-group count and N % 16 == 0.
* ``pack_mx_a_scale`` / ``unpack_mx_a_scale``: logical activation scales [M, K/32] (one code per row and 32
  inputs) <-> the MX_A_ZZ physical order: the rows in blocks of 16, and within a block the k-groups in pairs,
  pair-major, each row's two scales adjacent. Needs M % 16 == 0 and an even K-group count.
* ``mx_linear``: x quantized to MXFP8 per 32 inputs (rule ``ced_mxfp8``), times the decoded weight [K, N]
  accumulated in FP64 and rounded once to FP32; the result is kept as the FP32 partial when
  ``output_dtype=float32`` and rounded to BF16 otherwise (the default).
* ``official_linear``: the CED reference's quantized linear with weight [N, K] (output-major, as checkpoints
  store it): no bias and K % 32 == 0 required; x quantized to MXFP8; each group of 32 inputs gives a partial
  computed exactly and rounded to FP32, the partials are added **sequentially in FP32**, group by group, and the
  total is rounded to BF16 once.

Spec: §2.2 (MX codecs); upstream_checks CQ-15 (both scale layouts), CQ-16, CQ-18.
"""

from __future__ import annotations

import torch

from kernels import quant
from kernels.errors import ContractInputError

SPEC = "§2.2"
ROUNDING_VERSION = "quant-linear-1"


def _check_b(scale: torch.Tensor) -> tuple[list[int], int, int]:
    *lead, groups, n = scale.shape
    if groups % 2 or n % 16:
        raise ContractInputError("scale", None, "[..., K/32, N] with an even K-group count and N % 16 == 0",
                                 list(scale.shape), "CQ-15")
    return lead, groups, n


def pack_mx_b_scale(scale: torch.Tensor) -> torch.Tensor:
    """Logical [..., K/32, N] -> MX_B_NN physical order (same shape). Spec: CQ-15."""
    lead, groups, n = _check_b(scale)
    d = len(lead)
    blocks = scale.reshape(*lead, groups // 2, 2, n // 16, 16)
    return blocks.permute(*range(d), d + 2, d, d + 3, d + 1).contiguous().reshape(*lead, groups, n)


def unpack_mx_b_scale(packed: torch.Tensor) -> torch.Tensor:
    """MX_B_NN physical order -> logical [..., K/32, N]. Spec: CQ-15."""
    lead, groups, n = _check_b(packed)
    d = len(lead)
    blocks = packed.reshape(*lead, n // 16, groups // 2, 16, 2)
    return blocks.permute(*range(d), d + 1, d + 3, d, d + 2).contiguous().reshape(*lead, groups, n)


def _check_a(scale: torch.Tensor) -> tuple[int, int]:
    if scale.ndim != 2 or scale.shape[0] % 16 or scale.shape[1] % 2:
        raise ContractInputError("scale", None, "[M, K/32] with M % 16 == 0 and an even K-group count",
                                 list(scale.shape), "CQ-15")
    return scale.shape[0], scale.shape[1]


def pack_mx_a_scale(scale: torch.Tensor) -> torch.Tensor:
    """Logical [M, K/32] -> MX_A_ZZ physical order (same shape). Spec: CQ-15."""
    m, groups = _check_a(scale)
    blocks = scale.reshape(m // 16, 16, groups // 2, 2)
    return blocks.transpose(1, 2).contiguous().reshape(m, groups)


def unpack_mx_a_scale(packed: torch.Tensor) -> torch.Tensor:
    """MX_A_ZZ physical order -> logical [M, K/32]. Spec: CQ-15."""
    m, groups = _check_a(packed)
    blocks = packed.reshape(m // 16, groups // 2, 16, 2)
    return blocks.transpose(1, 2).contiguous().reshape(m, groups)


def mx_linear(x: torch.Tensor, weight: torch.Tensor, *, output_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """x [T, K] (K % 32 == 0), decoded weight [K, N] -> [T, N] in ``output_dtype`` (FP32 keeps the partial,
    BF16 rounds it). Spec: CQ-16."""
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[0] or x.shape[1] % 32:
        raise ContractInputError("mx_linear", None, "x [T, K] and weight [K, N] with K % 32 == 0",
                                 [list(x.shape), list(weight.shape)], SPEC)
    if output_dtype not in (torch.float32, torch.bfloat16):
        raise ContractInputError("output_dtype", None, "float32 or bfloat16", output_dtype, "CQ-16")
    q = quant.quant_dequant(x, "ced_mxfp8")
    out = (q.double() @ weight.double()).float()
    return out if output_dtype == torch.float32 else out.to(torch.bfloat16)


def official_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K], weight [N, K] -> [T, N] FP32 holding BF16 values: sequential FP32 sums of exact group-32
    partials, one BF16 rounding. Spec: CQ-18."""
    if bias is not None:
        raise ContractInputError("bias", None, "None (official quantized linears have no bias)", "a tensor", "CQ-18")
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[1] or x.shape[1] % 32:
        raise ContractInputError("official_linear", None, "x [T, K] and weight [N, K] with K % 32 == 0",
                                 [list(x.shape), list(weight.shape)], "CQ-18")
    q = quant.quant_dequant(x, "ced_mxfp8").double()
    w = weight.float().double()
    total = torch.zeros(x.shape[0], weight.shape[0], dtype=torch.float32)
    for k in range(0, x.shape[1], 32):
        total = total + (q[:, k:k + 32] @ w[:, k:k + 32].T).float()
    return total.to(torch.bfloat16).float()
