"""One exception type for the golden store layer."""


class GoldenStoreError(Exception):
    """A store, tree or file problem (missing/corrupt array, stale golden, wrong wiring, bad spec).

    CLI exit code 2. Messages name the case, wiring and array.
    """


class BackendFailure(Exception):
    """The backend under test raised while running a tree's operator (not a store problem): CLI exit code 3."""


class RuleChange(GoldenStoreError):
    """regen found outputs moved past their comparators: a rule change or a reference bug, not rounding."""

    def __init__(self, trees_: list[str]):
        self.trees = trees_
        shown = "; ".join(trees_[:3]) + (f"; +{len(trees_) - 3} more" if len(trees_) > 3 else "")
        super().__init__(f"{len(trees_)} tree(s) would move past their comparators, which a rounding change does "
                         f"not do: {shown}. Check the reference (a bug looks exactly like this); if the rule "
                         "changed on purpose, `goldens regen --accept-moved -m REASON` records it. Nothing was committed")
