"""One exception type for the golden store layer."""


class GoldenStoreError(Exception):
    """A store, tree or file problem (missing/corrupt array, stale golden, wrong wiring, bad spec).

    CLI exit code 2. Messages name the case, wiring and array.
    """


class BackendFailure(Exception):
    """The backend under test raised while running a tree's operator (not a store problem): CLI exit code 3."""
