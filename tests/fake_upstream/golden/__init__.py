"""TEST DOUBLE of upstream pypto-lib's ``golden`` package (see ../README.md). Its public names, signatures and
semantics are the real package's, for what a run does with specs, goldens and comparators; the "device" is the
entry's Python function on CPU tensors. ``tests/test_upstream_double.py`` checks the signatures and the spec /
validation semantics against a real checkout, which must be ``CHECKED_AGAINST`` or newer.

Like the real package, importing it sets torch's thread count from ``PYPTO_GOLDEN_NUM_THREADS`` (16 by
default): the harness must keep that side effect out of the test process, and the double lets it show."""

import os

import torch

TEST_DOUBLE = True
CHECKED_AGAINST = "hw-native-sys/pypto-lib@634e77bde7c3 (main, 2026-12-01)"

torch.set_num_threads(int(os.environ.get("PYPTO_GOLDEN_NUM_THREADS", "16")))

from .runner import RunResult, run, run_jit  # noqa: E402
from .spec import ScalarSpec, TensorSpec  # noqa: E402
from .validation import validate_golden  # noqa: E402

__all__ = ["RunResult", "ScalarSpec", "TensorSpec", "run", "run_jit", "validate_golden"]
