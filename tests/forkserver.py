"""``run`` and ``popen``: ``subprocess.run`` and ``subprocess.Popen`` for the unit tests, with ``python -m MOD`` /
``python -c CODE`` children forked from a server that has the third-party packages imported already
(``tests/zygote.py``; one per test process, started on first use; children run side by side). Any other
command, and every call when ``PTO_TEST_FORK_SERVER=0``, goes to ``subprocess`` unchanged;
``tests/test_forkserver.py`` checks that both give the same result.

Supported as ``subprocess.run`` has them: ``cwd``, ``env``, ``input``, ``capture_output``, ``stdout``/``stderr``
(None, PIPE, DEVNULL, STDOUT for stderr), ``text``, ``timeout`` (the child is killed, TimeoutExpired is raised)
and ``check``. Anything else falls back to ``subprocess``. A ``popen`` child's output is read when it has
ended (``communicate``), not while it runs: its standard streams are files.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

_SERVER = Path(__file__).resolve().parent / "zygote.py"
_KNOWN = {"cwd", "env", "input", "capture_output", "stdout", "stderr", "text", "timeout", "check"}
_lock = threading.Lock()  # one request line at a time; the replies are sorted by a reader thread
_server: subprocess.Popen | None = None
_replies: dict[int, tuple[subprocess.Popen, queue.Queue]] = {}  # request id -> (its server, its replies)
_ids = itertools.count()


def enabled() -> bool:
    return os.environ.get("PTO_TEST_FORK_SERVER", "1") != "0"


def _spawn(flags: list[str], args: list[str], **kwargs) -> subprocess.Popen:
    """``python FLAGS tests/zygote.py ARGS``: a fork server, started as a script from ``/`` without PYTHONPATH
    (nothing of the project imported into it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.Popen([sys.executable, *flags, str(_SERVER), *args], cwd="/", env=env,
                            stderr=subprocess.DEVNULL, **kwargs)


def launch_server(path: str) -> tuple[subprocess.Popen, dict[str, str]]:
    """An ``-O`` fork server listening on the Unix socket ``path`` for ``tests/pylaunch.py`` (it ends with this
    process), and the environment a launcher needs to reach it."""
    server = _spawn(["-O"], ["--socket", path, str(os.getpid())], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL)
    return server, {"PTO_TEST_PYTHON": sys.executable, "PTO_TEST_ZYGOTE_SOCKET": path,
                    "PTO_TEST_ZYGOTE_PID": str(server.pid)}


LAUNCHER = [sys.executable, "-S", str(_SERVER.with_name("pylaunch.py"))]  # the launcher's command prefix


EXECUTABLE = "PTO_TEST_EXECUTABLE"  # in a forked child's environment: its sys.executable (tests/zygote.py)
_home: str | None = None  # this process's folder of the server's socket and the wrapper script


def _start() -> subprocess.Popen:
    global _server, _home
    if _server is None or _server.poll() is not None:
        if _home is None:
            _home = tempfile.mkdtemp(prefix="pto-zygote-")
            atexit.register(shutil.rmtree, _home, True)
        sock = os.path.join(_home, f"plain-{next(_ids)}.sock")
        _server = _spawn([], ["--pipe", "--socket", sock, str(os.getpid())], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, bufsize=0)
        _server.socket = sock
        atexit.register(_stop, _server)
        threading.Thread(target=_sort_replies, args=(_server,), daemon=True).start()
    return _server


def python() -> str:
    """A stand-in for ``sys.executable`` whose ``python [-u] -m MOD`` / ``-c CODE`` children fork from this
    process's server (``tests/pylaunch.py --plain``; anything else runs the real interpreter): give it to code
    that starts Python processes itself, e.g. as ``sys.executable`` (``monkeypatch.setattr``) for
    ``goldens replay --devices``' workers, or as a forked child's ``sys.executable`` through
    ``PTO_TEST_EXECUTABLE`` in its environment (tests/zygote.py) for the xdist workers of a ``pytest -n``
    it runs. An executable script, because both take it as one path."""
    with _lock:
        server = _start()
    script = os.path.join(_home, f"python-{server.pid}")
    if not os.path.exists(script):
        body = (f"#!/bin/sh\nPTO_TEST_PYTHON={shlex.quote(sys.executable)} PTO_TEST_PLAIN_SOCKET={shlex.quote(server.socket)} "
                f"PTO_TEST_PLAIN_PID={server.pid} exec {shlex.join([*LAUNCHER, '--plain'])} \"$@\"\n")
        with open(script + ".new", "w") as fh:
            fh.write(body)
        os.chmod(script + ".new", 0o755)
        os.replace(script + ".new", script)
    return script


def _sort_replies(server: subprocess.Popen) -> None:
    """Each reply line to the queue of the request it answers; when the server dies, a None to every queue."""
    for line in server.stdout:
        reply = json.loads(line)
        with _lock:
            _owner, box = _replies.get(reply["id"], (None, None))
        if box is not None:
            box.put(reply)
    with _lock:
        for owner, box in _replies.values():
            if owner is server:
                box.put(None)


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.kill()
        server.wait()


def _forkable(args, kwargs) -> bool:
    return (enabled() and isinstance(args, list | tuple) and len(args) >= 3 and args[0] == sys.executable
            and args[1] in ("-m", "-c") and set(kwargs) <= _KNOWN
            and kwargs.get("stdout") in (None, subprocess.PIPE, subprocess.DEVNULL)
            and kwargs.get("stderr") in (None, subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT))


class ForkedProcess:
    """What ``subprocess.Popen`` gives for a child of the fork server: ``pid``, ``returncode``, ``poll``,
    ``wait``, ``send_signal``/``kill``/``terminate`` and ``communicate`` (the output, read when the child ended)."""

    def __init__(self, args: list[str], kwargs: dict):
        self.args = args
        self.returncode: int | None = None
        self._kwargs = kwargs
        self._tmp = tempfile.mkdtemp(prefix="pto-fork-")
        self._files = {name: os.path.join(self._tmp, name) for name in ("stdin", "stdout", "stderr")}
        data = kwargs.get("input")
        with open(self._files["stdin"], "wb") as fh:
            if data is not None:
                fh.write(data.encode() if isinstance(data, str) else data)
        env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
        self._merged = kwargs.get("stderr") == subprocess.STDOUT
        self._id = next(_ids)
        self._box: queue.Queue = queue.Queue()
        req = {"id": self._id, "argv": args[1:], "cwd": os.path.abspath(kwargs.get("cwd") or os.getcwd()),
               "env": {str(k): str(v) for k, v in env.items()}, "stdin": self._files["stdin"],
               "stdout": self._files["stdout"], "stderr": "stdout" if self._merged else self._files["stderr"]}
        with _lock:
            server = _start()
            _replies[self._id] = (server, self._box)
            server.stdin.write(json.dumps(req).encode() + b"\n")
        self.pid = self._reply(None)["pid"]

    def _reply(self, timeout: float | None) -> dict:
        try:
            reply = self._box.get(timeout=timeout)
        except queue.Empty:
            raise subprocess.TimeoutExpired(self.args, timeout) from None
        if reply is None:
            raise RuntimeError("the test fork server (tests/zygote.py) died")
        return reply

    def _ended(self, reply: dict) -> None:
        """The child has ended: its exit code, and its output taken in (its files removed)."""
        self.returncode = os.waitstatus_to_exitcode(reply["status"])
        with _lock:
            _replies.pop(self._id, None)
        try:
            self._out = Path(self._files["stdout"]).read_bytes()
            self._err = b"" if self._merged else Path(self._files["stderr"]).read_bytes()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(queue.Empty):
                self._ended(self._box.get_nowait())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._ended(self._reply(timeout))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)  # (the server reaps the child, so the pid is not reused before its reply)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, timeout: float | None = None) -> tuple:
        """(stdout, stderr) as ``subprocess`` gives them for the options given, once the child has ended;
        TimeoutExpired (the child still running) past ``timeout``."""
        self.wait(timeout)
        kwargs, out, err = self._kwargs, self._out, self._err
        want_out = kwargs.get("capture_output", False) or kwargs.get("stdout") == subprocess.PIPE
        want_err = kwargs.get("capture_output", False) or kwargs.get("stderr") == subprocess.PIPE
        decode = (lambda b: b.decode(errors="replace").replace("\r\n", "\n")) if kwargs.get("text") else (lambda b: b)
        if not (want_out or self._merged) and kwargs.get("stdout") is None:  # inherited: show it where ours goes
            sys.stdout.write(out.decode(errors="replace"))
        if not want_err and not self._merged and kwargs.get("stderr") is None:
            sys.stderr.write(err.decode(errors="replace"))
        return (decode(out) if want_out or self._merged else None), (decode(err) if want_err else None)


def popen(args, **kwargs):
    """``subprocess.Popen(args, **kwargs)``, forked from the server where ``run`` would fork; the child runs
    while the caller goes on."""
    if not _forkable(args, kwargs) or "input" in kwargs or "check" in kwargs or "timeout" in kwargs:
        return subprocess.Popen(args, **kwargs)
    return ForkedProcess([str(a) for a in args], kwargs)


def run(args, **kwargs) -> subprocess.CompletedProcess:
    if not _forkable(args, kwargs):
        return subprocess.run(args, **kwargs)
    proc = ForkedProcess([str(a) for a in args], kwargs)
    timeout = kwargs.get("timeout")
    try:
        stdout, stderr = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout, output=stdout, stderr=stderr) from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if kwargs.get("check"):
        done.check_returncode()
    return done
