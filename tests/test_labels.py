"""Labels (``measure-sites``): delta debugging, the winner's decisions, and the command end to
end with the real compiler and agent: a kill in the middle, a resume, the table."""
from __future__ import annotations

import itertools
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dispatcher.core.comparison import Comparison
from dispatcher.core.decisions import Override
from dispatcher.core.records import (
    Candidate,
    ConfirmEvent,
    FinishEvent,
    Pointer,
    RunRecord,
    RunResult,
    StepEvent,
)
from dispatcher.core.rundir import KILL_HOOK_ENV, Rundir, SitesRundir, read_batch_log
from dispatcher.core.site_records import (
    LabelEvent,
    MinimalEvent,
    Paired,
    ReferenceEvent,
    SiteDecision,
    SubsetEvent,
    WinnerEvent,
)
from dispatcher.core.tree import Tree, from_dumps
from dispatcher.labels.ddmin import ddmin, split
from dispatcher.labels.procedure import keeps_gain, pooled
from dispatcher.labels.winner import confirmed_winner, tree_with, winner_decisions
from tests.helpers import ROWS_0, ROWS_1, dump, invoke, one_line_error

REPO = Path(__file__).resolve().parent.parent
FIRST_CPU = min(os.sched_getaffinity(0))
ORIGINAL_AFFINITY = os.sched_getaffinity(0)

# --------------------------------------------------------------------------- ddmin


def test_split_covers_the_items_in_order():
    for n_items, n in itertools.product(range(1, 9), range(1, 9)):
        items = list(range(n_items))
        parts = split(items, n)
        assert [x for p in parts for x in p] == items
        assert len(parts) == min(n, n_items)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("needed", [{5}, {0, 7}, {2, 3, 6}, {1, 2, 3, 4, 5, 6}])
def test_ddmin_finds_exactly_the_decisions_that_must_be_together(needed):
    asked: list[tuple[int, ...]] = []

    def test(subset):
        asked.append(subset)
        return needed <= set(subset)  # the gain needs all of them (an interaction)

    reduced = ddmin(range(8), test, max_tests=100)
    assert set(reduced.subset) == needed
    assert reduced.stopped == "minimal"
    assert len(asked) == len(set(asked)) == reduced.tests  # no subset asked twice


def test_ddmin_keeps_one_of_two_alternatives():
    reduced = ddmin(range(6), lambda s: 1 in s or 4 in s, max_tests=100)
    assert len(reduced.subset) == 1 and reduced.subset[0] in (1, 4)


def test_ddmin_stops_at_its_budget_with_the_smallest_passing_subset_so_far():
    needed = {0, 3, 5, 6}
    reduced = ddmin(range(16), lambda s: needed <= set(s), max_tests=3)
    assert reduced.stopped == "budget" and reduced.tests == 3
    assert needed <= set(reduced.subset) and len(reduced.subset) < 16


def test_ddmin_asks_the_same_questions_in_the_same_order():
    """What lets a resume replay the journal: the answers decide the questions."""
    runs = []
    for _ in range(2):
        asked: list[tuple[int, ...]] = []

        def test(s, asked=asked):
            asked.append(s)
            return {2, 9} <= set(s)

        ddmin(range(10), test, max_tests=50)
        runs.append(asked)
    assert runs[0] == runs[1]


# --------------------------------------------------------------------------- outcomes


def paired(speedup, low, high, pairs=8) -> Paired:
    return Paired(status="measured", speedup=speedup, ci95=(low, high), pairs=pairs)


def test_keeps_gain_needs_significance_and_the_share_of_the_log_speedup():
    full = math.log(1.10)
    assert keeps_gain(paired(1.095, 1.08, 1.11), full, 0.9)
    assert not keeps_gain(paired(1.05, 1.03, 1.07), full, 0.9)  # half the gain
    assert not keeps_gain(paired(1.12, 0.99, 1.25), full, 0.9)  # not significant
    assert not keeps_gain(Paired(status="unresolved"), full, 0.9)


def comparison(ref, cand, stopped="target", failed=0) -> Comparison:
    return Comparison(worker="local/cpu0", reference_times=ref, candidate_times=cand,
                      results=[], stopped=stopped, failed=failed, min_pairs=2)


def test_pooled_parts_mix_no_unresolved_part_and_need_the_fewest_pairs():
    a = comparison([1.0, 1.1, 1.0], [0.9, 1.0, 0.91])
    b = comparison([1.0, 1.0], [1.0, 1.0])
    lost = comparison([2.0], [0.5], stopped="unresolved")
    out = pooled([a, b, lost], fewest=4, sha256="x")
    assert out.status == "measured" and out.pairs == 5
    assert out.ci95 is not None and out.ci95[0] <= out.speedup <= out.ci95[1]
    assert pooled([a, lost], fewest=4, sha256="x").status == "unresolved"
    assert pooled([a, comparison([1.0], [1.0], stopped="failed", failed=1)], fewest=2,
                  sha256="x").status == "failed"


def test_a_tests_cost_counts_the_runs_of_its_parts_measured_now_not_those_the_store_answered():
    def timed(*walls: float) -> RunResult:
        return RunResult(sha256="x", args=(), worker="local/cpu0", worker_class="local", cpu=0,
                         records=tuple(RunRecord(wall_ns=int(w * 1e9), user_s=w, sys_s=0.0,
                                                 maxrss_kb=1) for w in walls))
    fresh = replace(comparison([1.0, 1.0], [0.9, 0.9]), results=[timed(1.0, 0.9, 1.0, 0.9)])
    answered = replace(fresh, reused=True)
    assert pooled([fresh], fewest=2, sha256="x").cpu_s == pytest.approx(3.8)
    assert pooled([fresh, answered], fewest=2, sha256="x").cpu_s == pytest.approx(3.8)
    assert pooled([answered], fewest=2, sha256="x").cpu_s == 0


# --------------------------------------------------------------------------- decisions


def heuristic_tree() -> Tree:
    return from_dumps([dump("Main", 0, ROWS_0), dump("Main", 1, ROWS_1)])


def test_winner_decisions_are_its_forced_choices_the_heuristic_did_not_make():
    rows = [list(r) for r in ROWS_0]
    flipped_key = rows[8][0]  # Main.g: dont_inline by the heuristic
    rows[8][2:] = ["inline", "override"]
    rows[0][3] = "override"  # pinned, but as the heuristic decided: not a choice
    rows.append([flipped_key + "/I/C(Main.q@main.ml:9:2-3)", "Main.q", "dont_inline",
                 "override"])  # a site only the winner has
    rows.append([flipped_key + "/I/C(Main.r@main.ml:9:4-5)", "Main.r", "inline",
                 "heuristic"])  # decided by the compiler in the new body: a consequence
    winner = from_dumps([dump("Main", 0, [tuple(r) for r in rows]), dump("Main", 1, ROWS_1)])
    got = winner_decisions(heuristic_tree(), winner)
    assert [(d.key, d.action, d.heuristic) for d in got] == [
        (flipped_key, "inline", "dont_inline"),
        (flipped_key + "/I/C(Main.q@main.ml:9:2-3)", "dont_inline", None)]


def test_tree_with_pins_only_the_decisions_and_carries_dont_inline_to_later_rounds():
    h = heuristic_tree()
    run = ROWS_0[0][0]
    d = SiteDecision(unit="Main", round=0, key=run, callee="Main.run", action="dont_inline",
                     heuristic="inline")
    e = SiteDecision(unit="Main", round=0, key=ROWS_0[8][0], callee="Main.g", action="inline",
                     heuristic="dont_inline")
    assert tree_with(h, [d, e]) == sorted([Override("Main", 0, run, "dont_inline"),
                                           Override("Main", 1, run, "dont_inline"),
                                           Override("Main", 0, ROWS_0[8][0], "inline")])
    assert tree_with(h, []) == []  # the heuristic's own build


# --------------------------------------------------------------------------- end to end


def config(tmp_path: Path, store: Path) -> Path:
    data = {"store": str(store), "local": {"cpus": [FIRST_CPU]},
            "run": {"runs": 2, "timeout": 30, "size": "tiny"},
            "measure": {"max_pairs": 3, "canary_every": 0},
            "search": {"baseline_runs": 3, "remeasure_every": 0, "max_flips": 2,
                       "rundirs": str(tmp_path / "rundirs"),
                       "batch_log": str(tmp_path / "batch.log")}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600
        ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commands", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def crafted_winner(rundir: Path) -> str:
    """Journal a confirmation of a candidate of the search that differs from the heuristic:
    written by the test, so the attribution runs whatever the short search found.  The
    procedure measures the winner's decisions itself and takes the path its own figures
    say (no gain to attribute, or delta debugging)."""
    rd = Rundir(rundir)
    steps = list(rd.events_of(StepEvent))
    chosen = next(c for s in steps for c in s.candidates if c.sha256 and c.decisions)
    rd.append(ConfirmEvent(step=1, candidate=chosen.candidate, dir=chosen.dir, times=[1.0],
                           reference_times=[1.1], speedup=1.1, ci95=(1.05, 1.15),
                           significant=True))
    return chosen.dir


def test_measure_sites_attributes_a_winner_survives_a_kill_and_writes_the_table(
        tmp_path, compiler):
    cfg = config(tmp_path, tmp_path / "store")
    (tmp_path / "tasks").write_text("kahan\n")
    search = run("run_training_experiments", "--config", str(cfg), "--tasks",
                 str(tmp_path / "tasks"), "--steps", "2", "--seed", "3", cwd=tmp_path)
    assert search.returncode == 0, search.stderr
    source = next((tmp_path / "rundirs").iterdir())
    winner_dir = crafted_winner(source)

    # --no-cycles: what this test asserts is the attribution, the kill and the table
    # (tests/test_label_metrics.py tests the labels' cycles effect).
    args = ["measure-sites", "--config", str(cfg), str(source), "--sweep", "2", "--retest",
            "--max-tests", "6", "--no-cycles"]
    # Killed before the winner is journaled (what to attribute must survive in the rundir),
    # then again after two labels, then resumed to the end.
    killed = run(*args, cwd=tmp_path, env={KILL_HOOK_ENV: "reference:1"})
    assert killed.returncode == -9, killed.stderr
    labels_rundir = next(p for p in (tmp_path / "rundirs").iterdir() if "-sites-" in p.name)
    entry = read_batch_log(tmp_path / "batch.log")[-1]
    assert entry.algorithm == "sites" and Path(entry.rundir) == labels_rundir.resolve()
    again = ["measure-sites", "--config", str(cfg), "--resume", str(labels_rundir)]
    killed = run(*again, cwd=tmp_path, env={KILL_HOOK_ENV: "label:2"})
    assert killed.returncode == -9, killed.stderr
    before = SitesRundir(labels_rundir).events()
    assert sum(isinstance(e, LabelEvent) for e in before) == 2

    resumed = run(*again, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    events = SitesRundir(labels_rundir).events()
    assert events[:len(before)] == before  # the journal was appended to, never rewritten
    reference = next(e for e in events if isinstance(e, ReferenceEvent))
    winner = next(e for e in events if isinstance(e, WinnerEvent))
    assert winner.dir == winner_dir and winner.decisions
    assert winner.decisions == winner_decisions(
        Tree.from_dir(labels_rundir / "reference"), Tree.from_dir(source / winner_dir))
    tests = [e for e in events if isinstance(e, SubsetEvent)]
    assert tests[0].subset == list(range(len(winner.decisions)))  # the whole set first
    assert len({tuple(t.subset) for t in tests}) == len(tests)  # no subset measured twice
    minimal = [e for e in events if isinstance(e, MinimalEvent)]
    assert len(minimal) == 1
    labels = [e for e in events if isinstance(e, LabelEvent)]
    keys = [(e.trial, e.context, e.site.unit, e.site.round, e.site.key, e.site.action)
            for e in labels]
    assert len(keys) == len(set(keys))  # the kill lost nothing and doubled nothing
    if minimal[0].stopped == "no_gain":
        assert not any(e.decision is not None for e in labels)
    else:
        assert tests[0].outcome.measured
        kept = set(minimal[0].subset)
        assert {e.decision for e in labels if e.decision is not None} == kept
        assert all(e.site.action == winner.decisions[e.decision].action
                   for e in labels if e.context == "alone" and e.decision is not None)
    sweep = [e for e in labels if e.heat is not None and e.trial == "labels"]
    assert 1 <= len(sweep) <= 2 and all(e.context == "alone" for e in sweep)
    for e in labels:  # every outcome is a figure or a stated reason
        o = e.outcome
        if o.status == "measured":
            assert o.ci95 is not None and o.ci95[0] <= o.speedup <= o.ci95[1]
            # a flip alone is measured against the heuristic, so never its binary; a decision
            # taken out of the winner (removed, minimal) is measured against the winner's tree
            # and may well build the heuristic's binary (a minimal set of one, without it)
            if e.context == "alone":
                assert o.sha256 != reference.sha256
        else:
            assert o.why
    firsts = {k[1:] for k, e in zip(keys, labels) if k[0] == "labels" and e.outcome.measured}
    assert firsts == {k[1:] for k in keys if k[0] == "retest"}

    table = pd.read_parquet(tmp_path / "labels" / "kahan" / "sites.parquet")
    assert len(table) == len(labels)
    assert {"callee", "action", "context", "effect", "low", "high", "pairs",
            "disturbed_share", "heuristic_action", "callee_size", "in_loop"} <= set(table)
    measured = table[table["status"] == "measured"]
    assert ((measured["low"] <= measured["effect"]) & (measured["effect"] <= measured["high"])
            ).all()
    assert not table[table["status"] != "measured"]["effect"].notna().any()
    csv = pd.read_csv(tmp_path / "labels" / "kahan" / "sites.csv")
    assert len(csv) == len(table)
    assert (tmp_path / "labels" / "kahan" / "report.txt").read_text().startswith("winner:")


def test_measure_sites_refuses_bad_input_in_one_line(tmp_path):
    """Each refused before a session, a worker or a rundir exists: in this process, one line
    naming the command, the user-error status."""
    cfg = config(tmp_path, tmp_path / "store")
    (tmp_path / "not-a-rundir").mkdir()
    (tmp_path / "tasks").write_text("no_such_benchmark\n")
    for args, expected in [
            ([], "nothing to measure"),
            ([str(tmp_path / "not-a-rundir")], "not a rundir"),
            (["--tasks", str(tmp_path / "tasks")], "no_such_benchmark"),
            (["--resume", str(tmp_path / "not-a-rundir"), "--sweep", "3"],
             "--sweep cannot be used with --resume")]:
        line = one_line_error(invoke("measure-sites", "--config", str(cfg), *args,
                                     cwd=tmp_path))
        assert line.startswith("measure-sites: ") and expected in line, line
    assert not (tmp_path / "rundirs").exists() or not any((tmp_path / "rundirs").iterdir())


def test_a_flip_whose_code_is_decided_again_in_another_unit_is_not_reached(tmp_path, compiler):
    """lu: ``Matrix.get`` inside ``Matrix.update``, flipped in unit Matrix, where
    ``Matrix.update`` is inlined into Lu and its call decided again there: the flip's code
    is not what runs.  The label says so and measures nothing (never "no effect")."""
    import threading

    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.config import load_config
    from dispatcher.core.site_records import SitesExperiment
    from dispatcher.core.tree import flippable
    from dispatcher.labels.procedure import SiteLabeller
    from dispatcher.labels.winner import flipped
    from dispatcher.running import local
    from dispatcher.session import Session

    cfg = load_config(config(tmp_path, tmp_path / "store"))
    bench = resolve_benchmark("lu")
    # The session confines this process to the CPUs its workers leave (keep_master_off):
    # the rest of the suite runs in this process, so that is undone at the end.
    affinity, confined = os.sched_getaffinity(0), local._confined_from
    session = Session(cfg)
    try:
        measurements = session.start_workers()
        exp = SitesExperiment(task="lu", benchmark=str(bench.directory), size="quick", runs=2,
                              max_pairs=2, half_width=0.01, timeout=30, perf=False, aslr=False,
                              worker_class=session.worker_classes[0],
                              compiler=session.builds.toolchain.identity)
        rd = SitesRundir.create(tmp_path / "labels-lu", exp, {})
        labeller = SiteLabeller(rd, bench, session.builds, measurements, threading.Event())
        labeller._reference([])
        h = labeller.heuristic
        candidates = [(u, r, n) for u, r, n in flippable(h, 0)
                      if u == "Matrix" and n.name == "Matrix.get" and n.action == "inline"
                      and n.key.startswith("D(Matrix.update@")]
        assert candidates, "lu's Matrix.update no longer inlines its call of Matrix.get"
        for u, r, n in candidates:
            d = flipped(u, r, n.key, n.name, n.decided)
            labeller._label(d, "alone", tree_with(h, [d]), labeller.reference, None)
        labels = [e for e in rd.events() if isinstance(e, LabelEvent)]
        unreached = [e for e in labels if e.outcome.status == "not_reached"]
        assert unreached, [e.outcome for e in labels]
        for e in unreached:
            assert e.outcome.runs == 0 and e.outcome.speedup is None
            assert "decided again" in (e.outcome.why or "")
        rd.close()
    finally:
        session.close()
        os.sched_setaffinity(0, affinity)
        local._confined_from = confined


def test_the_suite_process_kept_every_cpu():
    """Run after the test above in this process: a later test sees the CPUs it started with
    (a confined suite made every later worker test fail on "expected CPUs of this machine")."""
    assert os.sched_getaffinity(0) == ORIGINAL_AFFINITY


PLANTED = REPO / "tests" / "planted" / "grid"
GAIN = ("Main", 0, "C(Grid.update@main.ml:8:8-52)", "inline")  # the planted decision
IDLE = [("Main", 0, "C(Grid.make@main.ml:3:10-25)", "inline"),  # run once each
        ("Main", 0, "C(Grid.sum@main.ml:12:25-37)", "inline"),
        ("Grid", 0, "D(Grid.sum@grid.ml:25:8-46)/C(Stdlib__Array.fold_left@grid.ml:25:12-46)",
         "inline")]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_delta_debugging_finds_exactly_the_planted_decision_among_idle_ones(tmp_path):
    """A tree of four decisions, one of which (inlining Grid.update in the loop) makes the
    planted program about 3x faster: the minimal subset is exactly that one, it keeps the
    gain, and its labels say so.  Measured in cycles: what this asserts is delta debugging,
    not the clock, and counts do not depend on the machine's load (the timed version failed
    on a loaded CI machine, 22 of 24 runs disturbed); --retest measures the labels again in
    wall time, as a published label is."""
    cfg = config(tmp_path, tmp_path / "store")
    tree = tmp_path / "tree.sexp"
    tree.write_text("(inlining_overrides (version 1) (overrides\n" + "".join(
        f' ((unit {u}) (round {r}) (key "{k}") (action {a}))\n' for u, r, k, a in [*IDLE, GAIN])
        + "))\n")
    done = run("measure-sites", "--config", str(cfg), "--tree", f"{PLANTED}={tree}",
               "--runs", "2", "--max-pairs", "3", "--keep", "0.5", "--metric", "cycles",
               "--retest", "--size", "tiny", "--confirm-size", "quick",
               cwd=tmp_path)  # counted at tiny: seconds under cachegrind; not full: seconds a run
    assert done.returncode == 0, done.stderr
    rundir = SitesRundir(next(p for p in (tmp_path / "rundirs").iterdir()
                              if "-sites-" in p.name))
    assert rundir.experiment.metric == "cycles"
    events = rundir.events()
    winner = next(e for e in events if isinstance(e, WinnerEvent))
    found = [(d.unit, d.round, d.key, d.action) for d in winner.decisions]
    assert sorted(found) == sorted([*IDLE, GAIN]), found  # the heuristic took none of them
    minimal = next(e for e in events if isinstance(e, MinimalEvent))
    assert minimal.stopped == "minimal"
    assert [found[i] for i in minimal.subset] == [GAIN]
    assert minimal.kept.metric == "cycles" and minimal.kept.speedup > 1.3
    assert minimal.kept.ci95 == (minimal.kept.speedup, minimal.kept.speedup)  # exact
    labels = [e for e in events if isinstance(e, LabelEvent)]
    alone = next(e for e in labels if e.context == "alone" and e.site.key == GAIN[2]
                 and e.trial == "labels")
    assert alone.site.action == GAIN[3] and alone.outcome.status == "measured"
    assert {e.outcome.metric for e in labels if e.trial == "labels"} == {"cycles"}
    assert {e.outcome.metric for e in labels if e.trial == "retest"} == {"time"}
    table = pd.read_csv(tmp_path / "labels" / "grid" / "sites.csv")
    assert {"alone", "removed"} <= set(table["context"]) <= {"alone", "removed", "minimal"}
    assert set(table["metric"]) == {"cycles", "time"}
    report = (tmp_path / "labels" / "grid" / "report.txt").read_text()
    assert f"winner: {tree}; 4 decision(s)" in report, report


GOLDEN = REPO / "tests" / "golden" / "labels-v1"


def test_golden_labels_rundir_reads_round_trips_and_tabulates():
    """A labels rundir written by format version 1 (measure-sites attributing the planted
    program's search winner at full size): its records read, write out as they were read,
    and give the table and report they gave."""
    import json as json_module

    from analysis.labels import label_rows, report
    rd = SitesRundir(GOLDEN)
    assert rd.experiment.task == "grid" and rd.experiment.version == 1
    lines = [json_module.loads(x) for x in (GOLDEN / "journal.jsonl").read_text().splitlines()]
    events = rd.events()
    assert [e.to_json() for e in events] == lines
    minimal = next(e for e in events if isinstance(e, MinimalEvent))
    assert minimal.stopped == "minimal" and len(minimal.subset) == 1
    table = label_rows(GOLDEN)
    assert len(table) == sum(isinstance(e, LabelEvent) for e in events) == 4
    assert list(table["trial"]) == ["labels", "labels", "retest", "retest"]
    assert (table["callee_size"].notna()).all()  # features from reference/
    text = report([GOLDEN], table)
    assert text[0].startswith("winner: ") and "69 decision(s)" in text[0]
    assert text[1].startswith("minimal subset: 1 decision(s) after 9 test(s), stopped: minimal")


# -- the winner of a search stopped before its confirmation

def _journal(path: Path, steps: list[tuple[int, float, tuple[float, float]]], best: int,
             tail: list) -> Path:
    """A search journal: one candidate per step (speedup and interval as given), its best
    pointer at step ``best`` (0: the baseline), then ``tail`` (finish or confirm events)."""
    path.mkdir(parents=True)
    cands = {s: Candidate(candidate=0, dir=f"steps/{s:05d}/c0", mutation="flip",
                          sha256=f"{s:064x}", energy=1 / x, speedup=x, ci95=ci)
             for s, x, ci in steps}
    base = Pointer(step=0, candidate=0, dir="baseline", energy=1.0)
    events = [StepEvent(step=s, temperature=0.01, candidates=[cands[s]], chosen=0,
                        accepted=True, incumbent=base,
                        best=cands[best].pointer(best) if 0 < best <= s else base, rng=[])
              for s, _, _ in steps]
    with open(path / "journal.jsonl", "w") as f:
        for e in [*events, *tail]:
            f.write(e.model_dump_json() + "\n")
    return path


def test_a_search_stopped_before_confirming_gives_its_best_so_far_unconfirmed(tmp_path):
    steps = [(1, 1.02, (0.99, 1.05)), (2, 1.20, (1.15, 1.25)), (3, 1.01, (0.98, 1.04))]
    stopped = _journal(tmp_path / "stopped", steps, best=2,
                       tail=[FinishEvent(reason="interrupted")])
    got = confirmed_winner([stopped])
    assert got is not None and not got.confirmed and got.dir == "steps/00002/c0"
    assert got.speedup == 1.20 and got.ci95 == (1.15, 1.25)
    # a best whose own interval holds 1 is no winner, confirmed or not
    weak = _journal(tmp_path / "weak", [(1, 1.02, (0.99, 1.05))], best=1, tail=[])
    assert confirmed_winner([weak]) is None
    # a search that completed without a confirmation (the heuristic stayed best, or
    # confirm: false) offers nothing
    done = _journal(tmp_path / "done", steps, best=2, tail=[FinishEvent(reason="completed")])
    assert confirmed_winner([done]) is None
    # a confirmation anywhere wins over any unconfirmed best, even a higher one
    confirmed = _journal(tmp_path / "confirmed", [(1, 1.05, (1.01, 1.09))], best=1, tail=[
        ConfirmEvent(step=1, candidate=0, dir="steps/00001/c0", times=[1.0],
                     reference_times=[1.04], speedup=1.04, ci95=(1.01, 1.07),
                     significant=True), FinishEvent(reason="completed")])
    got = confirmed_winner([stopped, confirmed])
    assert got is not None and got.confirmed and got.speedup == 1.04
    # a confirmation that found nothing: that search offers nothing, the stopped one does
    refuted = _journal(tmp_path / "refuted", [(1, 1.30, (1.2, 1.4))], best=1, tail=[
        ConfirmEvent(step=1, candidate=0, dir="steps/00001/c0", times=[1.0],
                     reference_times=[1.0], speedup=1.0, ci95=(0.97, 1.03),
                     significant=False), FinishEvent(reason="completed")])
    got = confirmed_winner([refuted, stopped])
    assert got is not None and got.rundir == str(stopped.resolve()) and not got.confirmed


class _CountedJournal:
    """A sites rundir's journal in memory, counting how often it is read whole."""

    def __init__(self, experiment, events):
        self.experiment, self._events, self.reads = experiment, events, 0
        self.path = Path("r")

    def events(self):
        self.reads += 1
        return list(self._events)


def _retest_reads(labels: int) -> tuple[int, int]:
    """(journal reads, labels retested) of a retest of ``labels`` labels in the winner's
    contexts ("minimal" and "removed"), the builds and measurements stood in for."""
    import threading
    from types import SimpleNamespace

    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.core.site_records import SitesExperiment
    from dispatcher.labels.procedure import SiteLabeller
    exp = SitesExperiment(task="grid", benchmark=str(REPO / "tests" / "planted" / "grid"),
                          size="tiny", runs=2, max_pairs=2, half_width=0.01, timeout=30,
                          perf=False, aslr=False, worker_class="local", compiler="c",
                          retest=True)
    decisions = [SiteDecision(unit="Main", round=0, key=f"C(Main.f{i}@m.ml:{i + 1}:0-9)",
                              callee=f"Main.f{i}", action="inline", heuristic="dont_inline")
                 for i in range(labels)]
    measured = Paired(status="measured", speedup=1.1, ci95=(1.05, 1.15), pairs=4)
    events = [WinnerEvent(rundir="w", dir="c", decisions=decisions),
              MinimalEvent(subset=list(range(labels)), tests=1, stopped="minimal",
                           full=measured, kept=measured),
              *[LabelEvent(site=d, context="minimal" if i % 2 else "removed", decision=i,
                           outcome=measured) for i, d in enumerate(decisions)]]
    journal = _CountedJournal(exp, events)
    lab = SiteLabeller(journal, resolve_benchmark(  # type: ignore[arg-type]
        str(REPO / "tests" / "planted" / "grid")), None, None,  # type: ignore[arg-type]
        threading.Event())
    lab.heuristic, lab.reference = Tree(), None  # type: ignore[assignment]
    retested: list[str] = []
    lab._build = lambda overrides: SimpleNamespace(artifact=None)  # type: ignore
    lab._label = lambda site, *a, **k: retested.append(site.key)  # type: ignore
    lab._retest()
    return journal.reads, len(retested)


def test_a_retest_reads_the_journal_a_fixed_number_of_times_whatever_its_labels():
    """The retest asks for the minimal subset per label in a winner's context: read from the
    journal once, not per label (which made measure-sites quadratic in its labels)."""
    few, many = _retest_reads(2), _retest_reads(12)
    assert few[1] == 2 and many[1] == 12
    assert many[0] == few[0] <= 3, (few, many)
