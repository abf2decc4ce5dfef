"""The upstream pypto A5 kernels as a backend, where that toolchain is installed.

The upstream toolchain is built from source; the PyPI package of the same import name is a
different project, so detection asks for ``pypto.language`` specifically. Without it every
operator is missing and each contract skips with a one-line reason. No result is ever faked.
"""

from __future__ import annotations

import importlib

PLATFORMS = ("a5sim", "a5")


def detect_toolchain() -> str | None:
    """None when the upstream toolchain imports, else a one-line reason."""
    try:
        importlib.import_module("pypto.language")
    except Exception as exc:  # any import failure means: not usable here
        return f"upstream pypto toolchain not installed (import pypto.language failed: {type(exc).__name__}: {exc})"
    return None


def make_backend(platform: str = "a5sim"):
    from contracts.backends import Backend, BackendError

    if platform not in PLATFORMS:
        raise BackendError(f"pypto backend: platform must be one of {PLATFORMS}, got {platform!r}")
    reason = detect_toolchain()
    if reason is None:
        reason = (f"pypto toolchain found, but no A5 kernel bindings are registered for platform {platform} "
                  "in this version of pto-contracts")
    return Backend("pypto", {}, platform=platform, unavailable=reason)
