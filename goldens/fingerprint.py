"""Exact reference fingerprints: what can move a tree's expected outputs, and nothing else.

Starting from a case's reference callable, ``parts`` walks what that code reaches -- functions, classes
(every method), and module-level constants (presets, rounding rules, ROUNDING_VERSION, ...) of this project's
modules (``kernels.*``, ``goldens.cases``) -- and fingerprints each one:

* a function or class by its normalised code: docstrings dropped, comments and formatting gone (AST), and
  every local name (arguments, assigned names, loop variables, comprehension targets) renamed to its
  position, so renaming a local moves nothing;
* a constant by its value (``repr``), so changing a rounding rule, a preset field or a version string does.

Library code (torch, numpy, the standard library) is not walked: its version is recorded apart. A tree is
stale exactly when one of its parts changed, and the message names them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import sys
import textwrap
import threading
import types
from collections.abc import Callable

from kernels.tables import WatchedTable

PROJECT = ("kernels", "goldens.cases")
_LOCK = threading.Lock()  # CPython 3.11's AST constructor is not thread-safe ("recursion depth mismatch")
_CODE: dict[str, str] = {}  # normalised-source cache: source text -> digest


def _ours(module: str | None) -> bool:
    return bool(module) and any(module == p or module.startswith(p + ".") for p in PROJECT)


class _Locals(ast.NodeTransformer):
    """Rename the names bound inside one function (its arguments and assignments) to positional names."""

    def __init__(self, bound: set[str]):
        self.bound, self.names = bound, {}

    def _name(self, name: str) -> str:
        if name not in self.bound:
            return name
        return self.names.setdefault(name, f"_v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._name(node.arg)
        node.annotation = None
        return node


def _bound_names(fn: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _strip_docstrings(tree: ast.AST) -> None:
    """Docstrings, and ``@operator(...)`` declarations (documentation of the operator, not its arithmetic)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = [d for d in node.decorator_list if not (
                isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "operator")]
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]


def _parse(source: str) -> ast.Module:
    """ast.parse, once more after CPython 3.11's spurious "AST constructor recursion depth mismatch" SystemError
    (python/cpython#106905: its AST state's depth counter is left off by an earlier failed construction, possibly
    on another thread; seen once by an outside trial of `goldens report`). A second failure is raised."""
    try:
        return ast.parse(source)
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(source)


def normalised_digest(source: str) -> str:
    """Digest of one function's or class's source, invariant to formatting, comments, docstrings, type
    annotations of arguments and the names of locals."""
    with _LOCK:
        if source not in _CODE:
            tree = _parse(textwrap.dedent(source))
            _strip_docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    _Locals(_bound_names(node)).visit(node)
            _CODE[source] = hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]
        return _CODE[source]


_SOURCES: dict[object, str | None] = {}  # code object (function) or class -> its source text
_IMPORTS: dict[str, list] = {}  # function source -> its local imports


def _source(obj) -> str | None:
    """Source text, cached by code object (a function) or class: inspect.getsource tokenizes the file and
    walking a half-layer reaches ~90 functions per tree."""
    key = getattr(obj, "__code__", obj)
    if key not in _SOURCES:
        try:
            _SOURCES[key] = inspect.getsource(obj)
        except (OSError, TypeError):
            _SOURCES[key] = None
    return _SOURCES[key]


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _value_like(value, depth: int = 0) -> bool:
    """A constant whose repr is its value (no addresses): numbers, strings, enums, dtypes, dataclasses and
    containers of those."""
    import dataclasses
    import enum

    import torch

    if depth > 6:
        return False
    if value is None or isinstance(value, bool | int | float | complex | str | bytes | enum.Enum | torch.dtype):
        return True
    if isinstance(value, tuple | list | set | frozenset):
        return all(_value_like(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_value_like(k, depth + 1) and _value_like(v, depth + 1) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(_value_like(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    return False


def _code_digest(code: types.CodeType) -> str:
    """A lambda's fingerprint from its code object (its source line may hold more than the lambda): the
    bytecode, constants and the global/attribute names it uses -- not the names of its arguments."""
    h = hashlib.sha256(code.co_code)
    for const in code.co_consts:
        h.update(_code_digest(const).encode() if isinstance(const, types.CodeType) else repr(const).encode())
    h.update(repr(code.co_names).encode())
    return h.hexdigest()[:16]


def _defined_in(fn: types.FunctionType, module: str) -> bool:
    """The function's code lives in its module's own file (not generated, not a wrapper from elsewhere)."""
    mod = sys.modules.get(module)
    return bool(mod) and fn.__code__.co_filename == getattr(mod, "__file__", None)


def _local_imports(fn: types.FunctionType) -> list[tuple[str, str | None]]:
    """(module, name) for ``from module import name`` and (module, None) for ``import module`` statements in
    the function's own body (absolute imports of project modules only)."""
    if fn.__name__ == "<lambda>":
        return []  # a lambda holds no statement; its source line may hold more than the lambda and not parse
    src = _source(fn)
    if not src:
        return []
    if src in _IMPORTS:
        return _IMPORTS[src]
    try:
        with _LOCK:
            tree = _parse(textwrap.dedent(src))
    except SyntaxError:
        _IMPORTS[src] = []
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module):
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if _ours(a.name)]
    _IMPORTS[src] = out
    return out


def _safe(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
        return True
    except ValueError:
        return False


def parts(entry: Callable, read: set[str] | None = None) -> dict[str, str]:
    """{qualified name: digest} of everything of this project that ``entry`` reaches. The entries of a watched
    rule table (``kernels.tables.WatchedTable``) count only when ``read`` names them: ``read`` is what the
    reference looked up while the tree was computed (``watch_reads``); None counts every entry."""
    walk = _Walk(read)
    walk.visit(entry)
    walk.names_on_modules()
    return walk.out


class _Walk:
    """One walk from an entry: every function, class and constant of this project it reaches, digested."""

    def __init__(self, read: set[str] | None):
        self.read = read
        self.out: dict[str, str] = {}
        self.seen: set[int] = set()
        self.codes: list[types.CodeType] = []  # every walked function's code: the names modules are asked for
        self.modules: dict[str, types.ModuleType] = {}
        self.reached: set[str] = set()  # modules of every function walked

    def function(self, fn: types.FunctionType) -> None:
        if not _defined_in(fn, fn.__module__):  # generated (dataclass __init__/__repr__): no source of ours
            return
        self.codes.append(fn.__code__)
        self.reached.add(fn.__module__)
        for module_name, name in _local_imports(fn):  # ``from kernels.cache import publish`` inside the body
            try:
                mod = importlib.import_module(module_name)
            except ImportError:
                continue
            if name is None:
                self.value_of(fn.__module__, module_name, mod)
            elif hasattr(mod, name):
                self.value_of(module_name, name, getattr(mod, name))
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
            if _safe(cell):
                self.value_of(fn.__module__, name, cell.cell_contents)
        for name in _code_names(fn.__code__):
            if name in fn.__globals__:
                self.value_of(fn.__module__, name, fn.__globals__[name])

    def visit(self, obj) -> None:
        if id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        if isinstance(obj, functools.partial):
            self.visit(obj.func)
            for v in (*obj.args, *obj.keywords.values()):
                if callable(v):
                    self.visit(v)
            return
        if isinstance(obj, types.MethodType):
            self.visit(obj.__func__)
            return
        module = getattr(obj, "__module__", None)
        if not _ours(module) or not isinstance(obj, types.FunctionType | type):
            return
        if isinstance(obj, types.FunctionType) and not _defined_in(obj, module):
            return  # generated or wrapped elsewhere (dataclass __repr__): its class is fingerprinted
        self._digest(obj, module)
        if isinstance(obj, types.FunctionType):
            self.function(obj)
            return
        for value in vars(obj).values():  # a class: every method it defines
            fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if isinstance(fn, types.FunctionType):
                self.function(fn)

    def _digest(self, obj, module: str) -> None:
        if isinstance(obj, types.FunctionType) and obj.__name__ == "<lambda>":
            key, n = f"{module}.{obj.__qualname__}", 1  # not the line number: moving code moves nothing
            while key in self.out:
                n += 1
                key = f"{module}.{obj.__qualname__}#{n}"
            self.out[key] = _code_digest(obj.__code__)
        else:
            src = _source(obj)
            self.out[f"{module}.{obj.__qualname__}"] = normalised_digest(src) if src else "no-source"

    def value_of(self, module: str, name: str, value) -> None:
        if isinstance(value, types.ModuleType):
            if _ours(value.__name__):
                self.modules[value.__name__] = value
        elif isinstance(value, types.FunctionType | type | functools.partial | types.MethodType):
            self.visit(value)
        elif _ours(module) and not name.startswith("__") and value is not None and _value_like(value):
            # (a None global is a slot filled at run time, e.g. a lazily created pool: not a constant)
            self._constant(module, name, value)

    def _constant(self, module: str, name: str, value) -> None:
        if isinstance(value, WatchedTable):  # the entries this tree's computation looked up, each on its own
            for key in value:  # (not iterating .items(): that would count as reading every entry)
                part = f"const {value.qualname}[{key!r}]"  # wherever it is imported
                if self.read is None or part in self.read:
                    self.out[part] = _digest(dict.__getitem__(value, key))
        elif isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            # a table of rules by name (quant.RULES): its key set, and each entry on its own, so a changed
            # entry is named ("changed const kernels.quant.RULES['index']")
            self.out[f"const {module}.{name}"] = _digest(sorted(value))
            for key, entry in value.items():
                self.out[f"const {module}.{name}[{key!r}]"] = _digest(entry)
        else:
            self.out[f"const {module}.{name}"] = _digest(value)

    def names_on_modules(self) -> None:
        """Names used on project modules (``quant.RULES``, ``rope.materialize_rope_rows``), to a fixed point; then
        each reached module's ROUNDING_VERSION (the rounding all its functions implement)."""
        for _ in range(50):
            before = (len(self.out), len(self.modules), len(self.codes))
            names = set()
            for code in self.codes:
                names |= _code_names(code)
            for mod in list(self.modules.values()):
                for name in sorted(names):
                    if name in vars(mod):
                        self.value_of(mod.__name__, name, vars(mod)[name])
            if (len(self.out), len(self.modules), len(self.codes)) == before:
                break
        for name in sorted(self.reached):
            version = getattr(sys.modules.get(name), "ROUNDING_VERSION", None)
            if version is not None and _value_like(version):
                self.out[f"const {name}.ROUNDING_VERSION"] = _digest(version)


def _canonical(value) -> str:
    """The value's full repr, with every dataclass spelled out field by field as the generated repr would: a
    class may give itself a short repr for failure messages (the model configs do), the digest must not shrink."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={_canonical(getattr(value, f.name))}" for f in dataclasses.fields(value) if f.repr)
        return f"{type(value).__qualname__}({fields})"
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return "(" + ", ".join(map(_canonical, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(map(_canonical, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_canonical(k)}: {_canonical(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _digest(value) -> str:
    return hashlib.sha256(_canonical(value).encode()).hexdigest()[:16]


def combined(p: dict[str, str]) -> str:
    return "sha256:" + hashlib.sha256(repr(sorted(p.items())).encode()).hexdigest()[:32]


def changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What moved between two parts maps, named: 'changed X', 'added Y', 'removed Z'."""
    out = [f"changed {k}" for k in sorted(set(old) & set(new)) if old[k] != new[k]]
    out += [f"now reaches {k}" for k in sorted(set(new) - set(old))]
    out += [f"no longer reaches {k}" for k in sorted(set(old) - set(new))]
    return out
