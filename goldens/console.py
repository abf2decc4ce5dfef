"""The command's two consoles (stdout for tables and results, stderr for errors and progress), the default store
and the number format of the tables.
"""

from __future__ import annotations

import math
import os

from rich.console import Console


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4g}"


DEFAULT_STORE = os.environ.get("PTO_GOLDEN_STORE", "artifacts/store")


console = Console(width=160, emoji=False)  # a name like a:b:c is text, never an emoji


err = Console(stderr=True, width=160, emoji=False)
