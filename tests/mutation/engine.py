"""Operator-level mutants of the Torch reference, generated from its source.

A mutant changes one thing in one module that implements a backend operator: a comparison
(``<`` <-> ``<=``, ``==`` <-> ``!=``), an arithmetic or bit operator, a constant (``n -> n+1``,
``c -> 2c``, ``True <-> False``), a boolean connective, a rounding or reduction function
(``floor`` <-> ``ceil``, ``amax`` <-> ``amin``, ...), a dtype (``float32`` <-> ``bfloat16``, ``int64`` <->
``int32``, ...), or it drops one step (a ``round``/``clamp``/``.to(dtype)``/``.float()``/``.clone()``
call, a unary minus, a ``not``). Only code reachable from an operator's entry point is mutated;
error-message construction (``raise`` statements, f-strings) and docstrings are left alone.

The mutated module is loaded as a *shadow copy* under a private name, together with shadow copies
of the operator modules that import it, so the mutant backend uses the mutated code while the
contracts' own reference (``kernels.*``, ``contracts.checks.*``) stays pristine.

Each mutant has a stable key ``module:function:kind:original->replacement#n`` (no line numbers), used
by the equivalence register ``tests/mutation/equivalent.py``.
"""

from __future__ import annotations

import ast
import copy
import importlib
import itertools
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from backends import reference_operators
from contracts.operators import REFERENCE_OPERATORS, Backend

ROOT = Path(__file__).resolve().parents[2]

# Modules that implement operators, in dependency order (a module only imports earlier ones).
# The modules mutated: every module that declares an operator (contracts.operators), in declaration order, and
# the helper modules they share that declare none.
HELPER_MODULES = ("kernels.reference.rowwise",)
MODULES = tuple(dict.fromkeys([*(m for m, _a in REFERENCE_OPERATORS.values()), *HELPER_MODULES]))

_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
             ast.Mod: ast.FloorDiv, ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr,
             ast.BitOr: ast.BitAnd, ast.Pow: ast.Mult}
_BOOL_SWAP = {ast.And: ast.Or, ast.Or: ast.And}
# rounding, reduction and dtype names (torch functions, tensor methods, builtins)
_NAME_SWAP = {
    "floor": "ceil", "ceil": "floor", "round": "floor", "trunc": "round",
    "amax": "amin", "amin": "amax", "maximum": "minimum", "minimum": "maximum", "max": "min", "min": "max",
    "argmax": "argmin", "argmin": "argmax", "clamp_min": "clamp_max", "clamp_max": "clamp_min",
    "any": "all", "all": "any", "isfinite": "isnan", "signbit": "isnan",
    "float32": "bfloat16", "bfloat16": "float32", "float64": "float32", "float16": "bfloat16",
    "int32": "int64", "int64": "int32", "uint8": "int8",
    "cumsum": "cumprod", "sum": "mean", "mean": "sum",
}
# calls that can be dropped (replaced by their receiver or first argument): a step skipped
_DROPPABLE = {"round", "floor", "ceil", "clamp", "clamp_min", "clamp_max", "to", "float", "abs", "clone",
              "contiguous", "nan_to_num", "masked_fill", "flip", "sort"}
_SKIP_ASSIGN = {"SPEC", "ROUNDING_VERSION", "__all__", "BLOCK_ELEMENTS", "_POOL"}
# Where the operator's code is narrower than what a module reaches: the schedule operator takes its config
# as an argument, so preset values and V4 presets are data of the caller (checked by test_schedule's facts).
SCOPE = {"kernels.config": frozenset({"resolve_schedule", "V41Config", "V41Config.schedule", "V41Config.layer_config", "V41Config._mode",
                                      "V41Config._active_source", "resolve_layer_kind", "_KINDS", "LayerConfig"})}


@dataclass(frozen=True)
class Mutant:
    module: str
    function: str  # qualified name, or "<module>" for module-level code
    kind: str
    original: str
    replacement: str
    occurrence: int
    line: int
    index: int  # the n-th site of the module (traversal order), used to apply it

    @property
    def key(self) -> str:
        return f"{self.module}:{self.function}:{self.kind}:{self.original}->{self.replacement}#{self.occurrence}"

    @property
    def where(self) -> str:
        return f"{self.module.replace('.', '/')}.py:{self.line}"


def _short(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def module_path(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


# ---------------------------------------------------------------------------
# reachability: which functions of a module an operator can run


def _defs(tree: ast.Module) -> dict[str, ast.AST]:
    """Top-level functions and classes, and methods as ``Class.method``."""
    out: dict[str, ast.AST] = {}
    for n in tree.body:
        if isinstance(n, ast.FunctionDef | ast.ClassDef):
            out[n.name] = n
        if isinstance(n, ast.ClassDef):
            for m in n.body:
                if isinstance(m, ast.FunctionDef):
                    out[f"{n.name}.{m.name}"] = m
    return out


def _module_assigns(tree: ast.Module) -> dict[str, ast.AST]:
    out = {}
    for n in tree.body:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = n
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = n
    return out


def _refs(node: ast.AST, defs: dict[str, ast.AST], assigns: dict[str, ast.AST]) -> set[str]:
    """Definitions (functions, classes, methods, module constants) a piece of code refers to."""
    methods: dict[str, set[str]] = {}
    for q in defs:
        if "." in q:
            methods.setdefault(q.split(".", 1)[1], set()).add(q)
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and (n.id in defs or n.id in assigns):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and n.attr in methods:
            out |= methods[n.attr]
    return out


def _used_from(module: str, other: str) -> set[str]:
    """Names of ``module`` that ``other`` uses: ``from module import a`` and ``alias.attr`` after
    ``from package import short as alias``."""
    pkg, short = module.rsplit(".", 1)
    tree = _tree(other)
    names, aliases = set(), set()
    for n in ast.walk(tree):  # imports anywhere in the module (some are inside functions)
        if isinstance(n, ast.ImportFrom) and n.module == module:
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module == pkg:
            aliases |= {a.asname or a.name for a in n.names if a.name == short}
    # ...but only uses inside the part of ``other`` an operator can run
    live = reachable(other)
    defs, assigns = _defs(tree), _module_assigns(tree)
    used = set()
    for q in live:
        node = defs.get(q) or assigns.get(q)
        if node is None or isinstance(node, ast.ClassDef):
            continue
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases:
                used.add(n.attr)
            elif isinstance(n, ast.Name) and n.id in names:
                used.add(n.id)
    return used


# Methods that only ever run on the caller's objects: the contracts build a QuantCache with the real
# module, so a shadow copy of its methods is never called by an operator.
EXCLUDE = {"kernels.cache": frozenset({"QuantCache.rows", "QuantCache.clone", "QuantCache.numpy_bits"})}


@cache
def reachable(module: str) -> frozenset[str]:
    """Functions, classes, methods and module constants of ``module`` that an operator can run: from its
    own operator entry points and from what other operator modules use of it, closed over references."""
    if module in SCOPE:
        return SCOPE[module]
    tree = _tree(module)
    defs, assigns = _defs(tree), _module_assigns(tree)
    frontier = {attr for m, attr in REFERENCE_OPERATORS.values() if m == module}
    for other in MODULES:
        if other != module and module in _imports(other):
            frontier |= _used_from(module, other) & (defs.keys() | assigns.keys())
    seen: set[str] = set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        node = defs.get(name) or assigns.get(name)
        if node is None:
            continue
        if isinstance(node, ast.ClassDef):  # constructing it runs its field defaults and __post_init__
            frontier |= {q for q in defs if q in (f"{name}.__post_init__", f"{name}.__init__")}
            body = [b for b in node.body if not isinstance(b, ast.FunctionDef)]
            frontier |= set().union(*(_refs(b, defs, assigns) for b in body)) if body else set()
        else:
            frontier |= _refs(node, defs, assigns)
    owners = {q.split(".")[0] + ".<methods>" for q in seen if "." in q}  # classes with a reachable method
    return frozenset((seen | owners) - EXCLUDE.get(module, frozenset()))


# ---------------------------------------------------------------------------
# sites


def _is_docstring(node: ast.AST, parent: ast.AST | None) -> bool:
    return (isinstance(parent, ast.Expr) and isinstance(node, ast.Constant) and isinstance(node.value, str))


class _Sites:
    """Walks a module in a fixed order and yields (node, kind, replacement-builder, description, function)."""

    def __init__(self, tree: ast.Module, module: str):
        self.tree, self.module = tree, module
        self.allowed = reachable(module)

    def walk(self) -> Iterator[tuple[ast.AST, str, Callable[[ast.AST], ast.AST | None], str, str, str]]:
        for stmt in self.tree.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name in self.allowed:
                yield from self._visit(stmt, stmt.name)
            elif isinstance(stmt, ast.ClassDef) and (stmt.name in self.allowed
                                                     or f"{stmt.name}.<methods>" in self.allowed):
                for child in stmt.body:
                    if isinstance(child, ast.FunctionDef) and f"{stmt.name}.{child.name}" in self.allowed:
                        yield from self._visit(child, f"{stmt.name}.{child.name}", stmt)
                    elif isinstance(child, ast.AnnAssign | ast.Assign) and child.value is not None \
                            and stmt.name in self.allowed and self.module not in SCOPE:
                        # field defaults run when the class is constructed (a scoped module's are caller data)
                        yield from self._visit(child.value, stmt.name, child)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                if names & _SKIP_ASSIGN or not names & self.allowed:
                    continue
                if stmt.value is not None:
                    yield from self._visit(stmt.value, "<module>")

    def _visit(self, node: ast.AST, func: str, parent: ast.AST | None = None):
        if isinstance(node, ast.Raise | ast.JoinedStr) or _is_docstring(node, parent):
            return
        if isinstance(node, ast.FunctionDef):
            # decorators (dataclass, cache, property) are structure, not arithmetic: not visited
            func = func if node.name == func.split(".")[-1] else f"{func}.{node.name}"
            for child in [*node.args.defaults, *node.args.kw_defaults, *node.body]:
                if child is not None:
                    yield from self._visit(child, func, node)
            return
        if isinstance(node, ast.ClassDef):
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "ContractInputError", "CodecError", "ConfigError", "Violation"):
            return  # an error or violation record: message fields only (the decision is mutated elsewhere)
        yield from self._sites_of(node, func)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr_context | ast.operator | ast.cmpop | ast.boolop | ast.unaryop):
                continue
            yield from self._visit(child, func, node)

    def _sites_of(self, node: ast.AST, func: str):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                new = _CMP_SWAP.get(type(op))
                if new:
                    yield (node, "cmp", _replace_cmp(i, new), type(op).__name__, new.__name__, func)
        elif isinstance(node, ast.BinOp | ast.AugAssign):
            new = _BIN_SWAP.get(type(node.op))
            if new:
                yield (node, "binop", _replace_op(new), type(node.op).__name__, new.__name__, func)
        elif isinstance(node, ast.BoolOp):
            new = _BOOL_SWAP[type(node.op)]
            yield (node, "boolop", _replace_op(new), type(node.op).__name__, new.__name__, func)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not | ast.Invert):
            yield (node, "drop-unary", lambda n: n.operand, type(node.op).__name__, "(none)", func)
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                yield (node, "const", _const(not v), repr(v), repr(not v), func)
            elif isinstance(v, int):
                yield (node, "const", _const(v + 1), repr(v), repr(v + 1), func)
            elif isinstance(v, float):
                new = v * 2 if v != 0 else 1.0
                yield (node, "const", _const(new), repr(v), repr(new), func)
        elif isinstance(node, ast.Attribute) and node.attr in _NAME_SWAP and isinstance(node.ctx, ast.Load):
            new = _NAME_SWAP[node.attr]
            yield (node, "name", _rename_attr(new), node.attr, new, func)
        elif isinstance(node, ast.Name) and node.id in ("max", "min", "round", "any", "all", "sum") \
                and isinstance(node.ctx, ast.Load):
            new = _NAME_SWAP[node.id]
            yield (node, "name", _rename_name(new), node.id, new, func)
        yield from _semantic_sites(node, func)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _DROPPABLE:
            receiver = node.func.value
            is_module_fn = isinstance(receiver, ast.Name) and receiver.id in ("torch", "math", "np")
            if is_module_fn and node.args:
                yield (node, "drop-call", lambda n: n.args[0], node.func.attr, "(skipped)", func)
            elif not is_module_fn:
                yield (node, "drop-call", lambda n: n.func.value, node.func.attr, "(skipped)", func)


_CLAMPS = ("clamp", "clamp_min", "clamp_max")


def _semantic_sites(node: ast.AST, func: str):
    """The plausible one-rule bugs of this field (issue #26): a reduction in another order, a clamp on the other
    side of the call it feeds or follows, the other tie rule, staging through FP16 instead of BF16, a failure
    clause dropped."""
    if isinstance(node, ast.For) and any(_accumulates(b) for b in ast.walk(node) if b is not node):
        yield (node, "reorder", _reversed_iter, "for ... in X (accumulating)", "for ... in reversed(list(X))", func)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CLAMPS \
            and isinstance(node.func.value, ast.Call) and node.func.value.args:
        yield (node, "move-clamp", _clamp_inside, f"f(x).{node.func.attr}(..)", f"f(x.{node.func.attr}(..))", func)
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Call) \
            and isinstance(node.args[0].func, ast.Attribute) and node.args[0].func.attr in _CLAMPS:
        yield (node, "move-clamp", _clamp_outside, f"f(x.{node.args[0].func.attr}(..))",
               f"f(x).{node.args[0].func.attr}(..)", func)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "round" \
            and not node.keywords and (len(node.args) == 1 and isinstance(node.func.value, ast.Name)
                                       and node.func.value.id == "torch" or not node.args):
        yield (node, "tie-rule", _half_away, "round (half to even)", "half away from zero", func)
    if isinstance(node, ast.Attribute) and node.attr == "bfloat16" and isinstance(node.ctx, ast.Load):
        yield (node, "stage-dtype", _rename_attr("float16"), "bfloat16", "float16", func)
    if isinstance(node, ast.If) and len(node.body) == 1 and isinstance(node.body[0], ast.Return) \
            and isinstance(node.body[0].value, ast.Call) and isinstance(node.body[0].value.func, ast.Name) \
            and node.body[0].value.func.id == "failed" and not node.orelse:
        yield (node, "drop-clause", _never, "if ...: return failed(..)", "(clause dropped)", func)


def _accumulates(node: ast.AST) -> bool:
    """``acc += x``, ``acc -= x`` or ``acc = acc + x``: a running sum whose order the loop decides."""
    if isinstance(node, ast.AugAssign):
        return isinstance(node.op, ast.Add | ast.Sub)
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
            and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add | ast.Sub):
        name = node.targets[0].id
        return any(isinstance(side, ast.Name) and side.id == name for side in (node.value.left, node.value.right))
    return False


def _reversed_iter(n):
    n.iter = ast.Call(ast.Name("reversed", ast.Load()), [ast.Call(ast.Name("list", ast.Load()), [n.iter], [])], [])
    return n


def _clamp_inside(n):  # f(x, ...).clamp(a) -> f(x.clamp(a), ...)
    inner = n.func.value
    clamped = ast.Call(ast.Attribute(inner.args[0], n.func.attr, ast.Load()), n.args, n.keywords)
    return ast.Call(inner.func, [clamped, *inner.args[1:]], inner.keywords)


def _clamp_outside(n):  # f(x.clamp(a), ...) -> f(x, ...).clamp(a)
    clamp = n.args[0]
    moved = ast.Call(n.func, [clamp.func.value, *n.args[1:]], n.keywords)
    return ast.Call(ast.Attribute(moved, clamp.func.attr, ast.Load()), clamp.args, clamp.keywords)


def _half_away(n):  # round(x) -> sign(x) * floor(|x| + 0.5)
    x = n.args[0] if n.args else n.func.value

    def torch_call(name, *args):
        return ast.Call(ast.Attribute(ast.Name("torch", ast.Load()), name, ast.Load()), list(args), [])

    return ast.BinOp(torch_call("sign", x), ast.Mult(),
                     torch_call("floor", ast.BinOp(torch_call("abs", x), ast.Add(), ast.Constant(0.5))))


def _never(n):
    n.test = ast.Constant(False)
    return n


def _replace_cmp(i: int, new):
    def f(n):
        n.ops[i] = new()
        return n
    return f


def _replace_op(new):
    def f(n):
        n.op = new()
        return n
    return f


def _const(value):
    def f(n):
        n.value = value
        return n
    return f


def _rename_attr(new: str):
    def f(n):
        n.attr = new
        return n
    return f


def _rename_name(new: str):
    def f(n):
        n.id = new
        return n
    return f


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(module_path(module).read_text(), filename=str(module_path(module)))


@cache
def mutants_of(module: str) -> tuple[Mutant, ...]:
    out = []
    counts: Counter = Counter()
    for i, (node, kind, _fn, orig, repl, func) in enumerate(_Sites(_tree(module), module).walk()):
        original = f"{_short(node)}[{orig}]" if kind in ("cmp", "binop", "boolop", "drop-unary", "drop-call") \
            else orig
        base = (func, kind, original, repl)
        out.append(Mutant(module, func, kind, original, repl, counts[base], getattr(node, "lineno", 0), i))
        counts[base] += 1
    return tuple(out)


def all_mutants(modules=MODULES) -> list[Mutant]:
    return [m for mod in modules for m in mutants_of(mod)]


def mutated_source(mutant: Mutant) -> str:
    tree = copy.deepcopy(_tree(mutant.module))
    for i, (node, _kind, fn, _o, _r, _f) in enumerate(_Sites(tree, mutant.module).walk()):
        if i == mutant.index:
            new = fn(node)
            if new is not node:
                _swap_node(tree, node, new)
            break
    else:
        raise LookupError(f"mutant {mutant.key}: site {mutant.index} not found")
    return ast.unparse(ast.fix_missing_locations(tree))


def _swap_node(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for j, item in enumerate(value):
                    if item is old:
                        value[j] = new
                        return
    raise LookupError("node to replace not found")


# ---------------------------------------------------------------------------
# shadow loading


def _imports(module: str) -> set[str]:
    out = set()
    for n in ast.walk(_tree(module)):
        if isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
            out |= {f"{n.module}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return out & set(MODULES)


def _load_order(modules) -> tuple[str, ...]:
    """Every module after the modules it imports (a stable topological order): the order shadow copies load in."""
    order: list[str] = []

    def visit(m: str, path: tuple[str, ...]) -> None:
        if m in order or m in path:
            return
        for d in sorted(_imports(m)):
            visit(d, (*path, m))
        order.append(m)

    for m in modules:
        visit(m, ())
    return tuple(order)


MODULES = _load_order(MODULES)


def dependents(module: str) -> list[str]:
    """``module`` and every operator module that imports it, directly or not, in load order."""
    need = {module}
    for m in MODULES:
        if _imports(m) & need:
            need.add(m)
    return [m for m in MODULES if m in need]


class _RewriteImports(ast.NodeTransformer):
    """``from P import a`` / ``from P.a import b`` of a shadowed module -> the shadow copy."""

    def __init__(self, shadow: dict[str, str]):
        self.shadow = shadow  # real name -> shadow name

    def visit_ImportFrom(self, node: ast.ImportFrom):
        keep, assigns = [], []
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            bound = alias.asname or alias.name
            if full in self.shadow:
                src = f"__import__('sys').modules[{self.shadow[full]!r}]"
            elif node.module in self.shadow:
                src = f"__import__('sys').modules[{self.shadow[node.module]!r}].{alias.name}"
            else:
                keep.append(alias)
                continue
            assigns.append(ast.parse(f"{bound} = {src}").body[0])
        if not assigns:
            return node
        out = [ast.ImportFrom(node.module, keep, node.level)] if keep else []
        return [*out, *assigns]


_COUNTER = itertools.count()


def load_shadow(mutant: Mutant | None, module: str | None = None) -> dict[str, types.ModuleType]:
    """Shadow copies of the mutated module and its dependents (``mutant=None``: an unmutated copy of
    ``module`` and its dependents, the control run)."""
    target = mutant.module if mutant is not None else module
    prefix = f"_pto_mutant{next(_COUNTER)}."
    names = dependents(target)
    shadow = {m: prefix + m for m in names}
    loaded = {}
    try:
        for m in names:
            src = mutated_source(mutant) if mutant is not None and m == target else module_path(m).read_text()
            tree = _RewriteImports(shadow).visit(ast.parse(src))
            mod = types.ModuleType(shadow[m])
            mod.__file__ = str(module_path(m))
            sys.modules[shadow[m]] = mod
            loaded[m] = mod
            exec(compile(ast.fix_missing_locations(tree), f"<mutant of {m}>", "exec"), mod.__dict__)
    except BaseException:
        unload(loaded)
        raise
    return loaded


def unload(loaded: dict[str, types.ModuleType]) -> None:
    for mod in loaded.values():
        sys.modules.pop(mod.__name__, None)


def shadow_backend(loaded: dict[str, types.ModuleType], name: str) -> Backend:
    """The torch backend with every operator of a shadowed module taken from its shadow copy."""
    ops = reference_operators(lambda m: loaded.get(m) or importlib.import_module(m))
    return Backend(name, ops, description="mutant of the Torch reference")


def operators_of(modules) -> set[str]:
    mods = set(modules)
    return {op for op, (m, _a) in REFERENCE_OPERATORS.items() if m in mods}
