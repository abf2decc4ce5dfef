"""Check results: a pure check returns a CheckResult; only the test boundary raises."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Bound:
    """The numbers a named comparator holds an output to, declared once beside the check that applies them
    (each ``contracts.checks`` module exports its ``BOUNDS``); the comparator table, the tree records and the
    report read them from here. ``values`` is empty for a byte-for-byte rule; ``rule`` says in one line how the
    numbers are applied."""

    comparator: str
    rule: str
    values: Mapping[str, float] = field(default_factory=dict)


def bounds_by_name(*groups: Iterable[Bound]) -> dict[str, Bound]:
    """One table from the check modules' ``BOUNDS``; a comparator declared twice is refused."""
    out: dict[str, Bound] = {}
    for group in groups:
        for b in group:
            if b.comparator in out:
                raise ValueError(f"bound of comparator {b.comparator!r} declared twice")
            out[b.comparator] = b
    return out


@dataclass(frozen=True)
class Violation:
    """The worst offending element of a failed check."""

    field: str
    index: tuple[int, ...]
    actual: object
    expected: object
    bound: object = None
    note: str = ""

    def describe(self) -> str:
        where = self.field + "".join(f"[{i}]" for i in self.index)
        if self.bound is not None and isinstance(self.expected, int | float) and self.expected == 0:
            # an error measure against its bound: 0 is the ideal error, not a value to expect
            text = f"{where} error {_fmt(self.actual)} > bound {_fmt(self.bound)}"
        else:
            text = f"{where} = {_fmt(self.actual)}, expected {_fmt(self.expected)}"
            if self.bound is not None:
                text += f" (bound {_fmt(self.bound)})"
        if self.note:
            text += f"; {self.note}"
        return text


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check: how many items were checked, how many failed, and the worst one."""

    check: str
    spec: str
    n_checked: int
    n_failed: int = 0
    worst: Violation | None = None
    evidence: tuple = ()  # contracts.evidence.Mismatch rows, attached to failed comparisons of outputs
    cause: str = ""  # one-line diagnosis from the bytes (contracts.evidence.cause), when one stands out

    @property
    def ok(self) -> bool:
        return self.n_failed == 0

    def __bool__(self) -> bool:  # a result is truthy only when it passed
        return self.ok

    def message(self) -> str:
        if self.ok:
            return f"{self.check}: ok, {self.n_checked} checked ({self.spec})"
        detail = self.worst.describe() if self.worst is not None else "no detail"
        text = f"{self.check} ({self.spec}): {self.n_failed}/{self.n_checked} failed; worst {detail}"
        if self.cause:
            text += f"; cause: {self.cause}"
        if self.evidence:
            from contracts.evidence import table

            text += f"; {table(self.evidence)}"
        return text

    def __str__(self) -> str:
        return self.message()


def passed(check: str, spec: str, n_checked: int) -> CheckResult:
    return CheckResult(check, spec, n_checked)


def failed(check: str, spec: str, n_checked: int, n_failed: int, worst: Violation) -> CheckResult:
    return CheckResult(check, spec, max(n_checked, n_failed, 1), max(n_failed, 1), worst)


def first_failure(results: Iterable[CheckResult]) -> CheckResult:
    """The first failing result, else the last one (an empty list is an error).

    Mirrors the upstream `combine_validation` rule. Spec: §7.2.
    """
    last: CheckResult | None = None
    for result in results:
        if not result.ok:
            return result
        last = result
    if last is None:
        raise ValueError("first_failure needs at least one result")
    return last


def assert_ok(result: CheckResult) -> None:
    """Test-boundary helper: raise AssertionError carrying the check message."""
    if not result.ok:
        raise AssertionError(result.message())


class Tally:
    """Accumulates element comparisons for one check; keeps the first violation."""

    def __init__(self, check: str, spec: str):
        self.check, self.spec = check, spec
        self.n_checked = 0
        self.n_failed = 0
        self.worst: Violation | None = None

    def expect(self, field: str, index: tuple[int, ...], actual: object, expected: object, note: str = "") -> bool:
        self.n_checked += 1
        if actual == expected:
            return True
        self.fail(Violation(field, index, actual, expected, note=note))
        return False

    def fail(self, violation: Violation) -> None:
        self.n_failed += 1
        if self.worst is None:
            self.worst = violation

    def result(self) -> CheckResult:
        if self.n_failed:
            return CheckResult(self.check, self.spec, max(self.n_checked, self.n_failed), self.n_failed, self.worst)
        return CheckResult(self.check, self.spec, self.n_checked)
