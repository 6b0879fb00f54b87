"""Issue 35, item 3: labels from an aggressive reference.  ``measure-sites --reference
always-inline|TREE`` flips sites that build inlined back to ``dont_inline``, alone, against
its build; the table records the reference (older tables read as heuristic); a benchmark's
table keeps both kinds, and ``train-policy --labels`` trains on both.  The rules on made-up
rows and the planted program's real dumps; the command's refusals in process; end to end on
the planted program at its tiny size in cycles, two sites."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from analysis.label_training import label_sites, read_sites_table, site_label
from analysis.labels import label_rows, merged_table, write_table
from dispatcher.build.manifest import load_benchmark
from dispatcher.build.policies import parse_policy
from dispatcher.build.service import CompileJob, CompileService
from dispatcher.core.decisions import Override, overrides_text
from dispatcher.core.records import HotFunctions
from dispatcher.core.rundir import SitesRundir
from dispatcher.core.site_records import LabelEvent, SitesExperiment, reference_name
from dispatcher.core.tree import Tree
from dispatcher.labels.reference import (
    CHOSEN,
    REFERENCE_TREE,
    flip_back_sites,
    flipped_back,
)
from dispatcher.search.focus import site_heat
from dispatcher.storage.store import Store
from tests.helpers import FIRST_CPU, GOLDEN_LABELS, invoke, needs_valgrind, one_line_error
from tests.helpers import PLANTED_GRID as PLANTED


def test_the_reference_a_table_records():
    assert reference_name(None) == reference_name("heuristic") == "heuristic"
    assert reference_name("always-inline") == "always-inline"
    assert reference_name("/some/where/optimal.sexp") == "tree:optimal.sexp"
    # an older rundir has no reference: it reads as the heuristic's, and writes as it did
    exp = json.loads((GOLDEN_LABELS / "experiment.json").read_text())
    assert "reference" not in exp
    loaded = SitesExperiment.model_validate(exp)
    assert loaded.reference is None and "reference" not in loaded.to_json()
    assert set(label_rows(GOLDEN_LABELS)["reference"]) == {"heuristic"}


@pytest.fixture(scope="module")
def always_inline_tree(compiler, tmp_path_factory) -> Tree:
    service = CompileService(Store(tmp_path_factory.mktemp("store")), compiler)
    try:
        built = service.compile(CompileJob(load_benchmark(PLANTED),
                                           policy=parse_policy("always-inline")))
    finally:
        service.close()
    return Tree.from_dumps(built.artifact.dumps())


def test_the_hottest_sites_the_reference_inlined_are_set_back(always_inline_tree):
    tree = always_inline_tree
    chosen = [(u, r, n) for u, r, n in tree.calls() if n.action == "inline"
              and n.reason in CHOSEN]
    assert any(n.children for _, _, n in chosen)  # inlined bodies with calls: candidates too
    # made-up samples: every function holding a chosen call, a different count each
    functions: dict[str, int] = {}
    for _, _, n in chosen:
        functions.setdefault(n.name, 3 * len(functions) + 1)
    hot = HotFunctions(functions=functions)
    sites = flip_back_sites(tree, hot, 3)
    assert len(sites) == 3
    assert all(s.action == "dont_inline" and s.heuristic == "inline" for s in sites)
    heats = [site_heat(s.unit, s.key, s.callee, hot) for s in sites]
    assert heats == sorted(heats, reverse=True) and heats[-1] > 0
    # nothing hotter left out, a site taken once, none the reference did not choose
    best = sorted({site_heat(u, n.key, n.name, hot) for u, _, n in chosen}, reverse=True)
    assert heats[0] == best[0]
    assert len({(s.unit, s.key) for s in sites}) == 3
    assert flip_back_sites(tree, HotFunctions(), 3) == []  # never sampled: never taken

    # the overrides of one: the reference's own kept, the site pinned to dont_inline in its
    # round and the unit's later rounds, replacing an entry of the same site
    s = sites[0]
    base = [Override(s.unit, s.round, s.key, "inline"), Override("Other", 0, "k", "inline")]
    got = flipped_back(base, tree, s)
    assert Override("Other", 0, "k", "inline") in got
    mine = [o for o in got if (o.unit, o.key) == (s.unit, s.key)]
    last = max(r for u, r, _ in tree.calls() if u == s.unit)
    assert [o.round for o in mine] == list(range(s.round, last + 1))
    assert {o.action for o in mine} == {"dont_inline"}


def row(action="dont_inline", effect=0.05, reference=None, context="alone", trial="labels"):
    low, high = effect - 0.02, effect + 0.02
    r = {"unit": "M", "round": 0, "key": "k", "heuristic_action": "inline", "action": action,
         "context": context, "status": "measured", "effect": effect, "low": low,
         "high": high, "trial": trial}
    if reference is not None:
        r["reference"] = reference
    return r


def test_both_kinds_label_a_site_and_a_conflict_is_default():
    t = 0.01
    # always-inline's flip-back faster: inlining there hurt, dont_inline; slower: inline
    assert site_label([row(reference="always-inline")], t) == "dont_inline"
    assert site_label([row(effect=-0.05, reference="always-inline")], t) == "inline"
    # from the heuristic's tree (no column: an older table) and from always-inline, agreeing
    agree = [row(action="dont_inline"), row(reference="always-inline")]
    assert site_label(agree, t) == "dont_inline"
    # another reference is another comparison, not a replicate: disagreeing, the site is
    # default (as two comparisons of one context that disagree)
    assert site_label([row(action="inline", effect=0.05),
                       row(reference="always-inline")], t) == "default"
    # one reference's nothing does not hide another's label
    assert site_label([row(effect=0.0), row(reference="always-inline")], t) == "dont_inline"


def test_a_table_keeps_both_kinds_and_trains_on_them(tmp_path):
    """The heuristic's labels (the golden rundir's) and an aggressive reference's in one
    table: writing one kind keeps the other's rows, writing a kind again replaces its own;
    the table reads back checked and labels sites of both."""
    heuristic = label_rows(GOLDEN_LABELS)
    directory = tmp_path / "labels" / "kahan"
    write_table(merged_table(heuristic, None), directory)
    measured = heuristic[heuristic["status"] == "measured"].head(3)
    aggressive = measured.assign(reference="always-inline", action="dont_inline",
                                 heuristic_action="inline", context="alone",
                                 key=[f"{k}/X" for k in measured["key"]])
    write_table(merged_table(aggressive, read_sites_table(directory / "sites.parquet")),
                directory)
    both = read_sites_table(directory / "sites.parquet")
    assert list(both["reference"]).count("always-inline") == len(aggressive)
    assert list(both["reference"]).count("heuristic") == len(heuristic)
    # the heuristic's again: its rows replaced, always-inline's kept
    write_table(merged_table(heuristic.head(2), both), directory)
    again = read_sites_table(directory / "sites.csv")
    assert list(again["reference"]).count("heuristic") == 2
    assert list(again["reference"]).count("always-inline") == len(aggressive)
    sites, _ = label_sites(both, 0.0)
    keys = set(sites["key"])
    assert {f"{k}/X" for k in measured["key"]} <= keys  # the aggressive ones are labelled
    assert keys - {f"{k}/X" for k in measured["key"]}  # and so are the heuristic's
    # a bad reference is one line naming the file, the row and the column
    bad = both.copy()
    bad.loc[0, "reference"] = "two\nlines"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match=r"bad.csv: row 1: reference .*: expected heuristic"):
        read_sites_table(tmp_path / "bad.csv")


def config(where: Path, store: Path) -> Path:
    path = where / "config.yaml"
    path.write_text(yaml.safe_dump({
        "store": str(store), "local": {"cpus": [FIRST_CPU]},
        "run": {"runs": 2, "timeout": 30, "size": "tiny"},
        "measure": {"max_pairs": 2, "canary_every": 0},
        "search": {"rundirs": str(where / "rundirs"), "batch_log": str(where / "batch.log")}}))
    return path


@pytest.mark.parametrize("args, says", [
    (["--reference", "sometimes"], "--reference sometimes: expected heuristic, always-inline"),
    (["--reference", "{tmp}/missing.sexp"], "{tmp}/missing.sexp: --reference: no such file"),
    (["--reference", "{tmp}/other.sexp"], "{tmp}/other.sexp: --reference: its decisions are "
                                          "for unit Nowhere, which grid does not have"),
    (["--reference", "always-inline", "--tree", f"{PLANTED}={{tmp}}/empty.sexp"],
     "--reference always-inline: only with --tasks"),
])
def test_a_bad_reference_is_one_line_before_any_rundir(tmp_path, args, says):
    (tmp_path / "tasks").write_text(f"{PLANTED}\n")
    (tmp_path / "other.sexp").write_text(overrides_text([Override("Nowhere", 0, "k",
                                                                  "inline")]))
    (tmp_path / "empty.sexp").write_text(overrides_text([]))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    line = one_line_error(invoke("measure-sites", "--config", str(config(tmp_path, tmp_path /
                                                                          "store")),
                                 "--tasks", str(tmp_path / "tasks"), *args, cwd=tmp_path))
    assert line.startswith(f"measure-sites: {says.replace('{tmp}', str(tmp_path))}"), line
    assert not (tmp_path / "rundirs").exists()


def test_a_reference_is_refused_on_resume(tmp_path):
    line = one_line_error(invoke("measure-sites", "--resume", str(tmp_path),
                                 "--reference", "always-inline", cwd=tmp_path))
    assert "--reference" in line, line


@needs_valgrind
def test_always_inline_sites_set_back_end_to_end(tmp_path, compiler):
    """The planted program's two hottest sites always-inline inlined, each set back alone
    against always-inline's build, in cycles at tiny size (no wall confirmation: above any
    effect); the table records the reference, and a label's effect is log(reference cycles
    / tested cycles) of its own binaries."""
    (tmp_path / "tasks").write_text(f"{PLANTED}\n")
    done = invoke("measure-sites", "--config", str(config(tmp_path, tmp_path / "store")),
                  "--tasks", str(tmp_path / "tasks"), "--reference", "always-inline",
                  "--sweep", "2", "--metric", "cycles", "--confirm-above", "100",
                  "--labels", str(tmp_path / "labels"), cwd=tmp_path)
    assert done.exit_code == 0, done.stderr
    assert "sweeping the 2 hottest sites always-inline inlined" in done.stderr
    assert "reference: always-inline: each label sets one site it inlined back" in done.stderr
    rundir = SitesRundir(next((tmp_path / "rundirs").iterdir()))
    assert rundir.experiment.reference == "always-inline"
    assert not (rundir.path / REFERENCE_TREE).exists()
    labels = [e for e in rundir.events() if isinstance(e, LabelEvent)]
    assert len(labels) == 2
    assert all(e.site.action == "dont_inline" and e.context == "alone" for e in labels)
    measured = [e for e in labels if e.outcome.measured]
    assert measured, [e.outcome for e in labels]
    table = read_sites_table(tmp_path / "labels" / "grid" / "sites.parquet")
    assert set(table["reference"]) == {"always-inline"}
    assert set(table["heuristic_action"]) == {"inline"}
    assert set(table["heuristic_reason"]) <= set(CHOSEN)
    for e in measured:
        assert e.outcome.speedup is not None and e.outcome.cycles is not None
        r = table[table["key"] == e.site.key].iloc[0]
        assert r["effect"] == pytest.approx(math.log(e.outcome.speedup))
        assert r["cycles_effect"] == pytest.approx(r["effect"])  # its own counts
    # the reference's binary is always-inline's, not the heuristic's
    store = CompileService(Store(tmp_path / "store"), compiler)
    try:
        heuristic = store.compile(CompileJob(load_benchmark(PLANTED)))
        aggressive = store.compile(CompileJob(load_benchmark(PLANTED),
                                              policy=parse_policy("always-inline")))
    finally:
        store.close()
    start = json.loads((rundir.path / "journal.jsonl").read_text().splitlines()[1])
    assert start["event"] == "reference" and start["sha256"] == aggressive.sha256 \
        != heuristic.sha256
