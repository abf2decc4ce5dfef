"""One exception type for bad engine inputs; messages name field, row, expected and actual."""

from __future__ import annotations

import torch


class ContractInputError(ValueError):
    """Malformed input to a reference or lowering function.

    The message always names the field, the offending row/index, the expected
    value or range, the actual value and the spec section.
    """

    def __init__(self, field: str, index: tuple[int, ...] | None, expected: str, actual: object, spec: str):
        self.field = field
        self.index = index
        self.expected = expected
        self.actual = actual
        self.spec = spec
        where = field + ("".join(f"[{i}]" for i in index) if index else "")
        super().__init__(f"{where}: expected {expected}, got {actual} ({spec})")


def first_true(mask: torch.Tensor) -> int:
    """Index (along dim 0) of the first True in ``mask``: the row an error message names."""
    return int(mask.nonzero()[0, 0])


def is_int(value) -> bool:
    """A Python integer, and not a bool (``True`` is an ``int`` to ``isinstance``; a count of ``True`` rows is a
    caller's mistake, refused like any other non-integer)."""
    return isinstance(value, int) and not isinstance(value, bool)
