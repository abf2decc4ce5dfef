"""The released V4.1-Flash checkpoint's linear weights, decoded on the host (upstream_checks CQ-19, CQ-22).

A checkpoint linear is stored output-major [N, K], as ``torch.nn.functional.linear`` takes it, in one of four
storage dtypes:

* F32 / BF16: the values themselves; such a weight carries no scale.
* F8_E4M3 (MXFP8): one E8M0 scale per 32 x 32 block, scale [N/32, K/32]; value = e4m3 * 2^(code - 127).
* I8 (MXFP4): two E2M1 codes a byte, the even input column in the low nibble, bit 3 of a nibble the sign;
  one E8M0 scale per 32 input columns of a row, scale [N, K/32]; the payload is [N, K/2].

E8M0 code 255 (NaN) is refused, a quantized weight without an E8M0 scale is refused, shapes that do not agree
are refused, and a decoded value that is not finite is refused, each naming what is wrong.

``linear_format`` is the released precision policy of a projection, which differs from its storage for a few
stems: the LM head and every MoE gate run in FP32, WO-A in BF16, the compressors of ratio-2 layers in FP32;
every other projection runs in its storage format.

Spec: upstream_checks CQ-19, CQ-22 (prefill_fwd.py, decode_checkpoint_linear and PrefillCheckpoint.linear_format).
"""

from __future__ import annotations

import torch

from kernels.config import FLASH, V41Config
from kernels.errors import ContractInputError

SPEC = "CQ-19"
ROUNDING_VERSION = "checkpoint-1"
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
BLOCK = 32
STORAGE_FORMATS = {"F32": "fp32", "BF16": "bf16", "F8_E4M3": "mxfp8", "I8": "mxfp4"}


def _factors(scale: torch.Tensor | None) -> torch.Tensor:
    if scale is None or scale.dtype != torch.float8_e8m0fnu:
        got = "no scale" if scale is None else str(scale.dtype)
        raise ContractInputError("scale", None, "E8M0 scales (float8_e8m0fnu) for a quantized weight", got, SPEC)
    codes = scale.contiguous().view(torch.uint8).long()
    if bool((codes == 255).any()):
        where = tuple(int(v) for v in (codes == 255).nonzero()[0])
        raise ContractInputError("scale", where, "a finite E8M0 code (not 255, NaN)", 255, SPEC)
    return torch.exp2(codes.double() - 127)


def decode_checkpoint_linear(weight: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """A stored linear -> its FP32 values [N, K], output-major (module docstring). Spec: CQ-19."""
    if weight.dtype in (torch.float32, torch.bfloat16):
        if scale is not None:
            raise ContractInputError("scale", None, "no scale for an unquantized (F32/BF16) weight",
                                     f"{scale.dtype}{list(scale.shape)}", SPEC)
        return weight.float().contiguous()
    if weight.dtype not in (torch.float8_e4m3fn, torch.int8):
        raise ContractInputError("weight", None, "F32, BF16, F8_E4M3 or I8 (packed FP4)", str(weight.dtype), SPEC)
    factors = _factors(scale)
    if weight.ndim != 2 or scale.ndim != 2:
        raise ContractInputError("weight", None, "a 2-D weight and a 2-D scale",
                                 [list(weight.shape), list(scale.shape)], SPEC)
    rows, cols = weight.shape
    if weight.dtype == torch.float8_e4m3fn:
        if (rows, cols) != (scale.shape[0] * BLOCK, scale.shape[1] * BLOCK):
            raise ContractInputError("weight", None, f"[{scale.shape[0] * BLOCK}, {scale.shape[1] * BLOCK}] "
                                     "(32 x 32 blocks of the scale)", list(weight.shape), SPEC)
        per_element = factors.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        values = weight.double() * per_element
    else:
        if rows != scale.shape[0] or 2 * cols != BLOCK * scale.shape[1]:
            raise ContractInputError("weight", None, f"[{scale.shape[0]}, {BLOCK * scale.shape[1] // 2}] packed "
                                     "bytes (one scale per 32 input columns)", list(weight.shape), SPEC)
        packed = weight.contiguous().view(torch.uint8).long()
        codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(rows, 2 * cols)  # even column low
        magnitude = torch.tensor(E2M1, dtype=torch.float64)[codes & 7]
        values = torch.where(codes & 8 != 0, -magnitude, magnitude) * factors.repeat_interleave(BLOCK, 1)
    out = values.float()
    if not bool(torch.isfinite(out).all()):
        where = tuple(int(v) for v in (~torch.isfinite(out)).nonzero()[0])
        raise ContractInputError("weight", where, "finite decoded values", float(out[where]), SPEC)
    return out.contiguous()


def linear_format(stem: str, storage: str, *, config: V41Config = FLASH) -> str:
    """The format a projection runs in ("fp32", "bf16", "mxfp8", "mxfp4") from its stem and storage dtype
    (a safetensors dtype name). Spec: CQ-22."""
    if storage not in STORAGE_FORMATS:
        raise ContractInputError("storage", None, f"one of {sorted(STORAGE_FORMATS)}", repr(storage), "CQ-22")
    if stem == "head" or stem.endswith(".ffn.gate"):
        return "fp32"
    if stem.endswith(".attn.wo_a"):
        return "bf16"
    parts = stem.split(".")
    if len(parts) == 5 and parts[0] == "layers" and parts[2:4] == ["attn", "compressor"] and parts[1].isdigit():
        layer = int(parts[1])
        if not 0 <= layer < len(config.compress_ratios):
            raise ContractInputError("stem", None, f"a layer in [0, {len(config.compress_ratios)})", stem, "CQ-22")
        if config.compress_ratios[layer] > 1:
            return "fp32"
    return STORAGE_FORMATS[storage]
