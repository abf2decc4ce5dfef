"""The test fork server (tests/forkserver.py, tests/zygote.py) gives what ``subprocess.run`` gives: each probe
runs both ways and the exit code, stdout and stderr must match."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests import forkserver

PROBES = {
    "exit code and argv": (["-c", "import sys; print(sys.argv); sys.exit(3)", "a", "b"], {}),
    "uncaught exception": (["-c", "def f():\n    raise ValueError('boom')\nf()"], {}),
    "SystemExit with text": (["-c", "import sys; sys.exit('bye')"], {}),
    "stdin, env and cwd": (["-c", "import os, sys; print(sys.stdin.read(), os.environ['PROBE'], os.getcwd())"],
                           {"input": "from stdin", "env_extra": {"PROBE": "env value"}}),
    "stderr merged into stdout": (["-c", "import sys; print('out'); sys.stdout.flush(); print('err', file=sys.stderr)"],
                                  {"stderr": subprocess.STDOUT}),
    "threads joined, then atexit": (["-c", textwrap.dedent("""
        import atexit, threading, time
        atexit.register(lambda: print('atexit ran'))
        def late():
            time.sleep(0.2)
            print('thread ran')
        threading.Thread(target=late).start()
        """)], {}),
    "the cli's one-line error": (["-m", "goldens.cli", "--store", "{tmp}/none", "log"], {}),
    "a copied tree shadows the project": (["-m", "shadow_probe"], {"cwd": "{tmp}/copy"}),
    "PYTHONPATH comes before site": (["-c", "import shadow_probe"], {"env_extra": {"PYTHONPATH": "{tmp}/copy"}}),
    "bytes, not text": (["-c", "import sys; sys.stdout.buffer.write(bytes(range(250, 256)))"], {"text": False}),
}


def _run(args, opts, tmp_path, fork: str, monkeypatch):
    monkeypatch.setenv("PTO_TEST_FORK_SERVER", fork)
    fill = lambda v: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v  # noqa: E731
    env = None
    if "env_extra" in opts:
        import os

        env = {**os.environ, **{k: fill(v) for k, v in opts["env_extra"].items()}}
    kwargs = {"cwd": fill(opts.get("cwd", str(forkserver._SERVER.parents[1]))), "env": env,
              "timeout": 120, "text": opts.get("text", True)}
    if "input" in opts:
        kwargs["input"] = opts["input"]
    if "stderr" in opts:
        kwargs.update(stdout=subprocess.PIPE, stderr=opts["stderr"])
    else:
        kwargs["capture_output"] = True
    return forkserver.run([sys.executable, *[fill(a) for a in args]], **kwargs)


@pytest.mark.parametrize("name", list(PROBES))
def test_a_forked_child_behaves_as_a_fresh_interpreter(name, tmp_path, monkeypatch):
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "shadow_probe.py").write_text("import sys\nprint('copy', __name__)\nsys.exit(5)\n")
    args, opts = PROBES[name]
    real = _run(args, opts, tmp_path, "0", monkeypatch)
    forked = _run(args, opts, tmp_path, "1", monkeypatch)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr), name


def test_a_child_past_its_timeout_is_killed_and_named(monkeypatch):
    monkeypatch.setenv("PTO_TEST_FORK_SERVER", "1")
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([sys.executable, "-c", "import time; time.sleep(60)"], capture_output=True, timeout=1)
    # the server is still there for the next child
    assert forkserver.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout == "1\n"


@pytest.mark.parametrize("fork", ["0", "1"])
def test_popen_children_run_side_by_side_and_are_killed_as_subprocess_children_are(fork, tmp_path, monkeypatch):
    """A ``popen`` child runs while the next one starts (the first waits for a file the second writes: with
    one child at a time this times out), reports its exit code and output as ``subprocess.Popen`` does; one
    killed while running ends with -SIGKILL, ``poll`` None until then."""
    import signal

    monkeypatch.setenv("PTO_TEST_FORK_SERVER", fork)
    flag = tmp_path / "flag"
    waiter = forkserver.popen([sys.executable, "-c", "import os, sys, time\n"
                               "for _ in range(600):\n    if os.path.exists(sys.argv[1]): break\n    time.sleep(0.05)\n"
                               "else: sys.exit('no flag')\nprint('saw it'); sys.exit(4)", str(flag)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sleeper = forkserver.popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE)
    assert forkserver.run([sys.executable, "-c", "import sys; open(sys.argv[1], 'w').close()", str(flag)]).returncode == 0
    assert waiter.communicate(timeout=60) == ("saw it\n", "") and waiter.returncode == 4
    assert sleeper.poll() is None
    sleeper.send_signal(signal.SIGKILL)
    assert sleeper.wait(timeout=30) == -signal.SIGKILL and sleeper.poll() == -signal.SIGKILL
    assert isinstance(waiter, forkserver.ForkedProcess) == (fork == "1")


def test_anything_else_is_plain_subprocess_run(monkeypatch):
    monkeypatch.setenv("PTO_TEST_FORK_SERVER", "1")
    assert not forkserver._forkable(["git", "--version"], {})
    assert not forkserver._forkable([sys.executable, "-X", "importtime", "-c", "pass"], {})
    assert not forkserver._forkable([sys.executable, "-c", "pass"], {"stdout": 3})
    assert forkserver._forkable([sys.executable, "-m", "pytest", "-q"], {"capture_output": True})
    assert forkserver.run(["true"]).returncode == 0


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    """(command prefix, environment) of tests/pylaunch.py: with the -O server tests/conftest.py started for this
    process, or (where it started none: $PTO_UPSTREAM_PYTHON given) one of this module's own."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if env.get("PTO_TEST_ZYGOTE_SOCKET"):
        yield forkserver.LAUNCHER, env
        return
    server, reach = forkserver.launch_server(str(tmp_path_factory.mktemp("launch") / "s.sock"))
    try:
        yield forkserver.LAUNCHER, {**env, **reach}
    finally:
        server.kill()
        server.wait()


LAUNCHED = {  # python -O ARGS: (stdin, expected stdout, expected exit code)
    "asserts off, stdin and stdout live": (["-c", "assert False\nimport sys\nfor line in sys.stdin:\n"
                                                  "    print(line.strip().upper(), __debug__, flush=True)"],
                                           "ping\n", "PING False\n", 0),
    "exit code": (["-c", "import sys; sys.exit(7)"], "", "", 7),
    "killed by a signal": (["-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], "", "", -15),
    "a module from the cwd": (["-m", "probe_mod", "x"], "", "probe_mod ['x'] False\n", 0),
}


@pytest.mark.parametrize("name", list(LAUNCHED))
def test_the_launcher_is_python_O_forked_from_the_server(name, launcher, tmp_path):
    """``python -S tests/pylaunch.py -O ARGS`` (the tests' $PTO_UPSTREAM_PYTHON) gives what ``python -O ARGS``
    gives -- asserts off, live pipes, exit code, death by signal -- from a child of the -O fork server."""

    prefix, env = launcher
    (tmp_path / "probe_mod.py").write_text("import sys\nprint(__name__ == '__main__' and 'probe_mod', sys.argv[1:], "
                                           "__debug__)\n")
    args, stdin, out, code = LAUNCHED[name]
    server = int(env["PTO_TEST_ZYGOTE_PID"])
    before = _children(server)  # (a shared server may keep earlier tests' upstream workers)
    runs = {}
    for how, cmd in (("real", [sys.executable, "-O", *args]), ("launched", [*prefix, "-O", *args])):
        proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        runs[how] = (*proc.communicate(stdin, timeout=120), proc.returncode)
    assert runs["launched"] == runs["real"] == (out, "", code), runs
    left = _children(server) - before
    assert not left, f"children of the server still running: {sorted(left)}"


def _children(pid: int) -> set[int]:
    import os

    return {int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == pid}


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_killed_launcher_takes_its_child_with_it_and_sigterm_is_passed_on(launcher, tmp_path):
    import os
    import signal
    import time

    prefix, env = launcher
    code = ("import os, signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: (print('term', flush=True), "
            "sys.exit(3)))\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)")
    for sig, want in ((signal.SIGTERM, 3), (signal.SIGKILL, -9)):
        mark = tmp_path / f"pid{sig}"
        proc = subprocess.Popen([*prefix, "-O", "-c", code, str(mark)], env=env, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (mark.exists() and mark.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(mark.read_text())
        assert child != proc.pid and _parent(child) == int(env["PTO_TEST_ZYGOTE_PID"]), "not forked by the server"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == want and out == ("term\n" if sig == signal.SIGTERM else ""), (sig, proc.returncode, out)
        while _parent(child) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _parent(child) is None, f"the child {child} outlived its launcher (signal {sig})"
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)


PLAIN = {  # python ARGS, and the same through forkserver.python(): (stdin, expected stdout, expected exit code)
    "-u: unbuffered, asserts on": (["-u", "-c", "import os\nprint(__debug__)\nos._exit(0)"], "", "True\n", 0),
    "a bootstrap line read from stdin": (["-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"],
                                         "'print(input().upper())'\nping\n", "PING\n", 0),
    "a module from the cwd": (["-m", "probe_mod", "x"], "", "probe_mod ['x'] True\n", 0),
    "none of the launcher's own variables": (["-c", "import os; print(sorted(k for k in os.environ if "
                                              "k.startswith('PTO_TEST_PLAIN')))"], "", "[]\n", 0),
    "killed by a signal": (["-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], "", "", -15),
}


@pytest.mark.parametrize("name", list(PLAIN))
def test_the_stand_in_python_is_python_forked_from_the_server(name, tmp_path):
    """``forkserver.python()`` (what the xdist workers of a child ``pytest -n`` and ``goldens replay --devices``'
    workers start as) gives what ``python ARGS`` gives -- ``-u``, live stdin, asserts on, exit code, death by
    signal -- from a child of this process's fork server."""
    import os

    stand_in = forkserver.python()
    (tmp_path / "probe_mod.py").write_text("import sys\nprint(__name__ == '__main__' and 'probe_mod', sys.argv[1:], "
                                           "__debug__)\n")
    args, stdin, out, code = PLAIN[name]
    server = forkserver._start().pid
    runs = {}
    for how, cmd in (("real", [sys.executable, *args]), ("stand-in", [stand_in, *args])):
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ""})
        runs[how] = (*proc.communicate(stdin, timeout=120), proc.returncode)
    assert runs["stand-in"] == runs["real"] == (out, "", code), runs
    probe = subprocess.run([stand_in, "-c", "import os; print(os.getppid())"], capture_output=True, text=True,
                           timeout=120)
    assert int(probe.stdout) == server, "the stand-in's child was not forked by the server"


def test_a_forked_child_takes_its_sys_executable_from_its_environment(tmp_path):
    """``PTO_TEST_EXECUTABLE`` in a forked child's environment is its ``sys.executable`` (and leaves the
    environment, so the child's own children start as usual)."""
    import os

    code = f"import os, sys; print(sys.executable, {forkserver.EXECUTABLE!r} in os.environ)"
    proc = forkserver.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, forkserver.EXECUTABLE: "/some/python"})
    assert proc.stdout == "/some/python False\n", proc.stdout + proc.stderr
