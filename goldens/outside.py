"""No output lands inside a golden store: a report, a JUnit file, an export or a new store written into a store's
folder (its ``icechunk/`` repository, its lock, anything beside them) can break every later command on that
store, so every option that writes a file or folder asks :func:`refuse_inside_store` first (issue #48 item 2).

A folder is a store's root when it holds the repository (``icechunk/repo`` or ``icechunk/refs``) or the store's
lock file. A path is inside a store when it, or any folder above it (symlinks resolved as far as they exist), is
such a root -- so ``STORE/icechunk/refs`` and ``STORE/rep`` are both inside ``STORE``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from goldens.errors import GoldenStoreError
from goldens.store_format import LOCK_NAME, REPO_DIR


def is_store_root(folder: Path) -> bool:
    try:
        return (folder / REPO_DIR / "repo").exists() or (folder / REPO_DIR / "refs").exists() \
            or (folder / LOCK_NAME).is_file()
    except OSError:
        return False


def store_containing(path: str | os.PathLike) -> Path | None:
    """The store whose folder holds ``path`` (or is ``path``), or None; symlinks in the existing part resolved."""
    p = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    with contextlib.suppress(OSError, RuntimeError):
        p = p.resolve(strict=False)
    for folder in (p, *p.parents):
        if is_store_root(folder):
            return folder
    return None


def refuse_inside_store(path: str | os.PathLike, what: str) -> None:
    """Raise ``GoldenStoreError`` (exit 2, one line, nothing written) when ``path`` -- an output ``what`` names,
    e.g. "--junit" -- is inside a store's folder."""
    store = store_containing(path)
    if store is not None:
        raise GoldenStoreError(f"{what} {os.fspath(path)}: inside the golden store {store}; write it outside any "
                               "store (a file in a store's folder can break every later command on it)")


def refuse_store_inside_store(root: str | os.PathLike, what: str = "--store") -> None:
    """A new store must not be created inside another store's folder (its repository would be read as damage)."""
    outer = store_containing(Path(os.path.abspath(os.path.expanduser(os.fspath(root)))).parent)
    if outer is not None:
        raise GoldenStoreError(f"{what} {os.fspath(root)}: inside the golden store {outer}; a store cannot be "
                               "created inside another")
