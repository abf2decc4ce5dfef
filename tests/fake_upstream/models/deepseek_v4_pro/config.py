"""TEST DOUBLE of upstream ``models/deepseek_v4_pro/config.py``: the geometry the double's kernels are "compiled"
at (the V4-Pro tiny preset's hidden size and stream count, so the contracts' calls fit)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str = "pro"
    hidden_size: int = 64
    hc_mult: int = 4


ACTIVE = ModelConfig()
