"""Reward assignment, step 2: the expanded tree of a benchmark and a feature vector per tree.

The expanded tree is the union of every tree measured for a benchmark: each node (a call or a
declaration, in one unit and round) is identified by its key path, which already names its
place in the tree.  A candidate is described by two columns per node: ``inline`` (the node is
in the tree and inlined, or is a declaration in the tree) and ``out`` (the node is a call left
out of line), each weighted by ``gamma ** depth`` (depth 0: a top-level node), so that
decisions deep in inlined bodies, which follow from those above them, weigh less.  A node
absent from a tree has zeros in both columns.  Columns that never vary across the candidates
carry no information about speed: they are reported and dropped before a fit.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from dispatcher.core.tree import CALL, DONT_INLINE, INLINE, SPECIALISE, Node, Tree

INLINE_COL, OUT_COL = "inline", "out"


@dataclass(frozen=True)
class UnionNode:
    """One node of the expanded tree."""

    unit: str
    round: int
    key: str
    kind: str  # decl | call
    name: str  # the callee of a call, the function of a declaration
    depth: int
    parent: int | None  # index of the parent node in ``ExpandedTree.nodes``
    inlined_in: int = 0  # trees in which this call is inlined (or specialised)
    out_in: int = 0  # trees in which it is left out of line

    @property
    def usual(self) -> str:
        """What the trees mostly did with this call (ties: inline)."""
        return INLINE if self.inlined_in >= self.out_in else DONT_INLINE


@dataclass(frozen=True)
class ExpandedTree:
    """The union of some trees; node ``i`` owns columns ``2i`` (inline) and ``2i + 1`` (out)."""

    nodes: tuple[UnionNode, ...]
    index: dict[tuple[str, int, str], int]
    children: tuple[tuple[int, ...], ...]

    @property
    def roots(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.parent is None]

    def column_names(self) -> list[str]:
        return [f"{n.unit}:{n.round}:{n.key}:{side}" for n in self.nodes
                for side in (INLINE_COL, OUT_COL)]


def _inlined(node: Node) -> bool:
    return node.kind != CALL or node.action in (INLINE, SPECIALISE)


def expand(trees: Sequence[Tree]) -> ExpandedTree:
    """The union of ``trees`` (nodes in first-seen order, parents before children)."""
    nodes: list[UnionNode] = []
    index: dict[tuple[str, int, str], int] = {}
    children: list[list[int]] = []
    counts: list[list[int]] = []  # [inlined in, out in]

    def add(unit: str, round_: int, node: Node, depth: int, parent: int | None) -> None:
        ident = (unit, round_, node.key)
        i = index.get(ident)
        if i is None:
            i = index[ident] = len(nodes)
            nodes.append(UnionNode(unit, round_, node.key, node.kind, node.name, depth, parent))
            children.append([])
            counts.append([0, 0])
            if parent is not None:
                children[parent].append(i)
        if node.kind == CALL:
            counts[i][0 if _inlined(node) else 1] += 1
        for c in node.children:
            add(unit, round_, c, depth + 1, i)

    for tree in trees:
        for part in tree.parts:
            for root in part.roots:
                add(part.unit, part.round, root, 0, None)
    nodes = [replace(n, inlined_in=a, out_in=b) for n, (a, b) in zip(nodes, counts)]
    return ExpandedTree(tuple(nodes), index, tuple(tuple(c) for c in children))


def features(expanded: ExpandedTree, trees: Sequence[Tree], gamma: float) -> sp.csr_matrix:
    """One row per tree, two columns per node of ``expanded`` (see the module's docstring)."""
    rows, cols, vals = [], [], []
    weight = [gamma ** n.depth for n in expanded.nodes]
    for r, tree in enumerate(trees):
        for unit, round_, node in tree.nodes():
            i = expanded.index.get((unit, round_, node.key))
            if i is None:
                continue
            rows.append(r)
            cols.append(2 * i if _inlined(node) else 2 * i + 1)
            vals.append(weight[i])
    return sp.csr_matrix((np.asarray(vals, dtype=float), (rows, cols)),
                         shape=(len(trees), 2 * len(expanded.nodes)))


def varying(matrix: sp.csr_matrix) -> np.ndarray:
    """A mask of the columns that take more than one value across the rows."""
    dense_max = matrix.max(axis=0).toarray().ravel()
    dense_min = matrix.min(axis=0).toarray().ravel()
    return np.asarray(dense_max != dense_min)
