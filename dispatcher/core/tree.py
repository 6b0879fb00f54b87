"""The inlining tree of one build, built from the compiler's decision dumps.

A dump is a flat list of keyed decisions; the key already encodes the tree (``compiler/README.md``,
"Call-site keys"): ``D(..)`` frames are declarations, ``C(..)`` frames calls, and ``I`` / ``S``
step into the inlined / specialised body of the call before them.  A search over inlining
decisions wants the tree itself: leaves to flip, inlined calls to undo, subtrees that vanish
with them.  Everything here is immutable and pure, so trees can be hashed, cached, compared,
and mutations can be replayed from a seed.

The search loop this serves: real tree ``T`` (from a build's dumps) -> ``mutate(T)`` gives a
proposal ``P`` -> ``to_overrides(P)`` -> compile -> the new dumps give the real tree ``T'``.
A proposal is only a request: the compiler may prevent a pin (guards), and sites inside a newly
inlined body are decided by the compiler, so the next state of a search is always ``T'``.
"""
from __future__ import annotations

import operator
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

from dispatcher.core.decisions import Decision, DecisionDump, Override, SortedOverrides
from dispatcher.core.lazy import cached
from dispatcher.core.outputs import read_dumps_in

T = TypeVar("T")

DECL = "decl"
CALL = "call"
INLINE, DONT_INLINE, SPECIALISE = "inline", "dont_inline", "specialise"

# D(...) or C(...), optionally #k; the name is everything before the first '@'.
_FRAME = re.compile(r"^(?P<kind>[DC])\((?P<name>[^@]*)@(?P<loc>.*)\)(?P<suffix>#\d+)?$")


class TreeError(ValueError):
    """Decision dumps that do not form a tree (a key whose parent call is missing, ...)."""


def split_key(key: str) -> list[str]:
    """Split a key into frames on '/' outside parentheses (file names may hold '/')."""
    frames: list[str] = []
    cur: str | None = None
    depth = 0
    for part in key.split("/"):  # then glue back the pieces split inside parentheses
        cur = part if cur is None else cur + "/" + part
        depth += part.count("(") - part.count(")")
        if depth == 0:
            frames.append(cur)
            cur = None
    if cur is not None:
        frames.append(cur)
    return frames


def join_key(frames: Iterable[str]) -> str:
    return "/".join(frames)


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class Node:
    """A declaration or a call site; ``key`` is the compiler's own key string for it.

    Calls carry what the compiler decided (``action``, ``reason`` ...); their ``children`` are
    the nodes directly under ``key/I/`` (inlined) or ``key/S/`` (specialised).  A declaration's
    key is the key prefix ending with its ``D`` frame; its children are what it contains.
    Children keep the order in which the dump first mentions them.
    """

    kind: str  # decl | call
    key: str
    name: str  # the callee of a call, the declared function of a decl
    action: str | None = None  # calls: inline | dont_inline | specialise
    reason: str | None = None  # calls: heuristic | attribute | override | prevented
    guard: str | None = None  # what prevented it, when reason == "prevented"
    detail: str | None = None
    override: str | None = None
    children: tuple[Node, ...] = ()

    @property
    def prevented(self) -> bool:
        return self.reason == "prevented"

    @property
    def is_call(self) -> bool:
        return self.kind == CALL

    @property
    def is_leaf(self) -> bool:
        """A call with nothing decided below it (a leaf of the search, flippable)."""
        return self.kind == CALL and not self.children

    @property
    def decided(self) -> str:
        """The action of a call (decls have none)."""
        if self.action is None:
            raise TreeError(f"{self.key}: a {self.kind} node has no action")
        return self.action

    def walk(self) -> Iterator[Node]:
        """This node and everything below it, parent before children."""
        yield self
        for c in self.children:
            yield from c.walk()

    @cached
    def pins_memo(self) -> dict[tuple[str, int, int, tuple[frozenset[str], ...]],
                                tuple[Override, ...]]:
        """``_unit_pins``' pins of this root-level node, by (unit, round, last round, keys
        of each of the unit's later rounds)."""
        return {}


@dataclass(frozen=True)
class RoundTree:
    """The root-level nodes of one compilation unit in one round (top-level calls and decls)."""

    unit: str
    round: int
    roots: tuple[Node, ...] = ()

    def walk(self) -> Iterator[Node]:
        return iter(self.preorder)

    # Computed once per round tree: a round tree is immutable, and the dumps' cache
    # (``dispatcher.core.dump_cache``) shares one between every build that dumped it.
    @cached
    def preorder(self) -> tuple[Node, ...]:
        """Every node, parent before children."""
        return tuple(n for r in self.roots for n in r.walk())

    @cached
    def keys(self) -> frozenset[str]:
        """The keys of its nodes (set at once by ``with_keys``, when its maker knows them)."""
        return frozenset(n.key for n in self.preorder)

    @staticmethod
    def with_keys(unit: str, round_: int, roots: tuple[Node, ...],
                  keys: frozenset[str]) -> RoundTree:
        """The round tree of ``roots``, whose nodes' keys its maker knows already (the dumps'
        cache: the union of its blocks' keys), so that ``keys`` walks no node."""
        tree = RoundTree(unit, round_, roots)
        tree.__dict__["keys"] = keys  # (``cached``'s place for it)
        return tree

    @cached
    def pins_memo(self) -> dict[tuple[int | None, tuple[int, ...]],
                                tuple[tuple[RoundTree, ...], tuple[Override, ...]]]:
        """``to_overrides``' pins of this unit, when this is its first round, by ``rounds``
        and the ids of its later round trees (held in the entry, so their ids stay theirs)."""
        return {}

    @cached
    def counts(self) -> tuple[int, int, int]:
        """(inlined, not_inlined, prevented) over its call nodes (``count``)."""
        return tally(n for n in self.preorder if n.kind == CALL)


class _Decided(Protocol):
    """A call as ``tally`` counts it: a tree's call node or a dump's decision."""

    @property
    def prevented(self) -> bool: ...

    @property
    def action(self) -> str | None: ...


def tally(calls: Iterable[_Decided]) -> tuple[int, int, int]:
    """(inlined, not_inlined, prevented) of ``calls``: prevented calls count only as
    prevented; a specialised call stays a call (to the specialised copy), not inlined."""
    inlined = not_inlined = prevented = 0
    for c in calls:
        if c.prevented:
            prevented += 1
        elif c.action == INLINE:
            inlined += 1
        else:
            not_inlined += 1
    return inlined, not_inlined, prevented


class Site(NamedTuple):
    """Where a call node lives: the compiler's (unit, round, key)."""

    unit: str
    round: int
    key: str


class Located(NamedTuple):
    unit: str
    round: int
    node: Node


@dataclass(frozen=True, eq=False)
class Tree:
    """Every unit and round of one build.  Equal when the same call sites got the same actions.

    ``parts`` is sorted by (unit, round) and keeps (unit, round)s without decisions: they count
    as rounds that ran (see ``to_overrides``).  Equality deliberately ignores reasons, order and
    empty parts: two builds with the same (unit, round, key, action) set made the same choices.
    """

    parts: tuple[RoundTree, ...] = ()

    def __post_init__(self) -> None:
        ids = [(p.unit, p.round) for p in self.parts]
        if ids != sorted(set(ids)):
            object.__setattr__(self, "parts", _merge_parts(self.parts))

    # ---- construction
    @staticmethod
    def from_dumps(dumps: Iterable[DecisionDump]) -> Tree:
        return from_dumps(dumps)

    @staticmethod
    def from_dir(directory: Path | str) -> Tree:
        """The tree of a build directory holding its dumps (packed, or ``*.decisions.sexp``
        files)."""
        return from_dumps(read_dumps_in(Path(directory)))

    # ---- access
    def part(self, unit: str, round: int) -> RoundTree | None:
        return self._parts_by_id.get((unit, round))

    def units(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.unit for p in self.parts))

    def rounds(self, unit: str) -> tuple[int, ...]:
        return tuple(p.round for p in self.parts if p.unit == unit)

    def nodes(self) -> Iterator[Located]:
        """Every node (decls too), per part, parent before children."""
        for p in self.parts:
            for n in p.preorder:
                yield Located(p.unit, p.round, n)

    def calls(self) -> Iterator[Located]:
        return (x for x in self.nodes() if x.node.kind == CALL)

    def decisions(self) -> Iterator[tuple[str, int, str, str]]:
        """(unit, round, key, action) of every call node."""
        for unit, round_, n in self.calls():
            yield (unit, round_, n.key, n.decided)

    def find(self, unit: str, round: int, key: str) -> Node | None:
        """The node (call or decl) with this key, if the tree has it."""
        return self._index.get((unit, round, key))

    def __len__(self) -> int:
        """Number of nodes, declarations included."""
        return len(self._index)

    # ---- identity
    @cached
    def _decision_set(self) -> frozenset[tuple[str, int, str, str]]:
        return frozenset(self.decisions())

    @cached
    def derived(self) -> dict[tuple[str, int | None], tuple[Located, ...]]:
        """What pure functions of the tree derive from it, made once per tree, by function
        and round (``flippable``, ``backtrackable``): a chain draws every proposal of a
        step from one tree."""
        return {}

    @cached
    def _parts_by_id(self) -> dict[tuple[str, int], RoundTree]:
        return {(p.unit, p.round): p for p in self.parts}

    @cached
    def _index(self) -> dict[tuple[str, int, str], Node]:
        return {(u, r, n.key): n for u, r, n in self.nodes()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        return self._decision_set == other._decision_set

    def __hash__(self) -> int:
        return hash(self._decision_set)

    def __repr__(self) -> str:
        inl, out, prev = count(self)
        return (f"Tree({len(self.parts)} unit-rounds, {inl} inlined, {out} not inlined, "
                f"{prev} prevented)")


def _merge_parts(parts: Iterable[RoundTree]) -> tuple[RoundTree, ...]:
    by_id: dict[tuple[str, int], RoundTree] = {}
    for p in parts:
        if (p.unit, p.round) in by_id:
            raise TreeError(f"two trees for unit {p.unit} round {p.round}")
        by_id[(p.unit, p.round)] = p
    return tuple(by_id[i] for i in sorted(by_id))


# --------------------------------------------------------------------------- dumps <-> tree


class _Builder:
    """A mutable node while the dump is read; children by key, in first-mention order."""

    __slots__ = ("kind", "key", "name", "decision", "children")

    def __init__(self, kind: str, key: str, name: str, decision: Decision | None) -> None:
        self.kind, self.key, self.name, self.decision = kind, key, name, decision
        self.children: dict[str, _Builder] = {}

    def freeze(self) -> Node:
        kids = tuple(c.freeze() for c in self.children.values())
        d = self.decision
        if d is None:
            return Node(DECL, self.key, self.name, children=kids)
        return Node(CALL, d.key, d.callee, d.action, d.reason, d.guard, d.detail, d.override,
                    kids)


def _frame_name(frame: str, where: str) -> tuple[str, str]:
    m = _FRAME.match(frame)
    if m is None:
        raise TreeError(f"{where}: malformed frame {frame!r} (expected D(..), C(..), I or S)")
    return m.group("kind"), m.group("name")


def _under(key: str, inside: dict[str, dict[str, _Builder]]) -> dict[str, _Builder] | None:
    """The children of the checked prefix ``key`` is one call frame under (``round_tree``'s
    ``inside``), or None: a key whose last ``/C(`` does not follow such a prefix, or whose
    rest is not one call frame, is split and checked frame by frame.  A prefix in ``inside``
    ends between frames, so the rest's frames are the key's last ones."""
    cut = key.rfind("/C(")
    if cut <= 0:
        return None
    container = inside.get(key[:cut])
    if container is None:
        return None
    rest = key[cut + 1:]
    if len(split_key(rest)) != 1 or _FRAME.match(rest) is None:
        return None  # the frame by frame reading says what is wrong
    return container


def round_tree(dump: DecisionDump) -> RoundTree:
    """The tree of one dump (one unit and round); TreeError if its keys do not form one."""
    return RoundTree(dump.unit, dump.round, round_roots(dump.unit, dump.round, dump.decisions))


def round_roots(unit: str, round_: int, decisions: Sequence[Decision]) -> tuple[Node, ...]:
    """The root-level nodes the decisions of one unit and round form, in first-mention order
    (``round_tree``'s); TreeError if their keys do not form a tree."""
    where = f"unit {unit} round {round_}"
    by_key: dict[str, Decision] = {}
    for d in decisions:
        if d.key in by_key:
            raise TreeError(f"{where}: key {d.key} decided twice")
        by_key[d.key] = d
    roots: dict[str, _Builder] = {}
    made: dict[str, _Builder] = {}
    # The children of each declaration or inlined body already checked, by its key prefix (a
    # D frame's, or a call's with its I / S step): the keys of a dump share their prefixes,
    # and a prefix checked once is not matched and checked again for every key under it.
    inside: dict[str, dict[str, _Builder]] = {}

    def get(container: dict[str, _Builder], kind: str, key: str, name: str,
            decision: Decision | None) -> _Builder:
        """The node of ``key``, made (and put in ``container``) the first time."""
        b = made.get(key)
        if b is None:
            b = made[key] = _Builder(kind, key, name, decision)
            container[key] = b
        return b

    for d in decisions:
        # A key under a prefix already checked: its last frame after it (``_under``).
        under = _under(d.key, inside)
        if under is not None:
            get(under, CALL, d.key, d.callee, d)
            continue
        frames = split_key(d.key)
        container = roots
        i = 0
        last = len(frames) - 1
        prefix = ""
        while i < last:
            frame = frames[i]
            prefix = prefix + "/" + frame if i else frame  # join_key(frames[: i + 1])
            known = inside.get(prefix)  # a declaration's
            if known is None and frames[i + 1] in ("I", "S"):
                known = inside.get(prefix + "/" + frames[i + 1])  # a call's body
                if known is not None:
                    prefix = prefix + "/" + frames[i + 1]
                    i += 1
            if known is not None:
                container = known
                i += 1
                continue
            if frame in ("I", "S"):
                raise TreeError(f"{where}: {d.key}: {frame} frame not after a C(..) frame")
            kind, name = _frame_name(frame, f"{where}: {d.key}")
            if kind == "D":
                b = get(container, DECL, prefix, name, None)
                i += 1
            else:
                step = frames[i + 1]
                if step not in ("I", "S"):
                    raise TreeError(f"{where}: {d.key}: call frame {frame} followed by {step!r}, "
                                    f"expected I or S")
                parent = by_key.get(prefix)
                if parent is None:
                    raise TreeError(f"{where}: {d.key}: its parent call {prefix} is not in the "
                                    f"dump")
                want = INLINE if step == "I" else SPECIALISE
                if parent.action != want:
                    raise TreeError(f"{where}: {d.key}: its parent call {prefix} was "
                                    f"{parent.action}, not {want}")
                b = get(container, CALL, prefix, parent.callee, parent)
                prefix = prefix + "/" + step
                i += 2
            container = inside[prefix] = b.children
        if i != last or _frame_name(frames[-1], f"{where}: {d.key}")[0] != "C":
            raise TreeError(f"{where}: {d.key}: a decision's key must end with a C(..) frame")
        get(container, CALL, d.key, d.callee, d)
    return tuple(b.freeze() for b in roots.values())


def from_dumps(dumps: Iterable[DecisionDump]) -> Tree:
    """The tree of a build from all its dumps (every unit and round)."""
    return Tree(_merge_parts(round_tree(d) for d in dumps))


def _node_decisions(unit: str, round_: int, node: Node) -> Iterator[Decision]:
    for n in node.walk():
        if n.kind == CALL:
            yield Decision(unit=unit, round=round_, key=n.key, callee=n.name, action=n.decided,
                           reason=n.reason or "", guard=n.guard, detail=n.detail,
                           override=n.override)


def to_dumps(tree: Tree) -> list[DecisionDump]:
    """The tree rendered back as dumps (parent before child), one per (unit, round).

    ``from_dumps(to_dumps(t))`` rebuilds ``t`` node for node.  The overrides statistics of the
    original dumps are not part of a tree and come back as zero.
    """
    return [DecisionDump(p.unit, p.round,
                         tuple(d for n in p.roots for d in _node_decisions(p.unit, p.round, n)))
            for p in tree.parts]


# --------------------------------------------------------------------------- overrides


def to_overrides(tree: Tree, rounds: int | None = None) -> SortedOverrides:
    """Pins that ask the compiler for exactly this tree: every call node with its action.

    Under -O3 every round re-decides the call sites that survived the earlier ones, with the same
    key.  So a ``dont_inline`` node of round r is pinned ``dont_inline`` in rounds r+1 .. R-1 as
    well, up to the first later round that has its own node for the key: from there on that
    node speaks for the site (its action, carried on if it is dont_inline).  R is ``rounds``
    when given, else the number of rounds the tree has for the unit (highest round + 1).
    Prevented nodes are pinned as what happened (their action), so the pin is honoured.
    Sorted, one pin per (unit, round, key): ``SortedOverrides``.
    """
    by_unit: dict[str, list[RoundTree]] = {}
    for part in tree.parts:  # sorted by (unit, round): so are the units' pins, one after another
        by_unit.setdefault(part.unit, []).append(part)
    out: list[Override] = []
    for unit, parts in by_unit.items():
        # Kept on the unit's first round tree, by the identity of the others: a flip copies
        # the round trees it changes and shares the rest (``_replace_nodes``), so the units
        # it left alone (all but one or two) give the very pins, the same ``Override``
        # objects, of the tree it was drawn from.
        memo, later = parts[0].pins_memo, tuple(parts[1:])
        key = (rounds, tuple(map(id, later)))
        hit = memo.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], later)):
            hit = memo[key] = (later, _unit_pins(unit, parts, rounds))
        out.extend(hit[1])
    return SortedOverrides(out)


def _unit_pins(unit: str, parts: Sequence[RoundTree], rounds: int | None
               ) -> tuple[Override, ...]:
    """``to_overrides``' pins of one unit (``parts``: its round trees, by round), sorted.

    A node's pins depend on the node, its round and the keys of the unit's later rounds
    only, and no two nodes give a pin for one (round, key): a node's own pin is for its round
    and key, unique in a round tree, and a ``dont_inline`` is carried only into rounds that
    have no node of its key.  So the pins are made per root-level node (``_root_pins``) and
    kept on it, by those later rounds' keys (sets compared by content: a build's later
    rounds are new objects, mostly with the keys of the build before): a flip, which copies
    the roots on its path and shares the others, makes only its own roots' pins again."""
    last = rounds if rounds is not None else parts[-1].round + 1
    later_keys = {p.round: p.keys for p in parts[1:]}
    pins: list[Override] = []
    for i, part in enumerate(parts):
        context = (unit, part.round, last, tuple(p.keys for p in parts[i + 1:]))
        for root in part.roots:
            memo = root.pins_memo
            hit = memo.get(context)
            if hit is None:
                if len(memo) >= _ROOT_CONTEXTS:  # a long search meets many: keep the last few
                    memo.clear()
                hit = memo[context] = _root_pins(unit, part.round, root, later_keys, last)
            pins.extend(hit)
    pins.sort(key=_ORDER)  # each a distinct (round, key); each root's pins one sorted run
    return tuple(pins)


def _root_pins(unit: str, r: int, root: Node, later_keys: dict[int, frozenset[str]],
               last: int) -> tuple[Override, ...]:
    """The pins of the nodes under (and of) ``root``, of round ``r``, sorted by (round, key):
    a call's action in its round, a ``dont_inline`` carried on to round ``last - 1`` up to
    the first later round that has a node of its key."""
    out: list[Override] = []
    for n in root.walk():
        if n.kind != CALL:
            continue
        key = n.key
        out.append(_pin(unit, r, key, n.decided))
        if n.action == DONT_INLINE:
            for later in range(r + 1, last):
                has = later_keys.get(later)
                if has is not None and key in has:
                    break
                out.append(_pin(unit, later, key, DONT_INLINE))
    return tuple(sorted(out, key=_ORDER))


_ORDER = operator.attrgetter("order")

#: Contexts (later rounds' keys) a root-level node keeps pins for: the trees a chain draws
#: from at once are a few, and each context holds its later rounds' keys alive.
_ROOT_CONTEXTS = 8

#: Pins made so far, by (unit, round, key, action).  A flip's unit has its pins made again for
#: every candidate (most programs are one or two units: most of their pins), and the same
#: object carries its line of the canonical text (``Override.line``) from one to the next.
#: Bounded by the sites of the programs searched; emptied if that ever passes ``_PINS_MAX``.
_PINS: dict[tuple[str, int, str, str], Override] = {}
_PINS_MAX = 1_000_000


def _pin(unit: str, round: int, key: str, action: str) -> Override:
    k = (unit, round, key, action)
    pin = _PINS.get(k)
    if pin is None:  # (two threads may make one at once: equal objects, either kept)
        if len(_PINS) >= _PINS_MAX:
            _PINS.clear()
        pin = _PINS[k] = Override(unit, round, key, action)
    return pin




# --------------------------------------------------------------------------- mutations
#
# A mutation changes nodes of one round (round 0 by default: the search controls round 0) and
# keeps every other round as it was, so ``to_overrides`` pins those too: sites that still exist
# after the change keep their earlier decisions, stale keys simply match nothing, and a site
# flipped to dont_inline is carried into the later rounds.  What the later rounds then really
# did is read back from the compiler's dumps.


def _replace_nodes(tree: Tree, new: dict[tuple[str, int, str], Node]) -> Tree:
    """Copy of ``tree`` with the nodes named in ``new`` replaced (path copying; the rest shared)."""

    def rebuild(unit: str, round_: int, node: Node) -> Node:
        hit = new.get((unit, round_, node.key))
        if hit is not None:
            return hit
        if not node.children:
            return node
        kids = tuple(rebuild(unit, round_, c) for c in node.children)
        same = all(x is y for x, y in zip(kids, node.children))
        return node if same else replace(node, children=kids)

    touched = {(u, r) for u, r, _ in new}
    parts = []
    for p in tree.parts:
        if (p.unit, p.round) in touched:
            p = replace(p, roots=tuple(rebuild(p.unit, p.round, n) for n in p.roots))
        parts.append(p)
    return Tree(tuple(parts))


def _proposed(node: Node, action: str) -> Node:
    """The node as a proposal asks for it: the pin will be an override, nothing below is known."""
    return Node(CALL, node.key, node.name, action, "override", None, None, action, ())


INLINED_ABOVE = "callee inlined above"
DECLARED_ABOVE = "in the callee's declaration"

# Guard classes (``guard_class``) whose prevented sites an ``inline`` override gets past, from
# ``bench/prevented_flips`` over the bundled benchmarks (table in compiler/README.md, "Which
# prevented sites can be flipped").  Every other class, and any guard not seen there, blocks.
HONOURABLE_GUARDS: frozenset[str] = frozenset({"unrolling_depth_exceeded", "max_inlining_depth"})


def callee_above(node: Node) -> str | None:
    """Where a call's own callee already sits on the call's path, if it does:
    ``INLINED_ABOVE`` when the key holds ``C(callee@..)/I`` (or ``/S``) above the call,
    ``DECLARED_ABOVE`` when it holds ``D(callee@..)``; None otherwise."""
    frames = split_key(node.key)[:-1]
    declared = False
    for frame, step in zip(frames, frames[1:] + [""]):
        m = _FRAME.match(frame)
        if m is None or m.group("name") != node.name:
            continue
        if m.group("kind") == "C" and step in ("I", "S"):
            return INLINED_ABOVE
        declared = declared or m.group("kind") == "D"
    return DECLARED_ABOVE if declared else None


def guard_class(node: Node) -> str:
    """The guard of a prevented call as ``flippable`` and ``bench/prevented_flips`` tell them
    apart: the dumped guard, followed by ``callee_above`` in parentheses when the callee is
    already on the call's path.  The compiler dumps two different checks as
    ``unrolling_depth_exceeded`` (one an override gets past, one it does not), and a site past
    ``max_inlining_depth`` meets the unrolling or self-call check once forced; the callee's
    place on the path tells which."""
    guard = node.guard or "unknown"
    where = callee_above(node)
    return f"{guard} ({where})" if where else guard


def honourable(guard: str) -> bool:
    """Whether an ``inline`` override gets past the guard class ``guard`` (from evidence)."""
    return guard in HONOURABLE_GUARDS


def flippable(tree: Tree, round: int | None = 0) -> list[Located]:
    """Leaves ``flip_leaves`` may pick in ``round`` (None: every round), in tree order.

    A prevented leaf is offered only when its guard class is ``honourable``: for the others
    the guard that stopped the heuristic stops an override too, and the flip would build the
    same binary.  Depends on the tree alone, so proposals replay exactly from the RNG.
    """
    got = tree.derived.get(("flippable", round))
    if got is None:
        got = tree.derived["flippable", round] = tuple(
            x for x in leaves(tree, round)
            if not x.node.prevented or honourable(guard_class(x.node)))
    return list(got)


def flip(action: str) -> str:
    """inline -> dont_inline; dont_inline -> inline; specialise -> dont_inline.

    Specialising copies the callee's body much as inlining does, so its opposite is keeping
    the plain call; asking for ``inline`` instead would be a different, second experiment.
    """
    return INLINE if action == DONT_INLINE else DONT_INLINE


def propose_action(tree: Tree, site: Located, action: str) -> Tree:
    """A proposal with the call ``site`` asking for ``action`` (what ``flip_leaves`` does to
    each leaf it picks)."""
    u, r, n = site
    return _replace_nodes(tree, {(u, r, n.key): _proposed(n, action)})


def flip_leaves(tree: Tree, k: int, rng: random.Random, round: int | None = 0,
                weights: Callable[[list[Located]], Sequence[float] | None] | None = None
                ) -> Tree:
    """A proposal with ``k`` distinct random leaves of ``round`` flipped (see ``flip``).

    A dont_inline leaf flipped to inline gets no children: the compiler decides the calls in the
    newly inlined body.  An inline leaf flipped to dont_inline simply becomes a plain call.
    ``weights`` (given the flippable leaves, their selection weights, or None for uniform)
    biases the choice (``weighted_sample``).  Raises ValueError when fewer than ``k`` leaves
    are flippable.
    """
    pool = flippable(tree, round)
    if not 0 <= k <= len(pool):
        raise ValueError(f"flip_leaves: cannot flip {k} leaves, {len(pool)} are flippable")
    w = weights(pool) if weights is not None else None
    chosen = rng.sample(pool, k) if w is None else weighted_sample(pool, w, k, rng)
    return _replace_nodes(tree, {(u, r, n.key): _proposed(n, flip(n.decided))
                                 for u, r, n in chosen})


def weighted_sample(pool: Sequence[T], weights: Sequence[float], k: int,
                    rng: random.Random) -> list[T]:
    """``k`` distinct items of ``pool``, each draw in proportion to the remaining items'
    ``weights`` (one ``rng.random()`` per draw, so a replay draws the same)."""
    if len(weights) != len(pool) or any(not w >= 0 for w in weights):
        raise ValueError("weighted_sample: one non-negative weight per item")
    left = list(range(len(pool)))
    chosen: list[T] = []
    for _ in range(k):
        total = sum(weights[i] for i in left)
        if total <= 0:  # only weightless items left: uniform among them
            j = int(rng.random() * len(left))
        else:
            x, acc, j = rng.random() * total, 0.0, len(left) - 1
            for pos, i in enumerate(left):
                acc += weights[i]
                if x < acc:
                    j = pos
                    break
        chosen.append(pool[left.pop(j)])
    return chosen


def backtrackable(tree: Tree, round: int | None = 0) -> list[Located]:
    """Inlined (or specialised) calls of ``round`` with something decided below them."""
    got = tree.derived.get(("backtrackable", round))
    if got is None:
        got = tree.derived["backtrackable", round] = tuple(
            Located(p.unit, p.round, n) for p in tree.parts if round is None or p.round == round
            for n in p.preorder
            if n.kind == CALL and n.children and n.action in (INLINE, SPECIALISE))
    return list(got)


def backtrack(tree: Tree, rng: random.Random, round: int | None = 0) -> Tree:
    """A proposal that undoes the inlining of one random ancestor: the call becomes a
    dont_inline leaf and its whole subtree is dropped.

    Specialised calls count as inlined here, as in ``flip``.  Raises ValueError when no call
    of ``round`` has children.
    """
    pool = backtrackable(tree, round)
    if not pool:
        raise ValueError("backtrack: no inlined call with children to undo")
    u, r, n = rng.choice(pool)
    return _replace_nodes(tree, {(u, r, n.key): _proposed(n, DONT_INLINE)})


# --------------------------------------------------------------------------- analysis


def leaves(tree: Tree, round: int | None = None) -> list[Located]:
    """Call nodes with no children, in tree order (optionally of one round)."""
    return [Located(p.unit, p.round, n) for p in tree.parts if round is None or p.round == round
            for n in p.preorder if n.kind == CALL and not n.children]


def count(tree: Tree) -> tuple[int, int, int]:
    """(inlined, not_inlined, prevented) over call nodes; the three partition them.

    Prevented calls count only as prevented; a specialised call stays a call (to the
    specialised copy), so it counts as not inlined.
    """
    parts = [p.counts for p in tree.parts]
    return (sum(c[0] for c in parts), sum(c[1] for c in parts), sum(c[2] for c in parts))


@dataclass(frozen=True)
class TreeDiff:
    """Call sites of two trees: decided differently, only in the first, only in the second."""

    changed: tuple[Site, ...] = ()
    only_a: tuple[Site, ...] = ()
    only_b: tuple[Site, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changed or self.only_a or self.only_b)


def diff(a: Tree, b: Tree) -> TreeDiff:
    """Which call sites differ between two trees (sorted)."""
    da = {Site(u, r, k): act for u, r, k, act in a.decisions()}
    db = {Site(u, r, k): act for u, r, k, act in b.decisions()}
    return TreeDiff(
        changed=tuple(sorted(s for s in da.keys() & db.keys() if da[s] != db[s])),
        only_a=tuple(sorted(da.keys() - db.keys())),
        only_b=tuple(sorted(db.keys() - da.keys())))
