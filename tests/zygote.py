"""A fork server for the unit tests' Python subprocesses (client: ``tests/forkserver.py``).

Most unit tests that start ``python -m goldens.cli`` or ``python -m pytest`` test what a process does (exit
codes, one-line errors on stderr, locks, a fresh import of a copied tree); each paid ~3.5 CPU s to import
torch, numpy, zarr, icechunk and hypothesis before doing it. This server imports those third-party packages
once (nothing of this project: a child imports the project afresh, from its own ``sys.path``), then forks one
child per request. The child becomes what ``python -m MOD ARGS`` or ``python -c CODE ARGS`` would be: its
own cwd, environment, ``sys.path`` (cwd, then ``PYTHONPATH``, then the interpreter's site paths), argv, stdin
and stdout/stderr files, an uncaught exception printed by ``sys.excepthook`` with exit code 1, ``SystemExit``
handled as the interpreter does, non-daemon threads and ``atexit`` handlers run before it exits.

Started as a script (``python tests/zygote.py``, no PYTHONPATH), so its ``sys.path[0]`` is this directory
and nothing of the project is imported into it.

Requests come two ways, both served by one loop (``serve``), while earlier children run:
- ``--pipe`` (tests/forkserver.py): one JSON line each way on stdin / stdout: request ``{"id", "argv", "cwd",
  "env", "stdin", "stdout", "stderr"}`` (paths; ``stderr`` may be the string ``"stdout"``) -> ``{"id", "pid"}``,
  then ``{"id", "status"}`` (the raw wait status) when the child ends;
- ``--socket PATH OWNER`` (tests/pylaunch.py): a connection per child, which gets the launcher's own fds.
A request's ``"unbuffered"`` is ``python -u``; ``PTO_TEST_EXECUTABLE`` in its environment is the child's
``sys.executable`` (``tests/forkserver.py: python()``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

EXECUTABLE = "PTO_TEST_EXECUTABLE"
PRELOAD = ("torch", "numpy", "zarr", "icechunk", "numcodecs", "blake3", "crc32c", "hypothesis", "pytest",
           "_pytest.config")


def _child(req: dict) -> None:
    """Become the requested process; never returns."""
    code = 1
    try:
        import importlib
        import runpy
        import threading

        os.environ.clear()
        os.environ.update(req["env"])
        if os.environ.get(EXECUTABLE):  # this child's sys.executable (tests/forkserver.py: python())
            sys.executable = os.environ.pop(EXECUTABLE)
        os.chdir(req["cwd"])
        if "fds" in req:  # the launcher's own standard streams (tests/pylaunch.py), passed over the socket
            stdin, out, err = req["fds"]
        else:
            stdin = os.open(req["stdin"], os.O_RDONLY)
            out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            err = out if req["stderr"] == "stdout" else os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                                                0o600)
        for fd, target in ((0, stdin), (1, out), (2, err)):
            os.dup2(target, fd)
        for fd in {stdin, out, err}:
            if fd > 2:
                os.close(fd)
        import io

        sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
        raw = bool(req.get("unbuffered"))  # python -u; else stdout block-buffered (not a tty), stderr by line
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(open(1, "wb", 0 if raw else -1, closefd=False),  # noqa: SIM115
                                                       write_through=raw)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(open(2, "wb", 0 if raw else -1, closefd=False),  # noqa: SIM115
                                                       errors="backslashreplace", write_through=raw,
                                                       line_buffering=not raw)
        argv = req["argv"]
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        first = req["cwd"] if argv[0] == "-m" else ""
        sys.path[:] = [first, *extra, *BASE_PATH]
        importlib.invalidate_caches()
        try:
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:  # -c
                sys.argv = ["-c", *argv[2:]]
                import types

                main = types.ModuleType("__main__")
                sys.modules["__main__"] = main
                exec(compile(argv[1], "<string>", "exec"), main.__dict__)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            kind, value, tb = sys.exc_info()
            tb = tb.tb_next if tb is not None else tb  # (not this frame)
            sys.excepthook(kind, value.with_traceback(tb), tb)
            code = 1
        threading._shutdown()  # as the interpreter does at exit: join non-daemon threads, then atexit
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # the server's own part failed: say so where the caller reads
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code & 0xFF)


def _preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)


def _reaped(children: dict):
    """(pid, wait status, what ``children`` held for it) of each child of ``children`` that has ended, without
    waiting for the others."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        if pid in children:
            yield pid, status, children.pop(pid)


def _listen(path: str):
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # ready: connections are accepted from here on
    return listener


def _received(listener) -> tuple[object, dict] | None:
    """A launcher's connection and its request -- an 8-byte length, the JSON ``{"argv", "cwd", "env"}`` and the
    launcher's fds 0, 1, 2 -- or None when it broke off."""
    import socket
    import struct

    conn, _ = listener.accept()
    try:
        msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
        while len(msg) < 8 or len(msg) < 8 + struct.unpack("<Q", msg[:8])[0]:
            more = conn.recv(1 << 20)
            if not more:
                raise EOFError
            msg += more
        return conn, {**json.loads(msg[8:]), "fds": fds}
    except (OSError, EOFError, ValueError):
        conn.close()
        return None


def serve(pipe: bool, path: str | None, owner: int | None) -> None:
    """Fork a child per request as it comes, so children run side by side.

    ``pipe``: request lines on stdin (``tests/forkserver.py``); each gets ``{"id", "pid"}`` at once and
    ``{"id", "status"}`` when its child ends (polled every 20 ms while any runs); the server ends when stdin
    closes. ``path``: also listen on that Unix socket for ``tests/pylaunch.py``; each connection sends one
    request (``_received``) and gets ``{"pid"}``, then ``{"status"}``; a launcher that goes away (killed) takes
    its child with it; the server ends when ``owner`` (the test process) has ended."""
    import select
    import signal
    import time

    _preload()
    tx = os.fdopen(1, "wb", buffering=0) if pipe else None
    listener = _listen(path) if path else None
    pending, running = b"", {}  # pid -> a pipe request's id, or a launcher's connection
    checked = time.monotonic()
    while True:
        conns = [c for c in running.values() if not isinstance(c, int)]
        sources = ([0] if pipe else []) + ([listener] if listener else []) + conns
        ready, _, _ = select.select(sources, [], [], 0.02 if running else 1.0)
        for src in ready:
            if src == 0:
                data = os.read(0, 1 << 16)
                if not data:
                    return  # the client is gone (its children are on their own)
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    req = json.loads(line)
                    pid = _fork(req, [tx, listener, *conns])
                    running[pid] = req["id"]
                    tx.write(json.dumps({"id": req["id"], "pid": pid}).encode() + b"\n")
            elif src is listener:
                got = _received(listener)
                if got is None:
                    continue
                conn, req = got
                pid = _fork(req, [tx, listener, *conns, conn])
                for fd in req["fds"]:
                    os.close(fd)
                running[pid] = conn
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            elif not src.recv(1):  # the launcher is gone: so is its child
                for pid, conn in running.items():
                    if conn is src:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
        for _pid, status, who in _reaped(running):
            if isinstance(who, int):
                tx.write(json.dumps({"id": who, "status": status}).encode() + b"\n")
            else:
                with contextlib.suppress(OSError):
                    who.sendall(json.dumps({"status": status}).encode() + b"\n")
                who.close()
        if owner and time.monotonic() - checked > 1.0:
            checked = time.monotonic()
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                return


def _fork(req: dict, close: list) -> int:
    """Fork the child of ``req``; in it, the server's own pipes and sockets (``close``) are closed first."""
    pid = os.fork()
    if pid == 0:
        for obj in close:
            if obj is not None:
                with contextlib.suppress(OSError):
                    obj.close()
        _child(req)
    return pid


# the interpreter's own paths: what a fresh ``python`` has after its script directory and PYTHONPATH
_SKIP = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
BASE_PATH = [p for p in sys.path[1:] if p not in _SKIP]

if __name__ == "__main__":
    _args = sys.argv[1:]
    _pipe = "--pipe" in _args or "--socket" not in _args
    _at = _args.index("--socket") if "--socket" in _args else -1
    serve(_pipe, _args[_at + 1] if _at >= 0 else None, int(_args[_at + 2]) if _at >= 0 else None)
