"""The upstream-goldens backend (``backends.upstream``) without a pypto-lib checkout: a checkout-shaped folder
written here (a config module and one model module whose "golden" is a few lines of Torch written for this test,
declaring a kernel the way upstream's modules do), so the worker protocol, the import shim, the geometry
overrides, the isolation of upstream's import side effects and the one-line errors are exercised on every CI run.
With ``PYPTO_LIB_ROOT`` naming a real checkout, ``test_real_checkout_gate_matches_the_reference`` runs upstream
main's own gate golden."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from backends import get_backend
from backends.upstream.backend import checkout, make_backend
from backends.upstream.client import UpstreamError, Worker
from contracts.operators import BackendError

# the tests that run a real pypto-lib checkout (CI has none: each names that missing piece)
needs_checkout = pytest.mark.skipif(not os.environ.get("PYPTO_LIB_ROOT"),
                                    reason="needs a pypto-lib checkout (PYPTO_LIB_ROOT)")

CONFIG = '''
import dataclasses, torch

@dataclasses.dataclass(frozen=True)
class Cfg:
    name: str
    hidden_size: int

ACTIVE_BASE = Cfg("pro", 8)
ACTIVE = ACTIVE_BASE
MOE_TOKENS = 4
torch.set_num_threads(1)  # an import side effect, as upstream's golden package has
'''

MODULE = '''
import pypto.language as pl
from config import ACTIVE as M, MOE_TOKENS

T, D = MOE_TOKENS, M.hidden_size
assert D % 512 == 0, "a kernel tiling assert the worker runs without (python -O)"
DYN = pl.dynamic("DYN")

@pl.jit
def kernel(x: pl.Tensor[[T, D], pl.BF16], y: pl.Out[pl.Tensor[[T, D], pl.FP32]]):
    return pl.add(x, x)

def golden_double(tensors):
    tensors["y"][:] = tensors["x"].float().view(T, D) * 2 + len(M.name)

def golden_raises(tensors):
    raise ValueError("bad geometry")
'''

# a whole-stage golden that chains another module's golden imported by name at call time (as moe.py's does), and
# re-derives ACTIVE from ACTIVE_BASE at import (as moe.py does for its EP)
STAGE = '''
import dataclasses
import config

config.ACTIVE = dataclasses.replace(config.ACTIVE_BASE, hidden_size=config.ACTIVE_BASE.hidden_size // 2)
from config import ACTIVE as M

def golden_stage(tensors):
    import os
    os.makedirs("build_output", exist_ok=True)  # upstream's runner writes its work folder where it runs
    from toy import golden_double
    for r in range(tensors["x"].shape[0]):
        golden_double({"x": tensors["x"][r], "y": tensors["y"][r]})
    tensors["width"][:] = M.hidden_size
'''


def _adapted_modules(model: Path) -> None:
    """A layout-only file for each module the folder's adapters name (the backend binds an adapter only where its
    module is in the checkout; these tests call the goldens of toy.py and stage.py)."""
    from backends.upstream.adapters import BY_FOLDER

    for a in BY_FOLDER[model.name].values():
        path = model / f"{a.module_of()}.py"
        if not path.exists():
            path.write_text("# layout only\n")


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("checkout")
    (root / "golden").mkdir()
    (root / "golden" / "runner.py").write_text("# layout only\n")
    model = root / "models" / "deepseek_v4_pro"
    model.mkdir(parents=True)
    (model / "config.py").write_text(textwrap.dedent(CONFIG))
    (model / "toy.py").write_text(textwrap.dedent(MODULE))
    (model / "stage.py").write_text(textwrap.dedent(STAGE))
    _adapted_modules(model)
    return root


def test_without_a_checkout_the_backend_is_unavailable_with_one_line(monkeypatch):
    monkeypatch.delenv("PYPTO_LIB_ROOT", raising=False)
    b = get_backend("upstream")
    assert b.unavailable and "--pypto-lib" in b.unavailable and b.operators == ()
    with pytest.raises(BackendError, match="'upstream' runs on the CPU: --platform a5sim"):
        get_backend("upstream", platform="a5sim")


def test_a_folder_without_golden_or_models_is_not_a_checkout_and_every_missing_piece_is_named(tmp_path):
    why = checkout(str(tmp_path))[1]
    assert "has no golden/runner.py" in why and "has none of models/" in why, why  # both, in one go
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "runner.py").write_text("")
    why = checkout(str(tmp_path))[1]
    assert "has none of models/" in why and "runner.py" not in why, why
    why = checkout(str(tmp_path / "nowhere"))[1]
    assert "does not exist" in why and "runner.py" not in why, why  # not "runner.py is missing"


def test_the_worker_runs_a_golden_at_the_asked_geometry_and_keeps_side_effects_out(fake_root):
    threads, path = torch.get_num_threads(), list(sys.path)
    w = Worker(fake_root)
    try:
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
        out = w.call("deepseek_v4_pro", "toy", "golden_double", {"x": x, "y": torch.zeros(3, 4)},
                     fields={"hidden_size": 4, "name": "flash"}, constants={"MOE_TOKENS": 3})
        assert torch.equal(out["y"], x.float() * 2 + 5), "geometry or config fields not applied"
        assert w.info["shim"] is True, "the pypto shim should stand in where the toolchain is absent"
        again = w.call("deepseek_v4_pro", "toy", "golden_double", {"x": x[:2, :2], "y": torch.zeros(2, 2)},
                       fields={"hidden_size": 2}, constants={"MOE_TOKENS": 2})
        assert torch.equal(again["y"], x[:2, :2].float() * 2 + 3)
        with pytest.raises(UpstreamError, match=r"toy.py::golden_raises raised ValueError: bad geometry \(at toy.py"):
            w.call("deepseek_v4_pro", "toy", "golden_raises", {}, fields={"hidden_size": 4})
        with pytest.raises(UpstreamError, match="no NOT_A_CONSTANT"):
            w.call("deepseek_v4_pro", "toy", "golden_double", {}, constants={"NOT_A_CONSTANT": 1})
        with pytest.raises(UpstreamError, match="models/deepseek_v4_1_flash is not in this checkout"):
            w.call("deepseek_v4_1_flash", "toy", "golden_double", {})
    finally:
        w.close()
    assert torch.get_num_threads() == threads and sys.path == path, "upstream's import side effects leaked"
    assert not any(m == "config" or m.startswith("pto_upstream_") for m in sys.modules), "upstream modules leaked"


def test_taps_observe_a_chained_golden_per_call_and_put_it_back(fake_root):
    """A tap copies the named entries after each call of a golden the stage golden imports by name (one dict per
    call, in order) and only when asked; config fields reach ACTIVE_BASE too, so a module re-deriving
    ACTIVE from it at import (moe.py's EP) sees this geometry."""
    w = Worker(fake_root)
    try:
        x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).to(torch.bfloat16)
        tensors = {"x": x, "y": torch.zeros(2, 3, 4), "width": torch.zeros(1)}
        fields, constants = {"hidden_size": 8, "name": "flash"}, {"MOE_TOKENS": 3}
        out = w.call("deepseek_v4_pro", "stage", "golden_stage", tensors, fields=fields, constants=constants,
                     taps={"toy.golden_double": ["y"]})
        seen = out["toy.golden_double"]
        assert len(seen) == 2 and all(torch.equal(seen[r]["y"], x[r].float() * 2 + 5) for r in range(2))
        assert int(out["width"]) == 4, "ACTIVE_BASE was not given the call's fields"
        plain = w.call("deepseek_v4_pro", "stage", "golden_stage", {**tensors, "y": torch.zeros(2, 3, 4)},
                       fields=fields, constants=constants)
        assert "toy.golden_double" not in plain and torch.equal(plain["y"], out["y"]), "a tap answered a call that asked for none"
        workdir = Path(w.workdir)
        assert (workdir / "build_output").is_dir() and not (Path.cwd() / "build_output").exists(), \
            "the worker wrote into the caller's folder"
    finally:
        w.close()
    assert not workdir.exists(), "the worker's work folder outlived it"


def test_the_backend_lists_every_operator_it_does_not_run_with_a_reason(fake_root):
    b = make_backend(str(fake_root))
    from backends.upstream.adapters import ADAPTERS

    assert b.operators == tuple(sorted(ADAPTERS)) and b.variants == {
        "v4_gate": {"dequant_factor": "reciprocal"}, "v4_prefill_indexer": {"padding_rows": "scored_capped"}}
    assert set(b.deviations) == {"batched-host-matmul", "fp32-layer-chain", "topk-tie-order", "cp-csa-seed-state"} \
        and all(b.deviations.values())
    from backends.upstream.adapters import PENDING

    assert PENDING == {}, f"upstream goldens not adapted: {PENDING}"
    assert "moe.py::golden_moe is the whole stage" in b.why_missing["v4_moe"]
    assert "fuses hc_mixes and hc_pre" in b.why_missing["hc_pre"]
    assert b.why_missing["build_forward_metadata"] == "no golden of models/deepseek_v4_pro is adapted for it"
    assert set(b.why_missing) | set(b.operators) >= {"v4_gate", "v4_moe", "sp_bounds"}


FLASH_CONFIG = CONFIG.replace('ACTIVE_BASE = Cfg("pro", 8)\nACTIVE = ACTIVE_BASE', 'FLASH = Cfg("flash", 8)')
FLASH_MODULE = MODULE.replace("from config import ACTIVE as M", "from config import FLASH as M")


@pytest.fixture(scope="module")
def flash_root(tmp_path_factory) -> Path:
    """A checkout-shaped folder with main's two V4-Flash folders, whose modules import ``FLASH as M``."""
    root = tmp_path_factory.mktemp("flash-checkout")
    (root / "golden").mkdir()
    (root / "golden" / "runner.py").write_text("# layout only\n")
    for folder in ("deepseek_v4_flash_mtp", "deepseek_v4_flash_dspark"):
        model = root / "models" / folder
        model.mkdir(parents=True)
        (model / "config.py").write_text(textwrap.dedent(FLASH_CONFIG))
        (model / "toy.py").write_text(textwrap.dedent(FLASH_MODULE))
        _adapted_modules(model)
    return root


def test_one_worker_switching_folders_imports_each_folders_own_config(tmp_path):
    """One worker asked for V4-Pro's folder, then dspark's, then V4-Pro's again imports each folder's own
    ``config`` (and helpers) every time: no module of the previous folder is found by name (a stale V4-Pro config
    made dspark's ``from config import FLASH`` fail on a real checkout)."""
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "runner.py").write_text("# layout only\n")
    for folder, config, module in (("deepseek_v4_pro", CONFIG, MODULE),
                                   ("deepseek_v4_flash_dspark", FLASH_CONFIG, FLASH_MODULE)):
        model = tmp_path / "models" / folder
        model.mkdir(parents=True)
        (model / "config.py").write_text(textwrap.dedent(config))
        (model / "toy.py").write_text(textwrap.dedent(module))
    w = Worker(tmp_path)
    try:
        x = torch.ones(3, 4).to(torch.bfloat16)
        # y = 2x + len(the folder's model name): "pro" 5, "flash" 7
        for folder, want in (("deepseek_v4_pro", 5.0), ("deepseek_v4_flash_dspark", 7.0), ("deepseek_v4_pro", 5.0)):
            out = w.call(folder, "toy", "golden_double", {"x": x, "y": torch.zeros(3, 4)},
                         fields={"hidden_size": 4}, constants={"MOE_TOKENS": 3})
            assert torch.equal(out["y"], torch.full((3, 4), want)), f"{folder}: another folder's config was read"
    finally:
        w.close()


def _pro_checkout(root: Path, **modules: str) -> Path:
    """A checkout-shaped folder at ``root`` with V4-Pro's folder holding CONFIG and ``modules`` (name -> source)."""
    (root / "golden").mkdir()
    (root / "golden" / "runner.py").write_text("# layout only\n")
    model = root / "models" / "deepseek_v4_pro"
    model.mkdir(parents=True)
    (model / "config.py").write_text(textwrap.dedent(CONFIG))
    for name, source in modules.items():
        (model / f"{name}.py").write_text(source)
    return root


def test_a_golden_gets_its_keyword_arguments_beside_its_tensors(tmp_path):
    """A golden taking keyword arguments after its tensors (``golden_lm_head_all_ranks(tensors, *, n_ranks)``) gets
    the call's ``kwargs``; without them it raises, named, as any golden does."""
    w = Worker(_pro_checkout(tmp_path, toy="def golden_scaled(tensors, *, n_ranks):\n"
                                           "    tensors['y'][:] = tensors['x'] * n_ranks\n"))
    try:
        x = torch.arange(6.0).reshape(2, 3)
        out = w.call("deepseek_v4_pro", "toy", "golden_scaled", {"x": x, "y": torch.zeros(2, 3)}, kwargs={"n_ranks": 3})
        assert torch.equal(out["y"], x * 3), "the keyword argument did not reach the golden"
        with pytest.raises(UpstreamError, match="n_ranks"):
            w.call("deepseek_v4_pro", "toy", "golden_scaled", {"x": x, "y": torch.zeros(2, 3)})
    finally:
        w.close()


def test_a_module_named_native_is_imported_at_the_folders_own_geometry(tmp_path):
    """A module that checks the model's tiling at import (as dspark's decode_o_proj.py) raises when the golden's
    module imports it at a tiny geometry; named ``native``, it is imported first at the folder's own geometry and
    the golden (imported at the call's fields) finds it by name."""
    w = Worker(_pro_checkout(tmp_path, tiled="from config import ACTIVE as M\nWIDTH = M.hidden_size\n"
                                             "if WIDTH % 8:\n    raise ValueError(f'width {WIDTH} is not a tile of 8')\n",
                             stage="from config import ACTIVE as M\nimport tiled\n\n"
                                   "def golden_stage(tensors):\n"
                                   "    tensors['y'][:] = tiled.WIDTH * 100 + M.hidden_size\n"))
    try:
        with pytest.raises(UpstreamError, match="not a tile of 8"):
            w.call("deepseek_v4_pro", "stage", "golden_stage", {"y": torch.zeros(1)}, fields={"hidden_size": 4})
        out = w.call("deepseek_v4_pro", "stage", "golden_stage", {"y": torch.zeros(1)}, fields={"hidden_size": 4},
                     native=("tiled",))
        assert float(out["y"]) == 804.0, "tiled was not imported at the folder's own width (8) before the fields"
    finally:
        w.close()


def test_a_flash_folder_takes_its_geometry_on_its_own_model_object(flash_root):
    """The Flash folders import ``FLASH as M``: the worker's field overrides land there (on V4-Pro's ``ACTIVE`` they
    would leave the module at the folder's own dims)."""
    w = Worker(flash_root)
    try:
        x = torch.ones(3, 4).to(torch.bfloat16)
        out = w.call("deepseek_v4_flash_mtp", "toy", "golden_double", {"x": x, "y": torch.zeros(3, 4)},
                     fields={"hidden_size": 4, "name": "ab"}, constants={"MOE_TOKENS": 3})
        assert torch.equal(out["y"], torch.full((3, 4), 4.0)), "the fields did not reach config.FLASH"
    finally:
        w.close()


def test_the_model_folder_selects_the_adapters_and_an_unknown_one_is_a_usage_error(flash_root, fake_root):
    from backends.upstream.adapters import BY_FOLDER

    mtp = make_backend(str(flash_root), "deepseek_v4_flash_mtp")
    assert mtp.operators == tuple(sorted(BY_FOLDER["deepseek_v4_flash_mtp"])) and "lookup_embedding" in mtp.operators
    assert mtp.variants["v4_gate"] == {"dequant_factor": "rounded-reciprocal"}, "the Flash golden's own factor rule"
    assert mtp.provenance["folder"] == "deepseek_v4_flash_mtp" and "models/deepseek_v4_flash_mtp" in mtp.description
    assert "no golden of models/deepseek_v4_flash_mtp is adapted" in mtp.why_missing["v4_sparse_attention"]
    pro = make_backend(str(fake_root))
    assert "lookup_embedding" not in pro.operators and pro.variants["v4_gate"] == {"dequant_factor": "reciprocal"}
    missing = make_backend(str(fake_root), "deepseek_v4_flash_dspark")
    assert missing.unavailable and "has no models/deepseek_v4_flash_dspark" in missing.unavailable
    with pytest.raises(BackendError, match="--model deepseek_v4_1_flash: expected one of deepseek_v4_pro"):
        make_backend(str(flash_root), "deepseek_v4_1_flash")
    with pytest.raises(BackendError, match=r"'torch' runs on the CPU: --model deepseek_v4_flash_mtp"):
        get_backend("torch", model="deepseek_v4_flash_mtp")
    with pytest.raises(BackendError, match="--model deepseek_v4_1_flash: expected one of"):
        get_backend("pypto", model="deepseek_v4_1_flash")


def _flash_mtp_folder(root: Path) -> Path:
    """A checkout-shaped ``root`` with an empty Flash-MTP folder (its config only): the folder."""
    (root / "golden").mkdir(parents=True)
    (root / "golden" / "runner.py").write_text("# layout only\n")
    model = root / "models" / "deepseek_v4_flash_mtp"
    model.mkdir(parents=True)
    (model / "config.py").write_text(textwrap.dedent(FLASH_CONFIG))
    return model


def test_an_adapted_golden_whose_module_the_checkout_lacks_is_left_out_and_named(tmp_path):
    """An older main without one of the adapted modules: that operator is not bound (its trees replay as SKIP, its
    contracts use the reference or skip), and why_missing names the file; the others stay bound."""
    root = tmp_path / "old-main"
    model = _flash_mtp_folder(root)
    _adapted_modules(model)
    (model / "prefill_cp_swa.py").unlink()
    b = make_backend(str(root), "deepseek_v4_flash_mtp")
    assert "prefill_cp_swa" not in b.operators and "v4_gate" in b.operators
    assert "has no models/deepseek_v4_flash_mtp/prefill_cp_swa.py" in b.why_missing["prefill_cp_swa"], \
        b.why_missing["prefill_cp_swa"]


@needs_checkout
def test_real_checkout_gate_matches_the_reference():
    """Upstream main's gate golden against this project's v4_gate on one score layer: codes and routes equal;
    scale and weights within the contract's bounds (upstream's FP32 two-stage row sums, its reciprocal factor)."""
    from contracts.test_v4_gate import MODELS, _call, _independent, _inputs, _judge

    b = make_backend(os.environ["PYPTO_LIB_ROOT"])
    config = MODELS[0]
    i = _inputs(config, 3)
    _judge(config, _call(b, config, i, 61), _independent(config, i, 61), i)


def test_the_worker_python_comes_from_the_environment_and_a_bad_one_is_named(fake_root, monkeypatch):
    """$PTO_UPSTREAM_PYTHON (e.g. the a5sim toolchain's chroot Python from scripts/a5sim-setup.sh) runs the worker;
    one that cannot start it is named in one line."""
    from backends.upstream.client import worker_python

    monkeypatch.setenv("PTO_UPSTREAM_PYTHON", f"{sys.executable} -X utf8")
    assert worker_python() == [sys.executable, "-X", "utf8"]  # a command line, split as the shell would
    for command, said in (("/bin/false", r"did not start with /bin/false .*PTO_UPSTREAM_PYTHON chose it"),
                          ("/nonexistent/python", r"did not start with /nonexistent/python: No such file")):
        monkeypatch.setenv("PTO_UPSTREAM_PYTHON", command)
        w = Worker(fake_root)
        try:
            with pytest.raises(UpstreamError, match=said):
                w.ready()
        finally:
            w.close()
    monkeypatch.delenv("PTO_UPSTREAM_PYTHON")
    assert worker_python() == [sys.executable]


def test_the_toolchain_check_names_each_missing_piece_and_the_bf16_probe_can_fail(tmp_path, monkeypatch):
    """goldens doctor's a5sim rows (computed in the worker's environment): without pypto, its runtime and ptoas each
    is MISSING with the set-up command; a g++-15 whose -std=c++23 lacks std::bfloat16_t (g++-12's case, where
    pto-isa silently takes BF16 for _Float16) is MISSING, one that has it is ok."""
    from backends.upstream.worker import BF16_PROBE, toolchain_facts

    fake = tmp_path / "bin"
    fake.mkdir()
    gxx = fake / "g++-15"
    log = tmp_path / "probe.cpp"
    # a stand-in compiler: --version answers; a compile keeps its input and fails unless told to pass
    gxx.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "g++-15 (stand-in) 15"; exit 0; fi\n'
                   f'cat > {log}\n[ -n "$PROBE_PASSES" ] || {{ echo "error: no std::bfloat16_t" >&2; exit 1; }}\n')
    gxx.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    monkeypatch.delenv("PTOAS_ROOT", raising=False)
    monkeypatch.delenv("PROBE_PASSES", raising=False)
    rows = {piece: (state, detail) for state, piece, detail in toolchain_facts()}
    assert rows["std::bfloat16_t"][0] == "MISSING" and "_Float16" in rows["std::bfloat16_t"][1]
    assert log.read_text() == BF16_PROBE and "__STDCPP_BFLOAT16_T__" in BF16_PROBE
    assert rows["PTO assembler"][0] == "MISSING" and "a5sim-setup.sh" in rows["PTO assembler"][1]
    if "pypto" in rows and rows["pypto"][0] == "MISSING":  # CI: no toolchain (the a5sim chroot has one)
        assert "a5sim-setup.sh" in rows["pypto"][1]
    monkeypatch.setenv("PROBE_PASSES", "1")
    ptoas = fake / "ptoas"
    ptoas.write_text("#!/bin/sh\necho 'ptoas 0.57 (stand-in)'\n")
    ptoas.chmod(0o755)
    monkeypatch.setenv("PTOAS_ROOT", str(fake))
    rows = {piece: (state, detail) for state, piece, detail in toolchain_facts()}
    assert rows["std::bfloat16_t"][0] == "ok" and rows["g++-15"] == ("ok", "g++-15 (stand-in) 15")
    assert rows["PTO assembler"] == ("ok", f"{ptoas}: ptoas 0.57 (stand-in)")


def test_a_compressor_call_is_one_device_step_only_when_it_is_exactly_4_requests_of_2_consecutive_tokens():
    # decode_compressor_ratio4.py::compressor_test is compiled for DECODE_BATCH x DECODE_SEQ = 4 x 2; the adapter
    # launches such a call once, in the request order of the call, and any other call one token at a time
    from backends.upstream.adapters import _bf16_if_exact, _decode_step

    pos = torch.tensor([2, 3, 7, 8, 100, 101, 4094, 4095])
    req = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert _decode_step(pos, req) == [(0, [0, 1]), (1, [2, 3]), (2, [4, 5]), (3, [6, 7])]
    mixed = torch.tensor([0, 2, 1, 3, 4, 6, 5, 7])  # requests interleaved, each in position order: the same steps
    assert _decode_step(pos[mixed], req[mixed]) == [(0, [0, 2]), (1, [1, 3]), (2, [4, 6]), (3, [5, 7])]
    for p, r in ((pos[:6], req[:6]),                                  # 3 requests
                 (torch.tensor([2, 4, 7, 8, 100, 101, 4094, 4095]), req),  # not consecutive
                 (torch.tensor([3, 2, 7, 8, 100, 101, 4094, 4095]), req),  # out of order within the request
                 (torch.tensor([-1, 0, 7, 8, 100, 101, 4094, 4095]), req),  # a padding position
                 (pos, torch.tensor([0, 0, 0, 1, 2, 2, 3, 3]))):             # 3 tokens of one request
        assert _decode_step(p, r) is None, (p, r)
    w = torch.randn(4, 3)
    assert _bf16_if_exact(w.to(torch.bfloat16).float()).dtype == torch.bfloat16
    assert _bf16_if_exact(w + 1e-4).dtype == torch.float32  # not BF16: kept, a kernel then refuses the dtype


def test_the_folder_survey_lists_every_golden_and_refuses_a_folder_the_checkout_lacks(flash_root, capsys):
    from backends.upstream import folders

    rows = folders.folder_rows(flash_root, "deepseek_v4_flash_mtp")
    assert ("toy", "golden_double", "kernel", "not adapted yet") in rows and \
        ("toy", "golden_raises", "kernel", "not adapted yet") in rows, rows
    assert "### models/deepseek_v4_flash_mtp (0 of 2 goldens adapted)" in folders.render(
        flash_root, ("deepseek_v4_flash_mtp",))
    assert folders.main(["--pypto-lib", str(flash_root), "--model", "deepseek_v4_pro"]) == 2
    assert "has no models/deepseek_v4_pro" in capsys.readouterr().err


def test_a_tree_of_one_folders_goldens_is_not_judged_on_another_folders_backend():
    """An ``up-`` tree holds one folder's numbers: on the upstream backend of another folder it is skipped naming
    both (their disagreements are docs/upstream.md's, not that backend's error); on its own folder, and on a
    backend that names no folder (the reference, a device), it is judged."""
    from backends import torch_backend
    from contracts.operators import Backend, Unsupported
    from goldens import trees
    from goldens.store import GoldenStore

    reader = GoldenStore(Path(__file__).resolve().parents[1] / "artifacts" / "store").reader()

    def on(folder):
        ref = torch_backend()
        return Backend("upstream", {n: ref.get(n) for n in ref.operators}, provenance={"folder": folder},
                       variants={"v4_gate": {"dequant_factor": "reciprocal" if folder == "deepseek_v4_pro"
                                             else "rounded-reciprocal"}})

    pro_tree = trees.load_tree(reader, "up-v4_gate_hash", "replicated")  # recorded before trees named a folder
    mtp_tree = trees.load_tree(reader, "up-mtp-v4_gate_hash", "replicated")
    with pytest.raises(Unsupported, match="deepseek_v4_pro's goldens; backend 'upstream' runs models/deepseek_v4_fl"):
        trees.replay(pro_tree, on("deepseek_v4_flash_mtp"))
    with pytest.raises(Unsupported, match="deepseek_v4_flash_mtp's goldens; backend 'upstream' runs models/deepseek_v4_pro"):
        trees.replay(mtp_tree, on("deepseek_v4_pro"))
    assert all(r.ok for r in trees.replay(mtp_tree, on("deepseek_v4_flash_mtp")).values())
    assert set(trees.replay(pro_tree, torch_backend().derive("ref-gate", v4_gate=lambda *a, **k: torch_backend().get(
        "v4_gate")(*a, **{**k, "dequant_factor": "reciprocal"})))) == {"x_norm_i8", "x_norm_scale", "indices", "weights"}


@needs_checkout
@pytest.mark.parametrize("cp", [2, 4])
def test_real_checkout_cp_swa_fixture_is_the_plan(cp):
    """Flash-MTP's CP-SWA fixture builds its metadata itself (prefill_cp_swa.py::build_metadata: zero history,
    equal segments of one window, an identity ring): every table it hands the kernel equals cp_swa_plan's at that
    layout, byte for byte."""
    from backends.upstream.adapters import _variant_fields
    from kernels.config import V4_FLASH
    from kernels.v4.cp_swa import cp_swa_plan

    w = Worker(Path(os.environ["PYPTO_LIB_ROOT"]))
    try:
        tables, _ = w.call("deepseek_v4_flash_mtp", "prefill_cp_swa", "build_metadata", {},
                           fields=_variant_fields(V4_FLASH), constants={"PREFILL_ORI_MAX_BLOCKS": 4},
                           args=(cp,))["result"]
    finally:
        w.close()
    r = V4_FLASH.sliding_window
    ours = cp_swa_plan(2 * cp * r, cp, r, torch.arange(4, dtype=torch.int32), config=V4_FLASH)
    shared = sorted(set(tables) & set(ours))
    assert len(shared) == 12, shared
    for name in shared:
        assert torch.equal(tables[name].to(torch.int32), ours[name]), f"{name} differs from upstream's fixture"


def test_a_global_names_a_module_before_a_function_of_the_same_name(tmp_path):
    """``module_globals``: "<module>.<NAME>" sets a constant on a module of the folder even where the golden's module
    holds a kernel function of that name (Flash's prefill_indexer imports the kernel prefill_indexer_compressor);
    "<function>.<attr>" sets an attribute a fixture would install on one of the module's functions."""
    root = tmp_path / "co"
    model = _flash_mtp_folder(root)
    (model / "helper.py").write_text("SCALE = 1.0\n\ndef helper(x):\n    return x\n")
    (model / "user.py").write_text(textwrap.dedent('''
        import helper as helper_module
        from helper import helper

        def golden_user(tensors):
            tensors["y"][:] = tensors["x"] * helper_module.SCALE + golden_user._ctx["shift"]
        '''))
    w = Worker(root)
    try:
        out = w.call("deepseek_v4_flash_mtp", "user", "golden_user", {"x": torch.ones(2), "y": torch.zeros(2)},
                     module_globals={"helper.SCALE": 3.0, "golden_user._ctx": {"shift": 0.5}})
        assert torch.equal(out["y"], torch.full((2,), 3.5)), out["y"]
        with pytest.raises(UpstreamError, match="nowhere"):
            w.call("deepseek_v4_flash_mtp", "user", "golden_user", {"x": torch.ones(2), "y": torch.zeros(2)},
                   module_globals={"nowhere.SCALE": 1.0})
    finally:
        w.close()


@needs_checkout
@pytest.mark.parametrize("model", ["deepseek_v4_pro", "deepseek_v4_flash_mtp"])
def test_real_checkout_prefill_attention_gathers_its_keys(model):
    """Disagreement 19: upstream's prefill attention golden (prefill_sparse_attn.py) on a chunk whose windows have
    holes and compressed keys gives v4_attention's prefill form (key_tiles="gathered") byte for byte, and not the
    decode goldens' column tiles; its padding rows are 0."""
    from backends.upstream.backend import CALLED
    from contracts.v4_inputs import prefill_attention_inputs
    from kernels.config import V4_FLASH_TINY, V4_PRO_TINY
    from kernels.v4.sparse_attention import v4_attention

    config = V4_PRO_TINY if model == "deepseek_v4_pro" else V4_FLASH_TINY
    i = prefill_attention_inputs(config, 23, rows=64, start=8)
    args = [i[n] for n in ("q", "ori_kv", "window_indices", "cmp_kv", "cmp_block_table", "compressed", "position_ids",
                           "attn_sink", "freqs_cos", "freqs_sin", "wo_a", "wo_b", "wo_b_scale")]
    b = make_backend(os.environ["PYPTO_LIB_ROOT"], model)
    CALLED.clear()
    got = b.get("v4_attention")("HCA", *args, config=config, seq=64, num_tokens=50)
    assert [f"models/{model}/prefill_sparse_attn.py::golden_prefill_sparse_attn"] == CALLED, CALLED
    assert torch.equal(got, v4_attention("HCA", *args, config=config, seq=64, num_tokens=50)), "not the gathered walk"
    assert not torch.equal(got, v4_attention("HCA", *args, config=config, seq=64, num_tokens=50, key_tiles="columns"))
    assert bool((got[50:] == 0).all())


def test_a_golden_called_inside_an_adapted_golden_is_listed_as_adapted_inside_it(tmp_path):
    """The survey reads the calls: a golden that an adapted golden calls by name -- of its own module, or of another
    importing it, under another name too -- runs under that adapter's contracts ("adapted inside"); one no adapted
    golden calls is not (its module is only read)."""
    from backends.upstream import folders

    model = tmp_path / "models" / "deepseek_v4_flash_mtp"
    model.mkdir(parents=True)
    (model / "rmsnorm.py").write_text(textwrap.dedent('''
        def golden_rms_norm(x, w):
            return x

        def golden_rms_norm_test(tensors):
            tensors["x_normed"][:] = golden_rms_norm(tensors["x"], tensors["norm_w"])

        def golden_unused(tensors):
            pass

        def golden_imported(tensors):
            pass
        '''))
    # an adapted golden of another module importing one of rmsnorm.py's (at call time, under another name)
    (model / "lookup_embedding.py").write_text(textwrap.dedent('''
        def golden_lookup_embedding_test(tensors):
            from rmsnorm import golden_imported as norm_rows
            norm_rows(tensors)
        '''))
    rows = {r[1]: r[3] for r in folders.folder_rows(tmp_path, "deepseek_v4_flash_mtp") if r[0] == "rmsnorm"}
    assert rows == {"golden_rms_norm": "adapted inside `golden_rms_norm_test` (`final_norm`), which calls it",
                    "golden_rms_norm_test": "adapted: `final_norm`",
                    "golden_unused": "not adapted itself (its module is read by `v4_attention_stage`'s adapter)",
                    "golden_imported": "adapted inside `lookup_embedding.py::golden_lookup_embedding_test` "
                                       "(`lookup_embedding`), which calls it"}, rows


@needs_checkout
def test_real_checkout_dspark_attention_keeps_fp32_probabilities():
    """Disagreement 21 on dspark's deployment (16 requests x 7 drafts, windows clamped and full): upstream's
    golden_dspark_attention is within its own compare_fn (dspark_x_out) of the "fp32" probability rule, and past it
    under the kernel's "bf16" rule (on this tree about 7.9 % of x_out's elements against the 5 % quota)."""
    from backends import torch_backend, upstream_backend
    from contracts.compare import COMPARATORS, Context
    from kernels.config import V4_FLASH_DSPARK
    from kernels.v4.dspark_attention import _attention_inputs

    c = V4_FLASH_DSPARK.kernel_preset()
    i = _attention_inputs(17, "replicated", c)
    golden = upstream_backend(os.environ["PYPTO_LIB_ROOT"], "deepseek_v4_flash_dspark").get("dspark_attention")(
        **i, config=c)["x_out"]
    ref = torch_backend().get("dspark_attention")

    def judge(rule):
        ours = ref(**i, config=c, probabilities=rule)["x_out"]
        return COMPARATORS["dspark_x_out"]("x_out", golden, ours, Context(inputs=i, actual_outputs={},
                                                                          expected_outputs={}, params={}))

    fp32, bf16 = judge("fp32"), judge("bf16")
    assert fp32.ok, f"the golden is not the fp32 rule: {fp32}"
    assert not bf16.ok, "the golden is within its bound of the bf16 rule here: the tree no longer separates them"


def test_rank_one_reordered_must_give_rank_zeros_rows():
    """The adapters' rank check: rank 1's rows put in another order are put back and compared with rank 0's, byte
    for byte; a golden that handed rank 1 rank 0's rows (the same bytes in the original order) fails, naming the
    output; an output not per row is compared as it is."""
    from backends.upstream.adapters import _rank1_reordered, _ranks_agree
    from contracts.operators import BackendError

    rows = torch.arange(12.0).reshape(4, 3)
    tensors = {"x": torch.stack([rows, rows]), "cache": torch.stack([rows, rows])}
    order = torch.tensor([3, 2, 1, 0])
    back = _rank1_reordered(tensors, ("x",), order)
    assert torch.equal(tensors["x"][0], rows) and torch.equal(tensors["x"][1], rows[order]), "rank 1 not reordered"
    good = {"y": tensors["x"] * 2, "cache": tensors["cache"]}  # a row-local golden: each rank its own rows
    _ranks_agree(good, ("y",), back, "toy.py", unordered=("cache",))
    bad = {"y": torch.stack([rows, rows]) * 2, "cache": tensors["cache"]}  # rank 1 computed from rank 0's rows
    with pytest.raises(BackendError, match="rank 1 .* differs from rank 0 in y"):
        _ranks_agree(bad, ("y",), back, "toy.py")
    with pytest.raises(BackendError, match="in cache"):
        _ranks_agree({"y": good["y"], "cache": torch.stack([rows, rows + 1])}, ("y",), back, "toy.py",
                     unordered=("cache",))
