"""The same golden store on S3 (``--store s3://bucket/prefix``, ``--golden-store`` for pytest), against the
local S3 test server (tests/s3_server.py): record, replay, regen after a rounding change, diff, log, gc with
tags, a tampered record refused, a defect out of bound, the pytest replay, and the one-line exit-2 errors of
a bad location. The concurrent-writer test runs on S3 in tests/test_store_concurrency.py.
Spec: §7.3; issue: the golden store as a trusted engine (item 5)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from goldens import cli, trees
from goldens.catalog import record_checksum
from goldens.errors import GoldenStoreError
from goldens.store import GoldenStore
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]


def test_record_replay_regen_diff_gc_on_s3(s3_store, monkeypatch, capsys):
    from kernels import quant

    store = GoldenStore(s3_store)
    assert not store.exists()
    assert cli.main(["--store", s3_store, "record", "cache_index", "rope_rows", "--seed", "5"]) == 0
    assert store.exists()
    first = store.log()[0].snapshot
    assert cli.main(["--store", s3_store, "replay"]) == 0
    assert cli.main(["--store", s3_store, "replay", "cache_index", "--backend-module",
                     "tests.defects.quant:PUBLISH_UNMAPPED"]) == 1
    # a rounding change: the tree is stale, regen moves exactly the payload, tagged; replay passes again
    monkeypatch.setitem(quant.RULES, "index", replace(quant.RULES["index"], tie="even"))
    monkeypatch.setattr(quant, "ROUNDING_VERSION", "mx-test-even")
    capsys.readouterr()
    assert cli.main(["--store", s3_store, "replay", "cache_index"]) == 2
    assert "stale tree(s) refused" in capsys.readouterr().err
    report, result = trees.regen(store, [("cache_index", "replicated"), ("rope_rows", "replicated")])
    assert {(c, d.name) for c, _w, ds, _change in report for d in ds} == {("cache_index", "payload")}
    assert [p for p in result.written if "/out/" in p or "/in/" in p] == ["cache_index/replicated/out/payload"]
    tag = next(t for e in store.log() for t in e.tags if t.startswith("regen-"))
    assert cli.main(["--store", s3_store, "replay"]) == 0
    rows = trees.diff_revisions(store, first, "main")
    assert [p for p, kind, _ in rows if kind == "changed" and "/out/" in p] == ["cache_index/replicated/out/payload"]
    assert cli.main(["--store", s3_store, "diff", first, "main"]) == 0
    # gc: the regen tag and the head survive; the first snapshot (untagged, off head) is expired
    assert cli.main(["--store", s3_store, "gc", "--older-than-days", "0", "--keep-last", "0"]) == 0
    assert first not in {e.snapshot for e in store.log()}
    assert cli.main(["--store", s3_store, "replay", "--rev", tag]) == 0
    assert cli.main(["--store", s3_store, "log"]) == 0 and tag in capsys.readouterr().out


def test_a_tampered_record_on_s3_is_refused(s3_store):
    store = GoldenStore(s3_store)
    trees.record(store, [("rope_rows", "replicated")], seed=3)
    attrs = store.reader().group_attrs("rope_rows/replicated")
    store.commit({}, {"rope_rows/replicated": {**attrs, "comparators": {}}}, "tamper")
    with pytest.raises(GoldenStoreError, match="checksum"):
        trees.load_tree(store.reader(), "rope_rows", "replicated")
    store.commit({}, {"rope_rows/replicated": (forged := {**attrs, "comparators": {}}) | {
        "checksum": record_checksum(forged)}}, "forge")
    with pytest.raises(GoldenStoreError, match="comparator"):
        trees.load_tree(store.reader(), "rope_rows", "replicated")


def test_pytest_replays_an_s3_store(s3_store):
    trees.record(GoldenStore(s3_store), [("rope_rows", "replicated"), ("sp_slabs", "sharded")], seed=4)
    proc = forkserver.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:randomly",
                           "contracts/test_golden_replay.py", "--golden-store", s3_store],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.parametrize(("where", "text"), [
    ("s3://no-such-bucket/goldens", "NoSuchBucket: The specified bucket does not exist"),
    ("s3://goldens", "give a bucket and a prefix"),
    ("gs://goldens/x", "unsupported scheme gs://"),
])
@pytest.mark.parametrize("verb", [["replay"], ["log"], ["record", "rope_rows"], ["gc", "--older-than-days", "1"]])
def test_a_bad_s3_location_is_one_line_and_exit_2(s3_store, capsys, where, text, verb):
    assert cli.main(["--store", where, *verb]) == 2
    err = capsys.readouterr().err.strip()
    assert text in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_pytest_names_an_unreadable_s3_store_in_one_failing_test(s3_store):
    proc = forkserver.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "contracts/test_golden_replay.py",
                           "--golden-store", "s3://no-such-bucket/goldens"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout[-2000:]
    assert "NoSuchBucket: The specified bucket does not exist" in proc.stdout
    usage = forkserver.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "contracts/test_golden_replay.py",
                            "--golden-store", "s3://goldens"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert usage.returncode == 4 and "give a bucket and a prefix" in usage.stderr, usage.stderr[-2000:]


def test_bad_s3_credentials_are_one_line_naming_the_cause(tmp_path, monkeypatch, capsys):
    """A server that checks credentials (moto with INITIAL_NO_AUTH_ACTION_COUNT=1: the bucket is created
    unauthenticated, every later request must sign with a known key): record, replay and log with unknown keys
    are one line naming the cause and what to check, exit 2 (issue #24: not `Error { aws_request_id: ... }`)."""
    import os

    import boto3

    proc = subprocess.Popen([sys.executable, "-m", "tests.s3_server", "--port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "1"})
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("port "), line
        endpoint = f"http://127.0.0.1:{line.split()[1]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
                     aws_secret_access_key="x").create_bucket(Bucket="locked")
        for name, value in {"AWS_ACCESS_KEY_ID": "not-a-key", "AWS_SECRET_ACCESS_KEY": "wrong",
                            "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                            "AWS_EC2_METADATA_DISABLED": "true", "PTO_STORE_READ_CACHE": ""}.items():
            monkeypatch.setenv(name, value)
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(name, raising=False)
        for verb in (["record", "sp_slabs"], ["replay"], ["log"]):
            assert cli.main(["--store", "s3://locked/goldens", *verb]) == 2, verb
            err = capsys.readouterr().err.strip()
            assert "InvalidAccessKeyId" in err and "AWS_ACCESS_KEY_ID" in err, err
            assert len(err.splitlines()) == 1 and "aws_request_id" not in err, err
    finally:
        proc.kill()
        proc.wait()
