"""TEST DOUBLE of ``pypto.runtime``'s ``RunConfig`` (the fields run_jit's compile step passes; unknown keys raise)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RunConfig:
    platform: str = "a2a3sim"
    device_id: int = 0
    distributed_config: Any = None
    dump_passes: bool = False
    compile_profiling: bool = False
