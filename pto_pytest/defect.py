"""A seeded defect declared beside the contracts that must catch it.

A contract file may list ``SEEDED_DEFECTS``: each a wrong implementation of one operator (the plausible bug a
kernel could ship) with the contract of that file that must fail on it and the text its failure must name.
``tests/test_seeded_defects.py`` runs every one through the same harness as the defects of ``tests/defects``, so
a new operator's contract file carries the proof that its contracts can fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SeededDefect:
    name: str  # short, unique: "v4-embed-pack:ids-wrap"
    operator: str
    impl: Callable  # replaces the operator on the torch reference backend
    test: str  # a test function of the declaring contract file
    mentions: str  # text the failure must contain (the field, row or rule the contract names)

    def backend(self):
        from backends import torch_backend

        return torch_backend().derive(f"defect:{self.name}", description=f"seeded defect {self.name}",
                                      **{self.operator: self.impl})
