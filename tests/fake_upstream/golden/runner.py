"""TEST DOUBLE of upstream ``golden/runner.py`` ``run`` (spec §7.3), as far as the pto-contracts binding
uses it: inputs from the specs or from ``golden_data`` (``in/``, ``out/``; missing files fail the run; pure
outputs zero-initialized; scalar dtypes checked), the golden from ``golden_fn`` on a snapshot of the inputs
unless ``golden_data`` gives it, directions stamped from the program (``pl.InOut`` / ``pl.Out`` parameters
are outputs, as the newer runner takes them from the compiled artifact), the "kernel" = the ``@pl.jit`` Python function called on the tensors, and
validation through ``compare_fn`` ({output name: callable(actual, expected, *, actual_outputs,
expected_outputs, inputs, rtol, atol) -> (ok, msg)}), else allclose. Returns RunResult(passed, error)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import torch

from .spec import ScalarSpec, TensorSpec

PLATFORMS = ("a2a3", "a2a3sim", "a5", "a5sim")


@dataclass
class RunResult:
    passed: bool
    error: str | None = None
    work_dir: Path | None = None


def _load(path: Path) -> torch.Tensor:
    return torch.load(path, weights_only=True)


def run(fn, specs, golden_fn=None, compare_fn=None, config=None, compile_only=False, save_data=False,
        golden_data=None, runtime_dir=None, rtol=1e-5, atol=1e-5) -> RunResult:
    config = dict(config or {})
    platform = config.get("platform")
    if platform not in PLATFORMS:
        raise ValueError(f"Unknown runtime platform {platform!r}; expected one of {sorted(PLATFORMS)}")
    if not getattr(fn, "__pto_program__", False):
        raise TypeError("fn must be a @pl.jit program")
    if compile_only:
        return RunResult(True)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate spec names: {names}")
    params = list(inspect.signature(fn).parameters)
    if params != names:
        raise ValueError(f"specs {names} do not match the program's parameters {params}")
    kinds = {n: getattr(a, "kind", "Tensor") for n, a in fn.__annotations__.items()}
    is_output = {n: kinds.get(n) in ("InOut", "Out") for n in names}
    has_init = {n: kinds.get(n) != "Out" for n in names}
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, torch.Tensor] = {}
    golden: dict[str, torch.Tensor] = {}
    outputs = [s.name for s in specs if isinstance(s, TensorSpec) and is_output[s.name]]
    if golden_data is not None:
        root = Path(golden_data)
        missing = []
        for s in specs:
            need = [("in", s.name)] if isinstance(s, ScalarSpec) or not is_output[s.name] else \
                [("out", s.name)] + ([("in", s.name)] if has_init[s.name] else [])
            missing += [str(root / d / f"{n}.pt") for d, n in need if not (root / d / f"{n}.pt").is_file()]
        if missing:
            raise ValueError(f"golden_data is missing files: {missing}")
        for s in specs:
            if isinstance(s, ScalarSpec):
                value = _load(root / "in" / f"{s.name}.pt")
                if value.ndim != 0 or value.dtype != s.dtype:
                    raise ValueError(f"{s.name}.pt dtype mismatch: spec={s.dtype} cache={value.dtype}")
                scalars[s.name] = value
            elif is_output[s.name] and not has_init[s.name]:
                tensors[s.name] = torch.zeros(s.shape, dtype=s.dtype)
            else:
                tensors[s.name] = _load(root / "in" / f"{s.name}.pt")
        golden = {n: _load(root / "out" / f"{n}.pt") for n in outputs}
    else:
        for s in specs:
            if isinstance(s, ScalarSpec):
                scalars[s.name] = s.value
            else:
                tensors[s.name] = s.create_tensor()
        if golden_fn is not None:
            snapshot = {n: t.clone() for n, t in tensors.items()} | {n: v.clone() for n, v in scalars.items()}
            golden_fn(snapshot)
            golden = {n: snapshot[n] for n in outputs}
    inputs = {n: t.clone() for n, t in tensors.items()} | dict(scalars)
    ordered = [tensors[s.name] if isinstance(s, TensorSpec) else int(scalars[s.name]) for s in specs]
    fn(*ordered)  # the "kernel": Python on the CPU
    if not golden:
        return RunResult(True)
    failures = []
    for name in outputs:
        actual, expected = tensors[name], golden[name]
        if compare_fn and name in compare_fn:
            ok, msg = compare_fn[name](actual, expected, actual_outputs={n: tensors[n] for n in outputs},
                                       expected_outputs=golden, inputs=inputs, rtol=rtol, atol=atol)
        else:
            ok, msg = bool(torch.allclose(actual.float(), expected.float(), rtol=rtol, atol=atol)), "allclose"
        if not ok:
            failures.append(f"{name}: {msg}")
    return RunResult(not failures, "; ".join(failures) or None)


