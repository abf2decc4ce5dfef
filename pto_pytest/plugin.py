"""pytest plugin (loaded by the project's root conftest.py, or `-p pto_pytest.plugin`): hypothesis profiles and backend selection.

Profiles: ``ci`` (derandomized, few examples; chosen automatically when CI=true), ``dev``
(the default elsewhere), ``verdict`` (ci's examples, stopping at the first failing one without shrinking it: the
fastest pass/fail) and ``thorough`` (many examples, on demand: ``--hypothesis-profile thorough`` or
HYPOTHESIS_PROFILE=thorough).

Options: ``--backend NAME`` (built in: torch, emulated, pypto), ``--backend-module pkg.module:OBJECT`` (or
``path/to/file.py:OBJECT``), ``--platform a5sim|a5``, ``--device IDS`` and ``--pypto-lib PATH`` (device
backends only), ``--allow-unavailable``, ``--golden-store PATH`` and ``--regen-goldens``.

A green run means something ran: the session fails with one line when the selected backend is unavailable
here, or when every test that needs one of its operators was skipped (``--allow-unavailable`` accepts
that), and it ends with a per-operator summary (ran / passed / failed / skipped, with the skip reasons).
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from backends import get_backend, load_backend_module
from contracts.operators import KERNEL_OPERATORS, Backend, BackendError, MissingOperator, Unsupported
from kernels.record import MODELS

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]
# No "explain" phase in ci and dev: it reruns a failing example under a line tracer, which took a failing rope contract
# on the device double from 4 s to 29 s; the shrunk example and its reproduce line are what a failure report needs.
_NO_EXPLAIN = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
settings.register_profile("ci", max_examples=20, derandomize=True, deadline=None, database=None,
                          print_blob=True, suppress_health_check=_SUPPRESS, phases=_NO_EXPLAIN)
settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=_SUPPRESS,
                          phases=_NO_EXPLAIN)
# The fastest verdict: ci's examples, stopping at the first failing one, unshrunk (is it caught, not how small).
settings.register_profile("verdict", max_examples=20, derandomize=True, deadline=None, database=None,
                          suppress_health_check=_SUPPRESS, report_multiple_bugs=False,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate])
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
                    help="platform of a device backend (pypto; default a5sim); refused for CPU backends")
    group.addoption("--device", default=None, metavar="IDS",
                    help="comma-separated device ids for a device backend (default 0..TP-1)")
    group.addoption("--pypto-lib", default=None, metavar="PATH",
                    help="root of the upstream pypto-lib checkout the pypto and upstream backends use (default $PYPTO_LIB_ROOT)")
    group.addoption("--model", default=None, metavar="FOLDER",
                    choices=MODELS,
                    help="the upstream model folder whose goldens (--backend upstream) or entries (--backend pypto) "
                         "are judged (default deepseek_v4_pro; deepseek_v4_pro:flash: that folder built with its "
                         "flash preset, DEEPSEEK_V4_VARIANT=flash); refused for the CPU reference backends")
    group.addoption("--tp", type=int, default=None, metavar="N",
                    help="attention TP of the deployment the topology contracts check (1, 2, 4, 8; default 4)")
    group.addoption("--ep", type=int, default=None, metavar="N",
                    help="MoE EP (the card count) of that deployment (2, 4, 8, a multiple of --tp; default 8)")
    group.addoption("--dp", type=int, default=None, metavar="N",
                    help="DP groups; when given it must equal ep / tp. A bad topology is a usage error before "
                         "any test runs; with --device it also needs exactly ep device ids")
    group.addoption("--devices", default=None, metavar="IDS",
                    help="with pytest-xdist's -n N, one worker per device: worker K runs the backend pinned to the "
                         "K-th id through its --device option (0-15, 0,2,4-7; N must equal the number of ids)")
    group.addoption("--operator", action="append", default=[], metavar="NAME",
                    help="run only the contracts that call operator NAME (each contract declares the operators it "
                         "calls with @pytest.mark.operators, and a call it did not declare fails it) and the golden "
                         "trees that reach NAME; repeatable or comma-separated (names: docs/backends.md)")
    group.addoption("--allow-unavailable", action="store_true",
                    help="accept a run in which the selected backend is unavailable or every contract needing "
                         "it was skipped (by default such a run fails: nothing ran is not a pass)")
    group.addoption("--golden-store", default=os.environ.get("PTO_GOLDEN_STORE", "artifacts/store"),
                    metavar="PATH|s3://BUCKET/PREFIX",
                    help="golden store replayed by contracts/test_golden_replay.py: a directory or an S3 prefix "
                         "(credentials, region and endpoint from the AWS_* environment; default "
                         "artifacts/store, env PTO_GOLDEN_STORE)")
    group.addoption("--record-counterexamples", action="store_true",
                    help="a contract that fails inside counterexample(...) records its (final, shrunk) failing "
                         "inputs as a replay tree in --golden-store, so the bug is replayed forever after")
    group.addoption("--golden-cases", action="append", default=[], metavar="MODULE",
                    help="import a module that registers user cases (goldens.cases.register); repeatable; "
                         "also PTO_GOLDEN_CASES")
    group.addoption("--golden-report", default=None, metavar="DIR",
                    help="write the HTML report of the golden replay (contracts/test_golden_replay.py) to "
                         "DIR/index.html: verdicts, bounds, per-row errors, ULP histograms, history (as "
                         "`goldens report`)")
    group.addoption("--regen-goldens", action="store_true",
                    help="regenerate stale golden trees with the current reference (the test still fails, so "
                         "a regeneration never passes silently)")


def pytest_configure(config: pytest.Config) -> None:
    # hypothesis' own --hypothesis-profile wins when given; otherwise keep our default.
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile(default_profile())
    config.addinivalue_line("markers", "slow: longer property runs")
    config.addinivalue_line("markers", "whole_backend(reason, inputs=()): the property compares a backend with "
                                       "itself (a stage with the chain of its own operators): never a mixed run, "
                                       "but for the operators named in inputs (metadata the chain is fed)")
    config.addinivalue_line("markers", "operators(*names): the operators a contract calls, on the backend or as "
                                       "the reference (what --operator selects by; checked as the test runs)")
    config._pto_operators = wanted_operators(config.getoption("operator"))
    import torch

    torch.set_printoptions(threshold=64, edgeitems=2, linewidth=110)  # a tensor in a failure: a few lines, not pages
    threads = worker_threads(getattr(config, "workerinput", None), os.environ, os.cpu_count())
    if threads is not None:  # the commands a test runs (and the test fork server) inherit it
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ.setdefault("PTO_WORKERS", str(threads))  # the host thread pool's share too (kernels.workers)
    from goldens.pytest_api import GoldenStoreError, check_location, load_case_modules

    try:  # a malformed location is a usage error at start-up, not one error per test
        check_location(config.getoption("golden_store"))
    except GoldenStoreError as exc:
        raise pytest.UsageError(f"--golden-store: {exc}") from None
    location = str(config.getoption("golden_store"))
    if "://" not in location and not config.getoption("record_counterexamples") and \
            not hasattr(config, "workerinput") and not Path(location).is_dir():
        raise pytest.UsageError(f"--golden-store {location}: no golden store there ("
                                f"{'a file' if Path(location).exists() else 'no such folder'}; goldens --store "
                                f"{location} record creates one)")
    lib = config.getoption("pypto_lib")
    if lib and not hasattr(config, "workerinput"):  # checked before any test runs, not after the last
        root = Path(os.path.expanduser(lib))
        if not root.is_dir() or not (root / "models").is_dir():
            raise pytest.UsageError(f"--pypto-lib {lib}: {'no such folder' if not root.is_dir() else 'no models/ in it'}"
                                    " (pass the folder of a pypto-lib clone)")
    from goldens.pytest_api import refuse_inside_store

    for option, what in (("golden_report", "--golden-report"), ("xmlpath", "--junit-xml"),
                         ("resultlog", "--result-log")):
        value = config.getoption(option, default=None)
        if value and not hasattr(config, "workerinput"):
            try:  # an output inside a store's folder can break every later command on it (#48)
                refuse_inside_store(value, what)
            except GoldenStoreError as exc:
                raise pytest.UsageError(str(exc)) from None
    report = config.getoption("golden_report")
    if report and not hasattr(config, "workerinput"):  # a folder every golden test writes into: checked once, here
        try:
            Path(report).mkdir(parents=True, exist_ok=True)
            if not os.access(report, os.W_OK | os.X_OK):
                raise PermissionError(13, "not writable")
        except OSError as exc:
            raise pytest.UsageError(f"--golden-report {report}: cannot write there ({exc.strerror or exc})") from None
    global _CONFIG
    _CONFIG = config
    if config.getoption("golden_cases"):
        try:
            load_case_modules(config.getoption("golden_cases"))
        except GoldenStoreError as exc:
            raise pytest.UsageError(f"--golden-cases: {exc}") from None
    config._pto_backend = backend_from_options(config)  # a bad backend is one usage error, here
    config._pto_deployment = deployment_from_options(config)
    config._pto_tally = SessionTally()


def pytest_report_header(config: pytest.Config) -> list[str]:
    b: Backend = config._pto_backend
    state = f"UNAVAILABLE: {b.unavailable}" if b.unavailable else \
        f"{len(b.operators)}/{len(KERNEL_OPERATORS)} operators bound"
    d = config._pto_deployment
    devices = f" devices={','.join(map(str, b.devices))}" if b.devices else ""
    return [f"pto-contracts: backend={b.name} platform={b.platform} ({state}) "
            f"hypothesis-profile={settings._current_profile} deployment=tp{d.tp}/ep{d.ep}/dp{d.dp}{devices}"]


def worker_threads(workerinput: dict | None, environ, cpus: int | None) -> int | None:
    """The torch threads of an xdist worker: the machine's cores shared out among the workers (at least 1), so
    ``-n auto`` does not run cores x cores threads that spin waiting for each other (on 2 cores, ``-n 2``: one
    thread each, about a sixth less CPU for this project's suite). None -- leave torch alone -- outside a worker,
    or when OMP_NUM_THREADS says how many. (This project's whole suite, the sample store's replays included,
    passes the same with one thread per worker.)"""
    if not workerinput or environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, (cpus or 1) // max(1, int(workerinput.get("workercount", 1))))


def worker_device(config: pytest.Config) -> str | None:
    """The --device this process runs with: --device, or with --devices the id of this xdist worker (gwK: the
    K-th); a session without a worker per id is a usage error."""
    given = config.getoption("devices", default=None)
    if not given:
        return config.getoption("device")
    from goldens.pytest_api import GoldenStoreError, parse_devices

    try:
        ids = parse_devices(given)
    except GoldenStoreError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("device"):
        raise pytest.UsageError("--devices gives each xdist worker its own --device: not both")
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:
        workers = config.getoption("numprocesses", default=None)
        if workers != len(ids):
            raise pytest.UsageError(f"--devices {given}: {len(ids)} device(s) need -n {len(ids)} (one xdist worker "
                                    f"per device), got {'no -n' if workers is None else f'-n {workers}'}")
        return ",".join(map(str, ids))  # the controller: every id (its header; it runs no test)
    return str(ids[int(worker.removeprefix("gw")) % len(ids)])


def backend_from_options(config: pytest.Config) -> Backend:
    target = config.getoption("backend_module")
    device_options = {k: config.getoption(k) for k in ("platform", "device", "pypto_lib", "model")}
    device_options["device"] = worker_device(config)
    try:
        if target:
            backend = load_backend_module(target, device=device_options["device"])
            given = {k: v for k, v in device_options.items() if v is not None and k != "device"}
            if given.get("platform") not in (None, backend.platform) or set(given) - {"platform"}:
                raise BackendError(f"--backend-module {target}: backend {backend.name!r} is built with platform "
                                   f"{backend.platform}; --platform/--pypto-lib do not apply to it")
            return backend
        return get_backend(config.getoption("backend"), **device_options)
    except BackendError as exc:
        raise pytest.UsageError(str(exc)) from None


def deployment_from_options(config: pytest.Config):
    """The Deployment of --tp / --ep / --dp (defaults: FLASH's tp 4, ep 8); an invalid topology, or a --device
    list without exactly one id per card when a topology is given, is a pytest UsageError at start-up (exit 4).
    Spec: upstream_checks CH-11, CH-02, MO-13."""
    from kernels.config import ConfigError, Deployment

    given = {k: config.getoption(k) for k in ("tp", "ep", "dp") if config.getoption(k) is not None}
    try:
        deployment = Deployment(**given)
        device = config.getoption("device")
        if given and device is not None:
            from backends.pypto import parse_devices

            deployment.check_devices(parse_devices(device))
    except (ConfigError, BackendError) as exc:
        raise pytest.UsageError(f"--tp/--ep/--dp: {exc}") from None
    return deployment


@pytest.fixture(scope="session")
def deployment(pytestconfig: pytest.Config):
    """The deployment the topology contracts check (see --tp / --ep / --dp)."""
    return pytestconfig._pto_deployment


@pytest.fixture(scope="session")
def backend(pytestconfig: pytest.Config) -> Backend:
    """The backend under test (see --backend / --backend-module)."""
    return pytestconfig._pto_backend


def wanted_operators(given: list[str]) -> frozenset[str]:
    """The operators of ``--operator``; an unknown name is a usage error naming the closest known ones."""
    from contracts.operators import operator_names

    try:
        return operator_names(given) if given else frozenset()
    except BackendError as exc:
        raise pytest.UsageError(str(exc)) from None


def declared_operators(item: pytest.Item) -> set[str]:
    """What ``@pytest.mark.operators`` declares for ``item``: module, function and parameter marks together."""
    return {name for mark in item.iter_markers("operators") for name in mark.args}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = config._pto_operators
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        (keep if declared_operators(item) & wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_ITEM: pytest.Item | None = None  # the test running in this process: op() records what it used


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Runs the test; then an operator it asked the backend for (through ``op``) that it does not declare with
    ``@pytest.mark.operators`` fails it: ``--operator`` would have left it out."""
    global _ITEM
    _ITEM = item
    if item.config.getoption("devices", default=None):  # which device ran it, for the per-device summary
        item.user_properties.append(("pto_device", ",".join(map(str, item.config._pto_backend.devices)) or "-"))
    try:
        result = yield
    finally:
        _ITEM = None
    if _asked(item) and _is_contract(item):  # (tests/ runs contracts through its harness: not checked there)
        undeclared = sorted(_asked(item) - declared_operators(item))
        if undeclared:
            pytest.fail(f"{item.nodeid} calls operator(s) {', '.join(undeclared)} that its "
                        f"@pytest.mark.operators({', '.join(sorted(declared_operators(item)))}) does not declare: "
                        "add them, or `pytest --operator` leaves this test out", pytrace=False)
    return result


def _is_contract(item: pytest.Item) -> bool:
    """A test of a ``contracts`` package's ``test_*.py`` module (the project's, or a copy of it)."""
    module = getattr(getattr(item, "module", None), "__name__", "")
    return module.startswith("contracts.test_") or item.get_closest_marker("operators") is not None


def _asked(item: pytest.Item) -> set[str]:
    return item.__dict__.get("_pto_asked", set())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """A failing contract's report ends with one note: the command that runs it again, alone, the same way
    (backend options and hypothesis profile included; a recorded counterexample adds its own replay line)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        report.sections.append(("pto-contracts: reproduce", reproduce_command(item)))


def reproduce_command(item: pytest.Item) -> str:
    config = item.config
    options = [f"--{name.replace('_', '-')} {shlex.quote(str(config.getoption(name)))}"
               for name in ("backend", "backend_module", "platform", "device", "pypto_lib", "model", "tp", "ep", "dp")
               if config.getoption(name, default=None) not in (None, "torch", False)]
    used = sorted({v for k, v in item.user_properties if k == "pto_operator"})
    profile = settings._current_profile
    return (f"HYPOTHESIS_PROFILE={profile} pytest -p no:xdist {shlex.quote(item.nodeid)} {' '.join(options)}".rstrip()
            + (f"   # operators: {', '.join(used)}" if used else ""))


def uses(name: str, role: str = "pto_operator") -> None:
    """Record that the running test exercises kernel operator ``name`` (for the per-operator summary): the
    backend's own (``pto_operator``) or the reference standing in for it (``pto_standin``)."""
    if _ITEM is None:
        return
    _ITEM.__dict__.setdefault("_pto_asked", set()).add(name)
    if name in KERNEL_OPERATORS and (role, name) not in _ITEM.user_properties:
        _ITEM.user_properties.append((role, name))


def _no_stand_in(backend: Backend, name: str) -> str | None:
    """Why the running test gets no reference stand-in for operator ``name`` on ``backend`` (None: it gets one).
    A whole-backend contract gets one only for an operator it names as an input of its chain
    (``whole_backend(..., inputs=(name,))``: integer metadata with contracts of its own, which a backend may lower
    inside its stage rather than offer alone)."""
    if not backend.reference_stand_ins or backend.unavailable or _ITEM is None:
        return "this backend runs whole or not at all"
    whole = _ITEM.get_closest_marker("whole_backend")
    if whole is not None and name not in whole.kwargs.get("inputs", ()):
        return "this contract compares a stage with the backend's own parts (whole_backend)"
    declared = {o for m in _ITEM.iter_markers("operators") for o in m.args}
    if not any(backend.has(o) and o in KERNEL_OPERATORS for o in declared):
        return "none of the operators it declares is the backend's own"
    return None


def operator_params(table, operator_of) -> list:
    """The parameters of a test that takes its operator from a table row: one per key, in sorted order, each
    declaring the operator its row calls (``@pytest.mark.operators`` per parameter), so ``--operator`` selects the
    rows of that operator only. ``operator_of(row)`` names it."""
    return [pytest.param(key, marks=pytest.mark.operators(operator_of(table[key])), id=str(key))
            for key in sorted(table)]


def op(backend: Backend, name: str):
    """The operator ``name`` of ``backend``; skips (with backend and operator named) when it is missing, or
    when the backend says a call of the test's subject is ``Unsupported`` (a device compiled for other constants).
    A backend gets the reference for an operator it lacks, and for a call of a helper operator (not the subject)
    it cannot take, when the test declares at least one operator the backend has (a mixed run, labelled in the
    summary), unless it says ``reference_stand_ins=False`` or the test is ``whole_backend``."""
    try:
        fn = backend.get(name)
    except MissingOperator as exc:
        why = _no_stand_in(backend, name)
        if why is not None:
            uses(name)
            pytest.skip(str(exc) + ("" if why.startswith("this backend runs whole") else
                                    f"; no reference stand-in: {why}"))
        from backends import torch_backend

        uses(name, "pto_standin")
        return backend.stand_in(name, torch_backend())
    uses(name)
    if not getattr(fn, "may_be_unsupported", False):
        return fn

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Unsupported as exc:
            if name == _subject() or _no_stand_in(backend, name) is not None:
                pytest.skip(f"backend {backend.name!r}, operator {name!r}: {exc}")
            from backends import torch_backend

            uses(name, "pto_standin")  # a helper operator's call the backend cannot take: the reference's
            return backend.stand_in(name, torch_backend())(*args, **kwargs)

    return call


def _subject() -> str | None:
    """The operator the running test is about: the first its ``operators`` marker names (None: no marker). A call
    of it the backend cannot take skips the test; a call of another declared operator gets the reference instead
    (a mixed run), so a contract is not skipped whole for a helper operator's call."""
    if _ITEM is None:
        return None
    for marker in _ITEM.iter_markers("operators"):
        return marker.args[0] if marker.args else None
    return None


class SessionTally:
    """Per-operator outcomes of the session (on the xdist controller: from every worker's reports)."""

    def __init__(self):
        self.ops: dict[str, dict[str, int]] = {}
        self.reasons: dict[str, str] = {}
        self.totals = {"passed": 0, "failed": 0, "skipped": 0}
        self.devices: dict[str, dict[str, int]] = {}  # with --devices: device -> outcome counts
        self.stand_ins: dict[str, int] = {}  # operator -> tests in which the reference stood in for it (mixed runs)
        self.verdict: str | None = None

    def add(self, report: pytest.TestReport) -> None:
        if not (report.when == "call" or (report.when == "setup" and report.outcome != "passed")):
            return
        outcome = report.outcome if report.outcome in self.totals else "failed"
        self.totals[outcome] += 1
        reason = ""
        if outcome == "skipped" and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        for key, name in report.user_properties:
            if key == "pto_standin" and outcome != "skipped":
                self.stand_ins[name] = self.stand_ins.get(name, 0) + 1
            if key == "pto_device":
                counts = self.devices.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0})
                counts[outcome] += 1
            if key != "pto_operator":
                continue
            row = self.ops.setdefault(name, {"ran": 0, "passed": 0, "failed": 0, "skipped": 0})
            row[outcome] += 1
            if outcome != "skipped":
                row["ran"] += 1
            elif reason:
                self.reasons.setdefault(name, reason)

    def nothing_ran(self, backend: Backend) -> str | None:
        """Why this session proves nothing about ``backend``, or None."""
        ran = sum(r["ran"] for r in self.ops.values())
        needing = sum(r["ran"] + r["skipped"] for r in self.ops.values())
        if backend.unavailable and needing:
            return (f"backend {backend.name!r} (platform {backend.platform}) is unavailable here: "
                    f"{backend.unavailable}; {needing} test(s) needing it did not run")
        if needing and not ran:
            first = next(iter(self.reasons.values()), "no reason given")
            return f"every test needing backend {backend.name!r} was skipped ({needing}); first reason: {first}"
        if sum(self.totals.values()) and not (self.totals["passed"] + self.totals["failed"]):
            return f"every test of this session was skipped ({self.totals['skipped']})"
        return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _CONFIG is not None:
        _CONFIG._pto_tally.add(report)

_CONFIG: pytest.Config | None = None


@contextlib.contextmanager
def counterexample(case: str, inputs: dict):
    """Wrap a contract's checks on ``inputs`` (laid out as golden case ``case``'s inputs). With
    ``--record-counterexamples``, a failure records them as a replay tree derived from that case (for a
    hypothesis test, only the final, shrunk example) and says so; the failure is re-raised either way."""
    snapshot = {k: v.clone() for k, v in inputs.items()}
    try:
        yield
    except AssertionError:
        if _CONFIG is not None and _CONFIG.getoption("record_counterexamples") and _final_example():
            from goldens.pytest_api import record_counterexample

            label = _ITEM.nodeid if _ITEM is not None else "a contract"
            name, snapshot_id = record_counterexample(_CONFIG.getoption("golden_store"), case, snapshot, label=label)
            print(f"\npto-contracts: recorded counterexample tree {name} (snapshot {snapshot_id}); replay it "
                  f"with: goldens --store {_CONFIG.getoption('golden_store')} replay {name}")
        raise


def _final_example() -> bool:
    """True outside hypothesis, or on hypothesis' final (reported, shrunk) run of a failing example."""
    try:
        from hypothesis.control import current_build_context

        return bool(current_build_context().is_final)
    except Exception:  # not inside a hypothesis test
        return True


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):  # xdist worker: the controller judges the whole session
        return
    report_dir = config.getoption("golden_report")
    if report_dir:  # the replay tests wrote one part per tree (xdist workers too); one page from all of them
        from goldens.pytest_api import assemble_report

        page = assemble_report(report_dir, f"golden replay (pytest) on {config._pto_backend.name} "
                               f"({config._pto_backend.platform}) of {config.getoption('golden_store')}")
        config._pto_report_page = page
    tally: SessionTally = config._pto_tally
    tally.verdict = tally.nothing_ran(config._pto_backend)
    if tally.verdict and not config.getoption("allow_unavailable") and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    tally: SessionTally = config._pto_tally
    b: Backend = config._pto_backend
    if tally.ops:
        tr = terminalreporter
        tr.section(f"pto-contracts: per-operator summary (backend {b.name}, platform {b.platform})", sep="-")
        tr.write_line(f"{'operator':28} {'ran':>5} {'passed':>7} {'failed':>7} {'skipped':>8}  skip reason")
        for name in sorted(tally.ops):
            r = tally.ops[name]
            reason = tally.reasons.get(name, "")
            tr.write_line(f"{name:28} {r['ran']:5d} {r['passed']:7d} {r['failed']:7d} {r['skipped']:8d}  "
                          f"{reason[:150]}")
    if tally.stand_ins:
        terminalreporter.write_line(
            f"mixed runs: the reference stood in for operators backend {b.name!r} does not bind (or calls they cannot "
            f"take), beside its own: "
            + ", ".join(f"{n} ({k} test(s))" for n, k in sorted(tally.stand_ins.items())))
    if tally.devices:
        tr = terminalreporter
        tr.section("pto-contracts: per-device summary (one xdist worker per device)", sep="-")
        tr.write_line(f"{'device':>8} {'passed':>7} {'failed':>7} {'skipped':>8}")
        for dev in sorted(tally.devices, key=lambda d: [int(x) for x in d.split(",") if x.isdigit()]):
            c = tally.devices[dev]
            tr.write_line(f"{dev:>8} {c['passed']:7d} {c['failed']:7d} {c['skipped']:8d}")
    page = getattr(config, "_pto_report_page", None)
    if page is not None:
        terminalreporter.write_line(f"pto-contracts: golden replay report: {page}")
    if tally.verdict:
        accepted = config.getoption("allow_unavailable")
        terminalreporter.write_line(
            f"pto-contracts: NOTHING RAN: {tally.verdict}" + (" (accepted: --allow-unavailable)" if accepted else
                                                               " -- failing the run (--allow-unavailable accepts it)"),
            red=not accepted, yellow=accepted, bold=True)
