"""Golden cases of CSA's indexer: at decode and on a prefill chunk (the V4-Pro tiny kernel preset).
Spec: §8."""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors
from goldens.cases import v4_config as _v4_config


def _v4_prefill_indexer_build(seed: int, wiring: str) -> Tensors:
    """CSA's indexer on one request's prefill chunk (contracts.v4_inputs.prefill_indexer_inputs): 128 rows at
    positions 960 .. 1087 (visible 240 .. 256, capped from position 1023), the last 28 rows padding."""
    from contracts.v4_inputs import prefill_indexer_inputs

    inputs = prefill_indexer_inputs(_v4_config(), seed, start=960)
    return {**inputs, "num_tokens": torch.tensor(100, dtype=torch.int32)}


def _v4_prefill_indexer_call(get, inputs: Tensors) -> Tensors:
    return dict(get("v4_prefill_indexer")(**{**inputs, "num_tokens": int(inputs["num_tokens"])}, config=_v4_config()))


def _v4_indexer_build(seed: int, wiring: str) -> Tensors:
    """V4-Pro (tiny, kernel preset) decode indexer at upstream's start regimes with a shuffled INT8 index cache
    (contracts.v4_inputs.indexer_inputs)."""
    from contracts.v4_inputs import indexer_inputs

    return indexer_inputs(_v4_config(), seed)


def _v4_indexer_call(get, inputs: Tensors) -> Tensors:
    config = _v4_config()
    return dict(get("v4_indexer")(**inputs, offset=config.sliding_window, config=config))


CASES = [
    Case("v4_indexer", "v4_indexer",
         "V4-Pro (tiny, kernel preset) CSA decode indexer: visible ranges 75 / 32 / 64 / 2 at upstream's "
         "start regimes, INT8 query and index cache, shuffled pages", build_inputs=_v4_indexer_build,
         run=lambda b, i, w: _v4_indexer_call(b.get, i),
         comparators=lambda w: {"score": "v4_index_score", "topk_idxs": "v4_index_topk"},
         params={"topk": _v4_config().index_topk, "offset": _v4_config().sliding_window,
         "seq": _v4_config().decode_seq}, preset="v4-pro-tiny"),
    Case("v4_prefill_indexer", "v4_prefill_indexer",
         "V4-Pro (tiny, kernel preset) CSA indexer on a prefill chunk: 128 rows at positions 960 .. 1087 "
         "(visible 240 .. 256, capped at two cache blocks from position 1023), a RoPE row per token, 28 "
         "padding rows, shuffled pages", build_inputs=_v4_prefill_indexer_build,
         run=lambda b, i, w: _v4_prefill_indexer_call(b.get, i),
         comparators=lambda w: {"score": "v4_prefill_index_score", "topk_idxs": "v4_prefill_index_topk"},
         modules=("kernels.v4.prefill_indexer", "kernels.v4.indexer"),
         params={"topk": _v4_config().index_topk}, preset="v4-pro-tiny"),
]
