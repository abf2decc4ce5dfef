"""Every backend, in one place: ``torch`` (the Torch references), ``emulated`` (the references with the
device-arithmetic twins of ``backends.emulated`` in their place), ``pypto`` (upstream's A5 kernels on a5sim / a5
through upstream's own runner, ``backends.pypto``) and ``upstream`` (upstream pypto-lib's own Torch goldens from
a user's checkout, ``backends.upstream``). Out-of-tree backends load with ``--backend-module pkg.module:OBJECT``
where OBJECT is a Backend, or a zero-argument callable returning one.

A backend imports contracts' types (``contracts.operators``), never the golden store; upstream code runs only in
the worker process of ``backends.upstream``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from functools import cache

from contracts.operators import REFERENCE_OPERATORS, Backend, BackendError


def reference_operators(load: Callable[[str], object] = importlib.import_module) -> dict[str, Callable]:
    """The reference operators, each taken from the module ``load(name)`` returns (the real modules by
    default; the mutation runner passes mutated copies)."""
    ops = {}
    for op_name, (module_name, attr) in REFERENCE_OPERATORS.items():
        module = load(module_name)
        ops[op_name] = getattr(module, attr)
    return ops


@cache
def torch_backend() -> Backend:
    """The Torch reference implementations."""
    return Backend("torch", reference_operators(), description="Torch reference (CPU)")


@cache
def emulated_backend() -> Backend:
    """The Torch references with the device-arithmetic twins of ``backends.emulated`` in place of the operators
    that have one: ``sparse_attention`` (C1A tiles, BF16 PV, FP32 patch), which every attention half-layer
    composed on this backend then uses; ``v4_sparse_attention`` (V4's 128-key FP32 tiles, BF16 PV), which
    ``v4_attention`` composed on this backend uses; and ``final_norm`` (the sum of squares in 128-column tiles, the
    mean as a multiply by 1 / D), which the V4 attention stage and the MTP layer composed on this backend use."""
    from backends.emulated.attention import tiled_sparse_attention
    from backends.emulated.rms_norm import tiled_final_norm
    from backends.emulated.v4_attention import tiled_v4_sparse_attention

    return torch_backend().derive("emulated", description="device-arithmetic twins (CPU)",
                                  sparse_attention=tiled_sparse_attention,
                                  v4_sparse_attention=tiled_v4_sparse_attention, final_norm=tiled_final_norm)


def pypto_backend(platform: str | None = None, device: str | None = None, pypto_lib: str | None = None,
                  model: str | None = None) -> Backend:
    from backends.pypto import make_backend

    return make_backend(platform or "a5sim", device=device, pypto_lib=pypto_lib, model=model)


def _cpu(factory: Callable[..., Backend], name: str, *, checkout: bool = False) -> Callable[..., Backend]:
    """A CPU backend's factory: --platform / --device refused; --pypto-lib and --model passed on when it takes a
    checkout (upstream's goldens of one model folder)."""
    def make(platform=None, device=None, pypto_lib=None, model=None) -> Backend:
        if checkout:
            return _checkout(factory, name, platform, device, pypto_lib, model)
        given = [f"--{k.replace('_', '-')} {v}" for k, v in
                 (("platform", platform), ("device", device), ("pypto_lib", pypto_lib), ("model", model))
                 if v is not None]
        if given:
            raise BackendError(f"backend {name!r} runs on the CPU: {', '.join(given)} applies to device backends "
                               "(--backend pypto)" + (" or upstream's goldens (--backend upstream)"
                                                      if model is not None or pypto_lib is not None else ""))
        return factory()

    return make


def _checkout(factory, name: str, platform, device, pypto_lib, model) -> Backend:
    given = [f"--{k} {v}" for k, v in (("platform", platform), ("device", device)) if v is not None]
    if given:
        raise BackendError(f"backend {name!r} runs on the CPU: {', '.join(given)} applies to device backends "
                           "(--backend pypto)")
    return factory(pypto_lib, model)


def upstream_backend(pypto_lib: str | None = None, model: str | None = None) -> Backend:
    """Upstream's own Torch goldens from a pypto-lib checkout (``backends.upstream``), on the CPU."""
    from backends.upstream import make_backend

    return make_backend(pypto_lib, model)


BUILTIN: dict[str, Callable[..., Backend]] = {"torch": _cpu(torch_backend, "torch"),
                                              "emulated": _cpu(emulated_backend, "emulated"),
                                              "pypto": pypto_backend,
                                              "upstream": _cpu(upstream_backend, "upstream", checkout=True)}


def get_backend(name: str, *, platform: str | None = None, device: str | None = None,
                pypto_lib: str | None = None, model: str | None = None) -> Backend:
    try:
        factory = BUILTIN[name]
    except KeyError:
        raise BackendError(f"unknown backend {name!r}; built in: {sorted(BUILTIN)} "
                           "(load others with --backend-module pkg.module:OBJECT)") from None
    return factory(platform=platform, device=device, pypto_lib=pypto_lib, model=model)


def load_backend_module(target: str, *, device: str | None = None) -> Backend:
    """Load ``pkg.module:OBJECT`` or ``path/to/file.py:OBJECT``; OBJECT is a Backend or a zero-argument callable
    returning one. With ``device`` (``--device IDS``; ``--devices`` gives each worker one), OBJECT must be a
    callable taking ``device=`` that returns the backend pinned to those ids (an out-of-tree device backend)."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise BackendError(f"--backend-module expects 'pkg.module:OBJECT' or 'path/to/file.py:OBJECT', got {target!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        module = _load_file(target, module_name)
    else:
        module = _import(target, module_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise BackendError(f"--backend-module {target!r}: {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Backend):
        _check_factory(target, attr, obj, device)
    if device is not None:
        return _with_device(target, attr, obj, device)
    if not isinstance(obj, Backend):
        try:
            obj = obj()
        except BackendError:
            raise
        except SystemExit as exc:  # a factory that exits: no green run where nothing ran
            raise BackendError(f"--backend-module {target!r}: calling {attr} raised SystemExit({exc.code!r}) "
                               "(expected a Backend, or a zero-argument callable returning one)") from None
        except Exception as exc:  # a factory that fails: one line, named
            raise BackendError(f"--backend-module {target!r}: calling {attr} raised {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:200] if str(exc) else ''} (expected a Backend, or a "
                               "zero-argument callable returning one)") from None
    if not isinstance(obj, Backend):
        raise BackendError(f"--backend-module {target!r}: expected a Backend, got {type(obj).__name__}")
    return obj


def _check_factory(target: str, attr: str, obj, device: str | None) -> None:
    """Before anything is called: ``obj`` (not a Backend) must be a factory written in Python -- a function, a
    method or a ``functools.partial`` of one -- whose required parameters are none (or ``device``). A builtin or
    any other callable (``sys:exit``, ``os:abort``, ``builtins:exit``, a class) is refused unrun."""
    import functools
    import inspect

    fn = inspect.unwrap(obj.func if isinstance(obj, functools.partial) else obj)  # functools.cache / wraps
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        what = "a builtin" if inspect.isbuiltin(fn) or type(fn).__module__ == "builtins" else type(obj).__name__
        raise BackendError(f"--backend-module {target!r}: {attr} is {what}, not a Backend nor a factory function "
                           "returning one (a def taking no required argument); nothing was called")
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return
    returns = sig.return_annotation
    if returns is not inspect.Signature.empty and "Backend" not in str(getattr(returns, "__name__", returns)):
        raise BackendError(f"--backend-module {target!r}: {attr} is annotated to return "
                           f"{getattr(returns, '__name__', returns)}, not a Backend; nothing was called")
    params = sig.parameters.values()
    required = [p.name for p in params if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and not (device is not None and p.name == "device")]
    if required:
        raise BackendError(f"--backend-module {target!r}: {attr} needs argument(s) {', '.join(required)}; a backend "
                           "factory takes none (device= with --device); nothing was called")


def _with_device(target: str, attr: str, obj, device: str) -> Backend:
    takes = callable(obj) and not isinstance(obj, Backend) and "device" in _parameters(obj)
    if not takes:
        raise BackendError(f"--backend-module {target!r}: {attr} takes no device ids (--device {device}); a device "
                           "backend of your own is a callable taking device= (e.g. def make(device=None))")
    try:
        backend = obj(device=device)
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(f"--backend-module {target!r}: {attr}(device={device!r}) raised {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    if not isinstance(backend, Backend):
        raise BackendError(f"--backend-module {target!r}: {attr}(device=...) returned {type(backend).__name__}, "
                           "expected a Backend")
    return backend


def _parameters(fn) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _load_file(target: str, path_text: str):
    import importlib.util

    path = os.path.abspath(path_text)
    if not os.path.isfile(path):
        raise BackendError(f"--backend-module {target!r}: no file {path_text}")
    name = "pto_backend_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # not a Python source file (/etc/passwd:X)
        raise BackendError(f"--backend-module {target!r}: {path_text} is not a Python file (expected "
                           "path/to/file.py:OBJECT)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise BackendError(f"--backend-module {target!r}: {path_text} raised {type(exc).__name__}: {exc}") from exc
    return module


def _import(target: str, module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        if cwd in sys.path or exc.name != module_name.split(".")[0]:
            raise BackendError(f"--backend-module {target!r}: cannot import {module_name!r}: {exc}") from exc
        sys.path.insert(0, cwd)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as exc2:
            raise BackendError(f"--backend-module {target!r}: cannot import {module_name!r}: {exc2}") from exc2
