"""Reward assignment, step 4: the best tree the rewards describe, as an overrides file.

Bottom-up over the expanded tree: a declaration is worth its own ``inline`` reward plus the
best of each of its children; a call is worth the larger of inlining it (its ``inline`` reward
plus the best of each of its children: the calls in its inlined body) and leaving it out of
line (its ``out`` reward; its body's calls are then not in this function).  The optimal tree
takes, from the roots down, the better choice at every call it reaches; calls below one left
out of line are not reached and not pinned.  On a tie (a call the data says nothing about:
its columns never varied, and nor did its body's) the call keeps what the measured trees
mostly did with it, so the optimal tree departs from them only where the rewards say so.

The result is an ordinary overrides file (``optimal.sexp``): ``run-benchmark`` and
``ocamlopt -inlining-overrides`` accept it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analysis.expanded import ExpandedTree
from dispatcher.core.decisions import Override
from dispatcher.core.tree import CALL, DONT_INLINE, INLINE


@dataclass(frozen=True)
class Choice:
    node: int
    action: str  # inline | dont_inline
    value: float  # the best total reward of the subtree under this choice


def optimal(expanded: ExpandedTree, rewards: Sequence[float]) -> tuple[dict[int, Choice], float]:
    """The choice at every call node reached from the roots (by node index), and the total
    reward of the optimal tree."""
    n = len(expanded.nodes)
    if len(rewards) != 2 * n:
        raise ValueError(f"optimal: {len(rewards)} rewards for {n} nodes (want two each)")
    best: dict[int, float] = {}
    action: dict[int, str] = {}
    # children always come after their parent: a reverse sweep is bottom-up
    for i in range(n - 1, -1, -1):
        below = sum(best[c] for c in expanded.children[i])
        inline_value = rewards[2 * i] + below
        if expanded.nodes[i].kind != CALL:
            best[i] = inline_value
            continue
        out_value = rewards[2 * i + 1]
        if inline_value > out_value or (inline_value == out_value
                                         and expanded.nodes[i].usual == INLINE):
            best[i], action[i] = inline_value, INLINE
        else:
            best[i], action[i] = out_value, DONT_INLINE
    chosen: dict[int, Choice] = {}
    stack = list(reversed(expanded.roots))
    while stack:
        i = stack.pop()
        if expanded.nodes[i].kind == CALL:
            chosen[i] = Choice(i, action[i], best[i])
            if action[i] != INLINE:
                continue
        stack.extend(reversed(expanded.children[i]))
    return chosen, sum(best[r] for r in expanded.roots)


def to_overrides(expanded: ExpandedTree, chosen: dict[int, Choice]) -> list[Override]:
    out = []
    for i, choice in sorted(chosen.items()):
        node = expanded.nodes[i]
        out.append(Override(unit=node.unit, round=node.round, key=node.key,
                            action=choice.action))
    return sorted(out)
