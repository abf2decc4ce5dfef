"""The device-arithmetic twin (``--backend emulated``) passes every contract that calls an operator it
replaces: it is judged by the same contracts, and against the same reference, as a kernel would be."""

from __future__ import annotations

import pytest

from contracts.backends import emulated_backend, torch_backend
from tests.harness import contracts_for, run_contract

TWINNED = sorted(op for op in emulated_backend().operators
                 if emulated_backend().get(op) is not torch_backend().get(op))
CONTRACTS = contracts_for(TWINNED)


def test_the_emulated_backend_replaces_sparse_attention():
    """The twin replaces ``sparse_attention``; the attention half-layer composed on the emulated backend runs
    on it (a composition is bound to its backend's operators), so the half-layer contracts run here too."""
    assert TWINNED == ["attention_half_layer", "sparse_attention"], TWINNED
    assert CONTRACTS, "no contract calls the twinned operators"


@pytest.mark.parametrize("fn", CONTRACTS, ids=[f.__name__ for f in CONTRACTS])
def test_emulated_backend_passes(fn):
    outcome = run_contract(fn, emulated_backend())
    assert outcome.passed, f"{outcome.contract}: {outcome.text()[:600]}"
