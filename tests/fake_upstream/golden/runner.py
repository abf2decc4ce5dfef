"""TEST DOUBLE of upstream ``golden/runner.py``: ``run`` and ``run_jit`` with the real signatures and the real
flow -- compile (``run_jit``: ``fn.compile(*dummy_args, config=RunConfig(**compile_cfg, platform=...))``;
``run``: the program kept), inputs from the specs or from ``golden_data`` (``in/`` for inputs, scalars and
InOut initial values, ``out/`` for outputs; missing files fail the run; pure outputs zero-initialised; scalar
files 0-dim of the spec's dtype), the golden from ``golden_fn`` on a scratch copy (scalars as Python values,
pure outputs zeros) unless ``golden_data`` gives it, execution with ``runtime_cfg`` (``platform``,
``device_id``; unknown keys raise TypeError as ``execute_compiled`` does; ``log_level`` consumed), then
``validate_golden`` over the ``is_output`` specs only. No golden -> validation skipped, passed. The "device"
is the entry's Python function called on the tensors (and scalars' Python values) in spec order."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .spec import ScalarSpec, TensorSpec
from .validation import validate_golden

PLATFORMS = ("a2a3", "a2a3sim", "a5", "a5sim")
EXECUTE_KEYS = ("platform", "device_id", "enable_chip_swimlane", "enable_dump_args", "enable_pmu",
                "enable_dep_gen", "enable_scope_stats")


@dataclass
class RunResult:
    passed: bool
    error: str | None = None
    execution_time: float | None = None
    work_dir: Path | None = None
    bench: Any = None


def _required_files(spec) -> list[tuple[str, str]]:
    if isinstance(spec, ScalarSpec):
        return [("in", f"{spec.name}.pt")]
    if not spec.is_output:
        return [("in", f"{spec.name}.pt")]
    return [("out", f"{spec.name}.pt")] + ([("in", f"{spec.name}.pt")] if spec.init_value is not None else [])


def _load(path: Path) -> torch.Tensor:
    return torch.load(path, weights_only=True)


def _prepare(specs, data_dir: Path | None):
    tensor_specs = [s for s in specs if isinstance(s, TensorSpec)]
    scalars = {s.name: s for s in specs if isinstance(s, ScalarSpec)}
    if data_dir is None:
        tensors = {s.name: s.create_tensor() for s in tensor_specs}
        snapshot = {s.name: tensors[s.name].clone() for s in tensor_specs if not s.is_output or s.init_value is not None}
        return tensors, scalars, snapshot
    missing = [str(data_dir / sub / name) for s in specs for sub, name in _required_files(s)
               if not (data_dir / sub / name).is_file()]
    if missing:
        raise ValueError(f"golden_data is missing files: {missing}")
    tensors = {s.name: _load(data_dir / "in" / f"{s.name}.pt") for s in tensor_specs
               if not s.is_output or s.init_value is not None}
    for s in tensor_specs:
        if s.is_output and s.init_value is None:
            tensors[s.name] = torch.zeros(s.shape, dtype=s.dtype)
    loaded = {}
    for name, s in scalars.items():
        cached = _load(data_dir / "in" / f"{name}.pt")
        if not isinstance(cached, torch.Tensor) or cached.ndim != 0:
            raise ValueError(f"{name}.pt must contain a 0-dim torch.Tensor")
        if cached.dtype != s.dtype:
            raise ValueError(f"{name}.pt dtype mismatch: spec={s.dtype} cache={cached.dtype}")
        loaded[name] = ScalarSpec(name=name, dtype=s.dtype, value=cached)
    return tensors, loaded, {}


def _golden(specs, scalars, snapshot, data_dir, golden_fn):
    outputs = [s.name for s in specs if isinstance(s, TensorSpec) and s.is_output]
    if data_dir is not None:
        return {n: _load(data_dir / "out" / f"{n}.pt") for n in outputs}
    scratch: dict[str, Any] = {}
    for s in specs:
        if isinstance(s, ScalarSpec):
            scratch[s.name] = scalars[s.name].to_python()
        elif s.is_output and s.init_value is None:
            scratch[s.name] = torch.zeros(s.shape, dtype=s.dtype)
        else:
            scratch[s.name] = snapshot[s.name].clone()
    golden_fn(scratch)
    return {n: scratch[n] for n in outputs}


def _execute(kernel: Callable, specs, tensors, scalars, runtime_cfg: dict) -> None:
    unknown = sorted(set(runtime_cfg) - set(EXECUTE_KEYS))
    if unknown:
        raise TypeError(f"execute_compiled() got unexpected keyword argument(s) {unknown}")
    platform = runtime_cfg.get("platform")
    if platform is not None and platform not in PLATFORMS:
        raise ValueError(f"Unknown runtime platform {platform!r}; expected one of {sorted(PLATFORMS)}")
    kernel(*[tensors[s.name] if isinstance(s, TensorSpec) else scalars[s.name].to_python() for s in specs])


def _build_folder(compiled_at: Path) -> Path:
    """Where a compile leaves its build: ``build_output/<n>/`` under the working folder, as the real runner
    does, with a stand-in binary; each compile is one line in ``$PTO_FAKE_COMPILES`` when it is set (how the
    compile-cache tests count compiles)."""
    import os

    folder = Path.cwd() / "build_output" / f"fake_{time.time_ns()}"
    folder.mkdir(parents=True)
    (folder / "kernel.so").write_text(f"built from {compiled_at}\n")
    if os.environ.get("PTO_FAKE_COMPILES"):
        with open(os.environ["PTO_FAKE_COMPILES"], "a", encoding="utf-8") as fh:
            fh.write(f"{folder}\n")
    return folder


def _harness(kernel_of: Callable, specs, golden_fn, golden_data, compile_cfg, runtime_cfg, rtol, atol, compare_fn,
             compile_only, runtime_dir) -> RunResult:
    runtime_cfg = dict(runtime_cfg or {})
    runtime_cfg.pop("log_level", None)
    compare_fn = compare_fn or {}
    start = time.time()
    if compile_only and runtime_dir is not None:
        return RunResult(passed=False, error="runtime_dir is incompatible with compile_only")
    if runtime_dir is not None and not Path(runtime_dir).is_dir():
        return RunResult(passed=False, error=f"runtime_dir does not exist: {Path(runtime_dir)}")
    kernel, work_dir = kernel_of(dict(compile_cfg or {}), runtime_cfg.get("platform"))
    # compile skipped when a build is given (the kernel is the entry itself); else the build it leaves
    work_dir = Path(runtime_dir) if runtime_dir is not None else _build_folder(work_dir)
    if compile_only:
        return RunResult(passed=True, execution_time=time.time() - start, work_dir=work_dir)
    data_dir = Path(golden_data) if golden_data is not None else None
    try:
        tensors, scalars, snapshot = _prepare(specs, data_dir)
    except ValueError as e:
        return RunResult(passed=False, error=str(e), work_dir=work_dir)
    golden = None
    import os

    if os.environ.get("PTO_FAKE_UPSTREAM_DEFECT") == "runner_skips_validation":  # a seeded runner fault
        golden_fn = golden_data = None
    if os.environ.get("PTO_FAKE_UPSTREAM_DEFECT") == "kernel_hangs":  # a simulated kernel that never finishes
        time.sleep(3600)
    if golden_fn is not None or golden_data is not None:
        golden = _golden(specs, scalars, snapshot, data_dir, golden_fn)
    _execute(kernel, specs, tensors, scalars, runtime_cfg)
    if golden is None:
        return RunResult(passed=True, execution_time=time.time() - start, work_dir=work_dir)
    tensor_specs = [s for s in specs if isinstance(s, TensorSpec)]
    inputs = {s.name: tensors[s.name] for s in tensor_specs if not s.is_output}
    inputs.update({n: s.value for n, s in scalars.items()})
    try:
        validate_golden({s.name: tensors[s.name] for s in tensor_specs if s.is_output}, golden, rtol=rtol,
                        atol=atol, compare_fn=compare_fn, inputs=inputs)
    except AssertionError as e:
        return RunResult(passed=False, error=str(e), execution_time=time.time() - start, work_dir=work_dir)
    return RunResult(passed=True, execution_time=time.time() - start, work_dir=work_dir)


def run(program: Any, specs: list[TensorSpec | ScalarSpec], golden_fn: Callable | None = None,
        golden_data: str | None = None, compile_cfg: dict[str, Any] | None = None,
        runtime_cfg: dict[str, Any] | None = None, rtol: float = 1e-5, atol: float = 1e-5,
        compare_fn: dict[str, Callable] | None = None, compile_only: bool = False, runtime_dir: str | None = None,
        save_data: bool = False) -> RunResult:
    """``@pl.program`` / ir.Program entry: "compiled" by keeping its ``__call__``."""
    def kernel_of(cfg, platform):
        if platform is not None and platform not in PLATFORMS:
            raise ValueError(f"Unknown runtime platform {platform!r}; expected one of {sorted(PLATFORMS)}")
        return program, Path(tempfile.gettempdir())

    return _harness(kernel_of, specs, golden_fn, golden_data, compile_cfg, runtime_cfg, rtol, atol, compare_fn,
                    compile_only, runtime_dir)


def run_jit(fn: Any, specs: list[TensorSpec | ScalarSpec], golden_fn: Callable | None = None,
            golden_data: str | None = None, compile_cfg: dict[str, Any] | None = None,
            runtime_cfg: dict[str, Any] | None = None, rtol: float = 1e-5, atol: float = 1e-5,
            compare_fn: dict[str, Callable] | None = None, compile_only: bool = False, runtime_dir: str | None = None,
            save_data: bool = False) -> RunResult:
    """``@pl.jit`` entry: compiled with ``fn.compile(*dummy_args, config=RunConfig(**cfg))`` as the real one."""
    def kernel_of(cfg, platform):
        from pypto.runtime import RunConfig

        if platform is not None:
            cfg["platform"] = platform
        dummy = [s.value.item() if isinstance(s, ScalarSpec) else torch.empty(s.shape, dtype=s.dtype) for s in specs]
        compiled = fn.compile(*dummy, config=RunConfig(**cfg))
        return compiled, Path(compiled.output_dir)

    return _harness(kernel_of, specs, golden_fn, golden_data, compile_cfg, runtime_cfg, rtol, atol, compare_fn,
                    compile_only, runtime_dir)
