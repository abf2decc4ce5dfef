"""Which trees a command works on: case names checked as one path segment each, the (case, wiring) pairs of the
named or recorded cases, those that reach an ``--operator``, and the backend a replay runs (``--backend``,
``--backend-module``; ``recorded`` is built from the store by the replay itself).
"""

from __future__ import annotations

import re

from goldens.catalog import select_wirings
from goldens.errors import GoldenStoreError

_CASE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def check_case_name(name: str) -> None:
    """A case name is one path segment of the store: letters, digits, '_', '.', '+', '-', not starting with '.'
    (so never '..' or a path)."""
    if not _CASE_NAME.fullmatch(name) or ".." in name:
        raise GoldenStoreError(f"case name {name!r}: expected letters, digits, '_', '.', '+' or '-' (one path "
                               "segment, not starting with '.'); see goldens show for the known cases")


def tree_items(names: list[str], wiring: str, *, reader=None) -> list[tuple[str, str]]:
    """(case, wiring) pairs. Without names: every recorded case (replay/regen) or every known case (record)."""
    from goldens import trees
    from goldens.cases import cases, get_case

    if not names:
        names = trees.recorded_cases(reader) if reader is not None else \
            sorted(n for n, c in cases().items() if not c.base)  # derived cases replay their stored inputs only
    out = []
    for name in names:
        check_case_name(name)
        if reader is not None:
            trees.adopt(reader, name)
        case = get_case(name)
        wanted = select_wirings(wiring)
        chosen = [w for w in wanted if w in case.wirings]
        if not chosen:
            raise GoldenStoreError(f"case {name} has no {wiring} wiring (it has {list(case.wirings)})")
        if reader is not None:
            have = trees.recorded_wirings(reader, name)
            missing = [w for w in chosen if w not in have]
            if missing and wiring != "both":
                raise GoldenStoreError(f"no {missing[0]} tree for case {name} (recorded wirings: {have or 'none'}); "
                                       "a tree saved by one wiring is never fed to the other")
            chosen = [w for w in chosen if w in have]
        out += [(name, w) for w in chosen]
    if not out:
        raise GoldenStoreError("nothing to do: no matching trees (see goldens show / goldens record --help)")
    return out


def reaching(reader, items: list[tuple[str, str]], given: list[str]) -> list[tuple[str, str]]:
    """The ``items`` whose trees reach one of the operators of ``--operator`` (contracts.operators)."""
    from contracts.operators import BackendError, operator_names, operators_reached
    from goldens import trees
    from goldens.cases import get_case

    try:
        wanted = operator_names(given)
    except BackendError as exc:
        raise GoldenStoreError(str(exc)) from None

    def reached(case: str, wiring: str) -> frozenset[str]:
        if reader.has(f"{case}/{wiring}"):
            return trees.tree_operators(reader, case, wiring)
        return operators_reached(get_case(case).operator)  # a kept run rebuilt without its tree

    out = [(c, w) for c, w in items if reached(c, w) & wanted]
    if not out:
        raise GoldenStoreError(f"no tree of the {len(items)} selected reaches {', '.join(sorted(wanted))} "
                               "(goldens show lists each tree's operator)")
    return out


def backend_of(args):
    from backends import get_backend, load_backend_module
    from contracts.operators import BackendError

    device = {"platform": args.platform, "device": args.device, "pypto_lib": args.pypto_lib,
              "model": getattr(args, "model", None)}
    try:
        if args.backend_module:
            if args.platform is not None or args.pypto_lib is not None or device["model"] is not None:
                raise BackendError("--platform/--pypto-lib/--model apply to --backend pypto or upstream, not to "
                                   "--backend-module (a module of your own may take --device: a callable with device=)")
            return load_backend_module(args.backend_module, device=args.device)
        if args.backend == "recorded" or args.backend.startswith("recorded:"):
            if any(v is not None for v in device.values()):
                raise BackendError("--platform/--device/--pypto-lib apply to a device backend, not to --backend "
                                   "recorded (it replays outputs a device run kept)")
            return None  # built from the store by cmd_replay
        return get_backend(args.backend, **device)
    except BackendError as exc:
        raise GoldenStoreError(str(exc)) from exc
