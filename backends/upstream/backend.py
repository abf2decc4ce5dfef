"""``make_backend``: the upstream-goldens backend for one checkout (see ``backends.upstream``)."""

from __future__ import annotations

import os
import subprocess
from functools import partial
from pathlib import Path

from kernels.record import FOLDERS

TEST_DOUBLE_MARKER = "PTO_CONTRACTS_TEST_DOUBLE"
ALLOW_TEST_DOUBLE = "PTO_CONTRACTS_ALLOW_TEST_DOUBLE"
MODEL_FOLDERS = (*FOLDERS, "deepseek_v4_1_flash")  # main's V4 folders, and V4.1-Flash's where a checkout has it


def checkout_problems(option: str | None) -> list[tuple[str, str]]:
    """Every reason at once why ``option`` (or $PYPTO_LIB_ROOT) is not a usable pypto-lib checkout, as
    (piece, what is wrong and what to do); empty when it is one. A checkout is a folder with ``golden/runner.py``
    and at least one of the model folders this harness has adapters for."""
    given = option or os.environ.get("PYPTO_LIB_ROOT")
    if not given:
        return [("pypto-lib checkout", "no pypto-lib checkout given (pass --pypto-lib PATH or set PYPTO_LIB_ROOT; "
                                       "git clone https://github.com/hw-native-sys/pypto-lib)")]
    root = Path(given).expanduser()
    if not root.exists():
        return [("pypto-lib checkout", f"{root} does not exist (pass the folder of a pypto-lib clone)")]
    if not root.is_dir():
        return [("pypto-lib checkout", f"{root} is a file, not a folder (pass the folder of a pypto-lib clone)")]
    out = []
    if not (root / "golden" / "runner.py").is_file():
        out.append(("golden/runner.py", f"{root} has no golden/runner.py: not a pypto-lib checkout, or one older "
                                        "than upstream's golden/ package (pull main)"))
    if not any((root / "models" / f).is_dir() for f in MODEL_FOLDERS):
        out.append(("model folders", f"{root} has none of models/{{{','.join(MODEL_FOLDERS)}}} (pull main for "
                                     "deepseek_v4_pro; the V4.1-Flash folder is not on main)"))
    if (root / TEST_DOUBLE_MARKER).exists() and os.environ.get(ALLOW_TEST_DOUBLE) != "1":
        out.append(("pypto-lib checkout", f"{root} is pto-contracts' test double of upstream, never used outside "
                                          "the project's tests"))
    return out


def checkout(option: str | None) -> tuple[Path | None, str]:
    """(root, "") or (None, why not: every problem, joined)."""
    problems = checkout_problems(option)
    if problems:
        return None, "; ".join(why for _piece, why in problems)
    return Path(option or os.environ["PYPTO_LIB_ROOT"]).expanduser().resolve(), ""


def revision(root: Path) -> str:
    if (root / TEST_DOUBLE_MARKER).exists():
        return "test double (not upstream)"
    commit, dirty = git_state(root)
    return (commit[:12] + (" (with local changes)" if dirty else "")) if commit else "unknown (not a git checkout)"


CALLED: list[str] = []  # the golden functions called, in order (read by goldens record --from upstream)


def git_state(root: Path) -> tuple[str, bool]:
    """(full commit, whether the work tree has local changes) of a checkout; ("", False) when not a git checkout
    (or the project's test double)."""
    if (root / TEST_DOUBLE_MARKER).exists():
        return "", False
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "", False
    if head.returncode != 0:
        return "", False
    return head.stdout.strip(), bool(status.stdout.strip())


def _operator(adapter, root: Path, env: dict[str, str] | None = None):
    from backends.upstream.client import UpstreamError, worker
    from contracts.operators import BackendError

    def run(tensors, fields, constants, *, module_globals=None, module=None, function=None, args=None, kwargs=None,
            taps=None, native=()):
        module = adapter.module_of(module)
        CALLED.append(f"models/{adapter.folder}/{module}.py::{function or adapter.function}")
        try:
            return worker(root, env).call(adapter.folder, module, function or adapter.function, tensors,
                                     fields=fields, constants=constants, module_globals=module_globals, args=args,
                                     kwargs=kwargs, taps=taps, native=native)
        except UpstreamError as exc:
            raise BackendError(str(exc)) from None

    fn = partial(adapter.build, run)
    fn.__name__ = adapter.operator
    fn.__doc__ = f"upstream {adapter.upstream} through backends.upstream.adapters"
    fn.may_be_unsupported = True  # a call asking for a rule upstream's golden does not have raises Unsupported
    return fn


def make_backend(pypto_lib: str | None = None, model: str | None = None):
    """Upstream's goldens of one model folder (``model``, default deepseek_v4_pro) in one checkout."""
    from backends.upstream.adapters import FUSED, PENDING, PRO, adapters_for, preset_environment
    from contracts.operators import KERNEL_OPERATORS, Backend
    from kernels.record import folder_of

    model = model or PRO
    ADAPTERS = adapters_for(model)  # a model not known raises BackendError: a usage error, before the checkout
    folder, env = folder_of(model), preset_environment(model)
    root, reason = checkout(pypto_lib)
    if root is None:
        return Backend("upstream", {}, unavailable=reason)
    if not (root / "models" / folder).is_dir():
        return Backend("upstream", {}, unavailable=f"{root} has no models/{folder} (--model {folder}; pull main)")
    present = {name: a for name, a in ADAPTERS.items()
               if (root / "models" / folder / f"{a.module_of()}.py").is_file()}  # an older main lacks a module
    ops = {name: _operator(a, root, env) for name, a in present.items()}
    why = {}
    for name in KERNEL_OPERATORS:
        if name in ops:
            continue
        if name in ADAPTERS and (root / "models" / folder).is_dir():
            why[name] = f"this checkout has no {ADAPTERS[name].upstream.split('::')[0]} (its golden " \
                        f"{ADAPTERS[name].function} is adapted; an older main?)"
        elif name in ADAPTERS:
            why[name] = f"this checkout has no models/{ADAPTERS[name].folder}"
        elif folder == PRO and name in PENDING:
            why[name] = f"upstream golden {PENDING[name]} not adapted yet"
        elif folder == PRO and name in FUSED:
            why[name] = FUSED[name]
        else:
            why[name] = f"no golden of models/{folder} is adapted for it"
    from backends.upstream.adapters import variants_for

    commit, dirty = git_state(root)
    provenance = {"repository": "hw-native-sys/pypto-lib", "commit": commit, "dirty": dirty, "folder": folder,
                  **({"model": model, "environment": env} if env else {}),
                  "goldens": {name: ADAPTERS[name].upstream for name in ops}, "called": CALLED}
    from backends.upstream.adapters import DEVIATIONS

    return Backend("upstream", ops, why_missing=why, variants={k: v for k, v in variants_for(folder).items() if k in ops},
                   deviations=DEVIATIONS,
                   description=f"upstream Torch goldens of models/{folder}"
                               + "".join(f" ({k}={v})" for k, v in env.items())
                               + f" from {root} @ {revision(root)} (worker process)",
                   provenance=provenance)
