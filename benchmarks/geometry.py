"""One attention tree at V4.1-Flash's own geometry (``goldens record --geometry flash``: 400-500 MB) through the
golden store, beside torch.save / torch.load of the same tensors (one .pt file per tensor, upstream's layout),
on a local directory and on an S3 server (moto on loopback, the one the tests use), in the same run:
write (once), read from the chunks (no read cache: another machine's first replay) and read again (the read
cache), each read the median of --repeats interleaved runs, and the whole replay on the reference.

Run: .venv/bin/python benchmarks/geometry.py [--case attn_c1a_full_decode_flash] [--no-s3]
Ratios are torch time / store time: above 1.0 the store is faster.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def start_s3() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.s3_server", "--port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("port "):
        proc.kill()
        raise SystemExit(f"the local S3 server did not start: {line!r}")
    endpoint = f"http://127.0.0.1:{line.split()[1]}"
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"})
    return proc, endpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="attn_c1a_full_decode_flash", help="a --geometry flash case")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--no-s3", action="store_true", help="local directory only")
    parser.add_argument("--repeats", type=int, default=3, help="reads: median of this many interleaved runs")
    args = parser.parse_args()

    import torch

    from backends import torch_backend
    from goldens import trees
    from goldens.cases import geometry_cases, get_case
    from goldens.catalog import tree_path
    from goldens.store import GoldenStore

    if args.case not in geometry_cases("flash"):
        raise SystemExit(f"{args.case}: not a --geometry flash case")
    case, wiring = get_case(args.case), "replicated"
    t_build, (rec, inputs, outputs) = timed(lambda: trees.build_tree(case, wiring, args.seed))
    arrays = trees.tree_arrays(case, rec, inputs, outputs)
    groups = {tree_path(case.name, wiring): rec.to_attrs()}
    tensors = {**{f"in/{k}": v for k, v in inputs.items()},
               **{f"out/{k}": v for k, v in outputs.items() if k not in case.inout}}
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"{case.name}/{wiring}: {len(tensors)} tensors, {size / 1e6:.1f} MB; inputs and reference built in "
          f"{t_build:.1f} s; torch threads {torch.get_num_threads()}", flush=True)
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="pto-geometry-"))
    server = None
    try:
        places = [("local", str(tmp / "store"))]
        if not args.no_s3:
            server, endpoint = start_s3()
            import boto3

            s3 = boto3.client("s3", endpoint_url=endpoint)
            s3.create_bucket(Bucket="bench")
            places.append(("s3 (moto, loopback)", "s3://bench/flash/store"))
        for where, location in places:
            os.environ["PTO_STORE_READ_CACHE"] = str(tmp / f"cache-{len(rows)}")
            store = GoldenStore(location)
            if where == "local":
                pt = tmp / "pt"

                def pt_write(pt=pt):
                    for name, t in tensors.items():
                        (pt / name).parent.mkdir(parents=True, exist_ok=True)
                        torch.save(t, pt / f"{name}.pt")

                def pt_read(pt=pt):
                    return {n: torch.load(pt / f"{n}.pt", weights_only=True) for n in tensors}
            else:
                def pt_write():
                    for name, t in tensors.items():
                        buf = io.BytesIO()
                        torch.save(t, buf)
                        s3.put_object(Bucket="bench", Key=f"pt/{name}.pt", Body=buf.getvalue())

                def pt_read():
                    return {n: torch.load(io.BytesIO(s3.get_object(Bucket="bench", Key=f"pt/{n}.pt")["Body"].read()),
                                          weights_only=True) for n in tensors}
            w_pt, _ = timed(pt_write)
            w_st, _ = timed(lambda store=store: trees._commit_trees(store, arrays, groups, force=True,
                                                                    message="bench", metadata={}))
            cache = Path(os.environ["PTO_STORE_READ_CACHE"])
            r_pts, r_colds, r_warms = [], [], []
            for _ in range(args.repeats):  # interleaved: this machine's reads swing 10x from one to the next
                t, got = timed(pt_read)
                r_pts.append(t)
                store.read_cache = None
                t, tree = timed(lambda store=store: trees.load_tree(store.reader(), case.name, wiring))
                r_colds.append(t)
                store.read_cache = cache
                timed(lambda store=store: trees.load_tree(store.reader(), case.name, wiring))  # fills the cache
                t, tree = timed(lambda store=store: trees.load_tree(store.reader(), case.name, wiring))
                r_warms.append(t)
            r_pt, r_cold, r_warm = (statistics.median(x) for x in (r_pts, r_colds, r_warms))
            def raw(x):
                return x.contiguous().reshape(-1).view(torch.uint8)

            for name, t in inputs.items():
                assert torch.equal(raw(tree.inputs[name]), raw(t)) and torch.equal(raw(got[f"in/{name}"]), raw(t)), name
            replay, results = timed(lambda tree=tree: trees.replay(tree, torch_backend()))
            assert all(r.ok for r in results.values())
            rows.append((where, w_pt, w_st, r_pt, r_cold, r_warm, replay))
            print(f"{where}: done", flush=True)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'':24} {'torch .pt (s)':>14} {'store (s)':>10} {'ratio':>7}   (ratio = torch / store)")
    for where, w_pt, w_st, r_pt, r_cold, r_warm, replay in rows:
        print(f"{where}")
        print(f"{'  write':24} {w_pt:14.2f} {w_st:10.2f} {w_pt / w_st:7.2f}")
        print(f"{'  read, chunks only':24} {r_pt:14.2f} {r_cold:10.2f} {r_pt / r_cold:7.2f}")
        print(f"{'  read, read cache':24} {r_pt:14.2f} {r_warm:10.2f} {r_pt / r_warm:7.2f}")
        print(f"{'  replay on torch':24} {'':14} {replay:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
