"""The one door from pytest's plugin (``pto_pytest.plugin``) into the golden store: the plugin imports this module
and nothing else of ``goldens``. Five things cross it: a store location checked at start-up, user case modules
loaded, a failing contract's inputs recorded as a counterexample tree, the replay report assembled, and the
``--devices`` list parsed (one reading for pytest and ``goldens replay``)."""

from __future__ import annotations

from goldens.errors import GoldenStoreError

__all__ = ["GoldenStoreError", "assemble_report", "check_location", "load_case_modules", "parse_devices",
           "record_counterexample"]


def check_location(text: str) -> None:
    """Raise GoldenStoreError (one line) when ``text`` is not a store location."""
    from goldens.store_format import Location

    Location.parse(text)


def refuse_inside_store(path, what: str) -> None:
    """GoldenStoreError when ``path`` (an output an option names) is inside a golden store's folder."""
    from goldens.outside import refuse_inside_store as refuse

    refuse(path, what)


def load_case_modules(names) -> None:
    from goldens.cases import load_case_modules as load

    load(names)


def record_counterexample(store: str, case: str, inputs: dict, *, label: str) -> tuple[str, str]:
    """Record ``inputs`` as a tree derived from ``case`` in the store at ``store``: (tree name, snapshot)."""
    from goldens import trees
    from goldens.store import GoldenStore

    name, result = trees.record_counterexample(GoldenStore(store), case, inputs, label=label)
    return name, result.snapshot


def assemble_report(directory: str, title: str):
    """One report page from the parts the replay tests wrote (xdist workers too)."""
    from goldens import report

    return report.assemble(directory, title)


def parse_devices(text: str) -> list[int]:
    """Device ids of ``--devices`` (``0-15``, ``0,2,4-7``); GoldenStoreError names a malformed list."""
    from goldens.devices import parse_devices as parse

    return parse(text)
