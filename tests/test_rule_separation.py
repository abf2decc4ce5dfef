"""Each named rounding rule is separated from every other: a backend that applies rule B when asked for
rule A fails ``test_each_rule_matches_its_hand_vectors`` for A, for every ordered pair (A, B). Spec: §2.2."""

from __future__ import annotations

import itertools

import pytest

from backends import torch_backend
from contracts.test_quant import test_each_rule_matches_its_hand_vectors as contract
from kernels import quant

PAIRS = [(a, b) for a, b in itertools.permutations(sorted(quant.RULES), 2)]


def swapped(a: str, b: str):
    def mx_quantize(x, rule_name):
        return quant.mx_quantize(x, b if rule_name == a else rule_name)
    return torch_backend().derive(f"swap:{a}->{b}", mx_quantize=mx_quantize)


@pytest.mark.parametrize("a, b", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_swapping_two_rules_fails_the_hand_vectors(a, b):
    with pytest.raises((AssertionError, RuntimeError, ValueError)) as info:
        contract(backend=swapped(a, b), rule_name=a)
    assert a in str(info.value) or "shape" in str(info.value) or "size" in str(info.value), str(info.value)[:300]
