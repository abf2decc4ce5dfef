"""The upstream pypto A5 kernels as a backend (``--backend pypto --platform a5sim|a5 [--device IDS]
[--pypto-lib PATH]``).

Each bound operator runs one upstream kernel entry through upstream's own harness, ``golden.run_jit`` (or
``golden.run`` for a ``@pl.program``), inside the upstream worker process (``backends.upstream.worker``): the
specs are built in the entry's declared parameter order with its declared directions (``pl.Tensor`` in,
``pl.Out`` out, ``pl.InOut`` in and out, ``pl.Scalar``) read from the entry's source, ``is_output`` set on the
outputs, ``runtime_cfg`` = {platform, device_id} (or, for a multi-device entry, ``compile_cfg`` =
{distributed_config: DistributedConfig(device_ids, ...)}), and ``compare_fn`` = {each output: a hook that hands
the kernel's actual outputs back}; this project's comparators then judge them. A call whose tensors do not fit
the entry as compiled (a static dim of the model's geometry, a dtype, a missing argument) is refused as
unsupported, naming the dim, before anything is launched. Nothing is computed here: a run that hands back no
output is an error.

Which entries: V4-Pro (``models/deepseek_v4_pro``, upstream main) through the same adapters the upstream-goldens
backend uses (``backends.upstream.adapters``: one tensors dict per call, named as upstream names them), at the
entries listed in ``backends.pypto.table.PRO_ENTRIES``; V4.1-Flash (``models/deepseek_v4_1_flash``, where the
checkout has it) through this project's wrapper programs (``backends.pypto.programs``). A checkout is detected
by the model folders it has.

The test double in ``tests/fake_upstream`` (marked by ``PTO_CONTRACTS_TEST_DOUBLE``) is refused unless
``PTO_CONTRACTS_ALLOW_TEST_DOUBLE=1``, which only this project's tests set; the backend is then named
``pypto-test-double`` everywhere it is reported.
"""

from __future__ import annotations

import os
import tempfile
from functools import partial
from pathlib import Path

import torch

from backends.upstream.backend import ALLOW_TEST_DOUBLE, TEST_DOUBLE_MARKER, checkout, revision  # noqa: F401

PLATFORMS = ("a5sim", "a5")


class UpstreamRunError(RuntimeError):
    """The upstream harness failed, or returned without handing back every output."""


def parse_devices(device: str | None) -> list[int]:
    """``--device``: comma-separated device ids, each plain decimal digits (no sign, space or underscore, which
    int() would accept), distinct. None gives [0]. Spec: upstream_checks CH-02, CH-10."""
    from contracts.operators import BackendError

    if device is None:
        return [0]
    parts = device.split(",")
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise BackendError(f"--device {device!r}: expected comma-separated device ids of digits only, e.g. 0 or 0,1")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise BackendError(f"--device {device!r}: ids must be distinct non-negative integers")
    return ids


RESIDENT_DEVICES = 4


def resident_devices(devices: str | None, environ: dict | None = None) -> list[int]:
    """The resident CED prefill's devices: ``--devices``, else ``$TASK_DEVICE`` (the task allocator's list), as
    ``parse_devices`` reads them, and exactly four distinct ones (one per EP rank). Spec: upstream_checks CH-22."""
    from contracts.operators import BackendError

    env = os.environ if environ is None else environ
    given = devices if devices is not None else env.get("TASK_DEVICE")
    if not given:
        raise BackendError(f"the resident CED prefill needs {RESIDENT_DEVICES} devices: give --devices or set "
                           "TASK_DEVICE")
    ids = parse_devices(given)
    if len(ids) != RESIDENT_DEVICES:
        raise BackendError(f"--device {given!r}: the resident CED prefill runs on exactly {RESIDENT_DEVICES} distinct "
                           f"devices, got {len(ids)}")
    return ids


def detect_toolchain(root: Path) -> str | None:
    """None when upstream's pypto toolchain imports in the worker for ``root``, else why not (one line)."""
    from backends.upstream.client import UpstreamError, worker

    try:
        info = worker(root).ready()
    except UpstreamError as exc:
        return str(exc)
    if info.get("toolchain_error"):
        return f"upstream pypto toolchain not installed ({info['toolchain_error']})"
    return None


class Device:
    """Runs kernel entries of one checkout on one platform and device list, through the worker."""

    def __init__(self, root: Path, platform: str, devices: list[int], env: dict[str, str] | None = None):
        self.root, self.platform, self.devices, self.env = root, platform, devices, dict(env or {})

    def run(self, folder: str, module: str, entry: str, tensors: dict, *, ranks: int = 1,
            golden_data: Path | None = None, fill: dict[str, float] | None = None) -> dict[str, torch.Tensor]:
        from backends.pypto.table import DYN_TILES
        from backends.upstream.client import UpstreamError, UpstreamUnsupported, worker
        from contracts.operators import Unsupported

        try:
            return worker(self.root, self.env).device(folder, module, entry, tensors, platform=self.platform,
                                            devices=self.devices, ranks=ranks,
                                            golden_data=str(golden_data) if golden_data else None,
                                            tiles=DYN_TILES.get(module, {}), fill=fill)
        except UpstreamUnsupported as exc:
            raise Unsupported(str(exc)) from None
        except UpstreamError as exc:
            raise UpstreamRunError(str(exc)) from None


def _pro_operator(adapter, device: Device):
    """An adapter of ``backends.upstream.adapters`` whose ``run`` launches the module's kernel entry instead of
    calling its golden: the tensors dict is the same (upstream's names); geometry overrides (``fields``,
    ``constants``, ``module_globals``: they re-target a golden at a tiny preset) do not apply to a kernel compiled
    at the model's geometry, so a call off that geometry is refused as unsupported by the entry check."""
    from backends.pypto.table import FOLDER_ENTRIES, PRO_ENTRIES
    from contracts.operators import Unsupported

    def run(tensors, fields, constants, *, module_globals=None, module=None, function=None, fill=None,
            **golden_only):
        # golden_only: what only a golden takes (its keyword arguments, modules imported at the folder's own
        # geometry), nothing to a kernel entry compiled at the model's geometry
        name = module or adapter.module  # V4-Pro's module name (a folder's own name: adapter.module_of)
        if name not in PRO_ENTRIES:
            raise Unsupported(f"no kernel entry of models/{adapter.folder}/{adapter.module_of(name)}.py is bound")
        entry, ranks = PRO_ENTRIES[name]
        entry = dict(FOLDER_ENTRIES.get(adapter.folder, ())).get(adapter.module_of(name), entry)
        return device.run(adapter.folder, adapter.module_of(name), entry, tensors, ranks=ranks, fill=fill)

    run.calls_goldens = False  # an adapter with a golden-only form (another golden of the module) keeps its main one
    fn = partial(adapter.build, run)
    fn.__name__ = adapter.operator
    fn.__doc__ = f"upstream kernel entry of models/{adapter.folder}/{adapter.module_of()}.py on the device"
    fn.may_be_unsupported = True
    return fn


def make_backend(platform: str = "a5sim", *, device: str | None = None, pypto_lib: str | None = None,
                 model: str | None = None):
    """The A5 kernels of one model folder (``model``, default V4-Pro; its V4.1 entries too where the checkout has
    that folder): each operator an adapter of that folder lays out whose module's entry ``PRO_ENTRIES`` names."""
    from backends.pypto import v41
    from backends.pypto.table import BINDINGS, PRO_ENTRIES, bound
    from backends.upstream.adapters import PRO, adapters_for, preset_environment
    from contracts.operators import Backend, BackendError
    from kernels.record import folder_of

    model = model or PRO
    ADAPTERS = adapters_for(model)
    folder, env = folder_of(model), preset_environment(model)

    if platform not in PLATFORMS:
        raise BackendError(f"pypto backend: platform must be one of {PLATFORMS}, got {platform!r}")
    devices = parse_devices(device)
    root, reason = checkout(pypto_lib)
    if root is None:
        return Backend("pypto", {}, platform=platform, unavailable=reason)
    reason = detect_toolchain(root)
    if reason is not None:
        return Backend("pypto", {}, platform=platform, unavailable=reason)
    double = (root / TEST_DOUBLE_MARKER).exists()
    dev = Device(root, platform, devices, env)
    ops, launchers = {}, {}
    for name, adapter in ADAPTERS.items():
        if adapter.module in PRO_ENTRIES and adapter.function.startswith("golden_") \
                and (root / "models" / adapter.folder / f"{adapter.module_of()}.py").is_file():
            ops[name] = _pro_operator(adapter, dev)
    if folder == PRO and (root / "models" / v41.FOLDER).is_dir():
        for b in bound():
            if b.program:
                launchers[b.operator] = v41.Launcher(b, dev)
                ops[b.operator] = v41.ADAPTERS[b.operator](launchers[b.operator])
    why = {}
    for b in BINDINGS.values():
        if b.operator in ops:
            continue
        if folder != PRO:
            why[b.operator] = f"no kernel entry of models/{folder} is laid out for it yet (backends.upstream.adapters)"
        elif b.status == "bound":
            why[b.operator] = f"bound to {b.upstream.split(' ')[0]}, which this checkout does not have"
        else:
            why[b.operator] = (f"{b.status}: {b.note}" if b.note else b.status) + f" (upstream {b.upstream})"
    backend = Backend("pypto-test-double" if double else "pypto", ops, platform=platform, why_missing=why,
                   description=f"upstream A5 kernels of models/{folder} from {root} @ {revision(root)} on {platform}, "
                               f"devices {devices}",
                   replay=lambda tree, export: replay_through_upstream(launchers, tree, export),
                   provenance=_provenance(root, platform, devices), devices=tuple(devices))
    backend.toolchain = lambda: toolchain(root)  # asked only when a run is kept (goldens replay --keep-actual)
    return backend


def _provenance(root: Path, platform: str, devices: list[int]) -> dict:
    """What a kept device run ran on: the pypto-lib checkout, the platform and devices, the worker's Python."""
    from backends.upstream.backend import git_state
    from backends.upstream.client import worker_python

    commit, dirty = git_state(root)
    return {"repository": "hw-native-sys/pypto-lib", "commit": commit, "dirty": dirty, "platform": platform,
            "devices": devices, "worker_python": " ".join(worker_python())}


def toolchain(root: Path) -> dict[str, str]:
    """The toolchain as the worker sees it (pypto, its runtime, pto-isa, g++-15, the assembler, the source commits
    the a5sim set-up built): piece -> "state: detail"."""
    from backends.upstream.client import UpstreamError, worker

    try:
        return {piece: f"{state}: {detail}" for state, piece, detail in worker(root).toolchain()}
    except UpstreamError as exc:
        return {"error": str(exc)}


def replay_through_upstream(launchers: dict, tree, export) -> dict[str, torch.Tensor] | None:
    """Replay a golden tree the way upstream replays saved data, when its operator is one V4.1 entry: ``export``
    (the caller's, ``goldens.trees.export_pt_tree``) writes the tree in upstream's ``golden_data`` layout into a
    fresh directory, the entry runs with ``golden_data`` pointing there, the kernel's outputs are captured. None
    otherwise (the caller runs the backend's operators on the tree's inputs)."""
    launch = launchers.get(tree.case.operator)
    if launch is None:
        return None
    with tempfile.TemporaryDirectory(prefix="pto-golden-data-") as tmp:
        export(Path(tmp))
        return launch(_values(tree), golden_data=Path(tmp))


def _values(tree) -> dict:
    values = dict(tree.inputs)
    for name, t in tree.expected.items():
        values.setdefault(name, torch.zeros_like(t))
    return {k: (int(v) if isinstance(v, torch.Tensor) and v.ndim == 0 else v) for k, v in values.items()}
