"""TEST DOUBLE of ``pypto.ir.distributed_compiled_program.DistributedConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DistributedConfig:
    device_ids: list[int] = field(default_factory=list)
    num_sub_workers: int = 0
