"""The wrong-input table of ``contracts/test_judges_wrong_inputs.py``: for each comparator, the tree of the sample
store that judges an output with it (or a kept device run's tree rebuilt from its case), and the kinds of wrong
input that apply to that output. Working it out loads every tree of the store (about 20 s), so it is committed as
``contracts/judges_table.json`` and collection reads that file; ``test_the_table_is_the_sample_stores`` works it
out again from the store on every run and fails on any drift, naming the command that writes it::

    python -m tests.judges_table        # after goldens regen or a new comparator
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

FLOAT_KINDS = ("low row", "nan actual", "inf actual", "nan expected", "split", "order")
INT_KINDS = ("off by one", "split", "order")
PATH = Path(__file__).resolve().parents[1] / "contracts" / "judges_table.json"
COMMAND = "python -m tests.judges_table"


@functools.cache
def _reader():
    """One read session of the sample store for the whole process (each session holds its own worker threads)."""
    from pathlib import Path

    from goldens.store import GoldenStore

    return GoldenStore(Path(__file__).resolve().parents[1] / "artifacts" / "store").reader()


@functools.cache
def _examples() -> dict[str, tuple[str, str, str]]:
    """comparator -> (case, wiring, output) of the first tree of the sample store that judges an output with it
    (outputs with at least two judged rows preferred)."""
    from goldens import trees

    reader = _reader()
    found: dict[str, tuple[str, str, str]] = {}
    for case in trees.recorded_cases(reader):
        for wiring in trees.recorded_wirings(reader, case):
            tree = trees.load_tree(reader, case, wiring)
            if tree.stale:
                continue
            for output, comparator in sorted(tree.record.comparators.items()):
                e = tree.expected[output]
                rows = _distinct_rows(e)
                if comparator not in found or (rows >= 2 and found[comparator][3] < 2):
                    found[comparator] = (case, wiring, output, rows)
    from goldens.recorded import REBUILD

    for case in reader.groups("actual/pypto-a5sim"):  # the kept device runs: Pro-geometry judges (outputs_at)
        for wiring in reader.groups(f"actual/pypto-a5sim/{case}"):
            if REBUILD not in reader.group_attrs(f"actual/pypto-a5sim/{case}/{wiring}"):
                continue
            for output, comparator in sorted(_tree(case, wiring).record.comparators.items()):
                if comparator not in found:
                    found[comparator] = (case, wiring, output, _distinct_rows(_tree(case, wiring).expected[output]))
    return {k: v[:3] for k, v in found.items()}


@functools.cache
def _tree(case: str, wiring: str):
    """A tree of the sample store, or a kept device run's tree rebuilt from its case (inputs checked by digest)."""
    from goldens import trees
    from goldens.recorded import REBUILD, rebuild_tree

    reader = _reader()
    kept = f"actual/pypto-a5sim/{case}/{wiring}"
    if case in set(trees.recorded_cases(reader)):
        return trees.load_tree(reader, case, wiring)
    assert REBUILD in reader.group_attrs(kept), f"{case}/{wiring}: neither a tree nor a kept run of the store"
    return rebuild_tree(reader, "pypto-a5sim", case, wiring)


def _distinct_rows(e: torch.Tensor) -> int:
    """How many distinct judged rows ``e`` has (0 when nothing is judged)."""
    if not e.numel():
        return 0
    rows, judged = _rows(e), _rows(_judged(e))
    live = [r for r in range(rows.shape[0]) if bool(judged[r].any())]
    return len({tuple(rows[r][judged[r]].double().tolist()) for r in live[:64]})


def _judged(e: torch.Tensor) -> torch.Tensor:
    """Elements a judge reads as values: finite, not a sentinel past a visible range (|e| < 1e30)."""
    if e.is_floating_point():
        f = e.float()
        return torch.isfinite(f) & (f.abs() < 1e30)
    return torch.ones_like(e, dtype=torch.bool)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1) if t.ndim >= 2 else t.reshape(1, -1)


def compute() -> dict:
    """The table worked out from the sample store: ``examples`` (comparator -> [case, wiring, output]) and ``rows``
    ([comparator, kind], one per kind of wrong input that applies to that output)."""
    examples = _examples()
    rows = []
    for comparator, (case, wiring, output) in sorted(examples.items()):
        e = _tree(case, wiring).expected[output]
        distinct = _distinct_rows(e)
        for kind in FLOAT_KINDS if e.is_floating_point() else INT_KINDS:
            if kind in ("split", "order") and distinct < 2:
                continue
            if kind == "split" and e.dtype == torch.bool:
                continue
            rows.append([comparator, kind])
    return {"examples": {k: list(v) for k, v in sorted(examples.items())}, "rows": rows}


def table() -> dict:
    """The committed table (examples as tuples); a missing or unreadable file is one line naming the command."""
    try:
        doc = json.loads(PATH.read_text(encoding="utf-8"))
        return {"examples": {k: tuple(v) for k, v in doc["examples"].items()},
                "rows": [tuple(r) for r in doc["rows"]]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"{PATH}: cannot read the wrong-input table ({exc}); write it with {COMMAND}") from None


def main() -> int:
    doc = compute()  # one line per comparator and per row, so a drift reads as a short diff
    lines = ['{"examples": {'] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in doc["examples"].items()]
    lines[-1] = lines[-1].rstrip(",")
    lines += ['}, "rows": ['] + [f" {json.dumps(r)}," for r in doc["rows"]]
    lines[-1] = lines[-1].rstrip(",")
    PATH.write_text("\n".join(lines + ["]}"]) + "\n", encoding="utf-8")
    print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
