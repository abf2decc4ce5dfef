"""TEST DOUBLE of upstream ``golden/spec.py``: ``TensorSpec`` and ``ScalarSpec`` with the real fields, defaults,
validation and value semantics (written for these tests from the real package's documented behaviour)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

_INT_RANGES = {torch.int8: (-(1 << 7), (1 << 7) - 1), torch.int32: (-(1 << 31), (1 << 31) - 1),
               torch.int64: (-(1 << 63), (1 << 63) - 1), torch.uint8: (0, (1 << 8) - 1)}
SUPPORTED_SCALAR_DTYPES = (*_INT_RANGES, torch.bool, torch.float32, torch.float16, torch.bfloat16)


@dataclass
class TensorSpec:
    """A runtime tensor: zero-initialised unless ``init_value`` (constant, tensor, factory or callable); an
    output (validated) only when ``is_output``; ``resident`` None/False, an int worker id or "stacked"."""

    name: str
    shape: list[int]
    dtype: torch.dtype
    init_value: int | float | torch.Tensor | Callable | None = field(default=None)
    is_output: bool = False
    resident: int | str | bool | None = None

    def __post_init__(self) -> None:
        r = self.resident
        if r is None or r is False or r == "stacked":
            return
        if isinstance(r, bool):
            raise ValueError(f"TensorSpec {self.name!r}: resident=True is ambiguous")
        if isinstance(r, int):
            if r < 0:
                raise ValueError(f"TensorSpec {self.name!r}: resident worker id must be >= 0, got {r}.")
            return
        raise ValueError(f"TensorSpec {self.name!r}: resident must be None/False, an int or 'stacked'; got {r!r}.")

    @property
    def is_resident(self) -> bool:
        return self.resident is not None and self.resident is not False

    def create_tensor(self) -> torch.Tensor:
        if self.init_value is None:
            return torch.zeros(self.shape, dtype=self.dtype)
        if isinstance(self.init_value, (int, float)):
            return torch.full(self.shape, self.init_value, dtype=self.dtype)
        if isinstance(self.init_value, torch.Tensor):
            return self.init_value.to(dtype=self.dtype)
        if callable(self.init_value):
            fn = self.init_value
            if fn in (torch.randn, torch.rand, torch.zeros, torch.ones):
                return fn(self.shape, dtype=self.dtype)
            return torch.as_tensor(fn(), dtype=self.dtype)
        raise TypeError(f"Unsupported init_value type {type(self.init_value)!r} for tensor {self.name!r}")


@dataclass
class ScalarSpec:
    """A scalar runtime argument; after construction ``value`` is always a 0-dim tensor of ``dtype``."""

    name: str
    dtype: torch.dtype
    value: int | float | bool | torch.Tensor

    def __post_init__(self) -> None:
        if self.dtype not in SUPPORTED_SCALAR_DTYPES:
            raise ValueError(f"ScalarSpec {self.name!r}: unsupported dtype {self.dtype!r}")
        if isinstance(self.value, torch.Tensor):
            if self.value.ndim != 0:
                raise ValueError(f"ScalarSpec {self.name!r}: value tensor must be 0-dim")
            if self.value.dtype != self.dtype:
                raise ValueError(f"ScalarSpec {self.name!r}: value tensor dtype {self.value.dtype} does not match "
                                 f"dtype field {self.dtype}")
            return
        if self.dtype in _INT_RANGES:
            if isinstance(self.value, bool) or not isinstance(self.value, int):
                raise ValueError(f"ScalarSpec {self.name!r} dtype={self.dtype} requires int value, got "
                                 f"{type(self.value).__name__}")
            lo, hi = _INT_RANGES[self.dtype]
            if not lo <= self.value <= hi:
                raise ValueError(f"ScalarSpec {self.name!r} value {self.value} out of range for {self.dtype}")
        elif self.dtype is torch.bool:
            if not isinstance(self.value, bool):
                raise ValueError(f"ScalarSpec {self.name!r} dtype=torch.bool requires bool value")
        elif isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise ValueError(f"ScalarSpec {self.name!r} dtype={self.dtype} requires int or float value")
        self.value = torch.tensor(self.value, dtype=self.dtype)

    def to_python(self) -> int | float | bool:
        return self.value.item()
