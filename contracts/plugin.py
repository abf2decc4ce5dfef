"""pytest plugin (entry point ``pytest11``): hypothesis profiles and backend selection.

Profiles: ``ci`` (derandomized, few examples; chosen automatically when CI=true), ``dev``
(the default elsewhere) and ``thorough`` (many examples, on demand:
``--hypothesis-profile thorough`` or HYPOTHESIS_PROFILE=thorough).

Options: ``--backend NAME`` (built in: torch, pypto), ``--backend-module pkg.module:OBJECT``,
``--platform a5sim|a5`` (for device backends), ``--golden-store PATH`` and ``--regen-goldens``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from contracts.backends import Backend, BackendError, MissingOperator, get_backend, load_backend_module

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=20, derandomize=True, deadline=None, database=None,
                          print_blob=True, suppress_health_check=_SUPPRESS)
settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=_SUPPRESS)
settings.register_profile("thorough", max_examples=600, deadline=None, suppress_health_check=_SUPPRESS,
                          phases=list(Phase))


def default_profile() -> str:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return os.environ["HYPOTHESIS_PROFILE"]
    return "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"



def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pto-contracts")
    group.addoption("--backend", default="torch",
                    help="backend whose operators the contracts test (built in: torch, emulated, pypto; default torch)")
    group.addoption("--backend-module", default=None, metavar="pkg.module:OBJECT",
                    help="load an out-of-tree backend (a Backend or a callable returning one); overrides --backend")
    group.addoption("--platform", default=None, choices=("a5sim", "a5"),
                    help="platform for device backends (pypto); default a5sim")
    group.addoption("--golden-store", default=os.environ.get("PTO_GOLDEN_STORE", "artifacts/store"),
                    metavar="PATH|s3://BUCKET/PREFIX",
                    help="golden store replayed by contracts/test_golden_replay.py: a directory or an S3 prefix "
                         "(credentials, region and endpoint from the AWS_* environment; default "
                         "artifacts/store, env PTO_GOLDEN_STORE)")
    group.addoption("--regen-goldens", action="store_true",
                    help="regenerate stale golden trees with the current reference (the test still fails, so "
                         "a regeneration never passes silently)")


def pytest_configure(config: pytest.Config) -> None:
    # hypothesis' own --hypothesis-profile wins when given; otherwise keep our default.
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile(default_profile())
    config.addinivalue_line("markers", "slow: longer property runs")
    from goldens.errors import GoldenStoreError
    from goldens.store import Location

    try:  # a malformed location is a usage error at start-up, not one error per test
        Location.parse(config.getoption("golden_store"))
    except GoldenStoreError as exc:
        raise pytest.UsageError(f"--golden-store: {exc}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    target = config.getoption("backend_module") or config.getoption("backend")
    return [f"pto-contracts: backend={target} hypothesis-profile={settings._current_profile}"]


def backend_from_options(config: pytest.Config) -> Backend:
    target = config.getoption("backend_module")
    try:
        if target:
            return load_backend_module(target)
        return get_backend(config.getoption("backend"), platform=config.getoption("platform"))
    except BackendError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.fixture(scope="session")
def backend(pytestconfig: pytest.Config) -> Backend:
    """The backend under test (see --backend / --backend-module)."""
    return backend_from_options(pytestconfig)


def op(backend: Backend, name: str):
    """The operator ``name`` of ``backend``; skips (with backend and operator named) when it is missing."""
    try:
        return backend.get(name)
    except MissingOperator as exc:
        pytest.skip(str(exc))
