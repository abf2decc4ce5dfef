"""The test double of upstream's ``golden`` package (tests/fake_upstream/golden) against the real one.

``describe`` runs in a fresh interpreter with one pypto-lib root first on the path (the real package sets
torch's thread count at import; nothing of it enters this process) and reports, as JSON, what the binding
relies on: the signatures of ``run``, ``run_jit`` and ``validate_golden``; the fields and defaults of
``TensorSpec``, ``ScalarSpec`` and ``RunResult``; and behaviour -- ``TensorSpec.create_tensor`` for every kind of
``init_value``, the ``resident`` checks, ``ScalarSpec`` coercion and refusals, which files a ``golden_data``
directory must hold per spec kind, and how ``validate_golden`` calls a ``compare_fn`` and judges the rest.

Without a checkout the double is held to the facts pinned below (read from upstream main); with
``PYPTO_LIB_ROOT`` the double's description must equal the real package's, and a difference names the
checkout's commit and the one the double was last checked against (``golden.CHECKED_AGAINST``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_upstream"

PROBE = r'''
import dataclasses, inspect, json, sys
import torch
sys.path.insert(0, sys.argv[1])
import golden
from golden import runner, spec

def sig(fn):
    return [(p.name, repr(p.default) if p.default is not inspect.Parameter.empty else None, str(p.kind))
            for p in inspect.signature(fn).parameters.values()]

def fields(cls):
    return [(f.name, repr(f.default) if f.default is not dataclasses.MISSING else None) for f in dataclasses.fields(cls)]

def outcome(fn):
    try:
        value = fn()
    except Exception as exc:
        return ["raises", type(exc).__name__]
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape), value.float().flatten()[:3].tolist()]
    return ["value", repr(value)]

T = golden.TensorSpec
S = golden.ScalarSpec
out = {
    "run": sig(golden.run), "run_jit": sig(golden.run_jit), "validate_golden": sig(golden.validate_golden),
    "TensorSpec": fields(T), "ScalarSpec": fields(S), "RunResult": fields(golden.RunResult),
    "create": {k: outcome(f) for k, f in {
        "none": lambda: T("a", [2, 3], torch.float32).create_tensor(),
        "const": lambda: T("a", [2], torch.bfloat16, init_value=2.5).create_tensor(),
        "tensor": lambda: T("a", [2], torch.float32, init_value=torch.tensor([1, 2], dtype=torch.int32)).create_tensor(),
        "factory": lambda: T("a", [2, 2], torch.float32, init_value=torch.ones).create_tensor(),
        "callable": lambda: T("a", [3], torch.int32, init_value=lambda: [4.0, 5.0, 6.0]).create_tensor(),
    }.items()},
    "resident": {k: outcome(f) for k, f in {
        "true": lambda: T("a", [1], torch.float32, resident=True), "neg": lambda: T("a", [1], torch.float32, resident=-1),
        "stacked": lambda: T("a", [1], torch.float32, resident="stacked").is_resident,
        "zero": lambda: T("a", [1], torch.float32, resident=0).is_resident,
        "off": lambda: T("a", [1], torch.float32).is_resident,
        "word": lambda: T("a", [1], torch.float32, resident="yes"),
    }.items()},
    "scalar": {k: outcome(f) for k, f in {
        "int32": lambda: S("n", torch.int32, 7).value, "int32_bool": lambda: S("n", torch.int32, True),
        "int32_big": lambda: S("n", torch.int32, 2**31), "int8_float": lambda: S("n", torch.int8, 1.0),
        "f32_int": lambda: S("n", torch.float32, 3).value, "bool_int": lambda: S("n", torch.bool, 1),
        "bool": lambda: S("n", torch.bool, True).value, "tensor_ok": lambda: S("n", torch.int64, torch.tensor(5)).value,
        "tensor_dtype": lambda: S("n", torch.int32, torch.tensor(5)), "tensor_rank": lambda: S("n", torch.int64, torch.tensor([5])),
        "uint16": lambda: S("n", torch.uint16, 1), "to_python": lambda: S("n", torch.int32, 9).to_python(),
    }.items()},
    "golden_data_files": {
        "scalar": runner._required_files(S("n", torch.int32, 1)),
        "input": runner._required_files(T("x", [1], torch.float32)),
        "output": runner._required_files(T("y", [1], torch.float32, is_output=True)),
        "inout": runner._required_files(T("z", [1], torch.float32, init_value=0.0, is_output=True)),
    },
}
seen = {}
def spy(actual, expected, **kw):
    seen.update({"args": [list(actual.shape), list(expected.shape)], "kwargs": sorted(kw),
                 "rtol": kw["rtol"], "inputs": sorted(kw["inputs"]), "outputs": sorted(kw["actual_outputs"])})
    return True, "ok"
a = {"p": torch.zeros(2), "q": torch.ones(3)}
g = {"p": torch.ones(2), "q": torch.ones(3)}
out["validate_custom"] = outcome(lambda: golden.validate_golden(a, g, rtol=0.5, atol=0.0, compare_fn={"p": spy},
                                                                  inputs={"x": torch.zeros(1)}))
out["validate_spy"] = seen
bad = {"p": torch.zeros(2), "q": torch.zeros(3)}
try:
    golden.validate_golden(bad, g, compare_fn={"p": spy})
    out["validate_default"] = "passed"
except AssertionError as exc:
    out["validate_default"] = ["AssertionError", "'q'" in str(exc), "'p'" in str(exc)]
def refusal(fn, **kw):
    try:
        result = fn(None, [], **kw)
    except ModuleNotFoundError as exc:  # the real run imports pypto first: only upstream's toolchain Python has it
        if (exc.name or "").split(".")[0] == "pypto":
            return "needs pypto"
        raise
    return [bool(result.passed), str(result.error)]
out["runtime_dir"] = {f"{name}_{k}": outcome(lambda: refusal(fn, **kw)) for name, fn in (("run", golden.run), ("run_jit", golden.run_jit))
                      for k, kw in {"missing": {"runtime_dir": "/nonexistent/pto-runtime-dir"},
                                    "compile_only": {"runtime_dir": sys.argv[1], "compile_only": True}}.items()}
out["threads"] = torch.get_num_threads()
print(json.dumps(out))
'''

# Facts of upstream main's golden package (634e77bd), held by the double even without a checkout
PINNED_RUN = ["program", "specs", "golden_fn", "golden_data", "compile_cfg", "runtime_cfg", "rtol", "atol",
              "compare_fn", "compile_only", "runtime_dir", "save_data"]
PINNED_TENSOR_SPEC = [("name", None), ("shape", None), ("dtype", None), ("init_value", "None"),
                      ("is_output", "False"), ("resident", "None")]


def describe(root: Path, threads: str = "3", python: list[str] | None = None) -> dict:
    """The probe's JSON for the golden package under ``root``, run by ``python`` (default this interpreter; the
    real package is described by upstream's own Python, ``$PTO_UPSTREAM_PYTHON``, whose pypto ``run`` imports)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYPTO_GOLDEN_NUM_THREADS"] = threads
    proc = forkserver.run([*(python or [sys.executable]), "-c", PROBE, str(root)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(root))
    assert proc.returncode == 0, f"describing the golden package of {root} failed: {proc.stderr[-1500:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_double_keeps_upstreams_pinned_signatures_and_semantics():
    d = describe(FAKE)
    assert [p[0] for p in d["run"]] == PINNED_RUN
    assert [p[0] for p in d["run_jit"]] == ["fn", *PINNED_RUN[1:]]
    assert [tuple(f) for f in d["TensorSpec"]] == PINNED_TENSOR_SPEC
    assert d["golden_data_files"] == {"scalar": [["in", "n.pt"]], "input": [["in", "x.pt"]],
                                      "output": [["out", "y.pt"]], "inout": [["out", "z.pt"], ["in", "z.pt"]]}
    assert d["validate_spy"]["kwargs"] == ["actual_outputs", "atol", "expected_outputs", "inputs", "rtol"]
    assert d["validate_default"] == ["AssertionError", True, False], "only the allclose output fails"
    assert d["runtime_dir"] == {  # RP-04: a replay directory must exist, and a compile-only run takes none
        f"{fn}_{k}": ["value", repr(v)] for fn in ("run", "run_jit") for k, v in (
            ("missing", [False, "runtime_dir does not exist: /nonexistent/pto-runtime-dir"]),
            ("compile_only", [False, "runtime_dir is incompatible with compile_only"]))}
    assert d["threads"] == 3, "like the real package, importing it sets torch's threads (the worker must isolate it)"


@pytest.mark.skipif(not os.environ.get("PYPTO_LIB_ROOT"), reason="needs a pypto-lib checkout (PYPTO_LIB_ROOT)")
def test_the_double_matches_the_real_golden_package():
    from backends.upstream.backend import revision

    real_root = Path(os.environ["PYPTO_LIB_ROOT"]).expanduser()
    from backends.upstream.python import worker_python

    real, double = describe(real_root, python=worker_python()), describe(FAKE)
    sys.path.insert(0, str(FAKE))
    try:
        from golden import CHECKED_AGAINST
    finally:
        sys.path.remove(str(FAKE))
        for name in [m for m in sys.modules if m == "golden" or m.startswith("golden.")]:
            del sys.modules[name]
    # without upstream's toolchain Python the real run stops at its pypto import: those refusals are held to the
    # pinned facts only (test_the_double_keeps_upstreams_pinned_signatures_and_semantics)
    for key in [k for k, v in real["runtime_dir"].items() if v == ["value", repr("needs pypto")]]:
        del real["runtime_dir"][key], double["runtime_dir"][key]
    differ = sorted(k for k in real if real[k] != double.get(k))
    assert not differ, (f"the test double differs from the golden package of {real_root} @ {revision(real_root)} "
                        f"in {differ} (last checked against {CHECKED_AGAINST}): "
                        + "; ".join(f"{k}: real {real[k]} double {double.get(k)}" for k in differ))


def _entry_shape(path: Path, entry: str) -> list[tuple[str, str, str, int]]:
    """(name, kind, dtype, rank) of each parameter of ``entry`` in ``path`` (kind: Tensor, Out, InOut, Scalar,
    DistributedTensor), read from the source: the double's dims are tiny, the real ones the model's."""
    import ast

    fn = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == entry)
    out = []
    for a in fn.args.args:
        node, kind, outer = a.annotation, "", None
        while isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            if node.value.attr in ("Out", "InOut"):  # pl.Out[pl.Tensor[...]]: an output tensor
                outer, node = node.value.attr, node.slice
                continue
            kind = node.value.attr
            break
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        dtype = parts[-1].attr if isinstance(parts[-1], ast.Attribute) else ast.unparse(parts[-1])
        rank = len(parts[0].elts) if len(parts) == 2 and isinstance(parts[0], ast.List) else 0
        out.append((a.arg, outer or kind, dtype, rank))
    return out


DOUBLE_ENTRIES = [("deepseek_v4_pro", "hc_post", "hc_post_test"), ("deepseek_v4_pro", "lm_head", "l3_lm_head"),
                  ("deepseek_v4_pro", "moe", "l3_moe")]


@pytest.mark.skipif(not os.environ.get("PYPTO_LIB_ROOT"), reason="needs a pypto-lib checkout (PYPTO_LIB_ROOT)")
@pytest.mark.parametrize("folder, module, entry", DOUBLE_ENTRIES, ids=[m for _f, m, _e in DOUBLE_ENTRIES])
def test_the_doubles_kernel_entries_declare_the_real_parameters(folder, module, entry):
    """Each kernel entry of the double takes the real entry's parameters: the same names in the same order, each
    an input, output or scalar alike, of the same dtype and rank (the dims are the double's tiny ones)."""
    real = Path(os.environ["PYPTO_LIB_ROOT"]).expanduser() / "models" / folder / f"{module}.py"
    double = FAKE / "models" / folder / f"{module}.py"
    assert _entry_shape(double, entry) == _entry_shape(real, entry), f"{module}.py::{entry}"


def test_the_entry_reader_tells_kinds_dtypes_and_ranks_apart(tmp_path):
    """The reader above sees a renamed, retyped, re-ranked or redirected parameter (so the comparison can fail)."""
    src = tmp_path / "m.py"
    src.write_text("def e(a: pl.Tensor[[N, D], pl.FP32], b: pl.Out[pl.Tensor[[T], pl.BF16]], "
                   "c: pl.Scalar[pl.INT32], d: pld.DistributedTensor[[R, 1], pl.INT32]):\n    pass\n")
    assert _entry_shape(src, "e") == [("a", "Tensor", "FP32", 2), ("b", "Out", "BF16", 1), ("c", "Scalar", "INT32", 0),
                                      ("d", "DistributedTensor", "INT32", 2)]
