"""Cases at dspark's deployment of V4-Flash (``kernels.config.V4_FLASH_DSPARK``: 16 requests x 8 tokens, pages of 32,
a ratio-4 state page of 2), the dims ``models/deepseek_v4_flash_dspark``'s entries are compiled for where they
differ from Flash-MTP's: every operator record's case that names the ``dspark`` geometry (the gate), and the decode
compressor's and indexer's cases. Never in the sample store: ``goldens --store DIR record --geometry dspark``.
Spec: §7.2.
"""

from __future__ import annotations

from goldens.cases import register
from goldens.cases.compressor import compressor_cases, indexer_case
from goldens.cases.records import cases_at
from kernels.config import V4_FLASH_DSPARK

_DSPARK = V4_FLASH_DSPARK.kernel_preset()
CASES = cases_at("dspark") + compressor_cases(_DSPARK, "_dspark", "dspark") + [
    indexer_case(_DSPARK, "_dspark", "dspark")]

for _c in CASES:
    register(_c)
