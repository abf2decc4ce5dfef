"""A hand vector pins a rule only if no plausible other rule gives the same bytes on it.

A contract that checks a kernel against a hand-computed value states, next to the vector, the alternatives an
implementation could plausibly have chosen (another summation order, the clamp on the other side of the
activation, the other tie rule, staging through another dtype, a cast at another point) and computes each of
them on the same inputs. ``separates`` asserts that the expected bytes differ from every alternative's, so a
kernel that implements an alternative fails the contract, and a vector that stops separating (someone edits
its numbers) fails loudly instead of passing everything. ``tests/test_hand_vectors.py`` checks that every
hand-vector contract calls it.

    separates("one BF16 cast after the FP32 sum", expected,
              cast_each_partial_first=sum(p.bfloat16() for p in parts),
              reversed_order=...)
"""

from __future__ import annotations

import torch

from contracts.evidence import same_bytes

PINNED: dict[str, tuple[str, ...]] = {}  # rule -> the alternatives it was separated from (this process)


def separates(rule: str, expected: torch.Tensor, **alternatives: torch.Tensor) -> torch.Tensor:
    """``expected`` (what ``rule`` gives on the vector) differs in bytes from what each named alternative gives
    on it; returns ``expected``. An alternative of another dtype or shape differs by construction: compare what
    the kernel would return (cast it as the kernel would)."""
    if not alternatives:
        raise AssertionError(f"the hand vector for {rule!r} names no alternative it separates the rule from")
    same = [name for name, alt in alternatives.items() if same_bytes(expected, alt)]
    if same:
        raise AssertionError(f"the hand vector for {rule!r} does not separate it from {same}: they give the same "
                             f"bytes ({torch.as_tensor(expected).flatten()[:8].tolist()}...); change the vector")
    PINNED[rule] = tuple(sorted(set(PINNED.get(rule, ())) | set(alternatives)))
    return expected


def separates_under(rule: str, judge, expected, **alternatives):
    """For a vector judged within a bound, not byte for byte: ``judge(candidate, expected)`` (a bool, or a
    result with ``.ok``) passes ``expected`` itself and fails each alternative, so a kernel implementing an
    alternative fails the contract's bound. Returns ``expected``."""
    def ok(candidate) -> bool:
        verdict = judge(candidate, expected)
        return bool(getattr(verdict, "ok", verdict))

    if not alternatives:
        raise AssertionError(f"the hand vector for {rule!r} names no alternative it separates the rule from")
    if not ok(expected):
        raise AssertionError(f"the judge of {rule!r} fails the rule's own expected value")
    within = [name for name, alt in alternatives.items() if ok(alt)]
    if within:
        raise AssertionError(f"the hand vector for {rule!r} does not separate it from {within} under its bound; "
                             "change the vector")
    PINNED[rule] = tuple(sorted(set(PINNED.get(rule, ())) | set(alternatives)))
    return expected


def bf16_once(x: torch.Tensor | float) -> torch.Tensor:
    """FP64 values rounded to BF16 in one rounding (8 significant bits, ties to even), returned as FP32 -- the
    "no FP32 stage" alternative. torch's own FP64 -> BF16 cast goes through FP32 and rounds twice, so it cannot
    stand for this alternative. Finite, normal-range values."""
    v = torch.as_tensor(x, dtype=torch.float64)
    _m, e = torch.frexp(v)
    return torch.where(v == 0, v, torch.round(v * torch.exp2(8.0 - e)) * torch.exp2(e - 8.0)).float()


def bf16_clear_of_midpoints(x: torch.Tensor, what: str, err: torch.Tensor | None = None) -> torch.Tensor:
    """The BF16 nearest an FP64 value, asserting the test's inputs keep it clear of a BF16 midpoint by 2^-13 of a step
    plus ``err`` (what an FP32 evaluation may be off by: a sum of terms of either sign errs by their magnitudes, not
    the result's), so a backend computing in FP32 has one right answer."""
    down = x.to(torch.bfloat16)
    _, exponent = torch.frexp(x)  # |x| in [2^(exponent-1), 2^exponent): a BF16 step there is 2^(exponent-8)
    step = torch.ldexp(torch.ones_like(x), exponent - 8)
    slack = 2**-13 + (0 if err is None else err / step)
    near = ((((x - down.double()) / step).abs() - 0.5).abs() < slack) & (x != 0)
    assert not bool(near.any()), f"the test's inputs reach a BF16 midpoint in {what}: choose another seed"
    return down


def running_sum(parts, start=None) -> torch.Tensor:
    """``start`` (or zero) plus each part in the order given, in the parts' dtype: a loop's summation order."""
    parts = list(parts)
    total = torch.zeros_like(parts[0]) if start is None else start
    for p in parts:
        total = total + p
    return total


def pairwise_sum(parts) -> torch.Tensor:
    """((p0 + p1) + (p2 + p3)) + ...: a tree reduction, the usual other order."""
    level = list(parts)
    while len(level) > 1:
        level = [level[i] + level[i + 1] if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0]


def separating_fraction(examples, rule, *alternatives) -> dict[str, float]:
    """For a property strategy: the fraction of ``examples`` on which each alternative's bytes differ from
    ``rule``'s (callables of one example). A byte-exact property whose strategy never separates an alternative
    cannot catch a kernel that implements it."""
    examples = list(examples)
    out = {}
    for alt in alternatives:
        out[alt.__name__] = sum(not same_bytes(rule(x), alt(x)) for x in examples) / max(len(examples), 1)
    return out
