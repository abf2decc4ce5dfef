"""The verdict of one replayed tree, and the verdicts of a replay run.

``judge`` is the one place a loaded tree becomes a verdict -- STALE (refused), SKIP (the backend lacks an operator
or cannot run this call), ERROR (the backend raised), FAIL or PASS (every output by its comparator) -- for
``goldens replay`` and for pytest's golden-tree tests alike. ``Verdicts`` collects a run's rows (one per output, or
one ``*`` row per tree that did not run), its counts and its exit code. Spec: §7.3.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from goldens.errors import BackendFailure

STYLES = {"PASS": "green", "FAIL": "red", "SKIP": "yellow", "ERROR": "bold magenta", "STALE": "bold red"}


@dataclass
class Judged:
    verdict: str  # PASS, FAIL, SKIP, ERROR or STALE
    detail: str = ""
    results: dict = field(default_factory=dict)  # output -> CheckResult, when the backend ran
    actual: dict = field(default_factory=dict)  # output -> the backend's tensor, when it ran


def judge(tree, backend, *, allow_stale: bool = False, stale_detail=None, verbose: bool = False) -> Judged:
    """Replay ``tree`` on ``backend`` and judge each output (``goldens.trees.replay``). A stale tree is refused
    unless ``allow_stale`` (``stale_detail(tree)`` says why; default: its stale reason)."""
    from contracts.operators import MissingOperator, Unsupported
    from goldens import trees

    if tree.stale and not allow_stale:
        return Judged("STALE", stale_detail(tree) if stale_detail else tree.stale_reason())
    actual: dict = {}
    try:
        results = trees.replay(tree, backend, allow_stale=allow_stale, keep=actual)
    except (MissingOperator, Unsupported) as exc:  # lacks the operator / cannot run this call: skipped, named
        return Judged("SKIP", str(exc))
    except BackendFailure as exc:  # the backend raised: an ERROR, and the other trees still run
        detail = str(exc)
        if verbose and exc.__cause__ is not None:
            import traceback

            detail += "\n" + "".join(traceback.format_exception(exc.__cause__)).rstrip()
        return Judged("ERROR", detail)
    return Judged("PASS" if all(r.ok for r in results.values()) else "FAIL", results=results, actual=actual)


class Verdicts:
    """A replay run's rows and counts: ``failed_outputs``, ``errors``, ``skipped``, ``stale``, ``ran``,
    ``unreadable`` (a tree that could not be read or judged)."""

    KEYS = ("failed_outputs", "errors", "skipped", "stale", "ran", "unreadable")

    def __init__(self, on_row=None):
        self.rows: list[dict] = []
        self.counts: Counter = Counter()
        self.first_skip = ""
        self.reported: list = []  # goldens.report.TreeReport of each tree, for --report
        self._on_row = on_row  # (row) -> None: the table the command prints

    def row(self, case, wiring, output, comparator, verdict, detail="", evidence=(), cause="") -> None:
        r = {"case": case, "wiring": wiring, "output": output, "comparator": comparator, "verdict": verdict,
             "detail": detail, "cause": cause, "evidence": [m.as_dict() for m in evidence]}
        self.rows.append(r)
        if self._on_row:
            self._on_row(r)

    def tree(self, case: str, wiring: str, verdict: str, detail: str, *, count: str) -> None:
        """One ``*`` row for a tree that did not run (SKIP, ERROR, STALE), counted under ``count``."""
        from goldens import report

        self.counts[count] += 1
        if verdict == "SKIP":
            self.first_skip = self.first_skip or detail
        self.row(case, wiring, "*", "-", verdict, detail)
        self.reported.append(report.TreeReport(case, wiring, verdict, detail))

    def outputs(self, case: str, wiring: str, judged: Judged, comparators: dict) -> None:
        self.counts["ran"] += 1
        for output, result in judged.results.items():
            self.counts["failed_outputs"] += not result.ok
            self.row(case, wiring, output, comparators[output], "PASS" if result.ok else "FAIL",
                     "" if result.ok else result.message(), result.evidence, result.cause)

    def summary(self) -> dict:
        return {k: self.counts[k] for k in self.KEYS}

    def by_tree(self) -> dict:
        """{(case, wiring): {output: verdict}}: what --keep-actual records beside each kept output."""
        out: dict = {}
        for r in self.rows:
            out.setdefault((r["case"], r["wiring"]), {})[r["output"]] = r["verdict"]
        return out

    def exit_code(self, *, rev: str | None, allow_unavailable: bool) -> tuple[int, str]:
        """(exit code, the one line that explains a non-zero one, or ""): 2 stale trees refused, 3 a backend
        error or nothing ran, 1 an output out of bound; then 2 where a tree could not be read."""
        c = self.counts
        code, line = 0, ""
        if c["stale"]:
            advice = ("the reference changed since they were recorded; each row says whether its outputs move "
                      "within their comparators (rounding: `goldens regen` is safe) or past them (check the reference "
                      "first)" if rev is None else
                      f"revision {rev} predates the current reference: `goldens replay --rev {rev} --allow-stale` "
                      "replays it anyway, `goldens replay` replays main")
            code, line = 2, f"error: {c['stale']} stale tree(s) refused: {advice}"
        elif c["errors"]:
            code, line = 3, (f"backend error: {c['errors']} tree(s) raised in the backend (ERROR rows above; "
                             "--verbose shows tracebacks)"
                             + (f"; {c['failed_outputs']} output(s) also out of bound" if c["failed_outputs"] else ""))
        elif c["failed_outputs"]:
            code = 1
        elif c["skipped"] and not c["ran"] and not allow_unavailable:
            code, line = 3, (f"backend error: nothing ran: every tree was skipped ({c['skipped']}); first: "
                             f"{self.first_skip} (--allow-unavailable accepts that)")
        if c["unreadable"]:
            line = "\n".join(x for x in (line, f"error: {c['unreadable']} tree(s) could not be read or judged (ERROR "
                                               "rows above: unreadable tree); the others were replayed") if x)
            code = 2 if code in (0, 1) else code
        return code, line
