"""Starts and talks to the upstream worker (``backends.upstream.worker``), one per (checkout, process)."""

from __future__ import annotations

import atexit
import os
import subprocess
import tempfile
import threading
from pathlib import Path

from backends.upstream import worker as protocol
from backends.upstream.python import PYTHON_ENV, worker_python  # noqa: F401  (re-exported)

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class UpstreamError(RuntimeError):
    """The upstream worker could not start, or a golden function raised (one line: what and where)."""


class UpstreamUnsupported(UpstreamError):
    """The call cannot be fed to the upstream kernel entry as compiled (its static geometry, its devices)."""


TIMEOUT_ENV = "PTO_DEVICE_TIMEOUT"
DEFAULT_DEVICE_TIMEOUT = 1800.0  # seconds: compiling a V4-Pro entry and running it on a5sim takes 1-10 minutes


def device_timeout() -> float:
    """Seconds one kernel launch (compile + run) may take before the worker is stopped: $PTO_DEVICE_TIMEOUT, or
    30 minutes."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_DEVICE_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise UpstreamError(f"${TIMEOUT_ENV}={text!r}: expected a positive number of seconds")
    return value


class Worker:
    def __init__(self, root: Path, env: dict[str, str] | None = None):
        self.root = root
        self.env = dict(env or {})  # set in the worker's environment (a folder preset: DEEPSEEK_V4_VARIANT=flash)
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self.workdir: str | None = None
        self._toolchain_key: str | None = None  # the toolchain rows, once: part of every compile-cache key
        self.compile_log: list[tuple[str, str, str]] = []  # (entry, hit | stored | miss | ..., key) per launch
        atexit.register(self.close)
        self.log = tempfile.NamedTemporaryFile(prefix="pto-upstream-worker-", suffix=".log", delete=False)  # noqa: SIM115 (kept open for the worker's stderr)

    def _start(self) -> None:
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
        # upstream's golden package sets torch's threads from this (16 by default); one thread keeps the worker's
        # FP32 sums in one order on every machine and leaves the cores to the test process
        env.setdefault("PYPTO_GOLDEN_NUM_THREADS", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        # a worker dies with the process that started it (killed mid-launch, it would run the launch to its end and
        # hold its memory); asked only from the main thread, as the signal follows the starting thread's exit
        from backends import lifetime

        if threading.current_thread() is threading.main_thread():
            env[lifetime.WORKER] = "1"
        else:
            env.pop(lifetime.WORKER, None)
        # upstream's runner writes its build_output/ into the working folder: the worker gets one of its own
        self.workdir = self.workdir or tempfile.mkdtemp(prefix="pto-upstream-work-")
        python = worker_python()
        chosen = f"; ${PYTHON_ENV} chose it" if PYTHON_ENV in os.environ else ""
        try:
            self.proc = subprocess.Popen([*python, "-O", "-m", "backends.upstream.worker", str(self.root)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                         cwd=self.workdir)
        except OSError as exc:
            self.proc = None
            raise UpstreamError(f"the upstream worker for {self.root} did not start with {' '.join(python)}: "
                                f"{exc.strerror or exc}{chosen}") from None
        hello = protocol.read_message(self.proc.stdout)
        if not isinstance(hello, dict) or not hello.get("ready"):
            raise UpstreamError(f"the upstream worker for {self.root} did not start with {' '.join(python)} "
                                f"(see {self.log.name}{chosen})")
        self.info = hello

    def call(self, folder: str, module: str, function: str, tensors: dict, *, fields: dict | None = None,
             constants: dict | None = None, module_globals: dict | None = None, args: tuple | None = None,
             kwargs: dict | None = None, taps: dict | None = None, native: tuple[str, ...] = ()) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        request = {"folder": folder, "module": module, "function": function, "tensors": tensors,
                   "fields": fields or {}, "constants": constants or {}, "globals": module_globals or {}}
        if args is not None:
            request.update(args=list(args), kwargs=dict(kwargs or {}))
        elif kwargs:  # a golden's keyword arguments beside its tensors (golden_lm_head_all_ranks' n_ranks)
            request["kwargs"] = dict(kwargs)
        if taps:
            request["taps"] = {key: list(names) for key, names in taps.items()}
        if native:
            request["native"] = list(native)
        where = f"models/{folder}/{module}.py::{function}"
        try:
            return self._ask(request, where)
        except UpstreamUnsupported:
            raise
        except UpstreamError as exc:
            if str(exc).startswith("upstream worker died"):
                raise
            raise UpstreamError(f"upstream {where} raised {exc}") from None

    def device(self, folder: str, module: str, entry: str, tensors: dict, *, platform: str, devices: list[int],
               ranks: int = 1, golden_data: str | None = None, tiles: dict | None = None,
               fill: dict[str, float] | None = None) -> dict:
        """Run a kernel entry on ``platform`` through upstream's runner (in the worker) -> the captured outputs.
        ``folder`` "" means ``module`` is one of this project's wrapper programs (a dotted module name). ``fill``:
        outputs handed to the kernel filled with a value (upstream's runner zeroes an output otherwise), so an
        element the kernel never writes shows as that value."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        request = {"kind": "device", "folder": folder, "module": module, "entry": entry, "tensors": tensors,
                   "platform": platform, "devices": list(devices), "ranks": ranks, "golden_data": golden_data,
                   "tiles": dict(tiles or {})}
        if fill:
            request["fill"] = {name: float(v) for name, v in fill.items()}
        cache, key, hit = self._cached_build(request)
        answer = self._launch(request, module, entry, platform)
        built = answer.get("work_dir")
        if cache is not None and hit is None and built:
            where = Path(built)
            if where.is_dir() and where.resolve().is_relative_to(Path(self.workdir).resolve()):
                stored = cache.store(key, where)  # (a build outside the worker's own folder is never packed)
                self.compile_log.append((f"{module}::{entry}", "stored" if stored else "miss", key))
            else:
                self.compile_log.append((f"{module}::{entry}", "not stored (outside the work folder)", key))
        return answer["tensors"]

    def _cached_build(self, request: dict):
        """(cache, key, unpacked build or None) for a device request: $PTO_COMPILE_CACHE looked up first; a hit
        becomes the request's ``runtime_dir``."""
        from backends.upstream.compile_cache import CompileCache, CompileCacheError, entry_key

        try:
            cache = CompileCache.from_env()
        except CompileCacheError as exc:
            raise UpstreamError(str(exc)) from None
        if cache is None:
            return None, None, None
        if self._toolchain_key is None:
            self._toolchain_key = "; ".join(f"{piece}={detail}" for _state, piece, detail in self.toolchain())
        module_file = None
        if not request["folder"]:
            import importlib.util

            spec = importlib.util.find_spec(request["module"])
            module_file = spec.origin if spec else None
        key = entry_key(self.root, request, self._toolchain_key, module_file)
        hit = cache.fetch(key, Path(self.workdir) / "compiled" / key[:16])
        if hit is not None:
            request["runtime_dir"] = str(hit)
            self.compile_log.append((f"{request['module']}::{request['entry']}", "hit", key))
        return cache, key, hit

    def _launch(self, request: dict, module: str, entry: str, platform: str) -> dict:
        limit = device_timeout()
        stopped = threading.Event()

        def stop():  # a launch that never returns (a simulated kernel that waits forever) must not hang the run
            if self.proc is not None and self.proc.poll() is None:
                stopped.set()
                self.proc.kill()

        watchdog = threading.Timer(limit, stop)
        watchdog.daemon = True
        watchdog.start()
        try:
            return self._answer(request, f"{module}::{entry}")
        except UpstreamError:
            if stopped.is_set():
                raise UpstreamError(f"{module}::{entry} did not finish within {limit:g} s on {platform} "
                                    f"(${TIMEOUT_ENV}); the worker was stopped (see {self.log.name})") from None
            raise
        finally:
            watchdog.cancel()

    def values(self, module: str, names: list[str]) -> dict:
        """Plain values (ints, floats, strings) of ``module`` (importable in the worker), by dotted name."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return self._ask({"kind": "values", "module": module, "names": list(names)}, module)

    def toolchain(self) -> list[tuple[str, str, str]]:
        """(state, piece, detail) rows for the a5 simulator's pieces, seen from the worker's environment."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return [tuple(r) for r in self._ask({"kind": "toolchain"}, "the toolchain check")["rows"]]

    def ready(self) -> dict:
        """Start the worker if needed; its hello ({"shim", "toolchain_error", "threads", ...})."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return self.info

    def _ask(self, request: dict, what: str) -> dict:
        return self._answer(request, what)["tensors"]

    def _answer(self, request: dict, what: str) -> dict:
        try:
            protocol.write_message(self.proc.stdin, request)
            answer = protocol.read_message(self.proc.stdout)
        except (BrokenPipeError, OSError) as exc:
            answer = {"error": f"worker died ({exc})"}
        if answer is None:
            self.proc = None
            raise UpstreamError(f"upstream worker died running {what} (see {self.log.name})")
        if "unsupported" in answer:
            raise UpstreamUnsupported(answer["unsupported"])
        if "error" in answer:
            raise UpstreamError(answer["error"])
        return answer

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
        if self.workdir is not None:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


_WORKERS: dict[tuple, Worker] = {}


def worker(root: Path, env: dict[str, str] | None = None) -> Worker:
    """The worker process for one checkout and environment (one per folder preset), started on first use."""
    key = (root, tuple(sorted((env or {}).items())))
    if key not in _WORKERS:
        _WORKERS[key] = Worker(root, env)
    return _WORKERS[key]
