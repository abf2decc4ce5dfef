"""Processes that must not outlive the process that started them: a distributed replay's task (started by the
local pool or a Ray worker, ``goldens.devices.run_task``) and an upstream worker (started by
``backends.upstream.client``). The parent sets the variable; the child calls :func:`die_with_parent` itself at
start-up. That is never done in a ``preexec_fn``, which Python calls unsafe while the parent runs threads (the
local pool's, a Ray worker's)."""

from __future__ import annotations

import contextlib
import os
import signal

TASK = "PTO_DIE_WITH_PARENT"  # a distributed replay's task process (its value: the parent's pid)
WORKER = "PTO_WORKER_DIE_WITH_PARENT"  # an upstream worker (its value: 1)


def die_with_parent(variable: str) -> None:
    """When ``$variable`` is set for this process: be killed when the process that started it dies (Linux
    ``PR_SET_PDEATHSIG``; elsewhere nothing: a worker still ends on its stdin's EOF between launches). The variable
    is taken out of the environment, so nothing this process starts inherits it."""
    if not os.environ.pop(variable, None):
        return
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
