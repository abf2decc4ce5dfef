"""The pypto device backend, tested here against the TEST DOUBLE of upstream in tests/fake_upstream (whose
``golden`` package has the real runner's signatures and semantics, checked by tests/test_upstream_double.py):
start-up refusals, the operator table, the run through upstream's ``golden.run_jit`` in the worker with specs
from each entry's declaration and the ``compare_fn`` capture, calls off the compiled geometry refused by name,
a multi-device entry, replay through upstream's ``golden_data`` layout, ``--keep-actual``, seeded wrong kernels
caught, and "nothing ran is not a pass" for pytest and ``goldens replay``. Spec: §4.2, §7.2, §7.3."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backends import get_backend
from backends import pypto as pb
from backends.pypto.table import BINDINGS, PRO_ENTRIES
from contracts.operators import KERNEL_OPERATORS, BackendError
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_upstream"


@pytest.fixture
def fake_upstream(monkeypatch):
    """The test double allowed for this test (it runs in the upstream worker: nothing of it enters this
    process)."""
    monkeypatch.setenv(pb.ALLOW_TEST_DOUBLE, "1")
    yield FAKE
    assert not any(m.split(".")[0] in ("pypto", "golden", "models") for m in sys.modules), "upstream code leaked"


@pytest.fixture
def fake_copy(tmp_path, monkeypatch):
    """A private copy of the double (its own worker, started with this test's environment)."""
    monkeypatch.setenv(pb.ALLOW_TEST_DOUBLE, "1")
    copy = tmp_path / "fake_upstream"
    shutil.copytree(FAKE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYPTO_LIB_ROOT", pb.ALLOW_TEST_DOUBLE,
                                                            "PTO_FAKE_UPSTREAM_DEFECT")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_every_kernel_operator_has_exactly_one_table_row():
    from backends.pypto import v41
    from backends.pypto.table import PENDING
    from backends.upstream.adapters import ADAPTERS

    assert set(BINDINGS) == set(KERNEL_OPERATORS)
    for b in BINDINGS.values():
        assert b.status in ("bound", "not bound", "not exposed", "host", "composition", "not surveyed"), b
        assert b.upstream, b.operator
        if b.status == "bound" and b.upstream.startswith("models/deepseek_v4_1_flash"):
            assert b.program and b.args and b.operator in v41.ADAPTERS, b.operator
        elif b.status == "bound":  # V4-Pro: the adapter's module has an entry
            assert b.operator in ADAPTERS and ADAPTERS[b.operator].module in PRO_ENTRIES, b.operator
        if b.status in ("not bound", "not exposed"):
            assert b.note, f"{b.operator}: a '{b.status}' row must say what is missing or where the work lives"
        assert "not transcribed" not in b.note or b.operator in PENDING, f"{b.operator}: the table is incomplete"


def test_every_prefill_leaf_is_its_decode_twin_with_the_prefill_output_window():
    from backends.pypto.table import BINDINGS

    entries = dict(BINDINGS["attention_half_layer"].variants)
    assert len(entries) == 12, "six decode leaves and six prefill leaves"
    for mode in ("c2a_full", "c2a_reuse", "c1a_full", "c1a_reindex", "c1a_reuse", "swa"):
        (decode,) = [a for e, a in entries.items() if f"decode_attn_{mode}.py" in e]
        (prefill,) = [a for e, a in entries.items() if f"prefill_attn_{mode}.py" in e]
        assert [a.name for a in prefill] == [a.name for a in decode], mode
        window = {a.name: a for a in prefill}["output_window"]
        assert window.shape == "[PREFILL_MAX_TOKENS, D]", mode


def test_unavailable_reasons_are_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("PYPTO_LIB_ROOT", raising=False)
    monkeypatch.delenv(pb.ALLOW_TEST_DOUBLE, raising=False)
    b = get_backend("pypto")
    assert b.unavailable and "--pypto-lib" in b.unavailable and "\n" not in b.unavailable
    assert b.operators == () and b.has("check_row_precision"), "comparators are not backend operators"
    b = get_backend("pypto", pypto_lib=str(tmp_path))
    assert "has no golden/runner.py" in b.unavailable and "has none of models/" in b.unavailable
    b = get_backend("pypto", pypto_lib=str(FAKE))
    assert "test double" in b.unavailable and "never used outside" in b.unavailable
    with pytest.raises(BackendError, match="comma-separated device ids"):
        get_backend("pypto", device="0,x")
    assert pb.parse_devices("3,1") == [3, 1] and pb.parse_devices(None) == [0]
    for bad in ("1,1", "-1", "", "+1", " 1", "1_0", "0,", "\u0661"):  # int() takes "+1", " 1", "1_0" and "\u0661"
        with pytest.raises(BackendError, match="--device"):
            pb.parse_devices(bad)
    with pytest.raises(BackendError, match="runs on the CPU"):
        get_backend("torch", platform="a5")
    # CH-22: the resident CED prefill takes --devices, else $TASK_DEVICE, and exactly four distinct ids
    assert pb.resident_devices("4,5,6,7", {"TASK_DEVICE": "0,1,2,3"}) == [4, 5, 6, 7]
    assert pb.resident_devices(None, {"TASK_DEVICE": "0,1,2,3"}) == [0, 1, 2, 3]
    for given, env, text in ((None, {}, "TASK_DEVICE"), ("0,1,2", {}, "exactly 4"), ("0,1,2,3,4", {}, "exactly 4"),
                             (None, {"TASK_DEVICE": "0,1,1,2"}, "distinct"), ("", {"TASK_DEVICE": "0,1,2,3"}, "4 devices")):
        with pytest.raises(BackendError, match=text):
            pb.resident_devices(given, env)


def test_a_bound_operator_runs_through_upstreams_runner_and_matches_the_reference(fake_upstream):
    from kernels.config import FLASH_TINY
    from kernels.reference.rope import materialize_rope_rows, precompute_rope_tables

    b = get_backend("pypto", pypto_lib=str(fake_upstream))
    assert b.name == "pypto-test-double"
    assert b.operators == ("candidate_blocks", "hc_post", "lm_head", "materialize_rope_rows", "v4_moe_stage")
    assert "not bound" in b.why_missing["o_proj"] and "host" in b.why_missing["sp_shard"]
    assert b.why_missing["v4_gate"] == ("bound to models/deepseek_v4_pro/gate.py::gate_test, which this checkout "
                                        "does not have")
    cos, sin = precompute_rope_tables(300, True, FLASH_TINY)
    pos = torch.tensor([256, -1, 0, 3, 3, 129, -9, 299], dtype=torch.int32)
    want = (torch.full((8, cos.shape[1]), 17.0), torch.full((8, cos.shape[1]), 19.0))
    got = (want[0].clone(), want[1].clone())
    materialize_rope_rows(cos, sin, pos, 6, *want)
    b.get("materialize_rope_rows")(cos, sin, pos, 6, *got)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_run_that_hands_back_no_output_is_an_error_never_a_result(fake_copy, monkeypatch):
    monkeypatch.setenv("PTO_FAKE_UPSTREAM_DEFECT", "runner_skips_validation")  # "passed", compare_fn never called
    b = get_backend("pypto", pypto_lib=str(fake_copy))
    cos = torch.zeros(4, 8)
    with pytest.raises(pb.UpstreamRunError, match=r"run_jit of backends.pypto.programs::materialize_rope_rows "
                                                  r"handed back no \['rope_cos', 'rope_sin'\]"):
        b.get("materialize_rope_rows")(cos, cos.clone(), torch.zeros(2, dtype=torch.int32), 2,
                                       torch.zeros(2, 8), torch.zeros(2, 8))


def test_a_launch_that_never_finishes_is_stopped_after_the_timeout_and_named(fake_copy, monkeypatch):
    """A simulated kernel that waits forever (the V4-Pro SWA and HCA sparse attention on a5sim: docs/a5sim.md)
    does not hang the run: after $PTO_DEVICE_TIMEOUT seconds the worker is stopped and the launch is an error
    naming the entry and the limit; the next call starts a fresh worker. A bad limit is refused."""
    import time

    from backends.upstream.client import UpstreamError, device_timeout

    monkeypatch.setenv("PTO_FAKE_UPSTREAM_DEFECT", "kernel_hangs")
    monkeypatch.setenv("PTO_DEVICE_TIMEOUT", "1.5")
    b = get_backend("pypto", pypto_lib=str(fake_copy))
    g = torch.Generator().manual_seed(0)
    x, r = torch.randn(8, 64, generator=g).to(torch.bfloat16), torch.randn(8, 4, 64, generator=g)
    p, c = torch.rand(8, 4, generator=g), torch.rand(8, 4, 4, generator=g)
    start = time.monotonic()
    with pytest.raises(pb.UpstreamRunError, match=r"hc_post::hc_post_test did not finish within 1.5 s on a5sim "
                                                  r"\(\$PTO_DEVICE_TIMEOUT\); the worker was stopped"):
        b.get("hc_post")(x, r, p, c)
    assert time.monotonic() - start < 60
    monkeypatch.delenv("PTO_FAKE_UPSTREAM_DEFECT")
    from kernels.reference.mhc import hc_post

    assert torch.equal(b.get("hc_post")(x, r, p, c), hc_post(x, r, p, c))  # a fresh worker
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv("PTO_DEVICE_TIMEOUT", bad)
        with pytest.raises(UpstreamError, match="expected a positive number of seconds"):
            device_timeout()


def test_an_output_handed_in_filled_shows_every_element_the_kernel_leaves(fake_copy, monkeypatch):
    """``fill`` (the MoE stage's x_next, MO-08): the output starts as the value instead of upstream's zeros, so a
    row the kernel never writes comes back as that value -- and as a plausible 0 without it. A fill naming what is
    not an output of the entry is an error naming it, before any launch."""
    monkeypatch.setenv("PTO_FAKE_UPSTREAM_DEFECT", "hc_post_last_row_unwritten")
    dev = pb.Device(fake_copy, "a5sim", [0])
    g = torch.Generator().manual_seed(0)
    t = {"x": torch.randn(8, 64, generator=g).to(torch.bfloat16), "residual": torch.randn(8, 4, 64, generator=g),
         "post": torch.rand(8, 4, generator=g), "comb": torch.rand(8, 16, generator=g), "y": torch.zeros(8, 4, 64)}
    plain = dev.run("deepseek_v4_pro", "hc_post", "hc_post_test", t)["y"]
    filled = dev.run("deepseek_v4_pro", "hc_post", "hc_post_test", t, fill={"y": 13.0})["y"]
    assert bool((plain[-1] == 0).all()) and bool((filled[-1] == 13.0).all()), (plain[-1, 0, :4], filled[-1, 0, :4])
    assert torch.equal(plain[:-1], filled[:-1]) and not bool((filled[:-1] == 13.0).any())
    with pytest.raises(pb.UpstreamRunError, match=r"outputs to fill \['x'\] are not outputs of the entry"):
        dev.run("deepseek_v4_pro", "hc_post", "hc_post_test", t, fill={"x": 1.0})


def test_a_worker_dies_with_the_process_that_started_it_even_mid_launch(fake_copy, tmp_path):
    """A goldens process killed while its worker runs a launch (the OOM killer took one on a5sim, 2026-12-04):
    the worker must not run the launch on to its end holding its memory. Here the launch never ends (the double's
    kernel_hangs); 2 s after the parent's SIGKILL the worker is gone. A worker between launches ends anyway, on
    its stdin's EOF."""
    import signal
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from backends import pypto as pb\n"
        "from backends.upstream.client import worker\n"
        f"root = Path({str(fake_copy)!r})\n"
        "w = worker(root, {})\n"
        "w._start()\n"
        "print(w.proc.pid, flush=True)\n"
        "t = {'x': torch.zeros(8, 64, dtype=torch.bfloat16), 'residual': torch.zeros(8, 4, 64),\n"
        "     'post': torch.zeros(8, 4), 'comb': torch.zeros(8, 16), 'y': torch.zeros(8, 4, 64)}\n"
        "pb.Device(root, 'a5sim', [0]).run('deepseek_v4_pro', 'hc_post', 'hc_post_test', t)\n")
    env = {**os.environ, "PTO_FAKE_UPSTREAM_DEFECT": "kernel_hangs", "PTO_DEVICE_TIMEOUT": "600",
           "PYTHONPATH": str(ROOT)}
    for launcher in ("PTO_UPSTREAM_PYTHON", "PTO_TEST_ZYGOTE_SOCKET"):  # the worker a child of the script itself
        env.pop(launcher, None)  # (the suite's fast launcher forks workers from a server of its own)
    parent = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        time.sleep(3)  # the launch is under way (the double's kernel sleeps for good)
        os.kill(pid, 0)  # the worker is alive while its parent is
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        time.sleep(2)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        parent.kill()
        with contextlib.suppress(ProcessLookupError, NameError):
            os.kill(pid, signal.SIGKILL)


def test_the_moe_stage_runs_on_two_devices_its_output_filled_and_each_ranks_rows_its_own(fake_copy, monkeypatch):
    """The MoE stage's kernel path (moe.py::l3_moe, EP 2, MO-08's device run on a5sim): on the double's l3_moe at
    tiny dims it hands back x_out alone, equal to the reference's. A kernel that leaves the padding rows unwritten
    shows them as the fill (13.0, not upstream's plausible zeros); a rank that gives back another rank's rows
    fails the call naming rank 1; one device is refused."""
    from backends.upstream import client
    from backends.upstream.adapters import MOE_UNWRITTEN
    from contracts.operators import Unsupported
    from kernels.config import V4_PRO_TINY
    from kernels.v4.moe import _moe_stage_call, _moe_stage_inputs, v4_moe_stage

    config = V4_PRO_TINY.kernel_preset()
    i = _moe_stage_inputs(0, "replicated", config)
    want = _moe_stage_call(v4_moe_stage, i, config)["x_out"]
    two = get_backend("pypto", pypto_lib=str(fake_copy), device="0,1")

    def run(defect):
        for w in client._WORKERS.values():  # a worker reads the double's defect when it starts
            w.close()
        monkeypatch.setenv("PTO_FAKE_UPSTREAM_DEFECT", defect)
        return _moe_stage_call(two.get("v4_moe_stage"), i, config)

    got = run("")
    assert set(got) == {"x_out"} and torch.equal(got["x_out"], want)
    n = int(i["num_tokens"])
    left = run("moe_padding_unwritten")["x_out"]
    assert torch.equal(left[:n], want[:n]) and bool((left[n:] == MOE_UNWRITTEN).all()), left[n:, 0, :4]
    with pytest.raises(BackendError, match=r"rank 1 \(the call's rows in another order\) differs from rank 0"):
        run("moe_rank1_unordered")
    with pytest.raises(Unsupported, match=r"l3_moe runs on 2 devices; --device gives \[0\]"):
        _moe_stage_call(get_backend("pypto", pypto_lib=str(fake_copy)).get("v4_moe_stage"), i, config)


def test_a_v4_pro_entry_runs_with_specs_from_its_declaration_and_refuses_other_geometry(fake_upstream):
    """hc_post through models/deepseek_v4_pro/hc_post.py::hc_post_test: the double's runner validates only the
    is_output spec (y) and hands it back; a call at another hidden size, or with rows that are not whole tiles
    of its T_TILE, is unsupported naming the dim, before any launch; lm_head's two-device entry needs two device ids and then runs with a distributed config."""
    from contracts.operators import Unsupported
    from kernels.reference.lm_head import lm_head
    from kernels.reference.mhc import hc_post

    b = get_backend("pypto", pypto_lib=str(fake_upstream))
    g = torch.Generator().manual_seed(0)
    x, r = torch.randn(8, 64, generator=g).to(torch.bfloat16), torch.randn(8, 4, 64, generator=g)
    p, c = torch.rand(8, 4, generator=g), torch.rand(8, 4, 4, generator=g)
    assert torch.equal(b.get("hc_post")(x, r, p, c), hc_post(x, r, p, c))
    with pytest.raises(Unsupported, match=r"x dim 0 \(T_DYN\) is 5: the kernel takes it in whole tiles of "
                                          r"T_TILE = 4"):  # the kernel would drop row 4 (found on a5sim)
        b.get("hc_post")(x[:5], r[:5], p[:5], c[:5])
    with pytest.raises(Unsupported, match=r"hc_post_test: x dim 1: the kernel is compiled for 64 \(its static "
                                          r"geometry\), the call has 32"):
        b.get("hc_post")(x[:, :32], r[:, :, :32], p, c)
    h, w = torch.randn(6, 64, generator=g).to(torch.bfloat16), (torch.randn(512, 64, generator=g) / 8).to(torch.bfloat16)
    with pytest.raises(Unsupported, match=r"l3_lm_head runs on 2 devices; --device gives \[0\]"):
        b.get("lm_head")(h, w, tp=2)
    two = get_backend("pypto", pypto_lib=str(fake_upstream), device="0,1")
    for got, want in zip(two.get("lm_head")(h, w, tp=2), lm_head(h, w, tp=2), strict=True):
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_seeded_hc_post_kernel_is_caught_by_the_contracts():
    proc = forkserver.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "contracts/test_mhc.py",
                           "--backend", "pypto", "--pypto-lib", str(FAKE)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=_env(**{pb.ALLOW_TEST_DOUBLE: "1", "HYPOTHESIS_PROFILE": "verdict",
                                                   "PTO_FAKE_UPSTREAM_DEFECT": "hc_post_untransposed"}))
    assert proc.returncode == 1 and "FAILED contracts/test_mhc.py" in proc.stdout, proc.stdout[-2000:]


def _pytest(*args, **env) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "contracts/test_rope.py", *args],
                          cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=300)


def test_pytest_on_an_unavailable_backend_fails_with_one_line_unless_allowed():
    proc = _pytest("--backend", "pypto")
    assert proc.returncode == 1, proc.stdout[-1500:]
    assert "NOTHING RAN: backend 'pypto' (platform a5sim) is unavailable here" in proc.stdout
    allowed = _pytest("--backend", "pypto", "--allow-unavailable", "--platform", "a5", "-v")
    assert allowed.returncode == 0 and "(accepted: --allow-unavailable)" in allowed.stdout
    assert "pto-contracts: backend=pypto platform=a5 (UNAVAILABLE: no pypto-lib checkout" in allowed.stdout
    bad = _pytest("--backend", "nope")
    assert bad.returncode == 4 and bad.stderr.count("unknown backend 'nope'") == 1, bad.stderr[-800:]
    assert _pytest("--platform", "a5").returncode == 4


def test_pytest_runs_the_contracts_on_the_test_double_and_catches_its_seeded_wrong_kernel():
    env = {pb.ALLOW_TEST_DOUBLE: "1"}
    good = _pytest("--backend", "pypto", "--pypto-lib", str(FAKE), **env)
    assert good.returncode == 0, good.stdout[-2000:]
    assert "materialize_rope_rows            3       3       0        1  " in good.stdout, good.stdout[-1500:]
    assert "freqs_cos dim 1: the kernel is compiled" in good.stdout  # the FLASH-width call: refused, by name
    bad = _pytest("--backend", "pypto", "--pypto-lib", str(FAKE), PTO_FAKE_UPSTREAM_DEFECT="rope_negative_zero",
                  HYPOTHESIS_PROFILE="verdict", **env)
    assert bad.returncode == 1 and "failed" in bad.stdout, bad.stdout[-2000:]


def _replay(store: Path, *args, **env) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "goldens.cli", "--store", str(store), "replay", *args], cwd=ROOT,
                          env=_env(**env), capture_output=True, text=True, timeout=300)


def test_goldens_replay_through_upstream_keeps_actual_outputs_and_catches_the_seeded_kernel(tmp_path):
    from goldens import trees
    from goldens.store import GoldenStore

    store = tmp_path / "store"
    trees.record(GoldenStore(store), [("rope_rows", "replicated"), ("sp_slabs", "replicated")], seed=3)
    unavailable = _replay(store, "--backend", "pypto")
    assert unavailable.returncode == 3 and "is unavailable here" in unavailable.stderr, unavailable.stderr
    assert _replay(store, "--backend", "pypto", "--allow-unavailable").returncode == 0
    env = {pb.ALLOW_TEST_DOUBLE: "1"}
    good = _replay(store, "rope_rows", "--backend", "pypto", "--pypto-lib", str(FAKE), "--keep-actual", **env)
    assert good.returncode == 0, good.stdout[-1500:] + good.stderr[-800:]
    kept = GoldenStore(store).reader()
    path = "actual/pypto-test-double-a5sim/rope_rows/replicated/rope_cos"
    assert kept.array_attrs(path)["digest"] == kept.array_attrs("rope_rows/replicated/out/rope_cos")["digest"]
    assert kept.group_attrs("actual/pypto-test-double-a5sim/rope_rows/replicated")["verdicts"] == {
        "rope_cos": "PASS", "rope_sin": "PASS"}
    skipped_only = _replay(store, "sp_slabs", "--backend", "pypto", "--pypto-lib", str(FAKE), **env)
    assert skipped_only.returncode == 3 and "nothing ran: every tree was skipped" in skipped_only.stderr
    # the kept outputs, judged again without the device (what CI does with the a5sim runs in the sample store),
    # in this process: the recorded backend runs nothing
    from goldens import cli
    from goldens.errors import GoldenStoreError
    from goldens.recorded import recorded_backend

    def recorded(*args) -> tuple[int, str]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = cli.main(["--store", str(store), "replay", "--json", *args])
        return code, buf.getvalue()

    code, out = recorded("rope_rows", "--backend", "recorded")
    assert code == 0 and '"backend": "recorded:pypto-test-double-a5sim"' in out, out[-1500:]
    assert GoldenStore(store).reader().group_attrs("actual/pypto-test-double-a5sim/rope_rows/replicated")[
        "provenance"]["repository"] == "hw-native-sys/pypto-lib"
    code, out = recorded("sp_slabs", "--backend", "recorded:pypto-test-double-a5sim")
    assert code == 3 and "no outputs of pypto-test-double-a5sim kept for sp_slabs" in out, out[-1500:]
    with pytest.raises(GoldenStoreError, match="no kept outputs of 'pypto-a5' in this store"):
        recorded_backend(GoldenStore(store).reader(), "recorded:pypto-a5")
    # the seeded kernel fails the replay, and its kept outputs fail when judged again
    bad = _replay(store, "rope_rows", "--backend", "pypto", "--pypto-lib", str(FAKE), "--keep-actual",
                  PTO_FAKE_UPSTREAM_DEFECT="rope_negative_zero", **env)
    assert bad.returncode == 1 and "worst rope_cos row" in bad.stdout, bad.stdout[-1500:]
    code, out = recorded("rope_rows", "--backend", "recorded")
    assert code == 1 and "worst rope_cos row" in out, out[-1500:]
    trees.record(GoldenStore(store), [("rope_rows", "replicated")], seed=4, force=True)
    code, out = recorded("rope_rows", "--backend", "recorded")
    assert code == 3 and "ran on other inputs" in out, out[-1500:]


def test_replay_exports_exactly_upstreams_golden_data_layout(tmp_path):
    from goldens import trees
    from goldens.store import GoldenStore

    store = GoldenStore(tmp_path / "store")
    trees.record(store, [("rope_rows", "replicated")], seed=3)
    tree = trees.load_tree(store.reader(), "rope_rows", "replicated")
    trees.export_pt_tree(tree, tmp_path / "data")
    files = sorted(str(p.relative_to(tmp_path / "data")) for p in (tmp_path / "data").rglob("*.pt"))
    # §7.3: pure inputs and scalars in in/, InOut outputs in both in/ and out/
    assert files == ["in/freqs_cos.pt", "in/freqs_sin.pt", "in/num_tokens.pt", "in/position_ids.pt",
                     "in/rope_cos.pt", "in/rope_sin.pt", "out/rope_cos.pt", "out/rope_sin.pt"], files
    scalar = torch.load(tmp_path / "data" / "in" / "num_tokens.pt", weights_only=True)
    assert scalar.ndim == 0 and scalar.dtype == torch.int32
    shutil.rmtree(tmp_path / "data")


def test_doctor_names_every_missing_piece_in_one_line_and_exits_2_only_when_the_default_job_cannot_run(
        tmp_path, monkeypatch, capsys, fake_upstream):
    from goldens import cli, trees
    from goldens.store import GoldenStore

    monkeypatch.delenv("PYPTO_LIB_ROOT", raising=False)
    rows = {piece: (state, detail) for state, piece, detail in cli.doctor_report(str(tmp_path / "none"), None)}
    assert rows["torch"][0] == "ok" and rows["icechunk"][0] == "ok"
    assert rows["pypto-lib checkout"][0] == "MISSING" and "--pypto-lib" in rows["pypto-lib checkout"][1]
    assert rows["golden store"][0] == "MISSING" and "goldens record" in rows["golden store"][1]
    assert all("\n" not in d for _s, d in rows.values())
    assert cli.main(["--store", str(tmp_path / "none"), "doctor"]) == 2
    trees.record(GoldenStore(tmp_path / "store"), [("rope_rows", "replicated")], seed=1)
    assert cli.main(["--store", str(tmp_path / "store"), "doctor", "--pypto-lib", str(fake_upstream)]) == 0
    out = capsys.readouterr().out
    assert "TEST DOUBLE" in out and "1 tree(s)" in out and "materialize_rope_rows" in out


def test_candidate_blocks_run_on_the_device_at_its_compiled_constants_and_are_unsupported_otherwise(fake_upstream):
    from contracts.operators import Unsupported
    from kernels.reference.indexer import candidate_blocks

    b = get_backend("pypto", pypto_lib=str(fake_upstream))
    fn = b.get("candidate_blocks")
    g = torch.Generator().manual_seed(5)
    scores = torch.randn((3, 8 * 2051), generator=g)
    scores[1, 8 * 2050:] = float("-inf")  # the forced last block holds no finite score
    lens = torch.tensor([8 * 2051, 8 * 2050 + 3, 0], dtype=torch.int32)
    for width in (8 * 2051, 8 * 2051 + 5, 100):  # same, wider (padded with -inf), narrower (cropped)
        want = candidate_blocks(scores, lens, block=8, topk_blocks=2048, width=width)
        got = fn(scores, lens, block=8, topk_blocks=2048, width=width)
        assert got.dtype == torch.uint8 and torch.equal(got, want), width
    with pytest.raises(Unsupported, match="compiled for block=8, topk_blocks=2048"):
        fn(scores, lens, block=8, topk_blocks=3, width=16)


def test_the_seeded_indexer_kernel_is_caught_by_the_contracts():
    proc = forkserver.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "contracts/test_topk.py",
                           "--backend", "pypto", "--pypto-lib", str(FAKE)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=_env(**{pb.ALLOW_TEST_DOUBLE: "1", "HYPOTHESIS_PROFILE": "verdict",
                                                   "PTO_FAKE_UPSTREAM_DEFECT": "hsi_drop_last_block"}))
    assert proc.returncode == 1 and "FAILED contracts/test_topk.py::test_candidate_selection_smoke_at_flash_size" \
        in proc.stdout, proc.stdout[-2000:]
    assert "is compiled for block=8, topk_blocks=2048" in proc.stdout  # the other calls: skipped, with the reason


def test_an_invalid_topology_is_a_usage_error_before_any_test_runs():
    """--tp / --ep / --dp build the deployment at start-up: an EP that is not a multiple of TP, and (on a device
    backend) a --device list without exactly ep ids, stop pytest with exit 4 and one line naming the field; a
    valid topology shows in the header. Spec:
    upstream_checks CH-11, CH-02, MO-13."""
    proc = _pytest("--tp", "4", "--ep", "2", "--co")  # every Deployment rule: contracts/test_schedule.py
    assert proc.returncode == 4 and proc.stderr.count("deployment.ep: expected a multiple of tp=4") == 1, \
        proc.stderr[-800:]
    assert "collected" not in proc.stdout
    env = {pb.ALLOW_TEST_DOUBLE: "1"}
    devices = _pytest("--backend", "pypto", "--pypto-lib", str(FAKE), "--tp", "2", "--ep", "4", "--device", "0,1",
                      "--co", **env)
    assert devices.returncode == 4 and "expected exactly 4 ids (ep=4 = tp=2 x dp=2), got 2" in devices.stderr, \
        devices.stderr[-800:]
    from types import SimpleNamespace

    from kernels.config import Deployment
    from pto_pytest.plugin import deployment_from_options

    options = {"tp": 2, "ep": 8, "dp": None, "device": None}
    config = SimpleNamespace(getoption=options.get)
    assert deployment_from_options(config) == Deployment(tp=2, ep=8)
    options["dp"] = 2
    with pytest.raises(pytest.UsageError, match="deployment.dp: expected ep / tp = 4, got 2"):
        deployment_from_options(config)
    from pto_pytest.plugin import pytest_report_header

    header = pytest_report_header(SimpleNamespace(_pto_backend=get_backend("torch"),
                                                  _pto_deployment=Deployment(tp=2, ep=4)))
    assert "deployment=tp2/ep4/dp2" in header[0], header
