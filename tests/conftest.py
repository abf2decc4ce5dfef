"""Fixtures shared by the unit tests: a local S3 server (test double, tests/s3_server.py) for the store."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

BUCKET = "goldens"
ROOT = Path(__file__).resolve().parents[1]

# Every store the tests make keeps its read cache (``$XDG_CACHE_HOME/pto-contracts``) in a folder of this
# process, inherited by the commands it runs and deleted at its exit: never the user's ~/.cache.
_CACHE_HOME = tempfile.TemporaryDirectory(prefix="pto-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME.name


_LAUNCH_SERVER: subprocess.Popen | None = None


def pytest_configure(config):
    """The upstream worker (``python -O -m backends.upstream.worker``, 15 starts in the suite) is forked from a
    ``-O`` fork server this process starts now (tests/pylaunch.py, tests/zygote.py) instead of importing torch
    each time; ``PTO_UPSTREAM_PYTHON`` names the launcher unless it is set already. Not for a --collect-only
    session or an xdist controller, which run no test."""
    global _LAUNCH_SERVER
    controller = not hasattr(config, "workerinput") and config.getoption("numprocesses", default=None)
    if config.option.collectonly or controller or os.environ.get("PTO_UPSTREAM_PYTHON") or \
            os.environ.get("PTO_TEST_FORK_SERVER", "1") == "0":
        return
    from tests import forkserver

    _LAUNCH_SERVER, env = forkserver.launch_server(os.path.join(_CACHE_HOME.name, f"pylaunch-{os.getpid()}.sock"))
    os.environ.update(env, PTO_UPSTREAM_PYTHON=shlex.join(forkserver.LAUNCHER))


def pytest_unconfigure(config):
    global _LAUNCH_SERVER
    if _LAUNCH_SERVER is not None:  # killed and waited: its CPU (and its children's) is this process's
        _LAUNCH_SERVER.kill()
        _LAUNCH_SERVER.wait()
        _LAUNCH_SERVER = None
        for name in ("PTO_TEST_PYTHON", "PTO_TEST_ZYGOTE_SOCKET", "PTO_TEST_ZYGOTE_PID", "PTO_UPSTREAM_PYTHON"):
            os.environ.pop(name, None)


# ``path::name`` of every test function this session collected (parameters stripped), when it collected the whole
# of contracts/ and tests/ (``pytest tests/ contracts/``, with or without -n): taken before any deselection (-k,
# -m, --operator), else None. tests/test_coverage_doc.py checks against it instead of collecting everything again.
WHOLE_COLLECTION: frozenset[str] | None = None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    global WHOLE_COLLECTION
    given = {Path(str(a).split("::")[0]).resolve() for a in config.args}
    whole = all("::" not in str(a) for a in config.args) and \
        (given == {ROOT} or given == {ROOT / "tests", ROOT / "contracts"}) and \
        not any(config.getoption(o, default=None) for o in ("ignore", "ignore_glob", "deselect", "lf", "stepwise"))
    WHOLE_COLLECTION = frozenset(i.nodeid.split("[")[0] for i in items) if whole else None
    yield


@pytest.fixture(scope="session")
def s3_endpoint():
    """http://127.0.0.1:PORT of a moto S3 server started for this test session (one per xdist worker), with
    the bucket ``goldens`` created. moto is a dev dependency: without it this fails, it never skips."""
    try:
        import boto3  # noqa: F401  (moto's dependency; used to create the bucket)
        import moto  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the S3 store tests need the dev dependencies (pip install -e '.[dev]'): {exc}")
    proc = subprocess.Popen([sys.executable, "-m", "tests.s3_server", "--port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line.startswith("port "):
            pytest.fail(f"the local S3 server did not start (printed {line!r}, exit {proc.poll()})")
        endpoint = f"http://127.0.0.1:{line.split()[1]}"
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def s3_store(s3_endpoint, monkeypatch, tmp_path):
    """A fresh ``s3://goldens/<unique prefix>`` URL, with the AWS environment pointing at the local server
    (subprocesses inherit it) and the read cache in tmp_path."""
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": s3_endpoint, "AWS_EC2_METADATA_DISABLED": "true",
           "PTO_STORE_READ_CACHE": str(tmp_path / "read-cache")}
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/store"
