"""Which Python runs upstream code (the worker, the survey): light to import (no torch)."""

from __future__ import annotations

import os
import shlex
import sys

PYTHON_ENV = "PTO_UPSTREAM_PYTHON"


def worker_python() -> list[str]:
    """The command that runs upstream's Python: ``$PTO_UPSTREAM_PYTHON`` (split like a shell word list), e.g. the
    a5sim toolchain's ``PREFIX/bin/python`` that scripts/a5sim-setup.sh writes, else this interpreter."""
    return shlex.split(os.environ.get(PYTHON_ENV, "")) or [sys.executable]
