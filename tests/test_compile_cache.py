"""Compiled kernel entries reused (``$PTO_COMPILE_CACHE``, backends/upstream/compile_cache.py; #49 item 3): the key
moves with every input of a build and with nothing else; entries are written once, unpacked only inside their
folder, a damaged one is a miss; through the pypto backend on the upstream TEST DOUBLE (whose runner leaves a
build under ``build_output/`` and skips compiling when given ``runtime_dir``, as the real one does) a second
launch compiles nothing, and a changed source or geometry compiles again. The figures on the real a5sim
toolchain are in docs/a5sim.md."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from backends.upstream.compile_cache import CompileCache, CompileCacheError, entry_key

ROOT = Path(__file__).resolve().parents[1]


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    (root / "golden").mkdir(parents=True)
    (root / "golden" / "runner.py").write_text("def run(): pass\n")
    (root / "models" / "f").mkdir(parents=True)
    (root / "models" / "f" / "k.py").write_text("def entry(): pass\n")
    (root / "models" / "g").mkdir()
    (root / "models" / "g" / "other.py").write_text("x = 1\n")
    return root


def _request(**over) -> dict:
    base = {"folder": "f", "module": "k", "entry": "entry", "platform": "a5sim", "ranks": 1, "tiles": {},
            "tensors": {"x": torch.zeros(8, 64, dtype=torch.bfloat16), "n": torch.tensor(5)}}
    return {**base, **over}


def test_the_key_moves_with_every_input_of_a_build_and_nothing_else(tmp_path):
    root = _root(tmp_path)
    key = entry_key(root, _request(), "pypto=A; g++-15=15.2")
    assert key == entry_key(root, _request(), "pypto=A; g++-15=15.2")
    assert key == entry_key(root, _request(tensors={"x": torch.ones(8, 64, dtype=torch.bfloat16),
                                                    "n": torch.tensor(5)}), "pypto=A; g++-15=15.2"), \
        "the values of a tensor are not part of a build"
    (root / "models" / "g" / "other.py").write_text("x = 2\n")
    assert key == entry_key(root, _request(), "pypto=A; g++-15=15.2"), "another folder's source is not this build's"
    moved = {
        "a source of the folder": lambda: (root / "models" / "f" / "k.py").write_text("def entry(): return 1\n"),
        "the runner": lambda: (root / "golden" / "runner.py").write_text("def run(): return 1\n"),
        "a new file in the folder": lambda: (root / "models" / "f" / "helper.py").write_text("y = 1\n"),
    }
    for what, edit in moved.items():
        before = entry_key(root, _request(), "t")
        edit()
        assert entry_key(root, _request(), "t") != before, what
    base = entry_key(root, _request(), "t")
    for what, req, tool in (
            ("a shape", _request(tensors={"x": torch.zeros(4, 64, dtype=torch.bfloat16), "n": torch.tensor(5)}), "t"),
            ("a dtype", _request(tensors={"x": torch.zeros(8, 64, dtype=torch.float32), "n": torch.tensor(5)}), "t"),
            ("a scalar (dynamic dim)", _request(tensors={"x": torch.zeros(8, 64, dtype=torch.bfloat16),
                                                         "n": torch.tensor(6)}), "t"),
            ("the tiles", _request(tiles={"TILE_M": 64}), "t"),
            ("the platform", _request(platform="a5"), "t"),
            ("the ranks", _request(ranks=2), "t"),
            ("the entry", _request(entry="entry2"), "t"),
            ("the toolchain", _request(), "t2")):
        assert entry_key(root, req, tool) != base, what


def test_an_entry_is_written_once_unpacked_inside_its_folder_and_a_damaged_one_is_a_miss(tmp_path):
    cache = CompileCache(str(tmp_path / "cache"))
    build = tmp_path / "build"
    (build / "kernels").mkdir(parents=True)
    (build / "kernels" / "k.cpp").write_text("int k;\n")
    (build / "kernels" / "k.so").write_text("binary\n")
    os.utime(build / "kernels" / "k.cpp", (1_000_000, 1_000_000))  # the binary newer than its source
    key = "ab" * 32
    assert cache.fetch(key, tmp_path / "out") is None
    assert cache.store(key, build) and not cache.store(key, build), "an entry is never overwritten"
    got = cache.fetch(key, tmp_path / "out")
    assert (got / "kernels" / "k.so").read_text() == "binary\n"
    assert (got / "kernels" / "k.cpp").stat().st_mtime == 1_000_000, "mtimes kept (upstream rebuilds older .so)"
    entry = next((tmp_path / "cache").rglob("*.tar"))
    entry.write_bytes(entry.read_bytes()[:100])
    assert cache.fetch(key, tmp_path / "out2") is None and not (tmp_path / "out2").exists()
    evil = io.BytesIO()  # a member pointing outside the folder it is unpacked into
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    entry.write_bytes(evil.getvalue())
    assert cache.fetch(key, tmp_path / "out3") is None and not (tmp_path / "escaped").exists()
    for bad in ("", "s3://bucket-only", "s3://"):
        with pytest.raises(CompileCacheError):
            CompileCache(bad)


def test_a_second_launch_compiles_nothing_and_a_changed_source_compiles_again(tmp_path, monkeypatch):
    from backends import get_backend
    from backends import pypto as pb
    from backends.upstream import client
    from kernels.reference.mhc import hc_post

    fake = tmp_path / "fake_upstream"
    shutil.copytree(ROOT / "tests" / "fake_upstream", fake, ignore=shutil.ignore_patterns("__pycache__"))
    compiles = tmp_path / "compiles.txt"
    monkeypatch.setenv(pb.ALLOW_TEST_DOUBLE, "1")
    monkeypatch.setenv("PTO_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PTO_FAKE_COMPILES", str(compiles))
    b = get_backend("pypto", pypto_lib=str(fake))
    g = torch.Generator().manual_seed(0)

    def launch(rows: int = 8):
        x, r = torch.randn(rows, 64, generator=g).to(torch.bfloat16), torch.randn(rows, 4, 64, generator=g)
        p, c = torch.rand(rows, 4, generator=g), torch.rand(rows, 4, 4, generator=g)
        assert torch.equal(b.get("hc_post")(x, r, p, c), hc_post(x, r, p, c))
        return len(compiles.read_text().splitlines()) if compiles.exists() else 0

    assert launch() == 1
    assert launch() == 1, "the second launch compiled again"
    log = [what for w in client._WORKERS.values() if w.root == fake.resolve() or w.root == fake
           for _entry, what, _key in w.compile_log]
    assert log[-2:] == ["stored", "hit"], log
    source = fake / "models" / "deepseek_v4_pro" / "hc_post.py"
    source.write_text(source.read_text() + "\n# edited\n")
    assert launch() == 2, "a changed source reused a stale build"
    assert launch() == 2
    assert len(list((tmp_path / "cache").rglob("*.tar"))) == 2


def test_an_s3_compile_cache_stores_once_and_fetches(s3_store, tmp_path):
    """The cache on S3 (the local S3 test server): a put that finds the entry there already stores nothing (a
    conditional write), a fetch unpacks it, a missing key is a miss."""
    spec = s3_store.rsplit("/", 1)[0] + "/compiled"
    cache = CompileCache(spec)
    build = tmp_path / "build"
    build.mkdir()
    (build / "kernel.so").write_text("binary\n")
    key = "cd" * 32
    assert cache.fetch(key, tmp_path / "out") is None
    assert cache.store(key, build) and not cache.store(key, build)
    assert (cache.fetch(key, tmp_path / "out") / "kernel.so").read_text() == "binary\n"


def test_doctor_says_what_the_compile_cache_holds(tmp_path, monkeypatch, capsys):
    """goldens doctor: the cache off (info), a folder with its builds (ok), a value that cannot be used (exit 2,
    named; it was reported as a reference that raises, exit 3)."""
    from goldens import cli

    store = str(ROOT / "artifacts" / "store")
    monkeypatch.delenv("PTO_COMPILE_CACHE", raising=False)
    assert cli.main(["--store", store, "doctor"]) == 0 and "compile cache" in capsys.readouterr().out
    cache = CompileCache(str(tmp_path / "cache"))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "k.so").write_text("x")
    cache.store("ef" * 32, tmp_path / "b")
    monkeypatch.setenv("PTO_COMPILE_CACHE", str(tmp_path / "cache"))
    assert cli.main(["--store", store, "doctor"]) == 0
    assert "1 build(s)" in capsys.readouterr().out.replace("│", " ")
    monkeypatch.setenv("PTO_COMPILE_CACHE", "")
    got = cli.main(["--store", store, "doctor"])
    text = capsys.readouterr()
    assert got == 2 and "$PTO_COMPILE_CACHE cannot be used" in text.err and "reference" not in text.err, text.err
