"""Compiled kernel entries, kept and reused (#49 item 3): ``$PTO_COMPILE_CACHE`` names a folder or an
``s3://bucket/prefix`` every node can reach. Before a launch the harness looks its build up there; on a hit the
build is unpacked into the worker's own folder and upstream's runner is given it as ``runtime_dir`` (it skips
pypto's compile, the PTO assembler and, since the binaries are newer than their sources, g++). After a launch
that compiled, its build folder is packed and stored under its key.

The key is a SHA-256 of everything that decides the build:

- the entry (module and function);
- the source of the entry's model folder and of upstream's ``golden/`` runner, every ``.py`` file by path and
  bytes (a wrapper program of this project: its own file, and every ``models/`` file);
- the geometry (each tensor's name, shape and dtype) and the scalars (dynamic dims);
- the tile sizes, the platform and the number of ranks;
- the toolchain as the worker sees it: pypto, its runtime, pto-isa's commit, g++, the assembler, and the commits
  ``scripts/a5sim-setup.sh`` built.

A changed source, geometry or toolchain is another key: a stale build is never reused. An entry is written once
(a temporary name, then a rename; on S3 one put) and never overwritten. An entry that cannot be read or
unpacked is a miss.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

ENV = "PTO_COMPILE_CACHE"
VERSION = b"pto-compile-cache 1"


class CompileCacheError(Exception):
    """A $PTO_COMPILE_CACHE that cannot be used (one line)."""


class CompileCache:
    def __init__(self, spec: str):
        self.spec = spec
        if spec.startswith("s3://"):
            bucket, _, prefix = spec[len("s3://"):].partition("/")
            if not bucket or not prefix.strip("/"):
                raise CompileCacheError(f"${ENV}={spec!r}: give a bucket and a prefix, e.g. s3://bucket/compiled")
            self.bucket, self.prefix, self.folder = bucket, prefix.strip("/"), None
        elif not spec.strip():
            raise CompileCacheError(f"${ENV} is empty: unset it, or name a folder or s3://bucket/prefix")
        else:
            self.bucket = self.prefix = None
            self.folder = Path(os.path.expanduser(spec)).resolve()

    @classmethod
    def from_env(cls) -> CompileCache | None:
        spec = os.environ.get(ENV)
        return None if spec is None else cls(spec)

    def _s3(self):
        try:
            import boto3
        except ImportError:
            raise CompileCacheError(f"${ENV}={self.spec}: an S3 compile cache needs boto3 (pip install boto3)") \
                from None
        return boto3.client("s3")

    def _name(self, key: str) -> str:
        return f"{key[:2]}/{key}.tar"

    def fetch(self, key: str, into: Path) -> Path | None:
        """The build stored under ``key``, unpacked into the fresh folder ``into`` (its path), or None."""
        try:
            if self.folder is not None:
                data = (self.folder / self._name(key)).read_bytes()
            else:
                data = self._s3().get_object(Bucket=self.bucket, Key=f"{self.prefix}/{self._name(key)}")["Body"].read()
        except Exception:  # noqa: BLE001 (not there, or unreadable: a miss)
            return None
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir(parents=True)
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(into, filter="data")  # never outside ``into``; modification times kept
        except (tarfile.TarError, OSError, ValueError):
            shutil.rmtree(into, ignore_errors=True)
            return None
        return into

    def store(self, key: str, folder: Path) -> bool:
        """Pack ``folder`` and store it under ``key`` unless an entry is there already; True when stored."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path in sorted(folder.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
        data = buf.getvalue()
        if self.folder is not None:
            target = self.folder / self._name(key)
            if target.exists():
                return False
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{key[:16]}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
            return True
        s3 = self._s3()
        name = f"{self.prefix}/{self._name(key)}"
        try:
            s3.put_object(Bucket=self.bucket, Key=name, Body=data, IfNoneMatch="*")
        except Exception as exc:  # noqa: BLE001
            if "PreconditionFailed" in str(exc):
                return False
            raise CompileCacheError(f"${ENV}={self.spec}: cannot store {name} ({str(exc).splitlines()[0][:200]})") \
                from None
        return True


def _sources(root: Path, folder: str, module_file: str | None) -> list[Path]:
    files = sorted((root / "golden").glob("*.py"))
    if folder:
        files += sorted((root / "models" / folder).rglob("*.py"))
    else:
        files += sorted((root / "models").rglob("*.py"))
        if module_file:
            files.append(Path(module_file))
    return files


def entry_key(root: Path, request: dict, toolchain: str, module_file: str | None = None) -> str:
    """The key of the build a device request compiles (see the module's docstring)."""
    import torch

    h = hashlib.sha256(VERSION)

    def part(label: str, value) -> None:
        blob = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, default=str).encode()
        h.update(f"\0{label}\0{len(blob)}\0".encode())
        h.update(blob)

    part("entry", [request["folder"], request["module"], request["entry"]])
    for path in _sources(root, request["folder"], module_file):
        part(f"source {path.relative_to(root) if path.is_relative_to(root) else path.name}", path.read_bytes())
    shapes = {}
    for name, value in sorted(request["tensors"].items()):
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            shapes[name] = [list(value.shape), str(value.dtype)]
        else:  # a scalar: a dynamic dim the build may specialise on
            shapes[name] = ["scalar", value.item() if isinstance(value, torch.Tensor) else value]
    part("geometry", shapes)
    part("tiles", request.get("tiles") or {})
    part("platform", [request["platform"], int(request.get("ranks", 1))])
    part("toolchain", toolchain)
    return h.hexdigest()
