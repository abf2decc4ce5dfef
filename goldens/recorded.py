"""``--backend recorded[:SOURCE]``: a device's outputs kept by ``goldens replay --keep-actual`` (e.g. the upstream
kernels on the a5 simulator), judged again -- with the current comparators, against the current expected
outputs -- on a machine without that device or toolchain (CI).

A kept run lives beside the trees at ``actual/<source>/<case>/<wiring>/<output>``; its group records the backend,
platform and provenance (toolchain and upstream commits) and a digest of the tree inputs it ran on. A tree with
no kept outputs of the source is a named skip; one whose inputs changed since the run (re-recorded) too: the kept
outputs are never judged against inputs they did not come from.
"""

from __future__ import annotations

import hashlib

import torch

from contracts.backends import MissingOperator, Unsupported
from goldens.codec import from_numpy, to_numpy
from goldens.errors import GoldenStoreError
from goldens.store import StoreReader

ACTUAL_ROOT = "actual"


def inputs_digest(inputs: dict[str, torch.Tensor]) -> str:
    """One hash of a tree's inputs (names, logical dtypes, shapes, bytes), in name order."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(inputs):
        arr, attrs = to_numpy(inputs[name])
        h.update(f"{name}|{attrs['dtype']}|{attrs['shape']}|".encode())
        h.update(arr.reshape(-1).view("uint8").data if arr.size else b"")
    return h.hexdigest()


def sources(reader: StoreReader) -> list[str]:
    """The sources (``<backend>-<platform>``) with kept outputs in this snapshot."""
    return reader.groups(ACTUAL_ROOT)


class RecordedBackend:
    """The kept outputs of one source, as a replay-only backend (``replay`` hook; no operator runs)."""

    def __init__(self, reader: StoreReader, source: str):
        self.reader, self.source = reader, source
        self.name, self.platform = f"recorded:{source}", "cpu"
        self.variants: dict = {}
        self.description = f"outputs of {source} kept by goldens replay --keep-actual"

    def get(self, op: str):
        raise MissingOperator(f"backend {self.name!r} replays kept outputs only: it runs no operator ({op})")

    def replay(self, tree, export) -> dict[str, torch.Tensor]:
        base = f"{ACTUAL_ROOT}/{self.source}/{tree.case.name}/{tree.record.wiring}"
        if not self.reader.has(base):
            raise Unsupported(f"no outputs of {self.source} kept for {tree.case.name}/{tree.record.wiring}")
        attrs = self.reader.group_attrs(base)
        kept_for = attrs.get("inputs_digest")
        if kept_for != inputs_digest(tree.inputs):
            raise Unsupported(f"the outputs of {self.source} kept for {tree.case.name}/{tree.record.wiring} ran on "
                              "other inputs (the tree was re-recorded since, or the run predates input digests): "
                              "replay on the device again with --keep-actual")
        out = {}
        for name in tree.record.comparators:
            path = f"{base}/{name}"
            if not self.reader.has(path):
                raise GoldenStoreError(f"{path}: kept run has no output {name!r}")
            arr, a = self.reader.read(path)
            out[name] = from_numpy(arr, a, name=path)
        return out


def recorded_backend(reader: StoreReader, spec: str) -> RecordedBackend:
    """``recorded`` (the only source kept) or ``recorded:SOURCE``."""
    have = sources(reader)
    source = spec.partition(":")[2]
    if not source:
        if len(have) != 1:
            raise GoldenStoreError(f"--backend recorded needs a source: recorded:SOURCE, one of {have or 'none kept'}")
        source = have[0]
    if source not in have:
        raise GoldenStoreError(f"no kept outputs of {source!r} in this store (kept: {have or 'none'}; goldens replay "
                               "--backend pypto --platform a5sim --keep-actual keeps them)")
    return RecordedBackend(reader, source)
