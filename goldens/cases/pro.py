"""Cases at V4-Pro's own geometry: the shapes upstream's kernel entries are compiled for, so that the device
binding (``--backend pypto --platform a5sim|a5``) runs them instead of refusing a tiny tree as another geometry.

Their inputs are 10-100 MB (the weights of one layer at hidden 7168), so they never go into the sample store:
load this module and name a store of your own::

    goldens --cases-module goldens.cases.pro --store ~/pro-store record v4_expert_shared_pro
    goldens --cases-module goldens.cases.pro --store ~/pro-store replay --backend pypto --platform a5sim \\
        --pypto-lib ~/pypto-lib --keep-actual v4_expert_shared_pro

The operators with a record (``kernels.record``: the gate, the experts, the projections, hc_post, the final norm)
bring their Pro cases from it (``cases_at("pro")``, built by the same builder as their tiny twins, at the rows the
entry is compiled for); the compressor, attention and indexer cases below are not records yet. Spec: §8.
"""

from __future__ import annotations

import torch

from goldens.cases import Case, Tensors, register
from goldens.cases.compressor import attention_case, compressor_cases, indexer_case
from goldens.cases.records import cases_at
from kernels.config import V4_PRO

PRO = V4_PRO.kernel_preset()
ROWS = PRO.decode_tokens  # MOE_TOKENS / one T_TILE of 8 rows: what the Pro entries are compiled to take


def _prefill_indexer_build(seed: int, wiring: str) -> Tensors:
    """CSA's indexer on one request's prefill chunk at Pro geometry (the 128 rows prefill_indexer_test takes, all
    real): positions 960 .. 1087, visible 240 .. 256 (capped at two index pages from position 1023)."""
    from contracts.v4_inputs import prefill_indexer_inputs

    inputs = prefill_indexer_inputs(PRO, seed, start=960)
    return {**inputs, "num_tokens": torch.tensor(inputs["qr"].shape[0], dtype=torch.int32)}


def _prefill_indexer_call(get, i: Tensors) -> Tensors:
    return dict(get("v4_prefill_indexer")(**{**i, "num_tokens": int(i["num_tokens"])}, config=PRO))


def _case(name: str, operator: str, description: str, build, call, comparators: dict, **more) -> Case:
    """A Pro-geometry case not yet an operator record's (kernels.record): ``call(get, inputs)`` on a backend's
    operators; its reference (derived) is the same call on the reference operators."""
    return Case(name, operator, description, build_inputs=build, run=lambda b, i, w: call(b.get, i),
                comparators=lambda w: dict(comparators), preset=PRO.name, **more)


def build() -> list[Case]:
    return [
        *compressor_cases(PRO, "_pro", "Pro"),
        *(attention_case(PRO, path, "_pro", "Pro") for path in ("SWA", "HCA", "CSA")),
        _case("v4_prefill_indexer_pro", "v4_prefill_indexer", "V4 CSA indexer on a prefill chunk at Pro geometry "
              "(128 rows at 960 .. 1087, all real; visible 240 .. 256; 64 index heads of 128)", _prefill_indexer_build,
              _prefill_indexer_call, {"score": "v4_prefill_index_score", "topk_idxs": "v4_prefill_index_topk"},
              modules=("kernels.v4.prefill_indexer", "kernels.v4.indexer"), params={"topk": PRO.index_topk}),
        indexer_case(PRO, "_pro", "Pro"),
    ]


CASES = build() + cases_at("pro")
for _c in CASES:
    register(_c)
