"""Backends of the test suite's own for ``goldens replay --cluster`` (loaded with ``--backend-module``): the Torch
reference, made slow or made to hang, so a test can kill a node while its task runs, or watch a hung task being
stopped. ``slow``: before its first operator call a process drops a mark in ``$PTO_TEST_MARKS`` (its pid), then
every call sleeps ``$PTO_TEST_SLOW`` seconds. ``hang``: every call sleeps for an hour."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

from backends import torch_backend

_MARKED = []


def _wrapped(base, name: str, pause):
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            pause()
            return fn(*args, **kwargs)

        call.composes_operators = getattr(fn, "composes_operators", False)
        return call

    return base.derive(name, **{op: wrap(fn) for op, fn in base._ops.items()})


def slow(device: str | None = None):
    def pause():
        marks = os.environ.get("PTO_TEST_MARKS")
        if marks and not _MARKED:
            _MARKED.append(True)
            Path(marks, f"{os.getpid()}").write_text(str(os.getppid()))
        time.sleep(float(os.environ.get("PTO_TEST_SLOW", "0")))

    return _wrapped(torch_backend(), "torch-slow", pause)


def hang(device: str | None = None):
    return _wrapped(torch_backend(), "torch-hang", lambda: time.sleep(3600))
