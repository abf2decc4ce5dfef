"""Cases at V4.1-Flash's own geometry: every attention half-layer (mode x phase, both wirings, TP2) with the
FLASH preset's dims instead of the tiny preset's, as a device compiled for Flash takes them. One tree holds
400-500 MB (the layer's weights and caches at hidden 4096), so they never go into the sample store:
``goldens record --geometry flash`` writes them into a store you name, a directory or ``s3://bucket/prefix``::

    goldens --store ~/flash-store record --geometry flash attn_c1a_full_decode_flash
    goldens --store s3://team-goldens/flash replay --geometry flash --backend pypto --platform a5 ...

Each case is its tiny twin of ``goldens.cases.attention`` (same batch, pages, padding and sentinels) at Flash's
dims, named with ``_flash``. Spec: §7.2.
"""

from __future__ import annotations

from goldens.cases import register
from goldens.cases.attention import half_layer_case
from kernels.config import FLASH, LayerKind

CASES = [half_layer_case(kind, phase, config=FLASH, suffix="_flash") for kind in LayerKind
         for phase in ("prefill", "decode")]

for _c in CASES:
    register(_c)
