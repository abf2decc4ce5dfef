"""The upstream worker: a separate Python process (run with ``-O``) that imports one pypto-lib checkout's model
modules and runs their golden functions on request. Started by ``backends.upstream.client``; not for direct use.

Protocol on stdin/stdout: each message is an 8-byte little-endian length and a ``torch.save`` payload of plain
containers and tensors, read back with ``torch.load(weights_only=True)``. A request names the model folder, the
module file, the golden function, config field overrides (applied to the folder's model object, ``MODEL_OBJECT``), config
constant overrides, module global overrides (constants a module derives at import, e.g. ``lm_head.py``'s
``TP_SIZE`` from its command line, set on the imported module before each call; ``"<module>.<NAME>"`` sets one
on another module of the folder that the golden imports by name, ``"<function>.<attr>"`` an attribute of one of the
module's functions, as a fixture installs ``golden_prefill_cp_swa._ctx``), and the tensors dict the golden
function fills in place, with ``kwargs`` as its keyword arguments when given (``golden_lm_head_all_ranks``'
``n_ranks``), or ``args`` / ``kwargs`` for a plain host function, whose result comes back as
``{"result": ...}``; ``native`` names modules imported first at the folder's own geometry (``Modules.load``); the
answer is
``{"tensors": ...}`` or ``{"error": "<one line>"}``. ``taps`` {"<module>.<golden>": [names]} observes the goldens a
whole-stage golden chains (it imports them by name at call time): after each call of that golden, the named
entries of its tensors dict are copied, and the answer's tensors gain ``"<module>.<golden>"``: one dict per call,
in call order (upstream's own intermediates, e.g. the combine that ``moe.py``'s golden hands to ``hc_post``).

Why ``-O``: upstream's modules assert their kernels' tiling (e.g. ``D % GATE_D_TILE == 0``) at import; the golden
functions' arithmetic does not depend on it, and the harness calls them at its own small geometries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import struct
import sys
import traceback

import torch


def read_message(stream) -> object | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return torch.load(io.BytesIO(stream.read(size)), weights_only=True)


def write_message(stream, obj: object) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


# The model config object each folder's modules import (``from config import ACTIVE as M``: V4-Pro, whose
# DEEPSEEK_V4_VARIANT picks it; ``from config import FLASH as M``: main's two V4-Flash folders); config field
# overrides replace that object.
MODEL_OBJECT = {"deepseek_v4_flash_mtp": "FLASH", "deepseek_v4_flash_dspark": "FLASH"}


class Modules:
    """The model module of the last request's (folder, file, geometry), imported afresh when any of them changes:
    one geometry at a time, so the modules a golden imports by name (and its ``config``) are this geometry's."""

    def __init__(self, root: str):
        self.root = root
        self.key: tuple | None = None
        self.module = None
        self.loads = 0

    def load(self, folder: str, module: str, fields: dict, constants: dict, native: tuple[str, ...] = ()):
        """``native``: modules of the folder imported first, at the folder's own geometry, so the module (imported
        at ``fields``) finds them by name as they are (one that checks the model's tiling at import, as dspark's
        ``decode_o_proj.py``); the golden is handed their widths as module globals."""
        key = (folder, module, tuple(sorted(fields.items())), tuple(sorted(constants.items())), tuple(native))
        if key == self.key:
            return self.module
        model_dir = os.path.join(self.root, "models", folder)
        if not os.path.isdir(model_dir):
            raise FileNotFoundError(f"models/{folder} is not in this checkout")
        models = os.path.join(self.root, "models")
        for name in [m for m, mod in sys.modules.items()
                     if getattr(mod, "__file__", None) and os.path.dirname(os.path.dirname(mod.__file__)) == models]:
            del sys.modules[name]  # a fresh config (and helpers) for this geometry -- and no other folder's
        sys.path[:] = [p for p in sys.path if os.path.dirname(p) != models]  # no other folder's modules by name
        sys.path.insert(0, model_dir)
        import config  # the checkout's models/<folder>/config.py

        for name in native:
            importlib.import_module(name)
        if fields:
            name = MODEL_OBJECT.get(folder, "ACTIVE")  # the model config object the folder's modules import
            setattr(config, name, dataclasses.replace(getattr(config, name), **fields))
            if hasattr(config, "ACTIVE_BASE"):  # modules that re-derive ACTIVE from it at import (moe.py's EP)
                config.ACTIVE_BASE = dataclasses.replace(config.ACTIVE_BASE, **fields)
        for name, value in constants.items():
            if not hasattr(config, name):
                raise AttributeError(f"models/{folder}/config.py has no {name}")
            setattr(config, name, value)
        path = os.path.join(model_dir, module + ".py")
        self.loads += 1
        spec = importlib.util.spec_from_file_location(f"pto_upstream_{folder}_{module}_{self.loads}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        self.key, self.module = key, mod
        return mod


@contextlib.contextmanager
def _tapped(taps: dict):
    """Wrap each tapped golden ("<module>.<golden>", the module imported by name) for one call: yields
    {key: [copies of the named entries, one dict per call]}; the originals are put back afterwards."""
    seen: dict[str, list] = {key: [] for key in taps}
    undo = []
    try:
        for key, names in taps.items():
            other, attr = key.split(".", 1)
            target = importlib.import_module(other)
            original = getattr(target, attr)

            def wrapper(tensors, _original=original, _key=key, _names=tuple(names)):
                result = _original(tensors)
                seen[_key].append({n: tensors[n].detach().clone() for n in _names})
                return result

            setattr(target, attr, wrapper)
            undo.append((target, attr, original))
        yield seen
    finally:
        for target, attr, original in reversed(undo):
            setattr(target, attr, original)


def _leave_outputs(values: dict) -> None:
    """golden_fn of a device run: the expected outputs stay as initialized (the harness judges the outputs it
    captures with its own comparators, never upstream's allclose)."""
    return None


def _off_tile(params, tensors: dict, tiles: dict, mod) -> str:
    """"" or why a dynamic dim the entry takes only in whole tiles (``tiles``: dim name -> the module constant
    sizing its tile) is not a positive multiple of that tile in this call."""
    for p in params:
        for axis, dim in enumerate(getattr(p, "dims", ())):
            name = dim if isinstance(dim, str) else None
            if name not in tiles or p.name not in tensors:
                continue
            tile, size = int(getattr(mod, tiles[name])), int(tensors[p.name].shape[axis])
            if size < tile or size % tile:
                return (f"{p.name} dim {axis} ({name}) is {size}: the kernel takes it in whole tiles of "
                        f"{tiles[name]} = {tile} (a remainder is dropped, and less than one tile launches nothing)")
    return ""


def device_run(modules: Modules, request: dict) -> dict:
    """Run one kernel entry through upstream's ``golden.run_jit`` / ``golden.run`` on the request's platform and
    devices, at the checkout's own geometry (kernels are compiled there), and hand back the outputs the harness
    captured through ``compare_fn``. {"tensors"} / {"unsupported": why} / {"error": why}."""
    from backends.upstream.entries import declared, mismatch

    folder, module, entry = request["folder"], request["module"], request["entry"]
    where = f"models/{folder}/{module}.py::{entry}" if folder else f"{module}::{entry}"
    if folder:
        mod = modules.load(folder, module, {}, {})
        path = os.path.join(modules.root, "models", folder, module + ".py")
    else:  # one of this project's wrapper programs around an upstream inline entry
        mod = importlib.import_module(module)
        path = mod.__file__
    with open(path, encoding="utf-8") as fh:
        params = declared(fh.read(), entry, vars(mod), where=where)
    tensors = request["tensors"]
    why = mismatch(params, tensors) or _off_tile(params, tensors, request.get("tiles") or {}, mod)
    if why:
        return {"unsupported": f"{where}: {why}"}
    devices = list(request.get("devices") or [0])
    ranks = int(request.get("ranks", 1))
    if len(devices) < ranks:
        return {"unsupported": f"{where} runs on {ranks} devices; --device gives {devices}"}
    import golden
    import torch as _torch

    fill = request.get("fill") or {}
    unknown = sorted(set(fill) - {p.name for p in params if p.direction == "out"})
    if unknown:
        return {"error": f"{where}: outputs to fill {unknown} are not outputs of the entry"}
    specs = []
    for p in params:
        value = tensors[p.name]
        if p.direction == "scalar":
            specs.append(golden.ScalarSpec(p.name, getattr(_torch, p.dtype), int(value)))
        else:  # an output starts zeroed (upstream's runner), or filled as asked (then it is an in-out to the runner)
            start = _torch.full(list(value.shape), fill[p.name], dtype=value.dtype) if p.name in fill else None
            specs.append(golden.TensorSpec(p.name, list(value.shape), value.dtype,
                                           init_value=start if p.direction == "out" else value.clone(),
                                           is_output=p.is_output))
    captured: dict = {}

    def capture(actual, expected, *, actual_outputs, expected_outputs, inputs, rtol, atol):
        captured.update({name: t.detach().cpu().clone() for name, t in actual_outputs.items()})
        return True, "captured by pto-contracts (judged by its own comparators)"

    capture.__name__ = "pto_contracts_capture"
    compile_cfg: dict = {}
    runtime_cfg: dict = {"platform": request["platform"]}
    if ranks > 1:
        from pypto.ir.distributed_compiled_program import DistributedConfig

        compile_cfg["distributed_config"] = DistributedConfig(device_ids=devices[:ranks], num_sub_workers=0)
    else:
        runtime_cfg["device_id"] = devices[0]
    fn = getattr(mod, entry)
    runner = golden.run_jit if hasattr(fn, "compile") else golden.run
    outputs = [p.name for p in params if p.is_output]
    golden_data = request.get("golden_data")
    runtime_dir = request.get("runtime_dir")  # a build from the compile cache: upstream skips compiling
    result = runner(fn, specs, golden_fn=None if golden_data else _leave_outputs, golden_data=golden_data,
                    compile_cfg=compile_cfg, runtime_cfg=runtime_cfg, rtol=0.0, atol=0.0,
                    compare_fn=dict.fromkeys(outputs, capture), save_data=False,
                    **({"runtime_dir": runtime_dir} if runtime_dir else {}))
    if not result.passed:
        first = str(result.error or "no error text").strip().splitlines()[0][:300]
        return {"error": f"upstream {runner.__name__} of {where} on {request['platform']} failed: {first}"}
    missing = [o for o in outputs if o not in captured]
    if missing:
        return {"error": f"upstream {runner.__name__} of {where} handed back no {missing} (compare_fn never "
                         "called): nothing to judge"}
    work_dir = getattr(result, "work_dir", None)
    return {"tensors": {o: captured[o] for o in outputs},
            "work_dir": None if work_dir is None else os.path.abspath(str(work_dir))}


BF16_PROBE = "#include <stdfloat>\n#ifndef __STDCPP_BFLOAT16_T__\n#error no std::bfloat16_t\n#endif\n" \
             "std::bfloat16_t x{1.0f};\n"


def toolchain_facts() -> list[tuple[str, str, str]]:
    """(state, piece, detail) for each piece the a5 simulator needs, as seen from this worker's environment (the
    a5sim chroot when $PTO_UPSTREAM_PYTHON points there): pypto, its runtime, pto-isa at the runtime's pin, g++-15
    with std::bfloat16_t (without it pto-isa silently takes BF16 for _Float16), the PTO assembler."""
    import shutil
    import subprocess

    setup = "scripts/a5sim-setup.sh --sources DIR, then PTO_UPSTREAM_PYTHON=PREFIX/bin/python"
    rows: list[tuple[str, str, str]] = []

    def run(cmd, **kw):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)
        except (OSError, subprocess.SubprocessError) as exc:
            return subprocess.CompletedProcess(cmd, 127, "", str(exc))

    try:
        import pypto as _p
        import pypto.language  # noqa: F401
        rows.append(("ok", "pypto", os.path.dirname(_p.__file__)))
    except Exception as exc:  # noqa: BLE001 (any import failure is the answer)
        rows.append(("MISSING", "pypto", f"import pypto.language failed ({type(exc).__name__}): {setup}"))
    try:
        import simpler_setup
        assets = os.path.join(os.path.dirname(simpler_setup.__file__), "_assets")
        rows.append(("ok", "pypto runtime (simpler)", os.path.dirname(simpler_setup.__file__)))
        with open(os.path.join(assets, "pto_isa.pin"), encoding="utf-8") as fh:
            pin = fh.read().strip()
        isa = os.path.join(assets, "build", "pto-isa")
        head = run(["git", "-C", isa, "rev-parse", "HEAD"]).stdout.strip()
        if not head:
            rows.append(("MISSING", "pto-isa", f"no checkout at {isa} (kernels stop with 'PTO-ISA not available'): "
                                               f"{setup}"))
        elif head != pin:
            rows.append(("MISSING", "pto-isa", f"{isa} is at {head[:12]}, the runtime pins {pin[:12]}: check out the pin"))
        else:
            rows.append(("ok", "pto-isa", f"{isa} @ {head[:12]} (the runtime's pin)"))
            try:
                with open(os.path.join(isa, "include", "pto", "cpu", "TAdd.hpp"), encoding="utf-8") as fh:
                    fixed = "pto-contracts a5sim-setup: TADD" in fh.read()
            except OSError:
                fixed = False
            rows.append(("ok", "pto-isa mixed-tile TADD", "present (scripts/a5sim-setup.sh stage simfix)") if fixed
                        else ("MISSING", "pto-isa mixed-tile TADD", "the CPU simulator adds tiles of one type only: the "
                              "gate, compressors, indexers and attention stop in g++ (no matching TADD_IMPL); run "
                              "scripts/a5sim-setup.sh --force simfix"))
    except Exception as exc:  # noqa: BLE001
        rows.append(("MISSING", "pypto runtime (simpler)", f"import simpler_setup failed ({type(exc).__name__}): {setup}"))
    gxx = shutil.which("g++-15")
    if gxx is None:
        rows.append(("MISSING", "g++-15", f"the simulator compiles its kernels with g++-15 (not on PATH): {setup}"))
    else:
        rows.append(("ok", "g++-15", (run([gxx, "--version"]).stdout.splitlines() or [gxx])[0]))
        probe = run([gxx, "-std=c++23", "-fsyntax-only", "-x", "c++", "-"], input=BF16_PROBE)
        rows.append(("ok", "std::bfloat16_t", "__STDCPP_BFLOAT16_T__ defined under -std=c++23") if probe.returncode == 0
                    else ("MISSING", "std::bfloat16_t", "g++-15 -std=c++23 has no std::bfloat16_t (pto-isa would take "
                          f"BF16 for _Float16): {(probe.stderr.strip().splitlines() or [''])[0][:160]}"))
    root = os.environ.get("PTOAS_ROOT")
    ptoas = os.path.join(root, "ptoas") if root else shutil.which("ptoas")
    if not ptoas or not os.access(ptoas, os.X_OK):
        where = f"PTOAS_ROOT={root} has no executable ptoas" if root else "no ptoas on PATH and no PTOAS_ROOT"
        rows.append(("MISSING", "PTO assembler", f"{where}: {setup}"))
    else:
        out = run([ptoas, "--version"])
        rows.append(("ok", "PTO assembler", f"{ptoas}: {(out.stdout or out.stderr).strip().splitlines()[0][:80]}")
                    if out.returncode == 0 else ("MISSING", "PTO assembler", f"{ptoas} --version exits {out.returncode}"))
    commits = os.environ.get("A5SIM_COMMITS")  # written by scripts/a5sim-setup.sh: the sources it built
    if commits and os.path.isfile(commits):
        with open(commits, encoding="utf-8") as fh:
            rows.append(("info", "built from", ", ".join(line.strip() for line in fh if line.strip())))
    return rows


def main() -> int:
    from backends.lifetime import WORKER, die_with_parent

    die_with_parent(WORKER)  # killed mid-launch, it would otherwise run the launch on to its end, memory held
    root = sys.argv[1]
    sys.path.insert(0, root)  # upstream's golden package, for modules that import it
    from backends.upstream.shim import install_if_missing

    toolchain = install_if_missing()  # "" = the real pypto toolchain imports; else why not (the shim is in)
    shimmed = bool(toolchain)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # upstream prints go to stderr, never into the protocol stream
    modules = Modules(root)
    write_message(stdout, {"ready": True, "shim": shimmed, "toolchain_error": toolchain,
                           "threads": torch.get_num_threads(), "python": sys.version})
    while True:
        request = read_message(stdin)
        if request is None:
            return 0
        try:
            if request.get("kind") == "values":  # constants a kernel is compiled with, by dotted name
                mod = importlib.import_module(request["module"])
                out = {}
                for name in request["names"]:
                    value = mod
                    for part in name.split("."):
                        value = getattr(value, part)
                    out[name] = value
                write_message(stdout, {"tensors": out})
                continue
            if request.get("kind") == "toolchain":
                write_message(stdout, {"tensors": {"rows": toolchain_facts()}})
                continue
            if request.get("kind") == "device":
                if shimmed:
                    write_message(stdout, {"error": f"no pypto toolchain in the worker ({toolchain})"})
                else:
                    write_message(stdout, device_run(modules, request))
                continue
            mod = modules.load(request["folder"], request["module"], request.get("fields", {}),
                               request.get("constants", {}), tuple(request.get("native", ())))
            for name, value in request.get("globals", {}).items():
                target, attr = mod, name
                if "." in name:  # "<module>.<NAME>": a module of the folder the golden imports by name;
                    other, attr = name.split(".", 1)  # "<function>.<attr>": one of this module's (a fixture's _ctx)
                    try:  # a module first: a kernel may carry its module's name (prefill_indexer_compressor)
                        target = importlib.import_module(other)
                    except ModuleNotFoundError:
                        if not callable(getattr(mod, other, None)):
                            raise
                        target = getattr(mod, other)
                if not hasattr(target, attr) and not callable(target):  # a function attribute may be new
                    raise AttributeError(f"models/{request['folder']}/{name.split('.')[0] if '.' in name else request['module']}"
                                         f".py has no {attr}")
                setattr(target, attr, value)
            fn = getattr(mod, request["function"])
            if "args" in request:  # a plain host function of the module (decode_metadata.py's lowering)
                write_message(stdout, {"tensors": {"result": fn(*request["args"], **request.get("kwargs", {}))}})
                continue
            tensors = request["tensors"]
            with _tapped(request.get("taps", {})) as seen:
                fn(tensors, **request.get("kwargs", {}))
            write_message(stdout, {"tensors": {**tensors, **seen}})
        except Exception as exc:  # one line back to the client, the trace on the worker's stderr
            traceback.print_exc(file=sys.stderr)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            write_message(stdout, {"error": f"{type(exc).__name__}: {exc} (at {os.path.basename(where.filename)}:"
                                     f"{where.lineno})"})


if __name__ == "__main__":
    sys.exit(main())
