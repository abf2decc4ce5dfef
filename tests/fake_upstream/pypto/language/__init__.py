"""TEST DOUBLE of ``pypto.language``: dtype names, tensor annotations and ``jit`` decorators that keep the
Python function (``golden.runner.run`` of this double calls it on CPU tensors)."""

from __future__ import annotations

import functools
import inspect
import tempfile

import torch

TEST_DOUBLE = True

FP32, BF16, FP16, INT32, INT64, INT8, UINT8 = (torch.float32, torch.bfloat16, torch.float16, torch.int32,
                                               torch.int64, torch.int8, torch.uint8)
FP8E4M3FN, FP8E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu


class DynVar:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"DynVar({self.name})"


def dynamic(name: str) -> DynVar:
    return DynVar(name)


class _Annotation:
    """``pl.Tensor[[shape], dtype]`` and friends: kept for introspection only."""

    def __init__(self, kind: str, args):
        self.kind, self.args = kind, args

    def __repr__(self) -> str:
        return f"{self.kind}{self.args!r}"


class _Factory:
    def __init__(self, kind: str):
        self.kind = kind

    def __getitem__(self, args):
        return _Annotation(self.kind, args)


Tensor, Scalar, InOut, Out = _Factory("Tensor"), _Factory("Scalar"), _Factory("InOut"), _Factory("Out")


class _Compiled:
    """What ``JITFunction.compile`` returns: an output directory and the "kernel" (the Python function)."""

    def __init__(self, fn, output_dir: str):
        self.fn, self.output_dir = fn, output_dir

    def __call__(self, *args):
        return self.fn(*args)


class JITFunction:
    """``@pl.jit``: a callable with ``compile(*dummy_args, config=RunConfig)`` as the real one has (golden's
    run_jit compiles through it); the arguments must match the function's parameters in number."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def compile(self, *dummy_args, config=None):
        params = inspect.signature(self.fn).parameters
        if len(dummy_args) != len(params):
            raise TypeError(f"{self.fn.__name__}: {len(params)} parameters, {len(dummy_args)} arguments")
        return _Compiled(self.fn, tempfile.gettempdir())


class _Jit:
    """``@pl.jit`` (an entry: a JITFunction) / ``@pl.jit.inline`` (a function entries call: kept as is)."""

    def __call__(self, fn=None, **_kw):
        if fn is None:
            return lambda f: self(f)
        return JITFunction(fn)

    def inline(self, fn=None, **_kw):
        if fn is None:
            return lambda f: f
        return fn


jit = _Jit()
