"""Decision dumps read once per content: a build's dumps and tree by the digests of its dumps.

The master reads the tree of every candidate it measures (what the compiler really did), and
most of a candidate's dumps are its parent's, byte for byte: a flip changes the dumps of its
own unit, and a unit compiled with the same overrides dumps the same decisions.  So each dump
is kept here, parsed (without its features: no tree needs them) and as its round tree, under
the sha256 of its bytes, and only a dump whose digest is not known is parsed.

Bounded, the least recently used going first: the dumps of the trees the chains draw from
are used again by every candidate drawn from them, and stay.  One cache per process
(``DUMPS``); its entries are immutable, so threads share them.
"""
from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dispatcher.core.decisions import DUMP_NAME, DecisionDump, dump_files, parse_dump
from dispatcher.core.tree import RoundTree, Tree, round_tree

#: Dumps kept: a program has tens of them (units x rounds), a chain holds a few trees, and a
#: candidate brings a few new ones.
CAPACITY = 4096


@dataclass(frozen=True)
class _Parsed:
    dump: DecisionDump  # its decisions without their features
    tree: RoundTree


class DumpCache:
    """Parsed dumps by the sha256 of their bytes (``capacity`` of them at most)."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._entries: collections.OrderedDict[bytes, _Parsed] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _parsed(self, data: bytes, source: str) -> _Parsed:
        digest = hashlib.sha256(data).digest()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries.move_to_end(digest)
                self.hits += 1
                return entry
        # Parsed outside the lock (two threads may parse one dump at once: the same result).
        dump = parse_dump(data.decode(), source, features=False)
        entry = _Parsed(dump, round_tree(dump))
        with self._lock:
            self.misses += 1
            self._entries[digest] = entry
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return entry

    def _all(self, files: Mapping[str, bytes], where: str) -> list[_Parsed]:
        """The parsed dumps among ``files`` (name -> bytes; other names are left out), sorted
        by (unit, round) as ``read_dumps`` sorts them."""
        parsed = [self._parsed(data, f"{where}/{name}") for name, data in sorted(files.items())
                  if DUMP_NAME.match(name)]
        return sorted(parsed, key=lambda p: (p.dump.unit, p.dump.round))

    def dumps(self, files: Mapping[str, bytes], where: str) -> list[DecisionDump]:
        """The dumps among ``files`` without their features, sorted by (unit, round)."""
        return [p.dump for p in self._all(files, where)]

    def tree(self, files: Mapping[str, bytes], where: str) -> Tree:
        """The tree of the build whose dumps are among ``files`` (``Tree.from_dumps``'s)."""
        return Tree(tuple(p.tree for p in self._all(files, where)))

    def tree_of_dir(self, directory: Path) -> Tree:
        """The tree of a directory holding a build's dumps (``Tree.from_dir``'s)."""
        return self.tree({p.name: p.read_bytes() for p in dump_files(directory)},
                         str(directory))


DUMPS = DumpCache()
