"""Recordable cases: for each operator, how inputs are made from a seed, how the reference computes the
expected outputs, how a backend runs on stored inputs, which comparator judges each output, and the
reference fingerprint.

This module holds the ``Case`` record and the registry. The built-in cases live next to their family, one
module each (``FAMILIES``: ``goldens.cases.metadata``, ``.cache``, ``.attention``, ...), each a ``CASES`` list
declared with keywords exactly as a user's case module declares its own (docs/examples/user_cases.py).
Trees are small tiny-preset problems with edge-aimed fixtures (sentinel-filled outputs, permuted pages,
spare unmapped rows, -1 slots, padding rows, ties in Top-K). Spec: §7.2, §7.3.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from goldens.catalog import ArgSpec
from goldens.codec import dtype_name
from goldens.errors import GoldenStoreError

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Case:
    """One recordable case: ``Case(name, operator, description, build_inputs=..., run=..., comparators=...)``.

    ``run(backend, inputs, wiring)`` calls the backend's operators; the expected outputs are the same call on the
    reference operators (``reference``, derived: write one only for a reference that is not a registered
    operator's). ``modules``: where the expected outputs' arithmetic lives (derived: the operators' own)."""

    name: str
    operator: str  # the operator the case judges; "a+b" where its call goes through several
    description: str
    build_inputs: Callable[[int, str], Tensors]
    run: Callable[[object, Tensors, str], Tensors]  # (backend, inputs, wiring) -> outputs
    comparators: Callable[[str], dict[str, str]]  # wiring -> {output: comparator}
    wirings: tuple[str, ...] = ("replicated",)
    modules: tuple[str, ...] = ()  # modules whose arithmetic defines the expected outputs
    reference: Callable[[Tensors, str], Tensors] | None = None
    inout: tuple[str, ...] = ()
    params: dict = field(default_factory=dict)
    preset: str = "flash-tiny"
    base: str | None = None  # a case derived from another (a recorded counterexample): its operator and call
    upstream: dict = field(default_factory=dict)  # a case whose expected outputs are upstream's (see upstream_case)
    # named deviations (a backend's ``deviations``) under which this case's numbers do not judge that backend: its
    # trees are then not judged on it, naming the deviation (docs/upstream.md)
    deviations: tuple[str, ...] = ()

    def __post_init__(self):
        if self.reference is None:
            object.__setattr__(self, "reference", ReferenceRun(self.run, self.operator))
        if not self.modules:
            object.__setattr__(self, "modules", tuple(dict.fromkeys(m for _n, m, _f in _reference_functions(
                self.operator))))

    def arg_specs(self, inputs: Tensors, outputs: Tensors) -> tuple[ArgSpec, ...]:
        specs = []
        for name, t in inputs.items():
            specs.append(ArgSpec(name, tuple(t.shape), dtype_name(t.dtype), "inout" if name in self.inout else "in",
                                 t.ndim == 0))
        for name, t in outputs.items():
            if name not in self.inout:
                specs.append(ArgSpec(name, tuple(t.shape), dtype_name(t.dtype), "out"))
        return tuple(specs)


def _reference_functions(operator: str) -> list[tuple[str, str, Callable]]:
    """(name, module, reference function) of each registered operator of ``operator`` ("a+b": both)."""
    from contracts.operators import OPERATORS

    return [(n, OPERATORS[n].module, OPERATORS[n].function) for n in operator.split("+") if n in OPERATORS]


class ReferenceRun:
    """A case's reference: its ``run`` on the reference backend (every operator its reference function;
    compositions on the reference operators). Its fingerprint is the run's code and each operator's reference."""

    def __init__(self, run: Callable, operator: str):
        self.run, self.operator = run, operator

    def __call__(self, inputs: Tensors, wiring: str) -> Tensors:
        from backends import torch_backend

        return self.run(torch_backend(), inputs, wiring)


def rounding_versions(case: Case) -> dict[str, str]:
    out = {}
    for m in case.modules:
        v = getattr(importlib.import_module(m), "ROUNDING_VERSION", None)
        if v is not None:
            out[m] = v
    return out


def fingerprint_parts(case: Case, read: set[str] | None = None) -> dict[str, str]:
    """What can move the case's expected outputs: every function, class and constant of this project its
    reference reaches, each by its normalised code or value (goldens/fingerprint.py), plus the operator. Of a
    watched rule table, only the entries in ``read`` (what the reference looked up; None: all)."""
    from goldens.fingerprint import parts

    if case.upstream:  # upstream's numbers: they move when upstream's golden does, never with this project's code
        u = case.upstream
        return {f"upstream {u.get('repository')}@{u.get('commit')}": " ".join(u.get("goldens", [])),
                f"operator {case.operator}": case.operator}
    if isinstance(case.reference, ReferenceRun):
        found = parts(case.reference.run, read)
        for _name, _module, fn in _reference_functions(case.operator):
            found.update(parts(fn, read))
        return {**found, f"operator {case.operator}": case.operator}
    return {**parts(case.reference, read), f"operator {case.operator}": case.operator}


def fingerprint(case: Case, read: set[str] | None = None) -> str:
    """Reference fingerprint: a hash of ``fingerprint_parts``. Renaming a local, a comment or a docstring
    moves nothing; a changed function, rounding rule, preset field or constant the reference reaches does,
    and only the trees that reach it become stale."""
    from goldens.fingerprint import combined

    return combined(fingerprint_parts(case, read))


def v4_config():
    """The V4 cases' model: the V4-Pro tiny twin's kernel preset."""
    from kernels.config import V4_PRO_TINY

    return V4_PRO_TINY.kernel_preset()


# The built-in cases, one module per family, in the order ``goldens list`` shows them.
FAMILIES = tuple(f"goldens.cases.{name}" for name in (
    "metadata", "cache", "attention", "mhc", "moe", "lm_head", "block", "v4_metadata", "v4_compressor",
    "v4_indexer", "v4_attention", "v4_mtp", "records"))

_CASES: dict[str, Case] = {}
_BUILT = False


def register(case: Case, *, replace: bool = False) -> Case:
    """Add a case to the registry -- the one way cases exist: the built-in ones go through it too. From user
    code, a module that calls ``register`` and is named in ``PTO_GOLDEN_CASES`` (comma-separated), in
    ``goldens --cases-module`` or in pytest's ``--golden-cases``; from a pytest test or conftest, call it
    directly. A name already taken is refused unless ``replace``."""
    if not isinstance(case, Case):
        raise GoldenStoreError(f"register: expected a goldens.cases.Case, got {type(case).__name__}")
    if not case.name or "/" in case.name:
        raise GoldenStoreError(f"register: case name {case.name!r} must be non-empty without '/'")
    if case.name in _CASES and not replace and _CASES[case.name] is not case:
        raise GoldenStoreError(f"register: case {case.name!r} exists (pass replace=True to redefine it)")
    _CASES[case.name] = case
    return case


def derived(base: Case, name: str, inputs: Tensors | None = None, *, description: str = "") -> Case:
    """A case with ``base``'s operator, call, reference and comparators and fixed ``inputs`` (a recorded
    counterexample); replayed like any other."""
    fixed = {k: v.clone() for k, v in (inputs or {}).items()}

    def build(seed: int, wiring: str) -> Tensors:
        if not fixed:
            raise GoldenStoreError(f"case {name}: a derived case replays its stored inputs; it cannot build new ones")
        return {k: v.clone() for k, v in fixed.items()}

    return dataclasses.replace(base, name=name, description=description or f"counterexample of {base.name}",
                               build_inputs=build, params=dict(base.params), base=base.name, upstream={})


UPSTREAM_PREFIX = "up-"
# a tree recorded from another model folder than V4-Pro's carries the folder in its name (up-mtp-v4_gate_hash), so
# trees of one case from two folders live side by side in one store
FOLDER_TAGS = {"deepseek_v4_flash_mtp": "mtp-", "deepseek_v4_flash_dspark": "dspark-", "deepseek_v4_pro:flash": "proflash-"}


class WithVariants:
    """A backend whose operators are called with the named variants a tree is judged by (``{operator: {rule:
    variant}}``), e.g. upstream's gate golden's ``dequant_factor="reciprocal"``."""

    def __init__(self, backend, variants: dict):
        self.backend, self.variants = backend, variants
        self.name = getattr(backend, "name", "backend")

    def get(self, op: str):
        from functools import partial

        fn = self.backend.get(op)
        return partial(fn, **self.variants[op]) if self.variants.get(op) else fn

    def __getattr__(self, attr):
        return getattr(self.backend, attr)


def upstream_case(base: Case, inputs: Tensors | None, upstream: dict) -> Case:
    """The case of a tree recorded from upstream's goldens: ``base``'s operator, call and comparators, its fixed
    ``inputs``, expected outputs that are upstream's numbers (``upstream``: repository, commit, goldens, variants).
    Replayed on any backend with the named variants upstream's goldens follow; never regenerated from this
    project's reference (record it again from upstream instead)."""
    name = UPSTREAM_PREFIX + FOLDER_TAGS.get(upstream.get("model") or upstream.get("folder", ""), "") + base.name
    fixed = {k: v.clone() for k, v in (inputs or {}).items()}
    variants = {op: dict(v) for op, v in upstream.get("variants", {}).items()}

    def build(seed: int, wiring: str) -> Tensors:
        if not fixed:
            raise GoldenStoreError(f"case {name}: a tree recorded from upstream replays its stored inputs; record "
                                   f"new ones with `goldens record --from upstream {base.name}`")
        return {k: v.clone() for k, v in fixed.items()}

    def reference(inputs: Tensors, wiring: str) -> Tensors:
        raise GoldenStoreError(f"{name} holds upstream's numbers ({upstream.get('repository')}@"
                               f"{str(upstream.get('commit'))[:12]}), not this project's reference: record it again "
                               f"with `goldens record --from upstream --pypto-lib PATH {base.name}`")

    return dataclasses.replace(base, name=name,
                               description=f"{base.description} -- expected outputs from upstream's goldens",
                               build_inputs=build, reference=reference,
                               run=lambda b, i, w: base.run(WithVariants(b, variants), i, w),
                               params=dict(base.params), base=base.name, upstream=dict(upstream))


def _import_cases(name: str) -> None:
    """A dotted module name (found on sys.path, or from the working directory, as ``python -m`` would), or a
    path to a ``.py`` file, like --backend-module."""
    if name.endswith(".py") or os.sep in name:
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise GoldenStoreError(f"cases module {name!r}: no file {path}")
        module_name = f"pto_cases_{path.stem}"
        if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(path):
            return  # imported once: its cases are registered
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception:
            sys.modules.pop(module_name, None)
            raise
        return
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        top = name.split(".")[0]
        if exc.name not in (top, name) or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)  # the `goldens` script does not put the working directory on sys.path
        importlib.import_module(name)


def load_case_modules(names=()) -> None:
    """Import user case modules (each registers its cases): ``names`` and ``PTO_GOLDEN_CASES``, each a dotted
    module name or a path to a .py file."""
    wanted = [n.strip() for n in (*names, *os.environ.get("PTO_GOLDEN_CASES", "").split(",")) if n and n.strip()]
    for name in wanted:
        try:
            _import_cases(name)
        except GoldenStoreError:
            raise
        except Exception as exc:
            raise GoldenStoreError(f"cases module {name!r} failed to import: {type(exc).__name__}: {exc}") from None
        module = sys.modules.get(name) or sys.modules.get(f"pto_cases_{Path(name).stem}")
        mine = getattr(module, "__name__", None)
        if not getattr(module, "CASES", None) and not any(getattr(c.build_inputs, "__module__", None) == mine
                                                          for c in _CASES.values()):
            raise GoldenStoreError(f"cases module {name!r} registers no case (a cases module calls "
                                   "goldens.cases.register, or lists CASES)")


def cases() -> dict[str, Case]:
    global _BUILT
    if not _BUILT:
        _BUILT = True
        for family in FAMILIES:
            for case in importlib.import_module(family).CASES:
                register(case)
        load_case_modules()
    return _CASES


# Cases at a model's own geometry (goldens record --geometry NAME): trees of hundreds of MB, never in the sample
# store. Their modules load when asked for, or when a store names one of their cases.
GEOMETRIES = {"flash": "goldens.cases.flash", "pro": "goldens.cases.pro", "v4-flash": "goldens.cases.v4_flash",
              "dspark": "goldens.cases.dspark"}


def geometry_cases(geometry: str) -> list[str]:
    """The names of the cases at ``geometry`` (a key of GEOMETRIES), loading its module."""
    return [c.name for c in importlib.import_module(GEOMETRIES[geometry]).CASES]


def get_case(name: str) -> Case:
    if name not in cases():
        for module in GEOMETRIES.values():  # a tree recorded at a model's geometry names its case
            if module not in sys.modules:
                importlib.import_module(module)
    try:
        return cases()[name]
    except KeyError:
        raise GoldenStoreError(f"unknown case {name!r}; known: {sorted(cases())} (a user case module not loaded? "
                               "PTO_GOLDEN_CASES / --cases-module)") from None
