"""Element-level evidence for a failed comparison -- one formatting path for every comparator: the first
mismatching elements with their index, actual, expected, |diff|, relative diff and the distance in units in
the last place of the output's dtype (floating dtypes, FP8 included), or the raw codes for integer and
packed byte outputs. Attached by ``contracts.compare.compare_all`` to every failed result and shown by the
CLI, the pytest replay and ``--json``. Issue: goldens a kernel engineer trusts (evidence in every failure)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

LIMIT = 8
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Mismatch:
    index: tuple[int, ...]
    actual: float | int
    expected: float | int
    abs_diff: float | None = None
    rel_diff: float | None = None
    ulps: int | None = None
    hex: bool = False  # byte codes (packed FP4 payloads, E8M0 scales stored as bytes) read best in hex

    def describe(self) -> str:
        where = "".join(f"[{i}]" for i in self.index)
        if self.abs_diff is None:
            if self.hex:
                return f"{where} actual=0x{self.actual:02x} expected=0x{self.expected:02x}"
            return f"{where} actual={self.actual} expected={self.expected}"
        ulp = "" if self.ulps is None else f" ulp={self.ulps}"
        return (f"{where} actual={self.actual:.6g} expected={self.expected:.6g} |diff|={self.abs_diff:.3g} "
                f"rel={self.rel_diff:.3g}{ulp}")

    def as_dict(self) -> dict:
        return {"index": list(self.index), "actual": self.actual, "expected": self.expected,
                "abs_diff": self.abs_diff, "rel_diff": self.rel_diff, "ulps": self.ulps}


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Integers that order like the floating values, so their difference counts the representable steps
    between two values (sign-magnitude folded to two's complement); e.g. 0 and the smallest subnormal are
    1 apart."""
    bits = t.contiguous().view(_INT_VIEW[t.element_size()]).to(torch.int64)
    sign = 1 << (8 * t.element_size() - 1)
    return torch.where(bits < 0, -(bits + sign), bits)


def mismatches(actual: torch.Tensor, expected: torch.Tensor, *, limit: int = LIMIT) -> tuple[Mismatch, ...]:
    """The first ``limit`` elements (in memory order) whose bytes differ."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype or actual.numel() == 0:
        return ()
    a, e = actual.detach().cpu().contiguous(), expected.detach().cpu().contiguous()
    if a.dtype == torch.bool:
        a, e = a.to(torch.uint8), e.to(torch.uint8)
    size = a.element_size()
    differ = (a.view(_INT_VIEW[size]) != e.view(_INT_VIEW[size])) if size in _INT_VIEW else (a != e)
    flat = differ.reshape(-1).nonzero().reshape(-1)[:limit]
    out = []
    floating = a.is_floating_point()
    fa, fe = a.reshape(-1), e.reshape(-1)
    oa, oe = (_ordered(fa), _ordered(fe)) if floating and size in _INT_VIEW else (None, None)
    for i in flat.tolist():
        index = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a.shape)) if a.ndim else ()
        if floating:
            x, y = float(fa[i].float()), float(fe[i].float())
            d = abs(x - y)
            rel = d / abs(y) if y != 0 else (0.0 if d == 0 else float("inf"))
            ulps = int(abs(int(oa[i]) - int(oe[i]))) if oa is not None else None
            out.append(Mismatch(index, x, y, d, rel, ulps))
        else:
            out.append(Mismatch(index, int(fa[i]), int(fe[i]), hex=a.dtype == torch.uint8))
    return tuple(out)


def table(rows: tuple[Mismatch, ...], *, limit: int = 3) -> str:
    """The compact form used in one-line messages: the first ``limit`` mismatches."""
    if not rows:
        return ""
    return "first mismatches: " + "; ".join(m.describe() for m in rows[:limit])
