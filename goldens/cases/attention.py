"""Golden cases of attention: the paged indexer's scores and Top-K, and every attention half-layer
(mode x phase, both wirings, TP2, tiny preset). Spec: §2.3, §5, §7.1."""

from __future__ import annotations

import torch

from contracts.half_layer_inputs import HalfLayerCase, build
from goldens.cases import Case, Tensors
from kernels.config import FLASH_TINY, LayerKind
from kernels.reference.attention_layer import attention_half_layer


def _indexer_build(seed: int, wiring: str) -> Tensors:
    from contracts.strategies import IndexerCase

    case = IndexerCase(lens_per_token=((0, 5, 16), (17, 40), (33,)), topk=16, heads=4, dim=32, block=16,
                       tie_rows=True, seed=seed)
    out = case.build()
    out["topk"] = torch.tensor(case.topk, dtype=torch.int32)
    out["block_size"] = torch.tensor(case.block, dtype=torch.int32)
    return out


def _indexer_call(score_fn, select_fn, inputs: Tensors) -> Tensors:
    keys = ("q", "head_weights", "keys", "block_table", "request_ids", "compressed_lens")
    bs = int(inputs["block_size"])
    scores = score_fn(**{k: inputs[k] for k in keys}, block_size=bs, width=int(inputs["compressed_lens"].max()))
    sel = select_fn(scores, inputs["block_table"], inputs["request_ids"], topk=int(inputs["topk"]), block_size=bs)
    return {"scores": scores, "topk_indices": sel}


# attention half-layers: every mode x phase, both wirings, at TP2 on the tiny preset

HALF_LAYER_TP = 2
HALF_LAYER_MODULES = ("kernels.reference.attention_layer", "kernels.reference.attention", "kernels.reference.o_proj",
                      "kernels.reference.tp", "kernels.reference.compressor", "kernels.reference.indexer",
                      "kernels.reference.rope", "kernels.cache", "kernels.quant", "kernels.half_layer",
                      "kernels.sequence_parallel")


HALF_LAYER_INOUT = ("window_payload", "window_scale", "compressed_payload", "compressed_scale", "index_payload",
                    "index_scale", "state_cache")  # caches the entry updates in place (a mode returns those it has)


def half_layer_case(kind, phase: str, config=FLASH_TINY, suffix: str = "") -> Case:
    """The half-layer case of ``kind`` x ``phase`` at ``config``'s geometry (the tiny preset here; at Flash's own
    in goldens.cases.flash, named with ``suffix``)."""
    def inputs(seed: int, wiring: str) -> Tensors:
        return build(HalfLayerCase(kind, phase, wiring, HALF_LAYER_TP, seed=seed, config=config))

    def call(fn, i: Tensors, wiring: str) -> Tensors:
        return fn(i, kind=kind, phase=phase, wiring=wiring, tp=HALF_LAYER_TP, config=config)

    def comparators(wiring: str) -> dict[str, str]:
        outputs = call(attention_half_layer, inputs(0, wiring), wiring)
        return dict.fromkeys(outputs, "half_layer")

    padding = "a 2-row inactive suffix" if phase == "decode" and kind.value == "C2A_REUSE" else (
        "3 padding rows" if phase == "prefill" else "no padding")
    return Case(f"attn_{kind.value.lower()}_{phase}{suffix}", "attention_half_layer",
                f"{kind.value} {phase} half-layer at TP{HALF_LAYER_TP}: 3 requests with history across permuted "
                f"pages, {padding}, 13.0 sentinel rows", build_inputs=inputs,
                run=lambda b, i, w: call(b.get("attention_half_layer"), i, w), comparators=comparators,
                wirings=("replicated", "sharded"), modules=HALF_LAYER_MODULES, inout=HALF_LAYER_INOUT,
                params={"kind": kind.value, "phase": phase, "tp": HALF_LAYER_TP, "preset": config.name},
                preset=config.name)


INDEXER_CASE = Case("indexer_topk", "index_scores+select_topk",
                    "paged indexer scores and Top-K with tied key rows, empty and short tokens, permuted pages",
                    build_inputs=_indexer_build,
                    run=lambda b, i, w: _indexer_call(b.get("index_scores"), b.get("select_topk"), i),
                    comparators=lambda w: {"scores": "masked_scores", "topk_indices": "topk_validity"})

CASES = [INDEXER_CASE] + [half_layer_case(kind, phase) for kind in LayerKind for phase in ("prefill", "decode")]
