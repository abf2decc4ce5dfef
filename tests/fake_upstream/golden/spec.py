"""TEST DOUBLE of upstream ``golden/spec.py``: the two spec kinds the runner takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TensorSpec:
    name: str
    shape: list[int]
    dtype: torch.dtype
    init_value: Any = None

    def create_tensor(self) -> torch.Tensor:
        value = self.init_value() if callable(self.init_value) else self.init_value
        if value is None:
            return torch.zeros(self.shape, dtype=self.dtype)
        return value.clone().to(self.dtype).reshape(self.shape)


@dataclass
class ScalarSpec:
    name: str
    dtype: torch.dtype
    value: Any

    def __post_init__(self):
        if not isinstance(self.value, torch.Tensor):
            self.value = torch.tensor(self.value, dtype=self.dtype)
