"""The project's pytest plugin stays out of other projects' pytest sessions.

Upstream's own suites declare options the plugin also has: pypto's runtime (``simpler/conftest.py``) and pypto's
system tests (``tests/st/conftest.py``) both add ``--platform`` and ``--device`` with argparse's default dest.
Were the plugin an installed ``pytest11`` entry point, those suites could not start in an environment that has
this project installed ("option dest 'platform' already used"). It is loaded by the project's root conftest
instead; these tests run a foreign session whose conftest declares upstream's option names the way upstream does.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]

FOREIGN_CONFTEST = '''
def pytest_addoption(parser):
    parser.addoption("--platform", action="store", default=None, help="Target platform (a2a3sim, a5sim, ...)")
    parser.addoption("--device", action="store", default="0", help="Device ID or range")
    parser.addoption("--backend", action="store", default=None)
'''

FOREIGN_TEST = '''
def test_platform(request):
    assert request.config.getoption("platform") == "a5sim"
'''


def _foreign(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(FOREIGN_CONFTEST)
    (tmp_path / "test_foreign.py").write_text(FOREIGN_TEST)
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the project importable, as it is once installed
    return forkserver.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "--platform", "a5sim", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_no_installed_entry_point_names_the_plugin():
    hooked = [e.value for e in importlib.metadata.entry_points(group="pytest11") if e.value.startswith("contracts")]
    assert hooked == [], f"contracts registered as a pytest11 entry point: {hooked}"
    assert "pytest11" not in (ROOT / "pyproject.toml").read_text()


def test_a_foreign_suite_with_upstreams_option_names_starts(tmp_path):
    proc = _foreign(tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


def test_loading_the_plugin_by_name_into_that_suite_is_the_clash_it_avoids(tmp_path):
    # the failure the root conftest prevents, shown to happen: the same session with the plugin forced in
    proc = _foreign(tmp_path, "-p", "pto_pytest.plugin")
    assert proc.returncode != 0
    assert "already used" in proc.stdout + proc.stderr


def test_sessions_rooted_in_the_project_get_the_plugin(request):
    # this very session is rooted here: the root conftest loaded the plugin, and its options exist
    import conftest as root_conftest

    assert Path(root_conftest.__file__).resolve() == ROOT / "conftest.py"
    assert root_conftest.pytest_plugins == ("pto_pytest.plugin",)
    assert request.config.pluginmanager.has_plugin("pto_pytest.plugin")
    assert request.config.getoption("golden_store") and request.config.getoption("backend_module") is None
