"""backends.upstream.survey reads upstream drivers' output the way upstream's runner prints it.

The driver double below prints what pypto-lib's ``golden/runner.py`` prints (``[RUN] <stage> ...`` when a stage
starts, ``[RUN] <stage> done (Ns)`` when it ends, also when it raised; ``[RUN] PASS (Ns)`` on success) and fails the
ways the real drivers were seen to fail on a5sim (a ptoas error in compile, a comparator refusal in validate).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from backends.upstream.survey import classify, drivers
from tests import forkserver
from tests.test_upstream_backend import needs_checkout

ROOT = Path(__file__).resolve().parents[1]

_DRIVER = '''
import sys
from golden import run_jit  # noqa: F401  (what marks a driver)
stages = {stages!r}
for s in stages:
    print(f"[RUN] {{s}} ...", flush=True)
    print(f"[RUN] {{s}} done (0.01s)", flush=True)
{tail}
def main():
    result = run_jit(None)
{check}


if __name__ == "__main__":
    pass
'''

_TAILS = {
    "ok": ('["compile", "generate inputs", "compute golden", "runtime", "validate"]', 'print("[RUN] PASS (0.05s)")'),
    "sort": ('["compile"]', 'sys.stderr.write("Failed to compile function \'route_sort\': ptoas compilation failed: '
             'error: \'pto.tsort32\' op requires explicit tmp\\\\nTraceback (most recent call last):\\\\n'
             'pypto.backend.pto_backend.PartialCodegenError: 1 function(s) failed to compile:\\\\n"); sys.exit(1)'),
    "refused": ('["compile", "generate inputs", "compute golden", "runtime", "validate"]',
                'print("Output \'sh\' does not match golden: 0.5% of points over 2e-3"); sys.exit(1)'),
    "nosim": ('[]', 'sys.stderr.write("usage: nosim.py [-h] [-p {a2a3,a5}]\\nnosim.py: error: argument -p/--platform: '
              'invalid choice: \'a5sim\' (choose from \'a2a3\', \'a5\')\\n"); sys.exit(2)'),
    "slow": ('["compile"]', 'import time; time.sleep(60)'),
    "swallow": ('["compile", "generate inputs", "compute golden", "runtime", "validate"]',
                'print("[RUN] PASS (0.05s)")'),
}
_CHECK = "    if not result.passed:\n        raise SystemExit(1)"


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "pypto-lib"
    models = root / "models" / "deepseek_v4_pro"
    models.mkdir(parents=True)
    (root / "golden").mkdir()
    (root / "golden" / "__init__.py").write_text("run_jit = None\n")
    for name, (stages, tail) in _TAILS.items():
        check = "    print(result)" if name == "swallow" else _CHECK  # swallow exits 0 whatever its result
        (models / f"{name}.py").write_text(_DRIVER.format(stages=eval(stages), tail=tail, check=check))
    (models / "config.py").write_text("X = 1\n")  # no driver
    (tmp_path / "pypto").mkdir()
    (tmp_path / "pypto" / "__init__.py").write_text("")
    return root


def test_drivers_are_the_modules_whose_main_runs_an_entry(tmp_path):
    assert drivers(_checkout(tmp_path), "deepseek_v4_pro") == ["nosim", "ok", "refused", "slow", "sort", "swallow"]


def test_each_way_a_driver_ends_gets_its_status(tmp_path):
    root = _checkout(tmp_path)
    results = tmp_path / "r.jsonl"
    env = dict(os.environ, PTO_UPSTREAM_PYTHON=sys.executable, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    proc = forkserver.run([sys.executable, "-m", "backends.upstream.survey", "--pypto-lib", str(root), "--timeout", "5",
                           "--results", str(results)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = {r["module"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert got["ok"]["status"] == "PASS" and got["ok"]["detail"] == "[RUN] PASS (0.05s)"
    assert got["sort"]["status"] == "FAIL compile" and "tsort32" in got["sort"]["detail"]
    assert got["refused"]["status"] == "FAIL validate" and "does not match golden" in got["refused"]["detail"]
    assert got["nosim"]["status"] == "NOT OFFERED" and "invalid choice" in got["nosim"]["detail"]
    assert got["slow"]["status"] == "TIMEOUT" and got["slow"]["exit_code"] is None
    assert got["swallow"]["status"] == "UNJUDGED" and "never ends the process" in got["swallow"]["detail"], \
        "exit 0 from a driver that exits 0 on a failed result too was read as a pass"
    # resumable: nothing left to run
    again = forkserver.run([sys.executable, "-m", "backends.upstream.survey", "--pypto-lib", str(root), "--resume",
                            "--results", str(results), "--list"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and again.stdout.strip() == ""


def test_bad_usage_and_a_python_without_pypto_are_one_line(tmp_path):
    root = _checkout(tmp_path)
    env = dict(os.environ, PTO_UPSTREAM_PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    for args, code, words in ((["--pypto-lib", str(tmp_path / "nowhere")], 2, "is not a folder"),
                              (["--pypto-lib", str(root), "nosuch"], 2, "no driver module nosuch"),
                              (["--pypto-lib", str(root), "ok"], 3, "cannot import pypto")):
        proc = forkserver.run([sys.executable, "-m", "backends.upstream.survey", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == code, (args, proc.stderr)
        assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_stage_that_raised_is_named_though_the_runner_printed_done():
    out = "[RUN] compile ...\n[RUN] compile done (0.54s)\n"
    assert classify(out, "Traceback (most recent call last):\nRuntimeError: boom\n", 1) == ("FAIL compile",
                                                                                           "RuntimeError: boom")
    assert classify("", "ImportError: no module x\n", 1) == ("FAIL before any stage", "ImportError: no module x")


# What the survey reads of upstream's golden/runner.py, pinned from upstream main (634e77bde7c3): the stages it
# opens with _Stage(...), the line a stage prints when it starts, and the success line.
RUNNER_FACTS = {"stages": ["benchmark", "compile", "compute golden", "generate inputs", "runtime", "validate"],
                "start": 'print(f"[RUN] {self._name} ...", flush=True)', "pass": 'print(f"[RUN] PASS ('}


def _runner_facts(runner: Path) -> dict:
    import re

    text = runner.read_text()
    return {"stages": sorted(set(re.findall(r'_Stage\("([^"]+)"\)', text))),
            "start": RUNNER_FACTS["start"] if RUNNER_FACTS["start"] in text else None,
            "pass": RUNNER_FACTS["pass"] if RUNNER_FACTS["pass"] in text else None}


def test_the_survey_reads_every_stage_upstreams_runner_opens():
    from backends.upstream.survey import _STAGE

    for stage in RUNNER_FACTS["stages"]:
        assert _STAGE.match(f"[RUN] {stage} ..."), stage
    root = os.environ.get("PYPTO_LIB_ROOT")
    if root:  # against the real runner: the same facts (a difference means the survey must learn a new line)
        assert _runner_facts(Path(root) / "golden" / "runner.py") == RUNNER_FACTS


UNCHECKED = {  # driver sources, and the lines unchecked_results must name (CH-21: a failed result exits non-zero)
    "checked": ("r = run_jit(f)\nif not r.passed:\n    print(r.error)\n    raise SystemExit(1)\n", []),
    "sys.exit": ("import sys\nr = run(p)\nif not r.passed:\n    sys.exit(3)\n", []),
    "message": ("r = run_jit(f)\nif not r.passed:\n    raise SystemExit('failed')\n", []),
    "bare": ("r = run_jit(f)\nif not r.passed:\n    raise SystemExit\n", []),
    "loop": ("for m in modes:\n    r = run_jit(f, m)\n    if not r.passed:\n        raise SystemExit(1)\n", []),
    "printed only": ("r = run_jit(f)\nif not r.passed:\n    print(r.error)\n", [1]),
    "exit zero": ("r = run_jit(f)\nif not r.passed:\n    raise SystemExit(0)\n", [1]),
    "other name": ("r = run_jit(f)\ns = run_jit(g)\nif not s.passed:\n    raise SystemExit(1)\n", [1]),
    "guard before": ("r = None\nif not r.passed:\n    raise SystemExit(1)\nr = run_jit(f)\n", [4]),
    "unbound": ("run_jit(f)\n", [1]),
    "passed kept": ("r = run_jit(f)\nok = r.passed\n", [1]),
}


def test_a_driver_that_exits_zero_on_a_failed_result_is_named():
    """CH-21 as the survey relies on it: each run / run_jit result of a driver ends the process non-zero when
    not passed. Accepted: ``raise SystemExit`` (no code, 1, a message) and ``sys.exit(3)`` under ``if not
    R.passed``, in a loop too; named: a failure only printed, ``SystemExit(0)``, a guard on another result or
    before the call, a result never bound or only stored."""
    from backends.upstream.survey import unchecked_results

    for what, (source, lines) in UNCHECKED.items():
        assert [line for line, _ in unchecked_results(source)] == lines, what


@needs_checkout  # in CI without one, test_a_driver_that_exits_zero_on_a_failed_result_is_named holds the rule
@pytest.mark.parametrize("folder", ["deepseek_v4_pro", "deepseek_v4_flash_mtp", "deepseek_v4_flash_dspark"])
def test_real_checkout_drivers_exit_nonzero_on_a_failed_result(folder):
    """Every driver of the checkout's folder ends the process non-zero when a result has not passed, so the
    survey's PASS (exit 0) is the driver's own verdict (CH-21 on main, whose drivers print no ``[GOLDEN]`` line)."""
    from backends.upstream.survey import unchecked_results

    root = Path(os.environ["PYPTO_LIB_ROOT"]).expanduser()
    found = drivers(root, folder)
    assert found, f"no driver in {root}/models/{folder}"
    bad = {m: unchecked_results((root / "models" / folder / f"{m}.py").read_text()) for m in found}
    bad = {m: v for m, v in bad.items() if v}
    assert not bad, f"drivers that can exit 0 on a failed result: {bad}"
