"""Golden case of V4's decode metadata and HCA's deterministic top-k (the V4-Pro tiny kernel preset).
Spec: §8."""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from goldens.cases import v4_config as _v4_config
from kernels.v4 import decode_metadata as v4md


def _v4_metadata_build(seed: int, wiring: str) -> Tensors:
    """Upstream's HCA decode start regimes (a long start, the ratio-128 boundary, a block crossing, a state page
    edge) over request-interleaved tables with one unmapped window page."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.tensor([300, 127, 255, 7])
    tables = {name: torch.randperm(4 * n, generator=g).reshape(4, n).to(torch.int32)
              for name, n in (("ori_table", 4), ("cmp4_table", 2), ("cmp128_table", 2), ("state4_table", 80),
                              ("state128_table", 40))}
    tables["ori_table"][1, 0] = -1
    return {"starts": starts, **tables}


def _v4_metadata_call(get, inputs: Tensors, wiring: str) -> Tensors:
    md = get("v4_decode_metadata")(inputs["starts"], inputs["ori_table"],
                                   {4: inputs["cmp4_table"], 128: inputs["cmp128_table"]},
                                   {4: inputs["state4_table"], 128: inputs["state128_table"]}, config=_v4_config())
    limit = min(_v4_config().max_position_embeddings // 128, _v4_config().index_topk)
    return {"position_ids": md.position_ids, "kv_seq_lens": md.kv_seq_lens, "ori_slot_mapping": md.ori_slot_mapping,
            "swa_indices": md.swa_indices, "swa_lens": md.swa_lens, "history_indices": md.history_indices,
            "history_lens": md.history_lens, "cmp4_slot_mapping": md.cmp_slot_mapping[4],
            "cmp128_slot_mapping": md.cmp_slot_mapping[128], "state4_slot_mapping": md.state_slot_mapping[4],
            "state128_slot_mapping": md.state_slot_mapping[128],
            "hca_topk": get("hca_topk")(md.position_ids, md.kv_seq_lens, seq=2, limit=limit)}


V4_METADATA_OPS = {"v4_decode_metadata": v4md.v4_decode_metadata, "hca_topk": v4md.hca_topk}
V4_METADATA_OUTPUTS = ("position_ids", "kv_seq_lens", "ori_slot_mapping", "swa_indices", "swa_lens",
                       "history_indices", "history_lens", "cmp4_slot_mapping", "cmp128_slot_mapping",
                       "state4_slot_mapping", "state128_slot_mapping", "hca_topk")

CASES = [
    Case("v4_decode_metadata", "v4_decode_metadata+hca_topk",
         "V4-Pro (tiny, kernel preset) decode metadata of upstream's HCA start regimes and HCA's "
         "deterministic top-k", build_inputs=_v4_metadata_build,
         run=lambda b, i, w: _v4_metadata_call(b.get, i, w),
         comparators=lambda w: dict.fromkeys(V4_METADATA_OUTPUTS, "exact"), preset="v4-pro-tiny"),
]
