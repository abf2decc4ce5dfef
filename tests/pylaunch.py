"""A stand-in for ``python -O`` that the tests put in ``$PTO_UPSTREAM_PYTHON`` (tests/conftest.py): ``python -S
tests/pylaunch.py -O -m MOD ARGS`` has the ``-O`` fork server (``tests/zygote.py --socket``) fork the process,
with this launcher's own stdin, stdout and stderr, so the upstream worker starts without importing torch
again (~2.3 CPU s each, 15 starts in the suite). The launcher waits for it, passes SIGTERM / SIGINT / SIGHUP
on, and ends as it ended (its exit code, or killed by the same signal); killed itself, the server kills the
child. Anything else -- other flags, a script, no socket -- runs the real interpreter in its place.

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


def _real(args: list[str]) -> None:
    os.execv(REAL, [REAL, *args])


def _connect() -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(PATH)
        return sock
    except OSError:
        sock.close()
        return None


def _server() -> socket.socket | None:
    """A connection to the server (tests/conftest.py starts it; it may still be importing torch)."""
    while True:
        sock = _connect()
        if sock is not None:
            return sock
        try:
            os.kill(int(SERVER), 0)
        except (ProcessLookupError, ValueError):
            return None  # the server has gone: run the real interpreter
        time.sleep(0.02)


def main(args: list[str]) -> None:
    if not (REAL and PATH and SERVER) or len(args) < 2 or args[0] != "-O" or args[1] not in ("-m", "-c"):
        _real(args)
    sock = _server()
    if sock is None:
        _real(args)
    req = json.dumps({"argv": args[1:], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
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
