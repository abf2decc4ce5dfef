"""The upstream pypto A5 kernels as a backend (``--backend pypto --platform a5sim|a5 [--device IDS]
[--pypto-lib PATH]``): each operator ``kernels.pypto_table`` marks ``bound`` runs its upstream entry through
upstream's own harness, ``golden.runner.run`` (spec §7.3), and returns the outputs the kernel produced,
captured through the ``compare_fn`` hook; this project's comparators then judge them. Nothing is computed
here: a run that does not hand back every output raises.

Where the pieces are: the pypto-lib checkout from ``--pypto-lib`` or ``PYPTO_LIB_ROOT`` (``golden/`` and
``models/deepseek_v4_1_flash/``), and the toolchain's ``pypto.language`` (the PyPI package of the same import
name is a different project, so detection asks for ``pypto.language``). Without them the backend is
unavailable with a one-line reason, and a session that therefore ran nothing fails (``--allow-unavailable``).

The test double in ``tests/fake_upstream`` (marked by its ``PTO_CONTRACTS_TEST_DOUBLE`` file) is refused
unless ``PTO_CONTRACTS_ALLOW_TEST_DOUBLE=1``, which only this project's tests set; the backend is then named
``pypto-test-double`` everywhere it is reported.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

import torch

from backends.upstream.backend import ALLOW_TEST_DOUBLE, TEST_DOUBLE_MARKER, revision  # noqa: F401 (shared with the upstream backend)

PLATFORMS = ("a5sim", "a5")


class UpstreamRunError(RuntimeError):
    """The upstream harness failed, or returned without handing back every output."""


def pypto_lib_root(option: str | None) -> tuple[Path | None, str | None]:
    """(root, None) or (None, why not)."""
    given = option or os.environ.get("PYPTO_LIB_ROOT")
    if not given:
        return None, "no pypto-lib checkout given (pass --pypto-lib PATH or set PYPTO_LIB_ROOT)"
    root = Path(given).expanduser()
    for need in ("golden/runner.py", "models/deepseek_v4_1_flash"):
        if not (root / need).exists():
            return None, f"{root} is not a pypto-lib checkout: {need} is missing"
    if (root / TEST_DOUBLE_MARKER).exists() and os.environ.get(ALLOW_TEST_DOUBLE) != "1":
        return None, (f"{root} is pto-contracts' test double of upstream (tests/fake_upstream), never used "
                      "outside the project's tests")
    return root.resolve(), None


def detect_toolchain(root: Path) -> str | None:
    """None when ``pypto.language`` and upstream's ``golden`` import with ``root`` on the path, else why not."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        importlib.import_module("pypto.language")
    except Exception as exc:  # any import failure means: not usable here
        return f"upstream pypto toolchain not installed (import pypto.language failed: {type(exc).__name__}: {exc})"
    try:
        importlib.import_module("golden")
    except Exception as exc:
        return f"{root}/golden does not import ({type(exc).__name__}: {exc})"
    return None


def parse_devices(device: str | None) -> list[int]:
    from contracts.backends import BackendError

    if device is None:
        return [0]
    try:
        ids = [int(d) for d in device.split(",")]
    except ValueError:
        raise BackendError(f"--device {device!r}: expected comma-separated device ids, e.g. 0 or 0,1") from None
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise BackendError(f"--device {device!r}: ids must be distinct non-negative integers")
    return ids


class Launcher:
    """Runs one wrapper program of ``kernels.pypto_programs`` through upstream's ``golden.runner.run``."""

    def __init__(self, binding, program, platform: str, devices: list[int]):
        self.binding, self.program, self.platform, self.devices = binding, program, platform, devices
        self.outputs = tuple(a.name for a in binding.args if a.direction in ("out", "inout"))

    def _capture(self, into: dict):
        def capture(actual, expected, *, actual_outputs, expected_outputs, inputs, rtol, atol):
            into.update({name: t.detach().clone() for name, t in actual_outputs.items()})
            return True, "captured for pto-contracts (judged by its comparators)"

        capture.__name__ = "pto_contracts_capture"
        return capture

    def __call__(self, values: dict, *, golden_data: Path | None = None) -> dict[str, torch.Tensor]:
        """Run on ``values`` ({argument name: tensor or int}); with ``golden_data``, upstream loads the inputs
        and expected outputs from that directory instead (``in/``, ``out/``). Returns {output: tensor}."""
        from golden import ScalarSpec, TensorSpec, run

        specs = []
        for arg in self.binding.args:
            value = values[arg.name]
            if arg.direction == "scalar":
                specs.append(ScalarSpec(arg.name, torch.int32, int(value)))
            else:
                specs.append(TensorSpec(arg.name, list(value.shape), value.dtype, init_value=value.clone()))
        captured: dict[str, torch.Tensor] = {}
        config = {"platform": self.platform, "device_id": self.devices[0]}
        try:
            result = run(fn=self.program, specs=specs, golden_fn=_unchanged, compare_fn=dict.fromkeys(
                self.outputs, self._capture(captured)), config=config, golden_data=str(golden_data)
                if golden_data else None, save_data=False, rtol=0, atol=0)
        except Exception as exc:
            raise UpstreamRunError(f"upstream run of {self.binding.upstream} on {self.platform} raised "
                                   f"{type(exc).__name__}: {exc}") from exc
        if not result.passed:
            raise UpstreamRunError(f"upstream run of {self.binding.upstream} on {self.platform} failed: "
                                   f"{result.error}")
        missing = [o for o in self.outputs if o not in captured]
        if missing:
            raise UpstreamRunError(f"upstream run of {self.binding.upstream} handed back no {missing} "
                                   "(compare_fn hook not called): nothing to judge")
        return {o: captured[o] for o in self.outputs}


def _unchanged(tensors) -> None:
    """golden_fn for calls whose expected outputs this project computes itself: leave them as initialized (the
    capture hook ignores them)."""
    return None


def _rope_rows(launch: Launcher):
    def materialize_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos, rope_sin):
        """The caller's side of the device ABI (§4.2: the kernel trusts it), checked before launching."""
        from kernels.errors import ContractInputError

        spec = "§4.2"
        if freqs_cos.dtype != torch.float32 or freqs_sin.dtype != torch.float32 or freqs_cos.ndim != 2 or \
                freqs_cos.shape != freqs_sin.shape or freqs_cos.shape[0] == 0:
            raise ContractInputError("freqs_cos/freqs_sin", None, "two FP32 [capacity>0, ROPE_DIM/2] tables",
                                     f"{freqs_cos.dtype}{list(freqs_cos.shape)} / "
                                     f"{freqs_sin.dtype}{list(freqs_sin.shape)}", spec)
        if position_ids.dtype not in (torch.int32, torch.int64) or position_ids.ndim != 1:
            raise ContractInputError("position_ids", None, "a 1-D INT32/INT64 tensor",
                                     f"{position_ids.dtype}{list(position_ids.shape)}", spec)
        if position_ids.dtype == torch.int64:  # the device takes INT32: narrow only what fits
            if position_ids.numel() and (int(position_ids.max()) >= 2**31 or int(position_ids.min()) < -2**31):
                raise ContractInputError("position_ids", None, "values that fit the device's INT32",
                                         f"range [{int(position_ids.min())}, {int(position_ids.max())}]", spec)
            position_ids = position_ids.to(torch.int32)
        rows = position_ids.shape[0]
        for name, out in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
            if out.shape != (rows, freqs_cos.shape[1]) or out.dtype != torch.float32:
                raise ContractInputError(name, None, f"FP32[{rows}, {freqs_cos.shape[1]}]",
                                         f"{out.dtype}{list(out.shape)}", spec)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 <= num_tokens <= rows:
            raise ContractInputError("num_tokens", None, f"an int in [0, {rows}]", repr(num_tokens), spec)
        capacity = freqs_cos.shape[0]
        beyond = (position_ids[:num_tokens] >= capacity).nonzero()
        if beyond.numel():
            t = int(beyond[0, 0])
            raise ContractInputError("position_ids", (t,), f"< table capacity {capacity}", int(position_ids[t]),
                                     spec)
        out = launch({"freqs_cos": freqs_cos, "freqs_sin": freqs_sin, "position_ids": position_ids,
                      "num_tokens": num_tokens, "rope_cos": rope_cos, "rope_sin": rope_sin})
        rope_cos.copy_(out["rope_cos"])
        rope_sin.copy_(out["rope_sin"])

    return materialize_rope_rows


def _candidate_blocks(launch: Launcher):
    def candidate_blocks(scores, compressed_lens, *, block, topk_blocks, width=None):
        """The hierarchical indexer's level-1 selection (§5.2) on the device; the constants it was compiled
        with must be the ones asked for."""
        from models.deepseek_v4_1_flash.config import FLASH as DEVICE

        from contracts.backends import Unsupported
        from kernels.errors import ContractInputError

        compiled = (DEVICE.candidate_block_size, DEVICE.candidate_topk_blocks)
        if (block, topk_blocks) != compiled:
            raise Unsupported(f"the device is compiled for block={compiled[0]}, topk_blocks={compiled[1]}; this "
                              f"call asks for block={block}, topk_blocks={topk_blocks}")
        if scores.ndim != 2 or compressed_lens.shape != (scores.shape[0],):
            raise ContractInputError("scores/compressed_lens", None, "[T, L] scores and [T] lengths",
                                     f"{list(scores.shape)} / {list(compressed_lens.shape)}", "§5.2")
        tokens, length = scores.shape
        width = length if width is None else width
        span = max(width, length, 1)
        padded = torch.full((tokens, span), float("-inf"), dtype=torch.float32)
        padded[:, :length] = scores.float()
        out = launch({"scores": padded, "compressed_lens": compressed_lens.to(torch.int32),
                      "candidate_mask": torch.zeros((tokens, span), dtype=torch.uint8)})
        return out["candidate_mask"][:, :width].contiguous()

    candidate_blocks.may_be_unsupported = True
    return candidate_blocks


ADAPTERS = {"materialize_rope_rows": _rope_rows, "candidate_blocks": _candidate_blocks}  # operator -> how its Python signature feeds the launcher


def make_backend(platform: str = "a5sim", *, device: str | None = None, pypto_lib: str | None = None):
    from contracts.backends import Backend, BackendError
    from kernels.pypto_table import BINDINGS, bound

    if platform not in PLATFORMS:
        raise BackendError(f"pypto backend: platform must be one of {PLATFORMS}, got {platform!r}")
    devices = parse_devices(device)
    root, reason = pypto_lib_root(pypto_lib)
    if root is None:
        return Backend("pypto", {}, platform=platform, unavailable=reason)
    reason = detect_toolchain(root)
    if reason is not None:
        return Backend("pypto", {}, platform=platform, unavailable=reason)
    double = (root / TEST_DOUBLE_MARKER).exists()
    programs = importlib.import_module("kernels.pypto_programs")
    launchers = {b.operator: Launcher(b, getattr(programs, b.program), platform, devices) for b in bound()}
    ops = {name: ADAPTERS[name](launch) for name, launch in launchers.items()}
    why = {b.operator: (f"{b.status}: {b.note}" if b.note else b.status) + f" (upstream {b.upstream})"
           for b in BINDINGS.values() if b.operator not in ops}
    return Backend("pypto-test-double" if double else "pypto", ops, platform=platform, why_missing=why,
                   description=f"upstream A5 kernels from {root} @ {revision(root)} on {platform}, devices {devices}",
                   replay=lambda tree: replay_through_upstream(launchers, tree))


def replay_through_upstream(launchers: dict, tree) -> dict[str, torch.Tensor] | None:
    """Replay a golden tree the way upstream replays saved data: export it in upstream's layout
    (``<dir>/in/<name>.pt``, ``<dir>/out/<name>.pt``), run the bound entry with ``golden_data`` pointing there,
    and return the kernel's outputs captured through ``compare_fn``. None when the tree's operator is not
    bound as one upstream entry (the caller then runs the backend's operators)."""
    launch = launchers.get(tree.case.operator)
    if launch is None:
        return None
    from goldens import trees

    with tempfile.TemporaryDirectory(prefix="pto-golden-data-") as tmp:
        trees.export_pt_tree(tree, Path(tmp))  # upstream's golden_data layout (spec §7.3)
        return launch(_values(tree), golden_data=Path(tmp))


def _values(tree) -> dict:
    values = dict(tree.inputs)
    for name, t in tree.expected.items():
        values.setdefault(name, torch.zeros_like(t))
    return {k: (int(v) if isinstance(v, torch.Tensor) and v.ndim == 0 else v) for k, v in values.items()}
