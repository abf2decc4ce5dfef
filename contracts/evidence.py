"""Element-level evidence for a failed comparison -- one formatting path for every comparator: the first
mismatching elements with their index, actual, expected, |diff|, relative diff and the distance in units in
the last place of the output's dtype (floating dtypes, FP8 E4M3 included), E8M0 scales decoded to their
power of two with the distance in codes, packed FP4 (E2M1 pairs in bytes, spec §2.2: even element in the
low nibble) decoded per element to its value with the distance in format steps, and the raw codes for
other integer outputs. ``cause`` adds the one-line diagnosis a comparator can make from the bytes: a scale
byte that differs, nibbles swapped within their byte, a count of valid indices that differs. Attached by
``contracts.compare.compare_all`` to every failed result and shown by the CLI, the pytest replay, the
report and ``--json``. Issue: goldens a kernel engineer trusts (evidence in every failure)."""

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
    hex: bool = False  # raw byte codes read best in hex
    unit: str = "ulp"  # what ``ulps`` counts: "ulp" (IEEE-like dtypes), "step" (E2M1 codes), "code" (E8M0);
    # "opposite signs": no count (across zero it would be every representable value in between)
    codes: tuple[int, int] | None = None  # (actual, expected) format codes of decoded FP4 / E8M0 elements

    def describe(self) -> str:
        where = "".join(f"[{i}]" for i in self.index)
        if self.abs_diff is None:
            if self.hex:
                return f"{where} actual=0x{self.actual:02x} expected=0x{self.expected:02x}"
            return f"{where} actual={self.actual} expected={self.expected}"
        ulp = " (opposite signs)" if self.unit == "opposite signs" else \
            "" if self.ulps is None else f" {self.unit}={self.ulps}"
        code = "" if self.codes is None else f" (codes 0x{self.codes[0]:x} vs 0x{self.codes[1]:x})"
        return (f"{where} actual={self.actual:.6g} expected={self.expected:.6g} |diff|={self.abs_diff:.3g} "
                f"rel={self.rel_diff:.3g}{ulp}{code}")

    def as_dict(self) -> dict:
        return {"index": list(self.index), "actual": self.actual, "expected": self.expected,
                "abs_diff": self.abs_diff, "rel_diff": self.rel_diff, "ulps": self.ulps, "unit": self.unit,
                "codes": list(self.codes) if self.codes is not None else None}


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Integers that order like the floating values, so their difference counts the representable steps
    between two values (sign-magnitude folded to two's complement); e.g. 0 and the smallest subnormal are
    1 apart."""
    bits = t.contiguous().view(_INT_VIEW[t.element_size()]).to(torch.int64)
    sign = 1 << (8 * t.element_size() - 1)
    return torch.where(bits < 0, -(bits + sign), bits)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equal, dtype and shape included (a NaN equals the same NaN, which torch.equal denies)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


# E2M1 magnitudes by 3-bit code (spec §2.2); bit 3 is the sign.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * _E2M1[code & 7]


def _e2m1_order(code: int) -> int:
    """Codes ordered like their values, so a difference counts format steps (-0 and +0 are one value)."""
    return -(code & 7) if code & 8 else code & 7


def e2m1_order(codes: torch.Tensor) -> torch.Tensor:
    """``_e2m1_order`` of every code of a tensor (int64)."""
    c = codes.to(torch.int64)
    return torch.where(c >= 8, -(c & 7), c)


def is_payload(name: str) -> bool:
    """A quantized cache's payload output: ``payload`` or ``<cache>_payload``."""
    return name == "payload" or name.endswith("_payload")


def is_packed_fp4(name: str, t: torch.Tensor) -> bool:
    """A payload stored as uint8 is packed FP4 (E2M1 pairs); MXFP8 payloads are float8_e4m3fn."""
    return t.dtype == torch.uint8 and is_payload(name)


def _diff(index: tuple[int, ...], x: float, y: float, steps: int | None, unit: str,
          codes: tuple[int, int] | None = None) -> Mismatch:
    d = abs(x - y) if x == x and y == y else float("nan")
    rel = d / abs(y) if y != 0 else (0.0 if d == 0 else float("inf"))
    return Mismatch(index, x, y, d, rel, steps, unit=unit, codes=codes)


def _fp4_mismatches(a: torch.Tensor, e: torch.Tensor, limit: int) -> tuple[Mismatch, ...]:
    """Packed E2M1 pairs: the index is the element's (…, 2·byte + nibble), its value decoded from the code."""
    out = []
    for i in (a.reshape(-1) != e.reshape(-1)).nonzero().reshape(-1).tolist():
        byte = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a.shape))
        x, y = int(a.reshape(-1)[i]), int(e.reshape(-1)[i])
        for nibble in (0, 1):
            cx, cy = (x >> 4 * nibble) & 15, (y >> 4 * nibble) & 15
            if cx != cy:
                out.append(_diff((*byte[:-1], 2 * byte[-1] + nibble), _e2m1(cx), _e2m1(cy),
                                 abs(_e2m1_order(cx) - _e2m1_order(cy)), "step", (cx, cy)))
                if len(out) == limit:
                    return tuple(out)
    return tuple(out)


def _e8m0(code: int) -> float:
    return float("nan") if code == 0xFF else 2.0 ** (code - 127)


def _e8m0_mismatches(a: torch.Tensor, e: torch.Tensor, limit: int) -> tuple[Mismatch, ...]:
    """E8M0 scales: 2^(code-127), 0xFF NaN; the distance is in codes (= factors of two)."""
    ca, ce = a.view(torch.uint8).reshape(-1), e.view(torch.uint8).reshape(-1)
    out = []
    for i in (ca != ce).nonzero().reshape(-1)[:limit].tolist():
        index = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a.shape))
        x, y = int(ca[i]), int(ce[i])
        out.append(_diff(index, _e8m0(x), _e8m0(y), abs(x - y), "code", (x, y)))
    return tuple(out)


def mismatches(actual: torch.Tensor, expected: torch.Tensor, *, limit: int = LIMIT,
               codec: str | None = None) -> tuple[Mismatch, ...]:
    """The first ``limit`` elements (in memory order) whose bytes differ. ``codec="fp4x2"`` reads uint8 bytes
    as packed E2M1 pairs; E8M0 tensors are recognised by their dtype."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype or actual.numel() == 0:
        return ()
    if codec == "fp4x2" and actual.dtype == torch.uint8:
        return _fp4_mismatches(actual.detach().cpu().contiguous(), expected.detach().cpu().contiguous(), limit)
    if actual.dtype == torch.float8_e8m0fnu:
        return _e8m0_mismatches(actual.detach().cpu().contiguous(), expected.detach().cpu().contiguous(), limit)
    a, e = actual.detach().cpu().contiguous(), expected.detach().cpu().contiguous()
    if a.dtype == torch.bool:
        a, e = a.to(torch.uint8), e.to(torch.uint8)
    size = a.element_size()
    differ = (a.view(_INT_VIEW[size]) != e.view(_INT_VIEW[size])) if size in _INT_VIEW else (a != e)
    flat = differ.reshape(-1).nonzero().reshape(-1)[:limit]
    out = []
    floating = a.is_floating_point()
    fa, fe = a.reshape(-1), e.reshape(-1)
    oa, oe = (ordered(fa), ordered(fe)) if floating and size in _INT_VIEW else (None, None)
    for i in flat.tolist():
        index = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a.shape)) if a.ndim else ()
        if floating:
            x, y = float(fa[i].float()), float(fe[i].float())
            d = abs(x - y)
            rel = d / abs(y) if y != 0 else (0.0 if d == 0 else float("inf"))
            ulps = int(abs(int(oa[i]) - int(oe[i]))) if oa is not None else None
            if ulps is not None and x * y < 0:  # across zero the step count is every value in between: say so
                out.append(Mismatch(index, x, y, d, rel, None, unit="opposite signs"))
                continue
            out.append(Mismatch(index, x, y, d, rel, ulps))
        else:
            out.append(Mismatch(index, int(fa[i]), int(fe[i]), hex=a.dtype == torch.uint8))
    return tuple(out)


def table(rows: tuple[Mismatch, ...], *, limit: int = 3) -> str:
    """The compact form used in one-line messages: the first ``limit`` mismatches."""
    if not rows:
        return ""
    return "first mismatches: " + "; ".join(m.describe() for m in rows[:limit])


def _where(index: tuple[int, ...]) -> str:
    return "".join(f"[{i}]" for i in index)


def cause(actual: torch.Tensor, expected: torch.Tensor, *, codec: str | None = None,
          scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> str:
    """A one-line diagnosis from the bytes, or "" when nothing specific stands out. ``scales`` is the
    (actual, expected) scale pair of a quantized payload (same leading dims, one scale per group)."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype or actual.numel() == 0:
        return ""
    a, e = actual.detach().cpu().contiguous(), expected.detach().cpu().contiguous()
    if scales is not None and scales[0].shape == scales[1].shape and scales[0].dtype == scales[1].dtype:
        sa, se = (s.detach().cpu().contiguous().view(torch.uint8) for s in scales)
        bad = (sa != se).nonzero()
        if len(bad):
            i = tuple(int(v) for v in bad[0])
            x, y = int(sa[i]), int(se[i])
            return (f"scale byte differs in {len(bad)} of {sa.numel()} groups (first {_where(i)}: actual 0x{x:02x}, "
                    f"expected 0x{y:02x}); the payload is judged against a different scale")
    if codec == "fp4x2" and a.dtype == torch.uint8:
        differ = a != e
        n = int(differ.sum())
        if n:
            x, y = a[differ].to(torch.int32), e[differ].to(torch.int32)
            swapped = ((x >> 4) | ((x & 15) << 4)) == y
            if bool(swapped.all()):
                first = tuple(int(v) for v in differ.nonzero()[0])
                return (f"nibbles swapped in all {n} differing bytes (first byte {_where(first)}): low and high "
                        "E2M1 elements exchanged (spec §2.2: the even element is the low nibble)")
            if scales is not None:
                return f"scales equal; {n} payload bytes differ"
    if a.dtype in (torch.int32, torch.int64) and a.ndim == 2 and bool(((a < 0) | (e < 0)).any()):
        ca, ce = (a >= 0).sum(1), (e >= 0).sum(1)
        rows = (ca != ce).nonzero().reshape(-1)
        if len(rows):
            r = int(rows[0])
            return (f"count differs in {len(rows)} row(s) (first row {r}: {int(ca[r])} valid indices, expected "
                    f"{int(ce[r])})")
    return ""
