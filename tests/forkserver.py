"""``run``: ``subprocess.run`` for the unit tests, with ``python -m MOD`` / ``python -c CODE`` children forked
from a server that has the third-party packages imported already (``tests/zygote.py``; one per test process,
started on first use). Any other command, and every call when ``PTO_TEST_FORK_SERVER=0``, goes to
``subprocess.run`` unchanged; ``tests/test_forkserver.py`` checks that both give the same result.

Supported as ``subprocess.run`` has them: ``cwd``, ``env``, ``input``, ``capture_output``, ``stdout``/``stderr``
(None, PIPE, DEVNULL, STDOUT for stderr), ``text``, ``timeout`` (the child is killed, TimeoutExpired is raised)
and ``check``. Anything else falls back to ``subprocess.run``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_SERVER = Path(__file__).resolve().parent / "zygote.py"
_KNOWN = {"cwd", "env", "input", "capture_output", "stdout", "stderr", "text", "timeout", "check"}
_lock = threading.Lock()
_server: subprocess.Popen | None = None


def enabled() -> bool:
    return os.environ.get("PTO_TEST_FORK_SERVER", "1") != "0"


def _start() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        _server = subprocess.Popen([sys.executable, str(_SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, cwd="/", env=env, bufsize=0)
        atexit.register(_stop, _server)
    return _server


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.kill()
        server.wait()


def _read(server: subprocess.Popen, deadline: float | None) -> dict | None:
    """The server's next reply line, or None when ``deadline`` passed first."""
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([server.stdout], [], [], wait)
        if ready:
            line = server.stdout.readline()
            if not line:
                raise RuntimeError("the test fork server (tests/zygote.py) died")
            return json.loads(line)
        if deadline is not None and time.monotonic() >= deadline:
            return None


def _forkable(args, kwargs) -> bool:
    return (enabled() and isinstance(args, list | tuple) and len(args) >= 3 and args[0] == sys.executable
            and args[1] in ("-m", "-c") and set(kwargs) <= _KNOWN
            and kwargs.get("stdout") in (None, subprocess.PIPE, subprocess.DEVNULL)
            and kwargs.get("stderr") in (None, subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT))


def run(args, **kwargs) -> subprocess.CompletedProcess:
    if not _forkable(args, kwargs):
        return subprocess.run(args, **kwargs)
    args = [str(a) for a in args]
    capture = kwargs.get("capture_output", False)
    want_out = capture or kwargs.get("stdout") == subprocess.PIPE
    want_err = capture or kwargs.get("stderr") == subprocess.PIPE
    merged = kwargs.get("stderr") == subprocess.STDOUT
    text = kwargs.get("text", False)
    timeout = kwargs.get("timeout")
    with tempfile.TemporaryDirectory(prefix="pto-fork-") as tmp:
        files = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
        data = kwargs.get("input")
        with open(files["stdin"], "wb") as fh:
            if data is not None:
                fh.write(data.encode() if isinstance(data, str) else data)
        env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
        req = {"argv": args[1:], "cwd": os.path.abspath(kwargs.get("cwd") or os.getcwd()),
               "env": {str(k): str(v) for k, v in env.items()}, "stdin": files["stdin"],
               "stdout": files["stdout"], "stderr": "stdout" if merged else files["stderr"]}
        with _lock:
            server = _start()
            server.stdin.write(json.dumps(req).encode() + b"\n")
            pid = _read(server, None)["pid"]
            deadline = None if timeout is None else time.monotonic() + timeout
            done = _read(server, deadline)
            timed_out = done is None
            if timed_out:
                os.kill(pid, signal.SIGKILL)
                done = _read(server, None)
        status = done["status"]
        code = os.waitstatus_to_exitcode(status)
        out = Path(files["stdout"]).read_bytes()
        err = b"" if merged else Path(files["stderr"]).read_bytes()
    decode = (lambda b: b.decode(errors="replace").replace("\r\n", "\n")) if text else (lambda b: b)
    stdout = decode(out) if want_out or merged else None
    stderr = decode(err) if want_err else None
    if not (want_out or merged) and kwargs.get("stdout") is None:  # inherited: show it where the caller's goes
        sys.stdout.write(out.decode(errors="replace"))
    if not want_err and not merged and kwargs.get("stderr") is None:
        sys.stderr.write(err.decode(errors="replace"))
    if timed_out:
        raise subprocess.TimeoutExpired(args, timeout, output=stdout, stderr=stderr)
    proc = subprocess.CompletedProcess(args, code, stdout, stderr)
    if kwargs.get("check"):
        proc.check_returncode()
    return proc
