"""Inputs of one decode Block call (``decode_block``): a half-layer case of the mode with every row active,
FP32 streams, an incoming mix that is not one-hot, both mHC weight sets, a router and BF16-valued experts.
Shared by the Block contracts and the Block golden trees. Spec: §1, HC-03, HC-05.
"""

from __future__ import annotations

import torch

from contracts.half_layer_inputs import HalfLayerCase, build
from kernels.config import FLASH_TINY, LayerKind
from kernels.reference.block import MhcWeights
from kernels.reference.moe import ExpertWeights

C = FLASH_TINY
HC, D = C.hc_mult, C.hidden_size
MIX = (2 + HC) * HC
TP = 2


def block_inputs(kind: LayerKind, seed: int = 0, *, batch: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
                 wiring: str = "replicated", tp: int = TP) -> dict:
    """Everything one decode Block call takes: a half-layer case with every row active (``batch``: its query
    and kv lens instead of the default), FP32 streams, an incoming mix that is not one-hot, both mHC weight sets,
    a router and BF16-valued experts."""
    g = torch.Generator().manual_seed(seed + 101)
    attention = build(HalfLayerCase(kind, "decode", wiring, tp, seed=seed, padding=0, batch=batch))
    tokens = attention["position_ids"].shape[0]

    def mhc_weights() -> MhcWeights:
        return MhcWeights(torch.randn(MIX, HC * D, generator=g) / (HC * D) ** 0.5, torch.randn(3, generator=g),
                          torch.randn(MIX, generator=g))

    def w(rows, cols):
        return (torch.randn(rows, cols, generator=g) / cols**0.5).to(torch.bfloat16)

    inter, experts = C.moe_intermediate_size, C.n_routed_experts
    incoming = torch.rand(tokens, HC, generator=g) + 0.1
    return {"x_hc": torch.randn(tokens, HC, D, generator=g), "incoming_pre_mix": incoming,
            "attention_inputs": attention, "attention_mhc": mhc_weights(), "ffn_mhc": mhc_weights(),
            "router": torch.randn(experts, D, generator=g) / D**0.5, "bias": torch.randn(experts, generator=g) * 0.05,
            "experts": [ExpertWeights(w(inter, D), w(inter, D), w(D, inter)) for _ in range(experts)],
            "shared": ExpertWeights(w(inter, D), w(inter, D), w(D, inter))}
