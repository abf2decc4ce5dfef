"""Seeded defects, one convention: each is declared beside the contract that must catch it.

A contract file lists ``SEEDED_DEFECTS``: each a wrong implementation (the plausible bug a kernel could ship), the
contract of that file that must fail on it, and the text its failure must name. The implementation is either the
file's own (``SeededDefect(name, operator, impl, test, mentions)``: one operator replaced on the reference) or a
defect several contracts share (``shared("family:OBJECT", test, mentions)``: a backend of ``tests/defects``, loaded
like ``--backend-module tests.defects.family:OBJECT``). ``tests/test_seeded_defects.py`` runs every one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SeededDefect:
    name: str  # short, unique with its test: "v4-embed-pack:ids-wrap", or the shared defect's "family:OBJECT"
    operator: str  # the operator it replaces ("" for a shared defect: its backend says which)
    impl: Callable | None  # replaces the operator on the torch reference backend (None: a shared defect)
    test: str  # a test function of the declaring contract file
    mentions: str  # text the failure must contain (the field, row or rule the contract names)
    source: str = ""  # a shared defect: "family:OBJECT" under tests.defects

    def backend(self):
        if self.source:
            from backends import load_backend_module

            return load_backend_module(f"tests.defects.{self.source}")
        from backends import torch_backend

        return torch_backend().derive(f"defect:{self.name}", description=f"seeded defect {self.name}",
                                      **{self.operator: self.impl})

    def operators(self) -> tuple[str, ...]:
        """The operators the defect replaces: its own, or those its shared backend binds otherwise than the
        reference."""
        if not self.source:
            return (self.operator,)
        from backends import torch_backend

        ref, bad = torch_backend(), self.backend()
        return tuple(op for op in bad.operators if op not in ref.operators or bad.get(op) is not ref.get(op))


def shared(source: str, test: str, mentions: str) -> SeededDefect:
    """A defect of ``tests/defects`` (``family:OBJECT``) that ``test`` of this contract file must catch."""
    return SeededDefect(source, "", None, test, mentions, source=source)


def reference_edit(function: str, old: str, new: str) -> Callable:
    """The reference function ``module:qualname`` with one literal edit of its source (``old`` -> ``new``): the edit a
    maintainer could make to the reference, as a seeded defect's implementation. ``old`` must occur exactly once,
    so a stale ``old`` fails loudly instead of seeding nothing. The function is compiled in a copy of its module's
    namespace (its ``__globals__``): it sees the module's helpers as they are, and a caller may re-bind one there
    to an edited helper (``new == old`` gives such a copy)."""
    import ast
    import importlib
    import inspect
    import textwrap

    module_name, name = function.split(":")
    module = importlib.import_module(module_name)
    original = getattr(module, name)
    source = textwrap.dedent(inspect.getsource(original))
    if source.count(old) != 1:
        raise ValueError(f"reference_edit {function}: {old!r} occurs {source.count(old)} times in its source")
    tree = ast.parse(source.replace(old, new))
    tree.body[0].decorator_list = []  # the declaration decorators (@operator) are not the function
    namespace: dict = {}
    exec(compile(tree, f"<edited {function}>", "exec"), module.__dict__.copy(), namespace)
    edited = namespace[name]
    edited.__wrapped_reference__ = original
    return edited
