"""Golden cases of V4's MTP layer, at decode and on one request's prefill chunk (the V4-Pro tiny kernel
preset). Spec: §8."""

from __future__ import annotations

import torch

from contracts.v4_inputs import mtp_layer_inputs, prefill_mtp_layer_inputs
from goldens.cases import Case, Tensors
from goldens.cases import v4_config as _v4_config

_MTP_GROUPS = ("projection", "attention", "moe", "head")


def _v4_mtp_layer_build(seed: int, wiring: str) -> Tensors:
    """The MTP layer of V4-Pro (tiny, kernel preset) at decode (contracts.v4_inputs.mtp_layer_inputs), flattened:
    each group's tensors as ``<group>.<name>``, the routed experts stacked as ``moe.routed.<w>`` [E, ...]."""
    return _mtp_flat(mtp_layer_inputs(_v4_config(), seed))


def _v4_prefill_mtp_layer_build(seed: int, wiring: str) -> Tensors:
    """The MTP layer of V4-Pro (tiny, kernel preset) on one request's prefill chunk
    (contracts.v4_inputs.prefill_mtp_layer_inputs): 128 rows at positions 200 .. 327, 100 real, the window's
    first page unmapped. The padding rows' slots are -1, as upstream's fixture ABI requires of inactive
    entries (the contracts give them a real row's slot to show the kernel ignores it). Flattened as the
    decode tree, with the window cache at the top as ``kv_cache`` (the in-out pool its comparator reads) and
    ``num_tokens``."""
    i = prefill_mtp_layer_inputs(_v4_config(), seed, rows=128, num_tokens=100, start=200)
    i["attention"]["swa_slot_mapping"][i["num_tokens"]:] = -1
    flat = _mtp_flat(i)
    flat["kv_cache"] = flat.pop("attention.kv_cache")
    flat["num_tokens"] = torch.tensor(i["num_tokens"], dtype=torch.int32)
    return flat


def _mtp_flat(i: dict) -> Tensors:
    flat = {"hidden": i["hidden"], "prev": i["prev"]}
    for group in _MTP_GROUPS:
        for name, value in i[group].items():
            if name == "routed":
                for w in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
                    flat[f"moe.routed.{w}"] = torch.stack([getattr(e, w) for e in value])
            elif name == "shared":
                for w in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
                    flat[f"moe.shared.{w}"] = getattr(value, w)
            elif isinstance(value, torch.Tensor):
                flat[f"{group}.{name}"] = value
            else:
                flat[f"{group}.{name}"] = torch.tensor(value, dtype=torch.int32)
    return flat


def _v4_mtp_layer_call(get, inputs: Tensors) -> Tensors:
    groups = _mtp_groups(inputs)
    out = get("v4_mtp_layer")(inputs["hidden"], inputs["prev"], groups["projection"], groups["attention"],
                              groups["moe"], groups["head"], config=_v4_config())
    return {"hidden_out": out["hidden_out"], "next_pre_hc_hidden": out["next_pre_hc_hidden"]}


def _v4_prefill_mtp_layer_call(get, inputs: Tensors) -> Tensors:
    groups = _mtp_groups({k: v for k, v in inputs.items() if k not in ("kv_cache", "num_tokens")})
    groups["attention"]["kv_cache"] = inputs["kv_cache"]
    out = get("v4_prefill_mtp_layer")(inputs["hidden"], inputs["prev"], groups["projection"], groups["attention"],
                                      groups["moe"], groups["head"], int(inputs["num_tokens"]), config=_v4_config())
    return {"hidden_out": out["hidden_out"], "next_pre_hc_hidden": out["next_pre_hc_hidden"],
            "kv_cache": out["kv_cache"]}


def _mtp_groups(inputs: Tensors) -> dict[str, dict]:
    """The flattened MTP tree's inputs back into the layer's argument groups."""
    from kernels.v4.moe import V4ExpertWeights

    groups: dict[str, dict] = {g: {} for g in _MTP_GROUPS}
    routed, shared = {}, {}
    for key, value in inputs.items():
        if key.startswith("moe.routed."):
            routed[key.split(".")[-1]] = value
        elif key.startswith("moe.shared."):
            shared[key.split(".")[-1]] = value
        elif "." in key:
            group, name = key.split(".", 1)
            groups[group][name] = int(value) if name == "num_tokens" else value
    ws = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
    groups["moe"]["routed"] = [V4ExpertWeights(*(routed[w][e] for w in ws)) for e in range(routed["w1"].shape[0])]
    groups["moe"]["shared"] = V4ExpertWeights(*(shared[w] for w in ws))
    return groups


MTP_MODULES = ("kernels.v4.mtp_layer", "kernels.v4.moe", "kernels.v4.gate", "kernels.v4.attention_stage",
               "kernels.v4.mtp")

CASES = [
    Case("v4_mtp_layer", "v4_mtp_layer",
         "V4-Pro (tiny, kernel preset) MTP layer at decode: projection, the SWA attention stage (its kv "
         "rows written before the read), the score-routed MoE stage with INT8 experts, the head mix, "
         "hc_head and the RMSNorm", build_inputs=_v4_mtp_layer_build,
         run=lambda b, i, w: _v4_mtp_layer_call(b.get, i),
         comparators=lambda w: {"hidden_out": "hc_out", "next_pre_hc_hidden": "hc_out"}, modules=MTP_MODULES,
         preset="v4-pro-tiny"),
    Case("v4_mtp_layer_prefill", "v4_prefill_mtp_layer",
         "V4-Pro (tiny, kernel preset) MTP layer on one request's prefill chunk: 128 rows at positions "
         "200 .. 327, 100 real; the window lowered from a 1-D page table whose first page is unmapped, "
         "profile-0 RoPE, no output for the padding rows (slot -1), the MoE stage with the same num_tokens",
         build_inputs=_v4_prefill_mtp_layer_build, run=lambda b, i, w: _v4_prefill_mtp_layer_call(b.get, i),
         comparators=lambda w: {"hidden_out": "v4_prefill_mtp_out", "next_pre_hc_hidden": "v4_prefill_mtp_out",
         "kv_cache": "v4_kv_pool"},
         modules=MTP_MODULES[:4] + ("kernels.v4.decode_metadata", "kernels.v4.mtp"), preset="v4-pro-tiny",
         deviations=("fp32-layer-chain",)),
]
