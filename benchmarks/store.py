"""Golden store vs the upstream layout (one torch.save file per tensor), side by side in one run on the
same ~200 MB tree (bf16, fp32, int32, fp8 + E8M0, packed fp4 + E4M3): write time, warm read time, disk
size, and the extra disk of a regeneration that changes 25 % of the outputs (for the .pt layout,
keeping the previous version means a full copy of the tree).

Run: .venv/bin/python benchmarks/store.py [--scale 1.0] [--repeats 3]
Goals: write and read throughput >= 1.0x torch.save / torch.load, size <= 0.9x the .pt files, regeneration
delta <= 0.3x a copy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import keep_heap_warm

from goldens.codec import from_numpy, to_numpy
from goldens.store import GoldenStore


def make_tree(scale: float, seed: int = 0) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Kernel-like tensors: activations (bf16), FP32 partials and state, int32 indices/metadata,
    MXFP8 payload + E8M0 scales, packed MXFP4 + E4M3 scales. Returns (tensors, output names)."""
    from kernels import quant

    g = torch.Generator().manual_seed(seed)
    rows = max(64, int(16384 * scale))
    t: dict[str, torch.Tensor] = {}
    t["in/x"] = (torch.randn((rows, 2048), generator=g) * 0.5).to(torch.bfloat16)  # 64 MB at scale 1
    t["in/state"] = torch.randn((rows // 4, 2048), generator=g)  # 32 MB
    t["in/topk"] = torch.randint(-1, 1 << 20, (rows, 512), generator=g, dtype=torch.int32)  # 32 MB
    t["in/positions"] = torch.arange(rows * 64, dtype=torch.int32).reshape(rows, 64)  # 4 MB
    win = quant.mx_quantize(torch.randn((rows, 1024), generator=g), "window")  # 16 MB + scales
    cmp_ = quant.mx_quantize(torch.randn((rows * 2, 1024), generator=g), "compressed")  # 16 MB + scales
    t["out/window_payload"], t["out/window_scale"] = win.payload, win.scale
    t["out/compressed_payload"], t["out/compressed_scale"] = cmp_.payload, cmp_.scale
    t["out/latent"] = torch.randn((rows, 1024), generator=g).to(torch.bfloat16)  # 32 MB
    t["out/partial"] = torch.randn((rows // 4, 1024), generator=g)  # 16 MB
    return t, [k for k in t if k.startswith("out/")]


def nbytes(t: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in t.values())


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def pt_write(tree, root: Path) -> None:
    for name, v in tree.items():
        path = root / f"{name}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(v, path)


def pt_read(tree_names, root: Path) -> dict:
    return {n: torch.load(root / f"{n}.pt", weights_only=True) for n in tree_names}


def cpu_seconds() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def store_write(tree, store: GoldenStore, message: str):
    return store.commit({f"case/replicated/{k}": to_numpy(v) for k, v in tree.items()},
                        {"case/replicated": {"case": "bench"}}, message)


class StorageFloor:
    """The same ``store.commit`` with the store's own work taken out, to show what is left: ``raw`` stores every
    array uncompressed, ``nohash`` also replaces the BLAKE3 digest and CRC32C with a counter (unique, so nothing
    is deduplicated). What remains is icechunk writing the chunk files and the commit -- the floor a store write
    cannot go under. A diagnostic: such a store is not a valid golden store."""

    def __init__(self, nohash: bool):
        import itertools

        import goldens.store as gs

        self.gs, self.nohash, self.count = gs, nohash, itertools.count()

    def __enter__(self):
        gs = self.gs
        self.saved = gs._codecs, gs.digest, gs.checksum
        gs._codecs = lambda arr: []
        if self.nohash:
            gs.digest = lambda arr: f"{gs.DIGEST_PREFIX}{next(self.count):032x}"
            gs.checksum = lambda arr: 0
        return self

    def __exit__(self, *exc):
        self.gs._codecs, self.gs.digest, self.gs.checksum = self.saved


def store_read(tree_names, store: GoldenStore) -> dict:
    reader = store.reader()  # opens the repository and a read-only session, as a replay does
    data = reader.read_many([f"case/replicated/{n}" for n in tree_names])
    return {n: from_numpy(*data[f"case/replicated/{n}"], name=n) for n in tree_names}


COLD = """
import sys, time, torch
sys.path.insert(0, {bench!r})
from store import pt_read, store_read
from goldens.store import GoldenStore
names = {names!r}
t0 = time.perf_counter()
if {which!r} == "pt":
    pt_read(names, __import__("pathlib").Path({pt!r}))
else:
    store_read(names, GoldenStore({store!r}))
print(time.perf_counter() - t0)
"""


def cold_reads(names, pt_root: Path, store_root: Path, repeats: int) -> tuple[float, float]:
    """Median time of the first read in a fresh Python process (imports excluded), .pt vs store, interleaved."""
    import subprocess
    import sys

    bench = str(Path(__file__).resolve().parent)
    out = {"pt": [], "store": []}
    for _ in range(repeats):
        for which in ("pt", "store"):
            code = COLD.format(bench=bench, names=names, which=which, pt=str(pt_root), store=str(store_root))
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                  cwd=str(Path(bench).parent))
            out[which].append(float(proc.stdout.strip().splitlines()[-1]))
    return statistics.median(out["pt"]), statistics.median(out["store"])


def regenerate(tree, outputs, fraction: float = 0.25, seed: int = 1) -> dict:
    """Change whole output arrays totalling ~``fraction`` of the output bytes (as a rounding fix would)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(tree[k].numel() * tree[k].element_size() for k in outputs)
    new, changed = dict(tree), 0
    for k in sorted(outputs, key=lambda k: tree[k].numel() * tree[k].element_size()):
        size = tree[k].numel() * tree[k].element_size()
        if changed + size > fraction * total * 1.05:
            continue
        raw = tree[k].contiguous().view(torch.uint8).clone()
        raw ^= torch.randint(0, 2, raw.shape, generator=g, dtype=torch.uint8)  # flip low bits: new values
        new[k] = raw.view(tree[k].dtype).reshape(tree[k].shape)
        changed += size
    return new, changed / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="tree size factor (1.0 ~ 200 MB)")
    parser.add_argument("--default-heap", action="store_true",
                        help="leave glibc's heap policy alone (temporaries may page-fault on every call)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    heap = "default heap" if args.default_heap else keep_heap_warm()
    tree, outputs = make_tree(args.scale)
    names = list(tree)
    size = nbytes(tree)
    tmp = Path(tempfile.mkdtemp(prefix="pto-bench-"))
    try:
        # writes: interleaved, each into a fresh directory / store, median of the repeats (a single write here
        # swings 2x with the page cache's writeback)
        pt_ws, st_ws, floors = [], [], {"raw": [], "raw, no hashes": []}
        cpu = {"pt": [], "store": []}  # CPU seconds of this process's threads (icechunk's writers among them)
        for i in range(args.repeats):
            pt_root, store = tmp / f"pt{i}", GoldenStore(tmp / f"store{i}")
            os.sync()  # each write starts with no dirty pages: none pays for the writeback of the one before
            t0, c0 = time.perf_counter(), cpu_seconds()
            pt_write(tree, pt_root)
            pt_ws.append(time.perf_counter() - t0)
            cpu["pt"].append(cpu_seconds() - c0)
            os.sync()
            t0, c0 = time.perf_counter(), cpu_seconds()
            store_write(tree, store, "record")
            st_ws.append(time.perf_counter() - t0)
            cpu["store"].append(cpu_seconds() - c0)
            for kind, samples in floors.items():
                floor_store = GoldenStore(tmp / f"floor{i}")
                with StorageFloor(nohash=kind != "raw"):
                    os.sync()
                    t0 = time.perf_counter()
                    store_write(tree, floor_store, "record")
                    samples.append(time.perf_counter() - t0)
                shutil.rmtree(floor_store.root)
            if i + 1 < args.repeats:
                shutil.rmtree(pt_root)
                shutil.rmtree(store.root)
        pt_w, st_w = statistics.median(pt_ws), statistics.median(st_ws)
        pt_read(names, pt_root)
        store_read(names, store)  # warm both
        pt_r, st_r = [], []
        for _ in range(args.repeats):  # interleaved
            t0 = time.perf_counter()
            a = pt_read(names, pt_root)
            pt_r.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = store_read(names, store)
            st_r.append(time.perf_counter() - t0)
        for n in names:
            assert torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)), n
        uncached = GoldenStore(store.root)
        uncached.read_cache = None  # straight from the icechunk chunks (another machine's first replay)
        nc_r = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            store_read(names, uncached)
            nc_r.append(time.perf_counter() - t0)
        pt_c, st_c = cold_reads(names, pt_root, store.root, args.repeats)
        pt_size, st_size = dir_bytes(pt_root), store.disk_bytes()
        new, frac = regenerate(tree, outputs)
        copy_size = pt_size  # keeping the previous .pt version = a full copy of the tree
        before = store.disk_bytes()
        store_write(new, store, "regen")
        st_delta = store.disk_bytes() - before
        pt_rm, st_rm = statistics.median(pt_r), statistics.median(st_r)
        print(f"tree: {len(names)} tensors, {size / 1e6:.1f} MB logical; regeneration changes {frac:.0%} of the "
              f"output bytes; torch threads {torch.get_num_threads()}; {heap}; read = median of {args.repeats} warm runs")
        print(f"{'':28} {'torch.save/.pt':>16} {'golden store':>14} {'store/.pt':>10}  goal")
        print(f"{'write (s)':28} {pt_w:16.3f} {st_w:14.3f} {st_w / pt_w:10.2f}")
        print(f"{'write throughput':28} {'':16} {'':14} {pt_w / st_w:10.2f}x  >= 1.0x (median of {args.repeats})")
        pt_cpu, st_cpu = statistics.median(cpu["pt"]), statistics.median(cpu["store"])
        print(f"{'write CPU (s, all threads)':28} {pt_cpu:16.3f} {st_cpu:14.3f} {st_cpu / pt_cpu:10.2f}  "
              f"(on {os.cpu_count()} cores a write cannot take less than CPU / cores)")
        for kind, samples in floors.items():
            fl = statistics.median(samples)
            print(f"{'  floor: ' + kind + ' (s)':28} {pt_w:16.3f} {fl:14.3f} {fl / pt_w:10.2f}  "
                  f"({pt_w / fl:.2f}x; the same commit without the store's {'compression' if kind == 'raw' else 'compression and checksums'})")
        print(f"{'warm read (s)':28} {pt_rm:16.3f} {st_rm:14.3f} {st_rm / pt_rm:10.2f}")
        print(f"{'read throughput (MB/s)':28} {size / 1e6 / pt_rm:16.0f} {size / 1e6 / st_rm:14.0f} "
              f"{pt_rm / st_rm:10.2f}x  >= 1.0x")
        nc_rm = statistics.median(nc_r)
        print(f"{'read, no read cache (s)':28} {pt_rm:16.3f} {nc_rm:14.3f} {nc_rm / pt_rm:10.2f}  (chunks only)")
        print(f"{'cold read (s, fresh process)':28} {pt_c:16.3f} {st_c:14.3f} {st_c / pt_c:10.2f}")
        print(f"{'cold read throughput':28} {'':16} {'':14} {pt_c / st_c:10.2f}x  >= 0.8x")
        print(f"{'disk (MB)':28} {pt_size / 1e6:16.1f} {st_size / 1e6:14.1f} {st_size / pt_size:10.2f}x  <= 0.9x")
        print(f"{'regen extra disk (MB)':28} {copy_size / 1e6:16.1f} {st_delta / 1e6:14.1f} "
              f"{st_delta / copy_size:10.2f}x  <= 0.3x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
