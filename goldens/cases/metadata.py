"""Golden cases of the host-side metadata: ForwardMetadata of a mixed batch and the sequence-parallel
owner slabs (both wirings). Spec: §3, §7.1."""

from __future__ import annotations

import random

import torch

from goldens.cases import Case, Tensors
from kernels.config import FLASH_TINY

# metadata


def _metadata_case_inputs(seed: int, wiring: str) -> Tensors:
    from contracts.strategies import BatchCase, materialize

    rng = random.Random(seed)
    qlens = (0, 1, 6, 23, rng.randint(1, 40))
    kvs = (0, 17, 129, 255, rng.randint(0, 3000) | 1)  # empty, decode, odd resume, page edge
    case = BatchCase(config=FLASH_TINY, query_lens=qlens, kv_lens=kvs, padding=3, tp=4,
                     inactive_state=(False, True, False, False, False), spare_pages=2, free_behind_window=True,
                     seed=seed)
    kw = materialize(case)
    out: Tensors = {"query_start_loc": kw["query_start_loc"], "kv_seq_lens": kw["kv_seq_lens"],
                    "window_block_table": kw["window_block_table"].to(torch.int32)}
    for src, t in kw["compressed_block_tables"].items():
        out[f"compressed_block_tables_src{src}"] = t.to(torch.int32)
    for src, t in kw["state_block_tables"].items():
        out[f"state_block_tables_src{src}"] = t
    out["tp_size"] = torch.tensor(kw["tp_size"], dtype=torch.int32)
    out["capacity"] = torch.tensor(kw["capacity"], dtype=torch.int32)
    return out


def _metadata_kwargs(inputs: Tensors) -> dict:
    return dict(
        query_start_loc=inputs["query_start_loc"], kv_seq_lens=inputs["kv_seq_lens"],
        window_block_table=inputs["window_block_table"],
        compressed_block_tables={int(k.rsplit("src", 1)[1]): v for k, v in inputs.items()
                                 if k.startswith("compressed_block_tables_src")},
        state_block_tables={int(k.rsplit("src", 1)[1]): v for k, v in inputs.items()
                            if k.startswith("state_block_tables_src")},
        config=FLASH_TINY, tp_size=int(inputs["tp_size"]), capacity=int(inputs["capacity"]))


def _flatten_metadata(meta) -> Tensors:
    out: Tensors = {}
    for name, value in meta.as_dict().items():
        if isinstance(value, dict):
            for src, t in sorted(value.items()):
                out[f"{name}_src{src}"] = t
        elif isinstance(value, torch.Tensor):
            out[name] = value
        else:
            out[name] = torch.tensor(value, dtype=torch.int64)
    return out


def _metadata_run(backend, inputs: Tensors, wiring: str) -> Tensors:
    return _flatten_metadata(backend.get("build_forward_metadata")(**_metadata_kwargs(inputs)))


def _metadata_reference(inputs: Tensors, wiring: str) -> Tensors:
    from kernels.metadata import build_forward_metadata

    return _flatten_metadata(build_forward_metadata(**_metadata_kwargs(inputs)))


def _sp_build(seed: int, wiring: str) -> Tensors:
    g = torch.Generator().manual_seed(seed + (1 if wiring == "sharded" else 0))
    active, capacity, tp = 5, 8, 4
    return {"x": (torch.rand((active, 16), generator=g) + 0.5).to(torch.bfloat16),
            "token_ids": torch.randperm(64, generator=g)[:active].to(torch.int32),
            "positions": torch.randint(0, 4000, (active,), generator=g, dtype=torch.int32),
            "tp": torch.tensor(tp, dtype=torch.int32), "capacity": torch.tensor(capacity, dtype=torch.int32)}


def _sp_call(shard, gather, inputs: Tensors, wiring: str) -> Tensors:
    tp, cap = int(inputs["tp"]), int(inputs["capacity"])
    slabs = shard(inputs["x"], inputs["token_ids"], inputs["positions"], tp=tp, capacity=cap)
    if wiring == "sharded":  # the per-rank slab ABI: [TP, width, ...]
        return {"slab_payload": torch.stack([s.payload for s in slabs]),
                "slab_token_ids": torch.stack([s.token_ids for s in slabs]),
                "slab_positions": torch.stack([s.positions for s in slabs]),
                "slab_valid": torch.stack([s.valid for s in slabs])}
    x, tok, pos = gather(slabs, active_tokens=inputs["x"].shape[0], capacity=cap)
    return {"gathered": x, "gathered_token_ids": tok, "gathered_positions": pos}


def _sp_comparators(wiring: str) -> dict[str, str]:
    names = (("slab_payload", "slab_token_ids", "slab_positions", "slab_valid") if wiring == "sharded"
             else ("gathered", "gathered_token_ids", "gathered_positions"))
    return dict.fromkeys(names, "exact")


CASES = [
    Case("metadata", "build_forward_metadata",
         "ForwardMetadata of a mixed batch: empty, decode, prefill, odd resume, inactive state, permuted "
         "pages, freed window pages, padding", build_inputs=_metadata_case_inputs, run=_metadata_run,
         comparators=lambda w: {k: "exact" for k in _metadata_reference(_metadata_case_inputs(0, w), w)}),
    Case("sp_slabs", "sp_shard+sp_gather",
         "sequence-parallel owner slabs (T=5, TP=4, capacity 8): the replicated wiring gathers, the "
         "sharded wiring publishes per-rank slabs", build_inputs=_sp_build,
         run=lambda b, i, w: _sp_call(b.get("sp_shard"), b.get("sp_gather"), i, w),
         comparators=_sp_comparators, wirings=("replicated", "sharded")),
]
