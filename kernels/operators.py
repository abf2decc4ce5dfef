"""The operator vocabulary, on the ground floor beside the references: ``@operator`` and the declared-operator
walk. An operator is declared once, on its reference function, with ``@operator(returns=..., spec=...)``: its name is
the function's name and its signature is read from the function. ``kernels`` imports nothing above this floor; the
registries a contract or a backend reads (``contracts.operators``: ``KERNEL_OPERATORS``, ``JUDGES``, ``OPERATORS``,
``Backend``) are built from these declarations one floor up.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Operator:
    """One operator, as declared on its reference: ``kind`` is ``kernel`` (a backend binds it) or ``judge``
    (a comparator every backend is judged with unless it gives its own)."""

    name: str
    module: str
    returns: str
    spec: str
    kind: str

    @property
    def function(self) -> Callable:
        return getattr(importlib.import_module(self.module), self.name)

    @property
    def signature(self) -> str:
        """The reference's own parameters (names, defaults, keyword-only marker), annotations left out."""
        sig = inspect.signature(self.function)
        return str(sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty, default=_shown(p.default))
                                           for p in sig.parameters.values()],
                               return_annotation=inspect.Signature.empty))


class _Name(str):
    def __repr__(self) -> str:
        return str(self)


def _shown(default):
    """A default as the docs show it: a function or class by its name (its repr carries an address)."""
    if default is not inspect.Parameter.empty and callable(default) and hasattr(default, "__qualname__"):
        return _Name(default.__qualname__)
    return default


def operator(*, returns: str, spec: str) -> Callable[[Callable], Callable]:
    """Declare the decorated reference function an operator (a ``check_*`` function of
    ``contracts.checks.precision``: a judge). The declaration is read, not executed: the function is returned
    unchanged, and golden fingerprints ignore the decorator."""
    if not returns or not spec.startswith("§"):
        raise ValueError(f"@operator: returns must say what comes back and spec name a section (got {spec!r})")

    def declare(fn: Callable) -> Callable:
        fn.__pto_operator__ = (returns, spec)
        return fn

    return declare


def declared(roots: Iterable[str], kind_of: Callable[[str], str]) -> dict[str, Operator]:
    """Every ``@operator`` function of the modules under ``roots`` (packages are walked), by name, its kind given by
    ``kind_of(module name)``; two declarations of one name are refused."""
    found: dict[str, Operator] = {}
    modules = []
    for root in roots:
        package = importlib.import_module(root)
        modules.append(package)
        if hasattr(package, "__path__"):
            modules += [importlib.import_module(m.name)
                        for m in pkgutil.walk_packages(package.__path__, root + ".")]
    for module in modules:
        for value in vars(module).values():
            decl = getattr(value, "__pto_operator__", None)
            if decl is None or getattr(value, "__module__", None) != module.__name__:
                continue
            name = value.__name__
            if name in found:
                raise BackendError(f"operator {name!r} declared twice: {found[name].module} and {module.__name__}")
            found[name] = Operator(name, module.__name__, decl[0], decl[1], kind_of(module.__name__))
    return dict(sorted(found.items()))


class BackendError(LookupError):
    """A backend that cannot be found, loaded, or that names an unknown operator."""


class Unsupported(BackendError):
    """A bound operator cannot run this particular call (e.g. a device compiled for other constants); the
    contract that made the call is skipped with this reason, never passed."""
