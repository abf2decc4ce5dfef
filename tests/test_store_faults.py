"""One error contract for every verb: each fault (damaged or missing snapshots and refs, a store path that is
a file, bad arguments, an empty root revision, a crashing backend) gives its documented exit code -- 2 for
store, I/O and usage problems, 3 for a backend error, never 1 (out of bound) and never a traceback -- and
leaves every byte already stored unchanged. Spec: §7.3; issue: the golden store as a trusted engine."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from goldens import trees
from goldens.store import GoldenStore
from goldens.store_format import LOCK_NAME, REPO_DIR

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faults") / "store"
    trees.record(GoldenStore(root), [("rope_rows", "replicated")], seed=1)
    trees.record(GoldenStore(root), [("sp_slabs", "replicated")], seed=2)
    return root


def _tree_bytes(root: Path) -> dict[str, str]:
    """Every file's sha256 in the store's directory but the lock (the read cache is outside it)."""
    if root.is_file():
        return {"": hashlib.sha256(root.read_bytes()).hexdigest()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != LOCK_NAME}


def _snapshots(root: Path) -> list[Path]:
    return sorted((root / REPO_DIR / "snapshots").iterdir(), key=lambda p: p.stat().st_mtime)


def _damage(root: Path, fault: str) -> None:
    if fault == "head snapshot missing":
        _snapshots(root)[-1].unlink()
    elif fault == "ancestor snapshot truncated":
        _snapshots(root)[1].write_bytes(b"")
    elif fault == "branch ref garbage":
        for ref in (root / REPO_DIR / "refs").rglob("*"):
            if ref.is_file() and "main" in str(ref):
                ref.write_bytes(b"\x00garbage")
    elif fault == "ancestor snapshot byte flipped":
        snap = _snapshots(root)[1]
        data = bytearray(snap.read_bytes())
        data[len(data) // 2] ^= 0xFF
        snap.write_bytes(bytes(data))
    elif fault in ("manifests byte flipped", "manifests truncated"):
        for f in (root / REPO_DIR / "manifests").iterdir():
            data = bytearray(f.read_bytes())
            if fault == "manifests truncated":
                data = data[: len(data) // 2]
            else:
                data[len(data) // 2] ^= 0xFF
            f.write_bytes(bytes(data))
    elif fault == "store path is a file":
        shutil.rmtree(root)
        root.write_text("not a store")


CASES = [
    # fault, command, exit code, text in the one error line
    ("head snapshot missing", ["log"], 2, "damaged or unreadable"),
    ("head snapshot missing", ["replay"], 2, "damaged or unreadable"),
    ("head snapshot missing", ["show"], 2, "damaged or unreadable"),
    ("head snapshot missing", ["record", "sp_slabs", "--seed", "5"], 2, "damaged or unreadable"),
    ("head snapshot missing", ["regen"], 2, "damaged or unreadable"),
    ("head snapshot missing", ["gc"], 2, "damaged or unreadable"),
    ("ancestor snapshot truncated", ["log"], 2, "damaged or unreadable"),
    ("branch ref garbage", ["replay"], 2, "damaged or unreadable"),
    ("ancestor snapshot byte flipped", ["log"], 2, "damaged or unreadable"),
    ("ancestor snapshot byte flipped", ["replay", "--rev", "ANCESTOR"], 2, "damaged or unreadable"),
    ("ancestor snapshot byte flipped", ["diff", "ANCESTOR", "main"], 2, "damaged or unreadable"),
    ("manifests byte flipped", ["replay"], 2, "could not be read or judged (ERROR rows above: unreadable tree)"),
    ("manifests truncated", ["regen"], 2, "(manifest "),
    ("branch ref garbage", ["record", "sp_slabs", "--seed", "5"], 2, "damaged or unreadable"),
    ("store path is a file", ["record", "sp_slabs"], 2, "cannot lock golden store"),
    ("store path is a file", ["replay"], 2, "no golden store"),
    ("none", ["gc", "--older-than-days", "nan"], 2, "finite number of days"),
    ("none", ["gc", "--older-than-days", "-1"], 2, "finite number of days"),
    ("none", ["replay", "--rev", "ROOT"], 2, "nothing to do"),
    ("none", ["diff", "ROOT", "main"], 0, ""),
    ("none", ["replay", "--backend-module", "tests.defects.crashing:CRASHING_ROPE"], 3,
     "backend error: 1 tree(s) raised in the backend"),
]


@pytest.mark.parametrize("fault,command,code,text", CASES, ids=[f"{f}|{' '.join(c)}" for f, c, _x, _t in CASES])
def test_each_fault_exits_with_its_code_and_changes_nothing(pristine, tmp_path, fault, command, code, text, capfd):
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    if "ROOT" in command or "ANCESTOR" in command:
        log = GoldenStore(root).log()
        ids = {"ROOT": log[-1].snapshot, "ANCESTOR": log[-2].snapshot}
        command = [ids.get(c, c) for c in command]
    command = [str(tmp_path / "out") if c == "OUT" else c for c in command]
    _damage(root, fault)
    before = _tree_bytes(root)
    # in process (the verbs' own error handling; capfd also sees what icechunk writes to fd 2 itself): a
    # traceback would escape main() and fail here
    from goldens import cli

    capfd.readouterr()
    try:
        returncode = cli.main(["--store", str(root), *command])
    except SystemExit as exc:  # argparse's usage errors
        returncode = exc.code
    out, stderr = capfd.readouterr()
    assert returncode == code, (returncode, out[-800:], stderr[-1500:])
    assert "Traceback" not in stderr, stderr[-1500:]
    assert text in stderr, stderr[-1500:]
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert (len(lines) <= 1 or stderr.startswith("usage:")) and "icechunk/src" not in stderr, stderr[-1500:]
    if code != 0:
        assert _tree_bytes(root) == before, "a failing verb changed stored bytes"


FS_SCRIPT = r"""
set -u
mount -t tmpfs -o size={size}k tmpfs "$MNT" || {{ echo "MOUNT-FAILED"; exit 97; }}
cp -a "$SRC" "$MNT/store" || {{ echo "COPY-FAILED"; exit 98; }}
sums='cd "$MNT/store" && find . -type f ! -name {lock} -print0 | sort -z | xargs -0 sha256sum'
"$PY" -c "$DRIVER" "full-record record compressor_r2 cache_index attn_c1a_reindex_prefill --seed 3" \
      "full-regen regen" "full-replay replay rope_rows" "sh:($sums) >$OUT/full.sums" "sh:mount -o remount,ro $MNT" \
      "ro-record record sp_slabs" "ro-gc gc --older-than-days 0" "ro-import import-pt $PT --case rope_rows" \
      "ro-replay replay rope_rows" "sh:($sums) >$OUT/ro.sums"
"""


# Runs each step ("NAME VERB ARGS...") as its own `python -m goldens.cli` process, forked from the tests' fork
# server (tests/forkserver.py) started inside the mount namespace: one torch import for all, not one per step;
# a step "sh:COMMAND" is a shell command run in between (the file sums, the read-only remount), and must succeed.
DRIVER = r"""
import os, subprocess, sys
from tests import forkserver
for step in sys.argv[1:]:
    if step.startswith("sh:"):
        subprocess.run(["bash", "-c", step[3:]], check=True)
        continue
    name, *argv = step.split()
    proc = forkserver.run([sys.executable, "-m", "goldens.cli", "--store", os.environ["MNT"] + "/store", *argv],
                          capture_output=True, timeout=300)
    for ext, data in (("out", proc.stdout), ("err", proc.stderr), ("rc", str(proc.returncode).encode())):
        with open(os.path.join(os.environ["OUT"], f"{name}.{ext}"), "wb") as fh:
            fh.write(data)
"""


def test_a_full_disk_and_a_read_only_store_exit_2_and_keep_every_snapshot(pristine, tmp_path):
    """The store on a tmpfs (in a private mount namespace, ``unshare -rm``) just larger than it: a record that
    does not fit exits 2 naming the full disk, commits nothing and leaves every stored file and the replay
    intact; remounted read-only, every writing verb exits 2 and a replay still passes."""
    if not shutil.which("unshare"):
        pytest.fail("this test needs util-linux's unshare (a private mount namespace for a tiny tmpfs)")
    out = tmp_path / "out"
    out.mkdir()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    pt = tmp_path / "pt"
    trees.export_pt(GoldenStore(pristine).reader(), "rope_rows", "replicated", pt)
    size_kib = sum(p.stat().st_blocks * 512 for p in pristine.rglob("*")) // 1024 + 64  # tmpfs counts pages
    before = _tree_bytes(pristine)
    script = FS_SCRIPT.format(size=size_kib, lock=LOCK_NAME)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MNT": str(mnt), "SRC": str(pristine), "OUT": str(out),
           "PT": str(pt), "PY": sys.executable, "PTO_STORE_READ_CACHE": "", "DRIVER": DRIVER}
    proc = subprocess.run(["unshare", "-rm", "bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"the mount namespace could not be set up: {proc.stdout}{proc.stderr}"

    def step(name):
        return int((out / f"{name}.rc").read_text()), (out / f"{name}.err").read_text()

    def sums(name):
        return {line.split("  ", 1)[1].removeprefix("./"): line.split()[0]
                for line in (out / name).read_text().splitlines()}

    code, err = step("full-record")
    assert code == 2 and "No space left on device" in err and "nothing was committed" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    code, err = step("full-regen")
    assert code == 0, err  # nothing moved: no commit, so the full disk does not matter
    assert step("full-replay")[0] == 0
    full = sums("full.sums")
    assert all(full.get(path) == digest for path, digest in before.items()), "a stored file changed on a full disk"
    for name, text in (("ro-record", "Read-only file system"), ("ro-gc", "Read-only file system"),
                       ("ro-import", "Read-only file system")):
        code, err = step(name)
        assert code == 2 and text in err and "Traceback" not in err, (name, err)
    assert step("ro-replay")[0] == 0, step("ro-replay")[1]
    assert sums("ro.sums") == full, "a verb changed a read-only store"
