"""The operator registries and the Backend type (one floor above the references).

An operator is declared once, on its reference function, with ``kernels.operators.operator(returns=..., spec=...)``:
its name is the function's name, its signature is read from the function, and every registry (``KERNEL_OPERATORS``,
``JUDGES``, ``OPERATORS``, ``REFERENCE_OPERATORS``), the backends' tables and docs/backends.md are derived from
those declarations. The references live under ``kernels`` (kernel operators); the five judges a contract takes
through ``op(backend, name)`` live in ``contracts.checks.precision``. Adding an operator: decorate its
reference, write its contract file, add its golden case (docs/guide.md, "Add an operator").

A backend is a set of operators (``Backend``); contracts take the implementation under test from the selected
one. Every backend is built in ``backends``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from functools import cache, partial

from kernels.operators import BackendError, Operator, Unsupported, declared, operator

__all__ = ["Backend", "BackendError", "JUDGES", "KERNEL_OPERATORS", "MissingOperator", "OPERATORS", "Operator",
           "REFERENCE_OPERATORS", "Unsupported", "operator", "operator_names", "operators_reached"]

# Where operators are declared: every module under these packages is read for ``@operator`` functions.
DECLARING = ("kernels", "contracts.checks.precision")


class _Registry(Mapping):
    """A read-only view of the declared operators of one kind (None: all), read on first use."""

    def __init__(self, kind: str | None):
        self.kind = kind

    @functools.cached_property
    def _items(self) -> dict[str, Operator]:
        return {k: v for k, v in _all().items() if self.kind is None or v.kind == self.kind}

    def __getitem__(self, name: str) -> Operator:
        return self._items[name]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@cache
def _all() -> dict[str, Operator]:
    return declared(DECLARING, lambda module: "judge" if module.startswith("contracts.") else "kernel")


KERNEL_OPERATORS: Mapping[str, Operator] = _Registry("kernel")
# The judges: comparators a contract takes through ``op(backend, name)`` like operators, so the comparator-variant
# tests and the mutation runner can put a variant in their place (``Backend(..., operators={"check_...": f})``);
# a backend does not supply them (spec §6) and is never "missing" one.
JUDGES: Mapping[str, Operator] = _Registry("judge")
# Every name a contract can take through ``op(backend, name)``.
OPERATORS: Mapping[str, Operator] = _Registry(None)


class _References(Mapping):
    """operator -> (module, function) of its reference: what the torch backend, the differential contracts and
    the mutation runner's mutant backends are built from."""

    def __getitem__(self, name: str) -> tuple[str, str]:
        return OPERATORS[name].module, name

    def __iter__(self):
        return iter(OPERATORS)

    def __len__(self) -> int:
        return len(OPERATORS)


REFERENCE_OPERATORS: Mapping[str, tuple[str, str]] = _References()


def operator_names(given: Iterable[str]) -> frozenset[str]:
    """The operators of ``--operator`` values (each repeatable and comma-separated); BackendError names an unknown
    one with the closest known names, or an empty list."""
    import difflib

    names = [n.strip() for g in given for n in g.split(",") if n.strip()]
    for n in names:
        if n not in OPERATORS:
            close = difflib.get_close_matches(n, list(OPERATORS), n=3, cutoff=0.5)
            raise BackendError(f"--operator {n}: no such operator" + (f" (did you mean {', '.join(close)}?)" if close
                                                                      else "") + "; docs/backends.md lists them")
    if not names:
        raise BackendError("--operator: expected an operator name")
    return frozenset(names)


def operators_reached(operator: str, parts: Iterable[str] = ()) -> frozenset[str]:
    """The operators a golden tree reaches: those its case names (``a+b`` names two) and every operator whose
    reference function its expected outputs were computed through (a tree record's fingerprint parts name each
    function of this project the reference reached, as ``module.function``). ``goldens replay --operator`` and
    ``pytest --operator`` select trees by it. Every operator its replay asks a backend for is among them
    (contracts/test_golden_replay.py checks that on each replay); a composition's trees also reach its parts."""
    by_path = {f"{o.module}.{name}": name for name, o in OPERATORS.items()}
    return frozenset({o for o in operator.split("+") if o in OPERATORS} | {by_path[p] for p in parts if p in by_path})


class MissingOperator(BackendError):
    def __init__(self, backend: Backend, op: str):
        self.backend, self.op = backend, op
        why = backend.unavailable or backend.why_missing.get(op)
        reason = f": {why}" if why else ""
        super().__init__(f"backend {backend.name!r} has no operator {op!r}{reason}")


@cache
def library_comparators() -> dict[str, Callable]:
    """The comparator library (``contracts.checks.precision``) every backend is judged with by default."""
    return {name: getattr(importlib.import_module(REFERENCE_OPERATORS[name][0]), REFERENCE_OPERATORS[name][1])
            for name in JUDGES}


class Backend:
    """A named set of kernel operators (``name -> callable``), optionally on a platform.

    ``unavailable`` is a one-line reason when the backend cannot run here (every operator is then missing;
    contracts that need one skip with that reason, and a session that ran nothing fails). Comparators
    (``check_*``) given among ``operators`` replace the library's for this backend (comparator variants,
    mutants); otherwise the library's judge it.
    """

    def __init__(self, name: str, operators: Mapping[str, Callable], *, platform: str = "cpu",
                 unavailable: str | None = None, description: str = "", why_missing: Mapping[str, str] = (),
                 replay: Callable | None = None, variants: Mapping[str, Mapping[str, str]] = (),
                 provenance: Mapping[str, object] = (), deviations: Mapping[str, str] = (),
                 devices: tuple[int, ...] = (), reference_stand_ins: bool = True):
        unknown = sorted(set(operators) - set(OPERATORS))
        if unknown:
            raise BackendError(f"backend {name!r}: unknown operator(s) {unknown}; known: {sorted(KERNEL_OPERATORS)}")
        self.name = name
        self.platform = platform
        self.unavailable = unavailable
        self.description = description
        kernels = {k: v for k, v in operators.items() if k in KERNEL_OPERATORS}
        self._ops = kernels if unavailable is None else {}
        self._comparators = {k: v for k, v in operators.items() if k in JUDGES}
        self.why_missing = dict(why_missing)  # operator -> why this backend does not bind it
        # a device backend's own way to replay a golden tree ((tree, export) -> outputs, or None to run the
        # operators; export(directory) writes the tree in upstream's golden_data layout)
        self.replay = replay
        # operator -> {rule: named variant} where this backend follows a named variant, not the default rule (e.g.
        # upstream's goldens); the contracts pinning that rule judge the backend by the variant it names
        self.variants = {k: dict(v) for k, v in dict(variants).items()}
        # where a backend's numbers come from, for trees recorded from it (upstream: repository, commit, dirty,
        # goldens {operator: "models/<folder>/<file>.py::<function>"})
        self.provenance = dict(provenance)
        # named, documented ways a backend is known to depart from a property a contract pins (docs/upstream.md):
        # such a contract that fails on it is reported as an expected failure naming the deviation, never a pass
        self.deviations = dict(deviations)
        self.devices = tuple(devices)  # the device ids its --device option pinned it to (empty: none given)
        # a contract that calls several operators runs with the reference standing in for the ones this backend
        # lacks, labelled as a mixed run, when at least one operator the contract declares is this backend's own
        # (pto_pytest.plugin.op); False: the backend is judged whole or not at all
        self.reference_stand_ins = reference_stand_ins

    def has(self, op: str) -> bool:
        return op in self._ops or op in JUDGES

    def get(self, op: str) -> Callable:
        if op in JUDGES:
            return self._comparators.get(op) or library_comparators()[op]
        if op not in OPERATORS:
            raise BackendError(f"unknown operator {op!r}; known: {sorted(KERNEL_OPERATORS)}")
        if op not in self._ops:
            raise MissingOperator(self, op)
        fn = self._ops[op]
        if getattr(fn, "composes_operators", False):  # a composition runs on this backend's own operators
            return partial(fn, ops=self._ops)
        return fn

    def stand_in(self, op: str, reference: Backend) -> Callable:
        """``reference``'s ``op`` standing in for one this backend lacks (a mixed run); a composition is composed
        from this backend's own operators where it has them, the reference's for the rest -- and for a call one of
        this backend's own cannot take (``Unsupported``: a golden's narrower domain), the reference's for that
        call, so a stand-in never fails on what the backend merely does not cover."""
        fn = reference._ops[op]
        if getattr(fn, "composes_operators", False):
            return partial(fn, ops=self._own_or_reference(reference))
        return fn

    def _own_or_reference(self, reference: Backend) -> dict[str, Callable]:
        """The operators a stand-in composition calls: this backend's own, each falling back for a call it cannot
        take to what the reference would stand in for it (a composed operator composed again over these same
        operators, as a call of it made by a contract directly is: the two fallbacks agree), the reference's
        for the rest."""
        ops = dict(reference._ops)
        for name, f in self._ops.items():
            ref = reference._ops.get(name)
            if ref is not None and getattr(ref, "composes_operators", False):
                ref = partial(ref, ops=ops)  # ops is filled in below before any call
            ops[name] = _or_reference(f, ref)
        return ops

    @property
    def operators(self) -> tuple[str, ...]:
        """The kernel operators this backend binds (comparators are not operators)."""
        return tuple(sorted(self._ops))

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(sorted(set(KERNEL_OPERATORS) - set(self._ops)))

    def derive(self, name: str, *, description: str = "", **overrides: Callable) -> Backend:
        """A copy with some operators replaced (how seeded defects and partial backends are built)."""
        return Backend(name, {**self._ops, **self._comparators, **overrides}, platform=self.platform,
                       description=description,
                       variants={k: v for k, v in self.variants.items() if k not in overrides})

    def without(self, name: str, *ops: str) -> Backend:
        return Backend(name, {k: v for k, v in {**self._ops, **self._comparators}.items() if k not in ops},
                       platform=self.platform)

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, platform={self.platform!r}, ops={len(self._ops)})"


def _or_reference(fn: Callable, reference: Callable | None) -> Callable:
    """``fn``, or the reference for a call ``fn`` says it cannot take (``Unsupported``), where it may say so."""
    if reference is None or not getattr(fn, "may_be_unsupported", False):
        return fn

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Unsupported:
            return reference(*args, **kwargs)

    call.composes_operators = getattr(fn, "composes_operators", False)
    return call
