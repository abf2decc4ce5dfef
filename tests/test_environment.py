"""Environment guards: the wrong `pypto` (the PyPI CANN tile framework) must never be installed."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from backends.pypto import detect_toolchain


def test_pypi_pypto_is_not_installed():
    """A distribution named pypto without `pypto.language` is the unrelated PyPI project."""
    try:
        importlib.metadata.distribution("pypto")
    except importlib.metadata.PackageNotFoundError:
        return
    assert importlib.util.find_spec("pypto.language") is not None, (
        "the PyPI package 'pypto' (CANN tile framework) is installed; it is not the upstream toolchain: "
        "pip uninstall pypto")


def test_toolchain_detection_gives_a_one_line_reason(tmp_path):
    if importlib.util.find_spec("pypto") is not None and importlib.util.find_spec("pypto.language") is not None:
        return  # a real toolchain here: detection finds it (tests/test_pypto_backend.py covers the binding)
    reason = detect_toolchain(tmp_path)
    assert reason is not None and "\n" not in reason and "pypto.language" in reason
