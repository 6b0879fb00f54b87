"""Decision dumps read once per content: a build's dumps and tree by the digests of its dumps.

The master reads the tree of every candidate it measures (what the compiler really did), and
most of a candidate's dumps are its parent's, byte for byte: a flip changes the dumps of its
own unit, and a unit compiled with the same overrides dumps the same decisions.  So each dump
is kept here, parsed (without its features: no tree needs them) and as its round tree, under
the sha256 of its bytes, and only a dump whose digest is not known is parsed.  A dump's round
tree is made when first asked for (``Build.tree``): a search journals every candidate's
decision counts, which the decisions give, but draws from the trees of those it accepts only
(so a dump whose keys do not form a tree is a ``TreeError`` when its tree is asked for).

A new dump is mostly its parent's too: a flip changes the lines under one top-level
declaration or call, and leaves the others' byte for byte.  So a dump in the compiler's own
layout is read in blocks (``decisions.fast_blocks``: the lines under one top-level frame, which
hold every ancestor of their keys), each kept parsed and as its root nodes under the digest of
its bytes, and only the blocks not known are parsed and made into nodes; a dump the blocks
cannot be read from (another layout, a top-level frame whose lines are not together, text that
is not ASCII) is read whole, as before.  A tree made of blocks is the one ``round_tree`` makes
of the whole dump (a key's ancestors are in its block: no block's nodes depend on another's),
and a block whose keys do not form a tree sends the dump to ``round_tree`` for its error.

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

from dispatcher.core.decisions import (
    DUMP_NAME,
    Decision,
    DecisionDump,
    fast_blocks,
    fast_head,
    fast_lines,
    fast_tail,
    parse_dump,
)
from dispatcher.core.outputs import place, read_outputs
from dispatcher.core.tree import Node, RoundTree, Tree, TreeError, round_roots, round_tree, tally

#: Dumps kept: a program has tens of them (units x rounds), a chain holds a few trees, and a
#: candidate brings a few new ones.
CAPACITY = 4096
#: Blocks kept: a dump has a few to a few tens (its top-level declarations and calls).
BLOCK_CAPACITY = 16 * CAPACITY


class _Block:
    """The decisions of one block of a dump, and its root nodes and their keys when first
    asked for."""

    __slots__ = ("decisions", "_roots", "_keys")

    def __init__(self, decisions: tuple[Decision, ...]):
        self.decisions = decisions
        self._roots: tuple[Node, ...] | None = None
        self._keys: frozenset[str] | None = None

    def roots(self, unit: str, round_: int) -> tuple[Node, ...]:
        """TreeError if its keys do not form a tree."""
        if self._roots is None:
            self._roots = round_roots(unit, round_, self.decisions)
        return self._roots

    def keys(self, unit: str, round_: int) -> frozenset[str]:
        """The keys of its nodes (declarations too)."""
        if self._keys is None:
            self._keys = frozenset(n.key for r in self.roots(unit, round_) for n in r.walk())
        return self._keys


class _Parsed:
    """One dump: its decisions without their features; its round tree and decision counts,
    each made once, when first asked for (two threads may make one at once: equal
    results, either kept)."""

    __slots__ = ("dump", "blocks", "_tree", "_counts")

    def __init__(self, dump: DecisionDump, blocks: list[_Block] | None = None):
        self.dump = dump
        self.blocks = blocks  # None: read whole
        self._tree: RoundTree | None = None
        self._counts: tuple[int, int, int] | None = None

    @property
    def tree(self) -> RoundTree:
        """TreeError if its keys do not form a tree."""
        if self._tree is None:
            tree = self._tree_of_blocks()
            self._tree = round_tree(self.dump) if tree is None else tree
        return self._tree

    def _tree_of_blocks(self) -> RoundTree | None:
        """The tree of its blocks' root nodes; None when read whole, or when a block's keys
        do not form a tree (the whole dump's reading then says what is wrong)."""
        if self.blocks is None:
            return None
        d = self.dump
        try:
            return RoundTree.with_keys(
                d.unit, d.round, tuple(n for b in self.blocks for n in b.roots(d.unit, d.round)),
                frozenset().union(*(b.keys(d.unit, d.round) for b in self.blocks)))
        except TreeError:
            return None

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

    def __init__(self, capacity: int = CAPACITY, block_capacity: int = BLOCK_CAPACITY):
        self.capacity = capacity
        self.block_capacity = block_capacity
        self.hits = 0
        self.misses = 0
        self._entries: collections.OrderedDict[bytes, _Parsed] = collections.OrderedDict()
        self._blocks: collections.OrderedDict[tuple[str, int, bytes], _Block] = \
            collections.OrderedDict()
        self.block_hits = 0
        self.block_misses = 0
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
        text = data.decode()
        entry = self._in_blocks(data, text, source) or _Parsed(
            parse_dump(text, source, features=False))
        with self._lock:
            self.misses += 1
            self._entries[digest] = entry
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return entry

    def _in_blocks(self, data: bytes, text: str, source: str) -> _Parsed | None:
        """The dump read in blocks, each known one taken as it is (None: it cannot be read
        so, and is read whole)."""
        head = fast_head(text)
        if head is None or not data.isascii():  # (ASCII: a block's bytes are its text's)
            return None
        spans = fast_blocks(text, head.end)
        if spans is None or not fast_tail(text, spans[-1][1] if spans else head.end):
            return None
        view = memoryview(data)
        keys = [(head.unit, head.round,
                 hashlib.blake2b(view[start:end], digest_size=16).digest())
                for start, end in spans]
        with self._lock:
            known = [self._blocks.get(k) for k in keys]
            for k, block in zip(keys, known):
                if block is not None:
                    self._blocks.move_to_end(k)
            self.block_hits += sum(b is not None for b in known)
        made: dict[tuple[str, int, bytes], _Block] = {}
        for k, (start, end), block in zip(keys, spans, known):
            if block is None and k not in made:
                got = fast_lines(text, head, start, end, source, features=False)
                if got is None or got[1] != end:
                    return None
                made[k] = _Block(tuple(got[0]))
        if made:
            with self._lock:
                self.block_misses += len(made)
                self._blocks.update(made)
                while len(self._blocks) > self.block_capacity:
                    self._blocks.popitem(last=False)
        blocks = [made[k] if block is None else block for k, block in zip(keys, known)]
        return _Parsed(head.dump(tuple(d for b in blocks for d in b.decisions)), blocks)

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
        """The tree of a directory holding a build's dumps, packed or plain
        (``Tree.from_dir``'s)."""
        return self.tree(read_outputs(directory), place(directory))


DUMPS = DumpCache()
