"""What a pypto-lib kernel entry declares, read from its source: each parameter's name, direction (``pl.Tensor``
in, ``pl.Out`` out, ``pl.InOut`` inout, ``pl.Scalar`` scalar), dtype, and dims -- static (an ``int`` in the module's
namespace, the geometry the kernel is compiled at) or dynamic (``pl.dynamic``; the run specializes on it). The
entry is the function upstream's own ``__main__`` hands to ``golden.run_jit`` / ``golden.run`` (``fn=`` /
``program=``), so the declaration is the kernel's, not a call site's reading of it.

Used inside the upstream worker (the module is imported there) and by tests on plain source text.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

DTYPES = {"BF16": "bfloat16", "FP16": "float16", "FP32": "float32", "INT8": "int8", "INT16": "int16",
          "INT32": "int32", "INT64": "int64", "UINT8": "uint8", "BOOL": "bool", "UINT32": "uint32"}
DIRECTIONS = {"Tensor": "in", "Out": "out", "InOut": "inout", "Scalar": "scalar"}


class EntryError(ValueError):
    """An entry that cannot be read (missing, or a parameter whose annotation is not a pl tensor or scalar)."""


@dataclass(frozen=True)
class Param:
    name: str
    direction: str  # in | out | inout | scalar
    dtype: str  # torch dtype name
    dims: tuple  # each an int (static) or a str (a dynamic dim's name)

    @property
    def is_output(self) -> bool:
        return self.direction in ("out", "inout")


def _tail(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _param(arg: ast.arg, namespace: dict, where: str) -> Param:
    ann = arg.annotation
    if not isinstance(ann, ast.Subscript):
        raise EntryError(f"{where}: parameter {arg.arg!r} is not annotated with a pl tensor or scalar")
    kind = DIRECTIONS.get(_tail(ann.value))
    if kind in ("out", "inout"):
        ann = ann.slice  # pl.Out[pl.Tensor[...]]
        if not isinstance(ann, ast.Subscript) or _tail(ann.value) != "Tensor":
            raise EntryError(f"{where}: parameter {arg.arg!r}: pl.Out / pl.InOut of something not a pl.Tensor")
    if kind is None:
        raise EntryError(f"{where}: parameter {arg.arg!r}: unknown annotation {ast.unparse(arg.annotation)}")
    if kind == "scalar":
        dtype = _tail(ann.slice)
        return Param(arg.arg, "scalar", DTYPES.get(dtype, dtype), ())
    parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    if len(parts) < 2 or not isinstance(parts[0], ast.List):
        raise EntryError(f"{where}: parameter {arg.arg!r}: expected pl.Tensor[[dims], dtype]")
    dims = []
    for dim in parts[0].elts:
        try:
            value = eval(compile(ast.Expression(dim), where, "eval"), dict(namespace))  # noqa: S307 (upstream's own constants)
        except Exception:
            value = None
        dims.append(int(value) if isinstance(value, int) and not isinstance(value, bool) else ast.unparse(dim))
    dtype = _tail(parts[1])
    return Param(arg.arg, kind, DTYPES.get(dtype, dtype), tuple(dims))


def declared(source: str, entry: str, namespace: dict, *, where: str = "<module>") -> tuple[Param, ...]:
    """The parameters ``entry`` (a top-level function of ``source``) declares, in order; dims evaluated in
    ``namespace`` (the imported module's globals)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            return tuple(_param(a, namespace, f"{where}::{entry}") for a in node.args.args)
    raise EntryError(f"{where} has no top-level kernel entry {entry!r}")


def mismatch(params: tuple[Param, ...], tensors: dict) -> str | None:
    """Why ``tensors`` (name -> tensor or Python scalar) cannot be fed to the entry, or None: every parameter by
    name, its dtype, its rank and every static dim (the geometry the kernel is compiled at); dynamic dims take the
    call's size, the same size for the same dynamic name."""
    names = [p.name for p in params]
    if set(tensors) != set(names):
        missing, extra = sorted(set(names) - set(tensors)), sorted(set(tensors) - set(names))
        return f"the entry's parameters are {names}: missing {missing}, unexpected {extra}"
    bound: dict[str, int] = {}
    for p in params:
        value = tensors[p.name]
        if p.direction == "scalar":
            continue
        got = str(value.dtype).removeprefix("torch.")
        if got != p.dtype:
            return f"{p.name}: the entry takes {p.dtype}, the call has {got}"
        if value.ndim != len(p.dims):
            return f"{p.name}: the entry takes rank {len(p.dims)} {list(p.dims)}, the call has {list(value.shape)}"
        for axis, (want, have) in enumerate(zip(p.dims, value.shape, strict=True)):
            if isinstance(want, int):
                if want != have:
                    return (f"{p.name} dim {axis}: the kernel is compiled for {want} (its static geometry), the "
                            f"call has {have}")
            elif bound.setdefault(want, int(have)) != have:
                return f"{p.name} dim {axis}: dynamic {want} is {bound[want]} elsewhere in the call, {have} here"
    return None
