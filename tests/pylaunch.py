"""A stand-in for ``python -O`` that the tests put in ``$PTO_UPSTREAM_PYTHON`` (tests/conftest.py): ``python -S
tests/pylaunch.py -O -m MOD ARGS`` has the ``-O`` fork server (``tests/zygote.py --socket``) fork the process,
with this launcher's own stdin, stdout and stderr, so the upstream worker starts without importing torch
again (~2.3 CPU s each, 15 starts in the suite). The launcher waits for it, passes SIGTERM / SIGINT / SIGHUP
on, and ends as it ended (its exit code, or killed by the same signal); killed itself, the server kills the
child. Anything else -- other flags, a script, no socket -- runs the real interpreter in its place.
``--plain [-u] -m|-c ...`` does the same through the plain fork server of tests/forkserver.py (its wrapper
script, ``python()``, passes ``--plain`` and that server's socket), asserts on.

Environment (set by tests/conftest.py, which starts the server): ``PTO_TEST_PYTHON`` (the real interpreter),
``PTO_TEST_ZYGOTE_SOCKET`` (the socket's path) and ``PTO_TEST_ZYGOTE_PID`` (the server's pid: while it is
starting, a launcher waits; once it has gone, a launcher runs the real interpreter).
"""

import json
import os
import signal
import socket
import struct
import sys
import time

REAL = os.environ.get("PTO_TEST_PYTHON", "")
PATH = os.environ.get("PTO_TEST_ZYGOTE_SOCKET", "")
SERVER = os.environ.get("PTO_TEST_ZYGOTE_PID", "")
PLAIN_SOCKET, PLAIN_PID = "PTO_TEST_PLAIN_SOCKET", "PTO_TEST_PLAIN_PID"  # --plain: set by the wrapper script


def _real(args: list[str]) -> None:
    os.execv(REAL, [REAL, *args])


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return sock
    except OSError:
        sock.close()
        return None


def _server(path: str, server: str) -> socket.socket | None:
    """A connection to the server (tests/conftest.py starts it; it may still be importing torch)."""
    while True:
        sock = _connect(path)
        if sock is not None:
            return sock
        try:
            os.kill(int(server), 0)
        except (ProcessLookupError, ValueError):
            return None  # the server has gone: run the real interpreter
        time.sleep(0.02)


def main(args: list[str]) -> None:
    """``-O -m|-c ...`` through the ``-O`` server; ``--plain [-u] -m|-c ...`` (the wrapper script of
    tests/forkserver.py: python()) through the plain one, its own variables kept out of the child's environment."""
    if args[:1] == ["--plain"]:
        args = args[1:]
        path, server = os.environ.pop(PLAIN_SOCKET, ""), os.environ.pop(PLAIN_PID, "")
        unbuffered = args[:1] == ["-u"]
        argv = args[1:] if unbuffered else args
    else:
        path, server, unbuffered = PATH, SERVER, False
        argv = args[1:] if args[:1] == ["-O"] else []
    if not (REAL and path and server) or len(argv) < 2 or argv[0] not in ("-m", "-c"):
        _real(args)
    sock = _server(path, server)
    if sock is None:
        _real(args)
    req = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "unbuffered": unbuffered}).encode()
    socket.send_fds(sock, [struct.pack("<Q", len(req)) + req], [0, 1, 2])
    replies = sock.makefile("rb")
    pid = json.loads(replies.readline())["pid"]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    line = replies.readline()
    if not line:
        sys.exit("pylaunch: the fork server ended before the child")
    code = os.waitstatus_to_exitcode(json.loads(line)["status"])
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
