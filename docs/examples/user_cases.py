"""User-defined golden cases: a module that registers its cases with ``goldens.cases.register`` (the built-in
cases go through the same call). Load it with ``PTO_GOLDEN_CASES=docs.examples.user_cases``,
``goldens --cases-module docs.examples.user_cases ...`` or pytest's ``--golden-cases``:

    goldens --store out/store --cases-module docs.examples.user_cases record rope_rows_flash
    goldens --store out/store --cases-module docs.examples.user_cases replay rope_rows_flash

A case names its operator, how to build inputs from a seed, the reference and the backend call (both map
inputs to outputs), the comparator of every output, and its wirings.
"""

from __future__ import annotations

import random

import torch

from goldens.cases import Case, register
from kernels.config import FLASH
from kernels.reference.rope import materialize_rope_rows, precompute_rope_tables


def build(seed: int, wiring: str) -> dict[str, torch.Tensor]:
    rng = random.Random(seed)
    cos, sin = precompute_rope_tables(4096, False, FLASH)  # FLASH geometry: 4096 positions, 32 pairs
    positions = [rng.randint(-2, 4095) for _ in range(40)] + [4095, 0, -1]
    half = cos.shape[1]
    return {"freqs_cos": cos, "freqs_sin": sin, "position_ids": torch.tensor(positions, dtype=torch.int32),
            "num_tokens": torch.tensor(len(positions) - 2, dtype=torch.int32),
            "rope_cos": torch.full((len(positions), half), 17.0), "rope_sin": torch.full((len(positions), half), 19.0)}


def _call(fn, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    rc, rs = inputs["rope_cos"].clone(), inputs["rope_sin"].clone()
    fn(inputs["freqs_cos"], inputs["freqs_sin"], inputs["position_ids"], int(inputs["num_tokens"]), rc, rs)
    return {"rope_cos": rc, "rope_sin": rs}


register(Case(
    name="rope_rows_flash",
    operator="materialize_rope_rows",
    description="RoPE rows at FLASH geometry (4096-row plain table), the last two rows past num_tokens",
    wirings=("replicated",),
    modules=("kernels.reference.rope",),
    build_inputs=build,
    reference=lambda inputs, wiring: _call(materialize_rope_rows, inputs),
    run=lambda backend, inputs, wiring: _call(backend.get("materialize_rope_rows"), inputs),
    comparators=lambda wiring: {"rope_cos": "exact", "rope_sin": "exact"},
    inout=("rope_cos", "rope_sin"),
    preset="flash",
))
