"""Decision dumps read once per content: a build's dumps and tree by the digests of its dumps.

The master reads the tree of every candidate it measures (what the compiler really did), and
most of a candidate's dumps are its parent's, byte for byte: a flip changes the dumps of its
own unit, and a unit compiled with the same overrides dumps the same decisions.  So each dump
is kept here, parsed (without its features: no tree needs them) and as its round tree, under
the sha256 of its bytes, and only a dump whose digest is not known is parsed.  A dump's round
tree is made when first asked for (``Build.tree``): a search journals every candidate's
decision counts, which the decisions give, but draws from the trees of those it accepts only
(so a dump whose keys do not form a tree is a ``TreeError`` when its tree is asked for).

Bounded, the least recently used going first: the dumps of the trees the chains draw from
are used again by every candidate drawn from them, and stay.  One cache per process
(``DUMPS``); its entries are immutable, so threads share them.
"""
from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Mapping
from pathlib import Path

from dispatcher.core.decisions import DUMP_NAME, DecisionDump, dump_files, parse_dump
from dispatcher.core.tree import RoundTree, Tree, round_tree, tally

#: Dumps kept: a program has tens of them (units x rounds), a chain holds a few trees, and a
#: candidate brings a few new ones.
CAPACITY = 4096


class _Parsed:
    """One dump: its decisions without their features; its round tree and decision counts,
    each made once, when first asked for (two threads may make one at once: equal
    results, either kept)."""

    __slots__ = ("dump", "_tree", "_counts")

    def __init__(self, dump: DecisionDump):
        self.dump = dump
        self._tree: RoundTree | None = None
        self._counts: tuple[int, int, int] | None = None

    @property
    def tree(self) -> RoundTree:
        """TreeError if its keys do not form a tree."""
        if self._tree is None:
            self._tree = round_tree(self.dump)
        return self._tree

    @property
    def counts(self) -> tuple[int, int, int]:
        """(inlined, not_inlined, prevented) over its decisions, as its round tree counts
        its call nodes (``RoundTree.counts``: each decision is one)."""
        if self._counts is None:
            self._counts = tally(self.dump.decisions)
        return self._counts


class Build:
    """A build's dumps, parsed: its decision counts at once, its tree when asked for."""

    def __init__(self, parsed: list[_Parsed]):
        self._parsed = parsed
        self._tree: Tree | None = None

    @property
    def tree(self) -> Tree:
        """``Tree.from_dumps``'s; TreeError if a dump's keys do not form a tree."""
        if self._tree is None:
            self._tree = Tree(tuple(p.tree for p in self._parsed))
        return self._tree

    def counts(self) -> tuple[int, int, int]:
        """(inlined, not_inlined, prevented): ``tree.count`` of its tree, without making it."""
        each = [p.counts for p in self._parsed]
        return (sum(c[0] for c in each), sum(c[1] for c in each), sum(c[2] for c in each))


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
        entry = _Parsed(parse_dump(data.decode(), source, features=False))
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

    def build(self, files: Mapping[str, bytes], where: str) -> Build:
        """The build whose dumps are among ``files``: its counts now, its tree when asked."""
        return Build(self._all(files, where))

    def tree(self, files: Mapping[str, bytes], where: str) -> Tree:
        """The tree of the build whose dumps are among ``files`` (``Tree.from_dumps``'s)."""
        return self.build(files, where).tree

    def tree_of_dir(self, directory: Path) -> Tree:
        """The tree of a directory holding a build's dumps (``Tree.from_dir``'s)."""
        return self.tree({p.name: p.read_bytes() for p in dump_files(directory)},
                         str(directory))


DUMPS = DumpCache()
