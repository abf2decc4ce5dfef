"""The upstream worker: a separate Python process (run with ``-O``) that imports one pypto-lib checkout's model
modules and runs their golden functions on request. Started by ``backends.upstream.client``; not for direct use.

Protocol on stdin/stdout: each message is an 8-byte little-endian length and a ``torch.save`` payload of plain
containers and tensors, read back with ``torch.load(weights_only=True)``. A request names the model folder, the
module file, the golden function, config field overrides (applied to the checkout's ``config.ACTIVE``), config
constant overrides, module global overrides (constants a module derives at import, e.g. ``lm_head.py``'s
``TP_SIZE`` from its command line, set on the imported module before each call), and the tensors dict the golden
function fills in place; the answer is
``{"tensors": ...}`` or ``{"error": "<one line>"}``.

Why ``-O``: upstream's modules assert their kernels' tiling (e.g. ``D % GATE_D_TILE == 0``) at import; the golden
functions' arithmetic does not depend on it, and the harness calls them at its own small geometries.
"""

from __future__ import annotations

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


class Modules:
    """Model modules imported per (folder, file, geometry): each geometry gets a fresh ``config`` and module."""

    def __init__(self, root: str):
        self.root = root
        self.cache: dict[tuple, object] = {}

    def load(self, folder: str, module: str, fields: dict, constants: dict):
        key = (folder, module, tuple(sorted(fields.items())), tuple(sorted(constants.items())))
        if key in self.cache:
            return self.cache[key]
        model_dir = os.path.join(self.root, "models", folder)
        if not os.path.isdir(model_dir):
            raise FileNotFoundError(f"models/{folder} is not in this checkout")
        for name in [m for m, mod in sys.modules.items()
                     if getattr(mod, "__file__", None) and os.path.dirname(mod.__file__) == model_dir]:
            del sys.modules[name]  # a fresh config (and helpers) for this geometry
        if model_dir in sys.path:
            sys.path.remove(model_dir)
        sys.path.insert(0, model_dir)
        import config  # the checkout's models/<folder>/config.py

        if fields:
            config.ACTIVE = dataclasses.replace(config.ACTIVE, **fields)
        for name, value in constants.items():
            if not hasattr(config, name):
                raise AttributeError(f"models/{folder}/config.py has no {name}")
            setattr(config, name, value)
        path = os.path.join(model_dir, module + ".py")
        spec = importlib.util.spec_from_file_location(f"pto_upstream_{folder}_{module}_{len(self.cache)}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        self.cache[key] = mod
        return mod


def main() -> int:
    root = sys.argv[1]
    sys.path.insert(0, root)  # upstream's golden package, for modules that import it
    from backends.upstream.shim import install_if_missing

    shimmed = install_if_missing()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # upstream prints go to stderr, never into the protocol stream
    modules = Modules(root)
    write_message(stdout, {"ready": True, "shim": shimmed, "threads": torch.get_num_threads(), "python": sys.version})
    while True:
        request = read_message(stdin)
        if request is None:
            return 0
        try:
            mod = modules.load(request["folder"], request["module"], request.get("fields", {}),
                               request.get("constants", {}))
            for name, value in request.get("globals", {}).items():
                if not hasattr(mod, name):
                    raise AttributeError(f"models/{request['folder']}/{request['module']}.py has no {name}")
                setattr(mod, name, value)
            fn = getattr(mod, request["function"])
            tensors = request["tensors"]
            fn(tensors)
            write_message(stdout, {"tensors": tensors})
        except Exception as exc:  # one line back to the client, the trace on the worker's stderr
            traceback.print_exc(file=sys.stderr)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            write_message(stdout, {"error": f"{type(exc).__name__}: {exc} (at {os.path.basename(where.filename)}:"
                                     f"{where.lineno})"})


if __name__ == "__main__":
    sys.exit(main())
