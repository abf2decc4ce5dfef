"""Every seeded defect a contract file declares (``SEEDED_DEFECTS``, ``pto_pytest.defect``) makes the contract it
names fail cleanly, naming what it says: the file's own wrong implementations and the shared ones of
``tests/defects`` (``module:OBJECT``, loaded with the same loader as ``--backend-module``). Each contract also passes
on the torch reference (the contracts/ suite itself).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from tests import forkserver
from tests.harness import run_contract

ROOT = Path(__file__).resolve().parents[1]

def _declared_defects() -> list[tuple[str, object]]:
    """(contract module, SeededDefect) of every ``SEEDED_DEFECTS`` a contract file declares."""
    out = []
    for path in sorted((ROOT / "contracts").glob("test_*.py")):
        module = importlib.import_module(f"contracts.{path.stem}")
        out += [(path.stem, d) for d in getattr(module, "SEEDED_DEFECTS", ())]
    return out


DECLARED = _declared_defects()


@pytest.mark.parametrize("module_name, defect", DECLARED, ids=[f"{d.name}->{d.test}" for _m, d in DECLARED])
def test_contract_file_catches_its_declared_defect(module_name, defect):
    """The defects a contract file declares beside its contracts (pto_pytest.defect.SeededDefect)."""
    fn = getattr(importlib.import_module(f"contracts.{module_name}"), defect.test)
    # a half-layer contract runs 72 calls: the first failing one is the evidence (and keeps CI fast)
    outcome = run_contract(fn, defect.backend(), stop_at_first=defect.source.startswith("half_layer:"))
    assert outcome.failures, (f"contract {module_name}::{defect.test} did not fail cleanly on defect {defect.name}"
                              + (f": it crashed with {outcome.crashes[0]!r}" if outcome.crashes else ": it passed"))
    text = " | ".join(str(e) for e in outcome.failures)
    assert defect.mentions in text, f"failure does not mention {defect.mentions!r}: {text[:600]}"


def test_declared_defects_have_unique_names_and_name_their_operator():
    from contracts.operators import KERNEL_OPERATORS

    keys = [(d.name, d.test) for _m, d in DECLARED]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
    own = [d.name for _m, d in DECLARED if not d.source]
    assert len(own) == len(set(own)), own
    assert all(d.operator in KERNEL_OPERATORS for _m, d in DECLARED if not d.source)
    assert len(DECLARED) >= 230  # the files' own and the shared ones: the walk found them at all


def test_every_shared_defect_replaces_an_operator_and_every_defect_module_is_used():
    """A shared defect that replaces nothing would be the reference under another name; a defect of tests/defects
    no contract file names is a proof nobody runs."""
    import pkgutil

    import tests.defects as defects

    used = {d.source for _m, d in DECLARED if d.source}
    for source in sorted(used):
        d = next(d for _m, d in DECLARED if d.source == source)
        assert d.operators(), f"{source} replaces no operator of the reference"
    families = {m.name for m in pkgutil.iter_modules(defects.__path__)} - {"crashing"}  # the CLI tests' crash, no contract's
    assert families <= {s.split(":")[0] for s in used}, families - {s.split(":")[0] for s in used}


def test_backend_module_option_runs_contracts_on_a_defect():
    """End to end: ``pytest --backend-module`` loads a defect and the contract run fails (exit 1)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "contracts/test_slabs.py",
           "--backend-module", "tests.defects.slabs:WIDTH_FROM_ACTIVE", "-k", "spec_examples"]
    proc = forkserver.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "failed" in proc.stdout

