"""A device backend of the test suite's own, loaded like any out-of-tree one (``--backend-module
tests.device_double:backend``): the Torch reference, pinned to the ``--device`` ids it is given (labels only),
so ``goldens replay --devices`` and ``pytest --devices`` run here without a device."""

from __future__ import annotations

from backends import torch_backend


def backend(device: str | None = None):
    from backends.pypto import parse_devices

    base = torch_backend()
    pinned = base.derive("torch-devices", description=f"the reference on device(s) {device}")
    pinned.devices = tuple(parse_devices(device)) if device else ()
    return pinned
