"""Golden cases of the decode Block: attention (TP2, replicated) and the compact MoE through mHC, for each
representative layer kind. Spec: §1."""

from __future__ import annotations

import torch

from contracts.block_inputs import TP, block_inputs
from goldens.cases import Case, Tensors
from goldens.cases.attention import HALF_LAYER_MODULES
from kernels.config import FLASH_TINY, LayerKind
from kernels.reference.block import MhcWeights
from kernels.reference.moe import ExpertWeights

# the decode Block

BLOCK_KEYS = ("x_hc", "incoming_pre_mix", "attn_function", "attn_scale", "attn_base", "ffn_function", "ffn_scale",
              "ffn_base", "router", "bias", "experts_w1", "experts_w3", "experts_w2", "shared_w1", "shared_w3",
              "shared_w2")


def _block_build(kind):
    def build(seed: int, wiring: str) -> Tensors:
        i = block_inputs(kind, seed)
        e = i["experts"]
        return {**i["attention_inputs"], "x_hc": i["x_hc"], "incoming_pre_mix": i["incoming_pre_mix"],
                "attn_function": i["attention_mhc"].function, "attn_scale": i["attention_mhc"].scale,
                "attn_base": i["attention_mhc"].base, "ffn_function": i["ffn_mhc"].function,
                "ffn_scale": i["ffn_mhc"].scale, "ffn_base": i["ffn_mhc"].base, "router": i["router"],
                "bias": i["bias"], "experts_w1": torch.stack([x.w1 for x in e]),
                "experts_w3": torch.stack([x.w3 for x in e]), "experts_w2": torch.stack([x.w2 for x in e]),
                "shared_w1": i["shared"].w1, "shared_w3": i["shared"].w3, "shared_w2": i["shared"].w2}
    return build


def _block_call(fn, inputs: Tensors, kind) -> Tensors:
    attention = {k: v for k, v in inputs.items() if k not in BLOCK_KEYS}
    experts = [ExpertWeights(inputs["experts_w1"][n], inputs["experts_w3"][n], inputs["experts_w2"][n])
               for n in range(inputs["experts_w1"].shape[0])]
    return fn(inputs["x_hc"], inputs["incoming_pre_mix"], attention,
              MhcWeights(inputs["attn_function"], inputs["attn_scale"], inputs["attn_base"]),
              MhcWeights(inputs["ffn_function"], inputs["ffn_scale"], inputs["ffn_base"]), inputs["router"],
              inputs["bias"], experts, ExpertWeights(inputs["shared_w1"], inputs["shared_w3"], inputs["shared_w2"]),
              kind=kind, tp=TP, config=FLASH_TINY)


def _block_case(kind: LayerKind) -> Case:
    return Case(f"block_{kind.value.lower()}", "decode_block",
                f"decode Block of the {kind.value} representative layer: attention (TP2, replicated) and the "
                "compact MoE through mHC, a non-one-hot incoming mix, every row active",
                build_inputs=_block_build(kind),
                run=lambda b, i, w: _block_call(b.get("decode_block"), i, kind),
                comparators=lambda w: {"x_hc": "fp8_budget", "attention_hidden": "attention_forced",
                "next_pre_mix": "hc_mix", "attention_input": "bf16_stage", "ffn_input": "ffn_input",
                "ffn_output": "fp8_budget"},
                modules=HALF_LAYER_MODULES + ("kernels.reference.mhc", "kernels.reference.moe", "kernels.reference.block"),
                params={"kind": kind.value, "phase": "decode", "tp": 2, "preset": "flash-tiny"})


CASES = [_block_case(k) for k in (LayerKind.SWA, LayerKind.C2A_FULL, LayerKind.C1A_FULL)]
