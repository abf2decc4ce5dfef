"""CheckResult plumbing. Spec: §7.2 (combine_validation)."""

from __future__ import annotations

import pytest

from contracts.result import CheckResult, Violation, first_failure


def test_first_failure_returns_first_failing_else_last():
    ok1, ok2 = CheckResult("a", "§x", 3), CheckResult("b", "§x", 4)
    bad1 = CheckResult("c", "§x", 2, 1, Violation("f", (1,), 2, 3))
    bad2 = CheckResult("d", "§x", 2, 2, Violation("g", (0,), 0, 1))
    assert first_failure([ok1, ok2]) is ok2
    assert first_failure([ok1, bad1, bad2]) is bad1
    assert first_failure([bad2, ok1]) is bad2  # a replicated pass cannot hide a sharded failure
    with pytest.raises(ValueError):
        first_failure([])


def test_message_names_field_index_and_bound():
    r = CheckResult("check_x", "§6", 10, 2, Violation("output row", (3, 1), 0.5, 0.0, 0.25, note="RMS"))
    assert not r.ok and not bool(r)
    assert r.message() == "check_x (§6): 2/10 failed; worst output row[3][1] error 0.5 > bound 0.25; RMS"
