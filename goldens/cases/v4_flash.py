"""Cases at main's V4-Flash geometry (hidden 4096, 256 experts: ``kernels.config.V4_FLASH``), the dims the
``deepseek_v4_flash_mtp`` and ``deepseek_v4_flash_dspark`` entries are compiled for: every operator record's case
that names the ``v4-flash`` geometry (``kernels.record``), named with ``_v4_flash``, and the decode compressor's two cases (``goldens.cases.compressor``). Never in the sample store:
``goldens --store DIR record --geometry v4-flash``. Spec: §7.2.
"""

from __future__ import annotations

from goldens.cases import register
from goldens.cases.compressor import attention_case, compressor_cases, indexer_case
from goldens.cases.records import cases_at
from kernels.config import V4_FLASH

_FLASH = V4_FLASH.kernel_preset()
CASES = cases_at("v4-flash") + cases_at("v4-flash-ep2") + compressor_cases(_FLASH, "_v4_flash", "V4-Flash") + [
    indexer_case(_FLASH, "_v4_flash", "V4-Flash"),
    *(attention_case(_FLASH, path, "_v4_flash", "V4-Flash") for path in ("SWA", "HCA", "CSA"))]

for _c in CASES:
    register(_c)
