"""dispatcher.core.tree: the inlining tree built from decision dumps, its overrides and mutations.

Hand-written dumps pin down the structure; hypothesis checks the invariants on random trees;
the last test drives the real compiler: tree -> overrides -> compile must give the tree back.
"""
from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

import pytest
import sexpdata
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.build.driver import build_benchmark
from dispatcher.build.manifest import resolve_benchmark
from dispatcher.core.decisions import (
    Decision,
    DecisionDump,
    Override,
    dump_files,
    read_dumps,
    write_overrides,
)
from dispatcher.core.tree import (
    CALL,
    DECL,
    Node,
    RoundTree,
    Site,
    Tree,
    TreeError,
    backtrack,
    backtrackable,
    callee_above,
    count,
    diff,
    flip_leaves,
    flippable,
    from_dumps,
    guard_class,
    leaves,
    propose_action,
    split_key,
    to_dumps,
    to_overrides,
)
from tests.helpers import (
    GO_DECL,
    HELPER_DECL,
    MAP,
    ROWS_0,
    ROWS_1,
    RUN,
    RUN_DECL,
    G,
    dump,
    on_every_cpu,
)

# --------------------------------------------------------------------------- hand-written dumps

def decision(key: str, action: str = "dont_inline", unit: str = "Main", round_: int = 0,
             reason: str = "heuristic") -> Decision:
    callee = split_key(key)[-1].split("(", 1)[1].split("@", 1)[0]
    return Decision(unit, round_, key, callee, action, reason)


@pytest.fixture
def tree() -> Tree:
    return from_dumps([dump("Main", 0, ROWS_0), dump("Main", 1, ROWS_1), dump("Lib", 0, [])])


def test_split_key_respects_parentheses():
    assert split_key(MAP + "/S/C(Lib.f@src/lib/a.ml:2:1-3)") == [MAP, "S",
                                                                "C(Lib.f@src/lib/a.ml:2:1-3)"]
    assert split_key(G + "#1/I/" + RUN) == [G + "#1", "I", RUN]


def test_structure_roots_decls_and_inlined_children(tree):
    assert [(p.unit, p.round) for p in tree.parts] == [("Lib", 0), ("Main", 0), ("Main", 1)]
    roots = tree.part("Main", 0).roots
    # first-mention order; decls appear where their first decision does
    assert [n.key for n in roots] == [RUN, HELPER_DECL, RUN_DECL, MAP, G, G + "#1"]
    run, helper, run_decl, map_, g, g1 = roots
    assert (run.kind, run.name, run.action, run.reason) == (CALL, "Main.run", "inline",
                                                           "heuristic")
    assert [c.key for c in run.children] == [RUN + "/I/C(Main.helper@main.ml:7:18-26)"]
    assert run.children[0].is_leaf and run.children[0].action == "dont_inline"
    assert (helper.kind, helper.name, helper.action) == (DECL, "Main.helper", None)
    assert [c.key for c in helper.children] == [HELPER_DECL + "/C(Util.add@main.ml:1:15-27)"]
    # nested declarations: D(run) holds a call, D(go) and a call with a '>' route
    assert [(c.kind, c.key) for c in run_decl.children] == [
        (CALL, RUN_DECL + "/C(Main.helper@main.ml:7:18-26)"),
        (DECL, GO_DECL),
        (CALL, RUN_DECL + "/C(Main.big@main.ml:7:19-28>main.ml:6:19-24)")]
    go_call = run_decl.children[1].children[0]
    assert go_call.prevented and go_call.guard == "self_call" and go_call.action == "dont_inline"
    assert run_decl.children[0].override == "dont_inline"


def test_structure_specialised_children_and_slash_in_file_names(tree):
    map_ = tree.find("Main", 0, MAP)
    assert map_.action == "specialise" and map_.name == "Lib.map"
    (f,) = map_.children
    assert f.key == MAP + "/S/C(Lib.f@src/lib/a.ml:2:1-3)" and f.reason == "attribute"
    (g,) = f.children
    assert g.key == f.key + "/I/C(Lib.g@src/lib/a.ml:1:1-3)" and g.is_leaf


def test_structure_suffixed_keys_are_separate_sites(tree):
    g, g1 = tree.find("Main", 0, G), tree.find("Main", 0, G + "#1")
    assert g.is_leaf and g.action == "dont_inline"
    (k_decl,) = g1.children
    assert k_decl.kind == DECL and k_decl.key == G + "#1/I/D(Main.k@main.ml:2:1-5)"
    assert k_decl.name == "Main.k"
    assert k_decl.children[0].key.startswith(G + "#1/I/")


def test_children_extend_parent_keys(tree):
    for _, _, node in tree.nodes():
        for child in node.children:
            sep = child.key[len(node.key):len(node.key) + 3]
            assert child.key.startswith(node.key)
            assert sep in ("/I/", "/S/") if node.kind == CALL else sep[0] == "/"


def test_round_one_is_its_own_tree(tree):
    helper = tree.find("Main", 1, RUN_DECL + "/C(Main.helper@main.ml:7:18-26)")
    assert helper.action == "inline" and len(helper.children) == 1
    assert tree.find("Main", 1, RUN) is None
    assert tree.rounds("Main") == (0, 1) and tree.rounds("Lib") == (0,)
    assert tree.part("Lib", 0).roots == ()


def test_decisions_and_equality_ignore_order_and_reasons(tree):
    decs = set(tree.decisions())
    assert ("Main", 0, MAP, "specialise") in decs
    assert len(decs) == len(ROWS_0) + len(ROWS_1)
    # same sites and actions, other order and reasons: equal
    shuffled = list(reversed(ROWS_0[4:])) + ROWS_0[:4]
    shuffled = [(k, c, a, "attribute" if r == "heuristic" else r) for k, c, a, r in shuffled]
    other = from_dumps([dump("Main", 1, ROWS_1), dump("Main", 0, shuffled)])
    assert other == tree and hash(other) == hash(tree)
    changed = ROWS_0[:-1] + [(ROWS_0[-1][0], "Main.big", "dont_inline", "heuristic")]
    assert from_dumps([dump("Main", 0, changed), dump("Main", 1, ROWS_1)]) != tree
    assert len({tree, other}) == 1


def test_from_dumps_accepts_decision_objects():
    t = from_dumps([DecisionDump("M", 0, (decision("C(M.a@m.ml:1:1-2)", "inline"),
                                          decision("C(M.a@m.ml:1:1-2)/I/C(M.b@m.ml:2:1-2)")))])
    (a,) = t.part("M", 0).roots
    assert a.children[0].name == "M.b"


@pytest.mark.parametrize("keys, message", [
    (["C(M.a@m.ml:1:1-2)/I/C(M.b@m.ml:2:1-2)"], "parent call C(M.a@m.ml:1:1-2) is not in"),
    (["C(M.a@m.ml:1:1-2)#1", "C(M.a@m.ml:1:1-2)/I/C(M.b@m.ml:2:1-2)"], "is not in the dump"),
    (["C(M.a@m.ml:1:1-2)", "C(M.a@m.ml:1:1-2)/I/C(M.b@m.ml:2:1-2)"], "was dont_inline, not inline"),
    (["C(M.a@m.ml:1:1-2)", "C(M.a@m.ml:1:1-2)/S/C(M.b@m.ml:2:1-2)"], "not specialise"),
    (["D(M.a@m.ml:1:1-2)"], "must end with a C(..) frame"),
    (["I/C(M.a@m.ml:1:1-2)"], "I frame not after a C(..) frame"),
    (["C(M.a@m.ml:1:1-2)/C(M.b@m.ml:2:1-2)"], "expected I or S"),
    (["X(M.a)"], "malformed frame"),
    (["C(M.a@m.ml:1:1-2)", "C(M.a@m.ml:1:1-2)"], "decided twice"),
])
def test_malformed_dumps_name_the_key(keys, message):
    with pytest.raises(TreeError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        from_dumps([DecisionDump("M", 0, tuple(decision(k) for k in keys))])
    assert keys[-1] in str(e.value) and "unit M round 0" in str(e.value)


def test_two_dumps_for_one_round_are_refused():
    with pytest.raises(TreeError, match="two trees for unit M round 0"):
        from_dumps([DecisionDump("M", 0, ()), DecisionDump("M", 0, ())])


def test_count_leaves_and_len(tree):
    # inlined: run, add, f, g#1, h, big, helper(r1) = 7; prevented: go;
    # not inlined: helper(r0 I), helper(r0 decl), map (specialise), lib.g, g, add(r1), g(r1)
    assert count(tree) == (7, 7, 1)
    assert len(tree) == 15 + 5  # calls; decls helper, run, go, k (round 0) and run (round 1)
    leaf_keys = {n.key for _, r, n in leaves(tree, 0)}
    assert RUN not in leaf_keys and G in leaf_keys and G + "#1" not in leaf_keys
    assert HELPER_DECL + "/C(Util.add@main.ml:1:15-27)" in leaf_keys  # an inlined leaf
    assert len(leaves(tree)) == len(leaves(tree, 0)) + len(leaves(tree, 1)) == 8 + 2


# --------------------------------------------------------------------------- to_overrides


def pins_by_site(overrides) -> dict[Site, str]:
    sites = Counter(Site(o.unit, o.round, o.key) for o in overrides)
    assert max(sites.values(), default=1) == 1, "a site pinned twice"
    return {Site(o.unit, o.round, o.key): o.action for o in overrides}


def test_to_overrides_pins_every_call_and_carries_dont_inline_forward(tree):
    pins = pins_by_site(to_overrides(tree))
    for unit, round_, key, action in tree.decisions():
        assert pins[Site(unit, round_, key)] == action
    helper = RUN_DECL + "/C(Main.helper@main.ml:7:18-26)"
    # round 1 has its own node for these: its action wins
    assert pins[Site("Main", 1, helper)] == "inline"
    assert pins[Site("Main", 1, G)] == "dont_inline"
    # dont_inline sites of round 0 without a round-1 node are pinned in round 1 too
    assert pins[Site("Main", 1, GO_DECL + "/C(Main.go@main.ml:5:5-9)")] == "dont_inline"
    assert pins[Site("Main", 1, RUN + "/I/C(Main.helper@main.ml:7:18-26)")] == "dont_inline"
    # inlined and specialised sites are not carried forward
    assert Site("Main", 1, RUN) not in pins and Site("Main", 1, MAP) not in pins
    # nothing past the last round of the unit
    assert not any(s.round > 1 for s in pins)
    carried = {s for s in pins if s.round == 1} - {Site(u, r, k) for u, r, k, _ in
                                                      tree.decisions()}
    round0_out = {n.key for _, r, n in tree.calls() if r == 0 and n.action == "dont_inline"}
    assert {s.key for s in carried} == round0_out - {helper, G}
    assert list(to_overrides(tree)) == sorted(to_overrides(tree))


def test_to_overrides_rounds_argument_extends_the_pins(tree):
    pins = pins_by_site(to_overrides(tree, rounds=3))
    assert pins[Site("Main", 2, G)] == "dont_inline"
    # dont_inline in round 1 carries into round 2
    assert pins[Site("Main", 2, RUN_DECL + "/C(Main.helper@main.ml:7:18-26)/I/"
                               "C(Util.add@main.ml:1:15-27)")] == "dont_inline"
    # round 1 inlined helper, so round 2 gets no carried pin for it
    assert Site("Main", 2, RUN_DECL + "/C(Main.helper@main.ml:7:18-26)") not in pins
    assert max(s.round for s in pins) == 2


def test_to_overrides_prevented_is_pinned_as_what_happened(tree):
    pins = pins_by_site(to_overrides(tree))
    assert pins[Site("Main", 0, GO_DECL + "/C(Main.go@main.ml:5:5-9)")] == "dont_inline"


# --------------------------------------------------------------------------- mutations


def test_flip_leaves_flips_k_distinct_leaves_of_round_zero(tree):
    new = flip_leaves(tree, 3, random.Random(1))
    d = diff(tree, new)
    assert len(d.changed) == 3 and not d.only_a and not d.only_b
    assert all(s.round == 0 for s in d.changed)
    for s in d.changed:
        old, got = tree.find(*s), new.find(*s)
        assert old.is_leaf and not old.prevented
        assert got.action == ("inline" if old.action == "dont_inline" else "dont_inline")
        assert got.reason == "override" and got.override == got.action and got.is_leaf


def test_flip_leaves_is_seeded_and_pure(tree):
    before = to_dumps(tree)
    a = flip_leaves(tree, 2, random.Random(7))
    b = flip_leaves(tree, 2, random.Random(7))
    assert a == b and a.parts == b.parts
    assert to_dumps(tree) == before
    outcomes = {frozenset(diff(tree, flip_leaves(tree, 2, random.Random(s))).changed)
                for s in range(20)}
    assert len(outcomes) > 1


def test_flip_leaves_skips_prevented_and_flips_specialise_to_dont_inline():
    t = from_dumps([dump("Main", 0, [
        ("C(M.a@m.ml:1:1-2)", "M.a", "dont_inline", "(prevented self_call)"),
        ("C(M.b@m.ml:2:1-2)", "M.b", "specialise", "heuristic")])])
    assert [n.key for _, _, n in flippable(t)] == ["C(M.b@m.ml:2:1-2)"]
    new = flip_leaves(t, 1, random.Random(0))
    assert new.find("Main", 0, "C(M.b@m.ml:2:1-2)").action == "dont_inline"
    with pytest.raises(ValueError, match="cannot flip 2 leaves, 1 are flippable"):
        flip_leaves(t, 2, random.Random(0))


# Prevented sites as the compiler dumps them (shapes taken from the bundled benchmarks).
LOOP = "D(Main.loop@m.ml:1:8-60)"
ITER = "C(Main.iter@m.ml:9:2-20)"
PREVENTED_ROWS = [
    # key, callee, action, reason
    (ITER, "Main.iter", "inline", "heuristic"),
    # honourable: a recursive callee not being unrolled, not on its own path
    (ITER + "/I/C(Main.step@m.ml:3:4-9)", "Main.step", "dont_inline",
     "(prevented unrolling_depth_exceeded)"),
    # honourable: past -inline-max-depth while speculating
    (ITER + "/I/C(Main.fold@m.ml:4:4-9)", "Main.fold", "dont_inline",
     "(prevented max_inlining_depth)"),
    # blocking: the callee is already inlined above (the unrolling count is spent)
    (ITER + "/I/C(Main.iter@m.ml:5:4-9>m.ml:9:2-20)", "Main.iter", "dont_inline",
     "(prevented unrolling_depth_exceeded)"),
    # blocking: a call in the callee's own declaration
    (LOOP + "/C(Main.loop@m.ml:1:40-50)", "Main.loop", "dont_inline",
     "(prevented self_call)"),
    (LOOP + "/C(Main.loop@m.ml:1:52-58)", "Main.loop", "dont_inline",
     "(prevented max_inlining_depth)"),
    # blocking: a self call of mutually recursive functions (not on the path)
    (LOOP + "/C(Main.other@m.ml:1:20-30)", "Main.other", "dont_inline",
     "(prevented self_call)"),
    # blocking: a guard the evidence has not seen
    ("C(Main.rare@m.ml:7:1-5)", "Main.rare", "dont_inline",
     "(prevented inlining_threshold_exhausted)"),
]


def test_prevented_sites_are_flippable_only_past_guards_an_override_gets_past():
    t = from_dumps([dump("Main", 0, PREVENTED_ROWS)])
    classes = {n.key: guard_class(n) for _, _, n in t.calls() if n.prevented}
    assert classes == {
        ITER + "/I/C(Main.step@m.ml:3:4-9)": "unrolling_depth_exceeded",
        ITER + "/I/C(Main.fold@m.ml:4:4-9)": "max_inlining_depth",
        ITER + "/I/C(Main.iter@m.ml:5:4-9>m.ml:9:2-20)":
            "unrolling_depth_exceeded (callee inlined above)",
        LOOP + "/C(Main.loop@m.ml:1:40-50)": "self_call (in the callee's declaration)",
        LOOP + "/C(Main.loop@m.ml:1:52-58)": "max_inlining_depth (in the callee's declaration)",
        LOOP + "/C(Main.other@m.ml:1:20-30)": "self_call",
        "C(Main.rare@m.ml:7:1-5)": "inlining_threshold_exhausted",
    }
    assert [n.key for _, _, n in flippable(t)] == [ITER + "/I/C(Main.step@m.ml:3:4-9)",
                                                   ITER + "/I/C(Main.fold@m.ml:4:4-9)"]
    # Flipped, a prevented site asks for inline, and the pin says so.
    new = flip_leaves(t, 2, random.Random(0))
    for key in (ITER + "/I/C(Main.step@m.ml:3:4-9)", ITER + "/I/C(Main.fold@m.ml:4:4-9)"):
        assert new.find("Main", 0, key).action == "inline"
        assert Override("Main", 0, key, "inline") in to_overrides(new)
    assert flip_leaves(t, 2, random.Random(0)).parts == new.parts  # replays


def test_callee_above_reads_only_the_path_above_the_call():
    t = from_dumps([dump("Main", 0, PREVENTED_ROWS)])
    node = t.find("Main", 0, ITER + "/I/C(Main.iter@m.ml:5:4-9>m.ml:9:2-20)")
    assert callee_above(node) == "callee inlined above"
    assert callee_above(t.find("Main", 0, ITER)) is None  # its own frame is not above it
    # A call frame of the callee that is not inlined (no I after it) is not "above".
    plain = Node(CALL, "C(M.f@a.ml:1:1-2)#1", "M.f", "dont_inline", "prevented",
                 "unrolling_depth_exceeded")
    assert callee_above(plain) is None and guard_class(plain) == "unrolling_depth_exceeded"


def test_flip_leaves_round_is_configurable(tree):
    new = flip_leaves(tree, 2, random.Random(3), round=1)
    assert {s.round for s in diff(tree, new).changed} == {1}
    every = flip_leaves(tree, len(flippable(tree, None)), random.Random(3), round=None)
    assert len(diff(tree, every).changed) == len(flippable(tree, None)) == 9


def test_backtrack_drops_a_subtree(tree):
    assert {n.key for _, _, n in backtrackable(tree)} == {RUN, MAP, MAP + "/S/C(Lib.f@src/lib/a.ml:2:1-3)", G + "#1"}
    seen = set()
    for seed in range(30):
        new = backtrack(tree, random.Random(seed))
        d = diff(tree, new)
        (site,) = d.changed
        seen.add(site.key)
        node = new.find(*site)
        assert node.action == "dont_inline" and node.is_leaf and node.reason == "override"
        below = {Site(site.unit, site.round, n.key)
                 for n in tree.find(*site).walk() if n.kind == CALL} - {site}
        assert set(d.only_a) == below and not d.only_b
        assert len(new) < len(tree)
        assert new == backtrack(tree, random.Random(seed))
    assert len(seen) == 4


def test_backtrack_without_candidates_raises():
    t = from_dumps([DecisionDump("M", 0, (decision("C(M.a@m.ml:1:1-2)", "inline"),))])
    with pytest.raises(ValueError, match="no inlined call with children"):
        backtrack(t, random.Random(0))


def test_diff():
    a = from_dumps([DecisionDump("M", 0, (decision("C(M.a@m.ml:1:1-2)", "inline"),
                                          decision("C(M.b@m.ml:2:1-2)")))])
    b = from_dumps([DecisionDump("M", 0, (decision("C(M.a@m.ml:1:1-2)"),
                                          decision("C(M.c@m.ml:3:1-2)")))])
    d = diff(a, b)
    assert d.changed == (Site("M", 0, "C(M.a@m.ml:1:1-2)"),)
    assert d.only_a == (Site("M", 0, "C(M.b@m.ml:2:1-2)"),)
    assert d.only_b == (Site("M", 0, "C(M.c@m.ml:3:1-2)"),)
    assert d and not diff(a, a)


# --------------------------------------------------------------------------- random trees

LEAF_ACTIONS = ("inline", "dont_inline", "specialise", "prevented")

shape_leaf = st.tuples(st.just("call"), st.sampled_from(LEAF_ACTIONS), st.booleans(),
                       st.just(()))


def _extend(kids):
    body = st.lists(kids, min_size=1, max_size=3).map(tuple)
    return st.one_of(
        st.tuples(st.just("call"), st.sampled_from(("inline", "specialise")), st.booleans(),
                  body),
        st.tuples(st.just("decl"), st.none(), st.booleans(), body))


shapes = st.recursive(shape_leaf, _extend, max_leaves=10)


def render(unit: str, round_: int, roots) -> RoundTree:
    """Shapes -> nodes with compiler-style keys; the counter restarts every round, so later
    rounds reuse round-0 keys the way surviving sites do."""
    counter = iter(range(10 ** 6))

    def node(prefix: str, shape) -> Node:
        kind, action, flag, kids = shape
        n = next(counter)
        if kind == "decl":
            key = f"{prefix}D({unit}.d{n}@lib/dir{n}/d.ml:{n}:1-9)"
            return Node(DECL, key, f"{unit}.d{n}",
                        children=tuple(node(key + "/", k) for k in kids))
        key = f"{prefix}C({unit}.f{n}@src/x{n}.ml:{n}:2-7>src/y.ml:1:1-2)" + ("#1" if flag else "")
        step = "/I/" if action == "inline" else "/S/"
        if action == "prevented":  # guards flippable or not (callees are never on the path)
            guard = ("self_call", "unrolling_depth_exceeded", "max_inlining_depth")[n % 3]
            return Node(CALL, key, f"{unit}.f{n}", "dont_inline", "prevented", guard)
        return Node(CALL, key, f"{unit}.f{n}", action, "heuristic", detail="with_subfunctions",
                    children=tuple(node(key + step, k) for k in kids))

    return RoundTree(unit, round_, tuple(node("", s) for s in roots))


@st.composite
def trees(draw) -> Tree:
    parts = []
    for unit in draw(st.lists(st.sampled_from(("Main", "Util", "Lib")), min_size=1,
                              max_size=3, unique=True)):
        for r in range(draw(st.integers(1, 3))):
            parts.append(render(unit, r, draw(st.lists(shapes, max_size=4))))
    return Tree(tuple(parts))


PROPS = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(trees())
def test_prop_dumps_round_trip(t):
    again = from_dumps(to_dumps(t))
    assert again == t
    assert again.parts == t.parts  # node for node, reasons and order included
    calls = [n for _, _, n in t.calls()]
    assert len({(u, r, k) for u, r, k, _ in t.decisions()}) == len(calls)


@PROPS
@given(trees(), st.one_of(st.none(), st.integers(1, 5)))
def test_prop_to_overrides_pins_each_call_once_per_round(t, rounds):
    pins = pins_by_site(to_overrides(t, rounds))
    nodes = {Site(u, r, k): a for u, r, k, a in t.decisions()}
    for site, action in nodes.items():
        assert pins[site] == action
    # The other pins: a round without a node for a key whose latest earlier node is dont_inline.
    expected = set()
    for unit, round_, key, action in t.decisions():
        last = rounds if rounds is not None else max(t.rounds(unit)) + 1
        for later in range(round_ + 1, last):
            if Site(unit, later, key) in nodes:
                break
            if action == "dont_inline":
                expected.add(Site(unit, later, key))
    assert pins.keys() - nodes.keys() == expected
    assert all(pins[s] == "dont_inline" for s in expected)


@PROPS
@given(trees(), st.one_of(st.none(), st.integers(1, 5)), st.integers(0, 2 ** 32))
def test_prop_to_overrides_of_a_chain_of_flips_as_of_fresh_trees(t, rounds, seed):
    """The pins kept per root-level node (a flip shares the roots it does not change) give
    what a tree made afresh, with nothing kept, gives: along a chain of flips and undone
    inlinings (in round 0 or later ones), each tree asked before and after the ones drawn
    from it."""
    rng = random.Random(seed)
    trees_seen = [t]
    for _ in range(6):
        x = rng.choice(trees_seen)
        to_overrides(x, rounds)
        # a flip in a later round keeps the earlier rounds' nodes: their pins are kept
        # for other later round trees, and must not be taken for these
        round_ = rng.choice([0, 1, None])
        if rng.random() < 0.2:  # a later round's nodes gone: its keys carry earlier pins
            x = Tree(tuple(RoundTree(p.unit, p.round) if p.round > 0 else p
                           for p in x.parts))
        elif backtrackable(x, round_) and rng.random() < 0.3:
            x = backtrack(x, rng, round_)
        elif flippable(x, round_):
            x = flip_leaves(x, rng.randint(1, min(2, len(flippable(x, round_)))), rng, round_)
        trees_seen.append(x)
    for x in trees_seen:
        fresh = from_dumps(to_dumps(x))
        assert list(to_overrides(x, rounds)) == list(to_overrides(fresh, rounds))


@PROPS
@given(trees(), st.data())
def test_prop_flip_leaves(t, data):
    pool = flippable(t)
    k = data.draw(st.integers(0, len(pool)))
    seed = data.draw(st.integers(0, 2 ** 32))
    before = to_dumps(t)
    new = flip_leaves(t, k, random.Random(seed))
    assert to_dumps(t) == before  # pure
    d = diff(t, new)
    assert len(d.changed) == k and not d.only_a and not d.only_b
    leaf_sites = {Site(u, r, n.key) for u, r, n in pool}
    assert set(d.changed) <= leaf_sites and all(s.round == 0 for s in d.changed)
    assert len(new) == len(t)
    again = flip_leaves(t, k, random.Random(seed))
    assert again.parts == new.parts
    with pytest.raises(ValueError):
        flip_leaves(t, len(pool) + 1, random.Random(seed))


@PROPS
@given(trees(), st.integers(0, 2 ** 32))
def test_prop_backtrack(t, seed):
    if not backtrackable(t):
        with pytest.raises(ValueError):
            backtrack(t, random.Random(seed))
        return
    before = to_dumps(t)
    new = backtrack(t, random.Random(seed))
    assert to_dumps(t) == before  # pure
    assert len(new) < len(t)
    d = diff(t, new)
    (site,) = d.changed
    node = new.find(*site)
    assert node.action == "dont_inline" and node.is_leaf
    assert t.find(*site).action in ("inline", "specialise") and t.find(*site).children
    assert not d.only_b
    assert all(s.key.startswith(site.key + "/") for s in d.only_a)
    assert backtrack(t, random.Random(seed)).parts == new.parts


# --------------------------------------------------------------------------- real compiler

BENCHMARKS = ("kahan", "lens")
SEEDS = range(6)


class Builds:
    """Compiles a benchmark with a tree's overrides, each into a fresh directory."""

    def __init__(self, compiler, root: Path) -> None:
        self.compiler, self.root, self.n = compiler, root, itertools.count(1)

    def compile(self, bench, overrides: list[Override] | None) -> tuple[Tree, list]:
        d = self.root / f"build{next(self.n)}"  # (one count for every thread)
        d.mkdir(parents=True)
        ov = write_overrides(d / "overrides.sexp", overrides) if overrides is not None else None
        build_benchmark(bench, d, self.compiler.ocamlopt, overrides=ov, dump_decisions=True)
        dumps = read_dumps(dump_files(d))
        return from_dumps(dumps), dumps


def unmatched(dumps) -> set[Site]:
    return {Site(x.unit, x.round, k) for x in dumps for k in x.unmatched_keys}


def heuristic_tree(bundled_builds, bench) -> Tree:
    """The heuristic's tree of a bundled benchmark, from the session's build with dumps."""
    return from_dumps(read_dumps(dump_files(bundled_builds.get(bench, dumps=True).binary.parent)))


def test_tree_overrides_compile_round_trip(compiler, bundled_builds, tmp_path):
    """P = mutate(T) -> compile -> T'; pinning T' must give T' back exactly (T'' == T'),
    and T' must honour every pin of P whose site it still has (or show it prevented)."""
    builds = Builds(compiler, tmp_path)
    stats = Counter()
    benches = [resolve_benchmark(name) for name in BENCHMARKS]
    bundled_builds.prefetch(benches, dumps=True)
    bases = {b.name: heuristic_tree(bundled_builds, b) for b in benches}

    def trip(job):
        """The seed's proposal, its build, and the build pinned to what that one decided."""
        bench, seed = job
        base = bases[bench.name]
        rng = random.Random(seed)
        proposal = (flip_leaves(base, 3, rng) if seed % 2 == 0 else backtrack(base, rng))
        real, dumps1 = builds.compile(bench, to_overrides(proposal))
        return proposal, real, dumps1, builds.compile(bench, to_overrides(real))

    jobs = [(bench, seed) for bench in benches for seed in SEEDS]
    for (bench, seed), (proposal, real, dumps1, (again, dumps2)) in zip(
            jobs, on_every_cpu(trip, jobs)):
        name, base = bench.name, bases[bench.name]
        asked = to_overrides(proposal)
        flipped = diff(base, proposal).changed
        for pin in asked:
            got = real.find(pin.unit, pin.round, pin.key)
            if got is None:
                stats["pins without a site"] += 1
                continue
            assert got.action == pin.action or got.prevented, (name, seed, pin, got)
            if Site(pin.unit, pin.round, pin.key) in flipped:
                stats["flips honoured" if got.action == pin.action else "flips prevented"] += 1
        assert unmatched(dumps1) == {Site(o.unit, o.round, o.key) for o in asked
                                     if real.find(o.unit, o.round, o.key) is None}

        pins = to_overrides(real)
        assert again == real, (name, seed, diff(real, again))
        # Every node pin matched; only the carried-forward dont_inline pins did not.
        carried = {Site(o.unit, o.round, o.key) for o in pins
                   if real.find(o.unit, o.round, o.key) is None}
        assert unmatched(dumps2) == carried
        stats["round trips"] += 1
        stats["carried pins unmatched"] += len(carried)
    print(f"\ntree round trip: {dict(stats)}")
    assert stats["round trips"] == len(BENCHMARKS) * len(SEEDS)
    assert stats["flips honoured"] > 0


@pytest.mark.parametrize("text, expected", [
    ('(a "b\\"c\\\\d\\ne\\tf" -3 x:y)',
     [sexpdata.Symbol("a"), 'b"c\\d\ne\tf', -3, sexpdata.Symbol("x:y")]),
    ("; comment (\n(a ;x)\n b) ; trailing\n", [sexpdata.Symbol("a"), sexpdata.Symbol("b")]),
])
def test_fast_sexp_reader_reads_what_the_compiler_writes(text, expected):
    from dispatcher.core.decisions import read_sexp
    assert read_sexp(text) == sexpdata.loads(text) == expected


@pytest.mark.parametrize("text", ["(a", "a)", '(a "b)', "(a) (b)", "", '(a "x\\q")'])
def test_fast_sexp_reader_refuses_what_it_does_not_know(text):
    from dispatcher.core.decisions import read_sexp
    with pytest.raises(ValueError):
        read_sexp(text)


@given(st.text(alphabet="ab/()#1", max_size=16))
def test_split_key_cuts_only_at_top_level_slashes(key):
    from dispatcher.core.tree import join_key, split_key
    frames = split_key(key)
    assert join_key(frames) == key
    for frame in frames[:-1]:  # every cut is a '/' at parenthesis depth 0
        assert frame.count("(") == frame.count(")")


def test_prevented_sites_flippable_or_not_as_the_compiler_honours_them(compiler, bundled_builds,
                                                                       tmp_path):
    """Forced to inline as a search step would (``propose_action`` then ``to_overrides``),
    the prevented sites ``flippable`` offers are inlined, and those it keeps out are
    prevented again: the evidence of ``bench/prevented_flips`` (compiler/README.md), on a
    small seeded sample of round 0."""
    builds = Builds(compiler, tmp_path)
    outcomes: Counter = Counter()
    benches = [resolve_benchmark(name) for name in BENCHMARKS]
    bundled_builds.prefetch(benches, dumps=True)
    bases = [heuristic_tree(bundled_builds, b) for b in benches]
    jobs = []  # (benchmark, guard class, flippable, base, site): one build each, site inlined
    for bench, base in zip(benches, bases):
        offered = {(u, r, n.key) for u, r, n in flippable(base)}
        by_class: dict[tuple[str, bool], list] = {}
        for site in leaves(base, 0):
            if site.node.prevented:
                by_class.setdefault((guard_class(site.node), (site.unit, site.round,
                                                              site.node.key) in offered),
                                    []).append(site)
        for (group, flippable_), sites in sorted(by_class.items()):
            for site in random.Random(7).sample(sites, min(2, len(sites))):
                jobs.append((bench, group, flippable_, base, site))
    reals = on_every_cpu(lambda job: builds.compile(job[0], to_overrides(propose_action(
        job[3], job[4], "inline")))[0], jobs)
    for (bench, group, flippable_, _, site), real in zip(jobs, reals):
        name = bench.name
        got = real.find(site.unit, site.round, site.node.key)
        assert got is not None, (name, site.node.key)
        honoured = got.action == "inline"
        assert honoured == flippable_, (name, group, site.node.key, got)
        outcomes[(group, honoured)] += 1
    print(f"\nprevented flips: {dict(outcomes)}")
    assert any(honoured for _, honoured in outcomes) and not all(h for _, h in outcomes)
