"""An import shim for ``pypto`` used only inside the upstream worker, and only when the real toolchain is absent.

Upstream's model modules import ``pypto.language as pl`` at the top and use it for kernel declarations
(decorators, tensor annotations, ``pl.dynamic`` dims) evaluated at import time. Their golden functions are plain
Torch and never touch ``pl``. This shim makes those declarations evaluate to inert placeholders so the module
imports and its golden functions can run; any attempt to *run* a kernel through it fails loudly. It is written
here, from the shape of those declarations; it is not upstream's code and implements none of pypto.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class Inert:
    """A placeholder for anything ``pl`` declares: attribute access, calls, subscripts and arithmetic give another
    placeholder; a call whose only argument is a function or class returns it unchanged (a decorator)."""

    def __init__(self, name: str = "pl"):
        self._name = name

    def __getattr__(self, item: str) -> Inert:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return Inert(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (isinstance(args[0], type) or callable(args[0])) \
                and not isinstance(args[0], Inert):
            return args[0]
        return Inert(f"{self._name}(...)")

    def __getitem__(self, item) -> Inert:
        return Inert(f"{self._name}[...]")

    def __repr__(self) -> str:
        return f"<pypto shim {self._name}>"

    def _arith(self, *_args) -> Inert:
        return Inert(f"({self._name} op ...)")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _arith
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = _arith
    __neg__ = __or__ = __ror__ = __and__ = __rand__ = _arith


class _ShimModule(types.ModuleType):
    def __getattr__(self, item: str):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return Inert(f"{self.__name__}.{item}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "pypto" or fullname.startswith("pypto."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _ShimModule(spec.name)
        module.__path__ = []
        module.PTO_CONTRACTS_SHIM = True
        return module

    def exec_module(self, module):
        return None


def install_if_missing() -> str:
    """Install the shim when ``pypto.language`` (upstream's toolchain) does not import: "" when the real one
    imports (nothing installed), else why it does not (one line; the shim is then installed)."""
    try:
        import pypto.language  # noqa: F401
        return ""
    except Exception as exc:
        for name in [m for m in sys.modules if m == "pypto" or m.startswith("pypto.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _Finder())
        return f"import pypto.language failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
