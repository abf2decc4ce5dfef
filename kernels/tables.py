"""Tables of named rules whose reads can be watched.

A golden tree goes stale when something its reference computation read has changed. For a table of rules
(``quant.RULES``) "read" means the entries the computation looked up, not the whole table: a tree that never
quantizes with the ``index`` rule does not depend on it. ``WatchedTable`` is a plain dict that, while
``watch_reads()`` is open, notes every entry looked up by key (``table[name]``, ``get``) or by walking its values
(``values``, ``items``: every entry). Listing the names (``sorted(table)``, ``in``) reads no entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_WATCHERS: list[set[str]] = []


class WatchedTable(dict):
    """A dict of named entries that reports its reads, as ``const <qualname>[<key>]`` (the fingerprint's names)."""

    def __init__(self, qualname: str, entries: dict):
        super().__init__(entries)
        self.qualname = qualname

    def _note(self, key) -> None:
        for seen in _WATCHERS:
            seen.add(f"const {self.qualname}[{key!r}]")

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self._note(key)
        return value

    def get(self, key, default=None):
        if key in self:
            self._note(key)
        return super().get(key, default)

    def values(self):
        for key in self:
            self._note(key)
        return super().values()

    def items(self):
        for key in self:
            self._note(key)
        return super().items()


@contextmanager
def watch_reads() -> Iterator[set[str]]:
    """The set of watched-table entries read inside the block (nested blocks each see every read)."""
    seen: set[str] = set()
    _WATCHERS.append(seen)
    try:
        yield seen
    finally:
        del _WATCHERS[next(i for i, w in enumerate(_WATCHERS) if w is seen)]  # by identity: equal sets differ
