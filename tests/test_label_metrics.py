"""Labels carry both metrics (issue 34, item 6), and the metric bookkeeping around them.

A label's cycles effect beside its wall effect: the records (``Paired.cycles``, the labels
experiment's ``cycles_size``, absent in older rundirs), the table's ``cycles_effect`` column
(older tables read as before), the labeller counting a timed label's binaries, and
``train-policy --require-sign-agreement``; the batch-log CSV's ``metric`` column; and
``assign-rewards`` refusing to fit one benchmark's candidates measured in two metrics.  All in
process and without the clock, but one end-to-end ``measure-sites`` on the planted program at
its tiny size (cachegrind)."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.label_training import (
    CYCLES_ZERO,
    label_sites,
    read_sites_table,
    row_label,
    signs_agree,
)
from analysis.labels import label_rows, report, write_table
from dispatcher.core.comparison import Comparison
from dispatcher.core.decisions import Features
from dispatcher.core.site_records import (
    LabelEvent,
    Paired,
    SiteDecision,
    SitesExperiment,
)
from tests.helpers import (
    FASTER,
    GOLDEN_LABELS,
    NOTHING,
    REPO,
    SLOWER,
    invoke,
    one_line_error,
    synthetic_candidates,
)
from tests.helpers import (
    PLANTED_GRID as PLANTED,
)


def row(effect=0.05, low=0.03, high=0.07, cycles=None, metric=None, action="inline", **rest):
    """A measured alone row as the labelling reads it."""
    r = {"unit": "Main", "round": 0, "key": "C(Main.f@m.ml:1:0-9)", "context": "alone",
         "action": action, "status": "measured", "effect": effect, "low": low, "high": high,
         "trial": "labels", "heuristic_action": "dont_inline", **rest}
    if cycles is not None:
        r["cycles_effect"] = cycles
    if metric is not None:
        r["metric"] = metric
    return r


# -- the rule ------------------------------------------------------------------------------

def test_sign_agreement_keeps_a_wall_label_only_beside_a_cycles_effect_of_its_sign():
    t = 0.01
    assert row_label(row(**FASTER, cycles=0.02), t, agreement=True) == "inline"
    assert row_label(row(**SLOWER, cycles=-0.3), t, agreement=True) == "dont_inline"
    # the other sign, no counted change (code layout), no count at all: nothing
    assert row_label(row(**FASTER, cycles=-0.02), t, agreement=True) is None
    assert row_label(row(**FASTER, cycles=CYCLES_ZERO / 2), t, agreement=True) is None
    assert row_label(row(**FASTER, cycles=math.nan), t, agreement=True) is None
    assert row_label(row(**FASTER), t, agreement=True) is None
    # without the option, as ever
    assert row_label(row(**FASTER, cycles=-0.02), t) == "inline"
    # a wall effect that is not significant, or within the threshold, has no sign to agree
    # with: default, whatever the cycles say
    assert row_label(row(**NOTHING, cycles=0.2), t, agreement=True) == "default"
    assert row_label(row(effect=0.008, low=0.002, high=0.014, cycles=-0.1), t,
                     agreement=True) == "default"
    # a row in an exact metric says nothing by itself: its wall figure is its retest's
    assert row_label(row(**FASTER, cycles=0.05, metric="cycles"), t, agreement=True) is None
    assert row_label(row(**FASTER, cycles=0.05, metric="cycles"), t) == "inline"
    assert signs_agree(row(**FASTER, cycles=0.05, metric="time"), t)


def test_label_sites_sets_aside_disagreeing_rows_and_an_exact_label_rests_on_its_retest():
    t = 0.01
    other = {"key": "C(Main.g@m.ml:2:0-9)"}
    third = {"key": "C(Main.h@m.ml:3:0-9)"}
    table = pd.DataFrame([
        row(**FASTER, cycles=0.04),  # f: agrees
        row(**FASTER, cycles=0.04, trial="retest"),
        row(**FASTER, cycles=-0.01, **other),  # g: disagrees in both replicates
        row(**FASTER, cycles=-0.01, trial="retest", **other),
        row(**FASTER, cycles=0.03, metric="cycles", **third),  # h: exact, retest in time
        row(**SLOWER, cycles=0.03, metric="time", trial="retest", **third),
    ]).assign(**featured(0))
    plain, left = label_sites(table, t)
    assert dict(zip(plain["key"], plain["label"])) == {
        "C(Main.f@m.ml:1:0-9)": "inline", "C(Main.g@m.ml:2:0-9)": "inline",
        "C(Main.h@m.ml:3:0-9)": "default"}  # its replicates disagree
    assert left == {"unmeasured": 0, "featureless": 0}  # the key only with the option
    agreed, left = label_sites(table, t, agreement=True)
    assert dict(zip(agreed["key"], agreed["label"])) == {"C(Main.f@m.ml:1:0-9)": "inline"}
    # g's rows and h's timed retest (slower in time, fewer cycles) are set aside; h's exact
    # row says nothing by itself, and is not counted among them
    assert left == {"unmeasured": 2, "featureless": 0, "disagree": 3}


# -- the records and the table --------------------------------------------------------------

def test_cycles_fields_are_later_fields_and_the_table_carries_them(tmp_path):
    """An older labels rundir reads, writes and tabulates as it did (no cycles_size, no
    cycles in its outcomes: the column empty); a label journaled with its cycles effect gives
    cycles_effect and cycles_size, and the report shows it."""
    rundir = tmp_path / "labels"
    shutil.copytree(GOLDEN_LABELS, rundir)
    exp = json.loads((rundir / "experiment.json").read_text())
    assert "cycles_size" not in exp
    loaded = SitesExperiment.from_json(exp)
    assert loaded.cycles_size is None and "cycles_size" not in loaded.to_json()
    before = label_rows(rundir)
    assert before["cycles_effect"].isna().all() and before["cycles_size"].isna().all()
    assert Paired(status="measured", speedup=1.1).to_json().get("cycles", "absent") == "absent"

    (rundir / "experiment.json").write_text(json.dumps({**exp, "cycles_size": "tiny"}))
    from dispatcher.core.rundir import SitesRundir
    rd = SitesRundir(rundir)
    site = SiteDecision(unit="Main", round=0, key="C(Grid.update@main.ml:8:8-52)",
                        callee="Grid.update", action="inline", heuristic="dont_inline")
    outcome = Paired(status="measured", speedup=1.5, ci95=(1.4, 1.6), pairs=4, runs=8,
                     cycles=2.0)
    assert outcome.to_json()["cycles"] == 2.0
    rd.append(LabelEvent(site=site, context="alone", trial="labels", outcome=outcome))
    rd.close()
    table = label_rows(rundir)
    last = table.iloc[-1]
    assert last["cycles_effect"] == pytest.approx(math.log(2.0))
    assert last["cycles_size"] == "tiny" and last["metric"] == "time"
    assert table.iloc[:-1]["cycles_effect"].isna().all()
    lines = report([rundir], table)
    assert any("Grid.update" in x and "cycles +100.00%" in x for x in lines), lines
    # written and read back (CSV and parquet): a number where counted, empty elsewhere
    write_table(table, tmp_path / "out")
    for name in ("sites.csv", "sites.parquet"):
        back = read_sites_table(tmp_path / "out" / name)
        assert back["cycles_effect"].iloc[-1] == pytest.approx(math.log(2.0))
        assert back["cycles_effect"].iloc[:-1].isna().all()


def test_a_cycles_effect_that_is_not_a_number_is_one_line(tmp_path):
    from analysis.label_training import LabelsError
    table = pd.DataFrame([{**row(**FASTER), **featured(0), "cycles_effect": "fast"}])
    table.to_csv(tmp_path / "sites.csv", index=False)
    with pytest.raises(LabelsError, match=r"row 1: cycles_effect 'fast': expected a number"):
        read_sites_table(tmp_path / "sites.csv")


# -- the labeller --------------------------------------------------------------------------

class _Rundir:
    def __init__(self, experiment):
        self.experiment = experiment
        self.path = Path("/nonexistent")


class _Slot:
    worker_class = "local"


class _Measurements:
    """compare() answers a counted comparison of the two jobs, and records what it asked."""

    def __init__(self, ratio, metric="cycles", reused=False):
        self.ratio, self.metric, self.reused = ratio, metric, reused
        self.asked = []
        self.scheduler = type("S", (), {"slots": [_Slot()]})()

    def compare(self, reference, candidate, worker_class, policy, metric="time", **_):
        self.asked.append((reference.args, candidate.args, metric))
        done: Future = Future()
        done.set_result(Comparison(worker="w", reference_times=[self.ratio * 100.0],
                                   candidate_times=[100.0], results=[], stopped="exact",
                                   min_pairs=1, metric=self.metric, reused=self.reused))
        return done


def labeller(metric="time", cycles_size="tiny", measurements=None):
    import threading

    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.labels.procedure import SiteLabeller
    exp = SitesExperiment(task="grid", benchmark=str(PLANTED), size="quick", runs=2,
                          max_pairs=3, half_width=0.01, timeout=30, perf=False, aslr=False,
                          worker_class="local", compiler="c", metric=metric,
                          cycles_size=cycles_size)
    return SiteLabeller(_Rundir(exp), resolve_benchmark(str(PLANTED)), None,  # type: ignore
                        measurements or _Measurements(1.25), threading.Event())  # type: ignore[arg-type]


def test_a_timed_label_gets_its_binaries_counted_at_the_cycles_size():
    # the store's artifacts: only their sha256 and binary are read here
    art = [type("A", (), {"sha256": k, "binary": Path(f"/b/{k}")})() for k in ("r", "t")]
    timed = Paired(status="measured", speedup=1.1, ci95=(1.05, 1.15), pairs=4, cpu_s=3.0)
    m = _Measurements(1.25)
    lab = labeller(measurements=m)
    got = lab._with_cycles(timed, art[1], art[0])
    assert got.cycles == pytest.approx(1.25) and got.speedup == 1.1 and got.metric == "time"
    assert m.asked == [(("40",), ("40",), "cycles")]  # grid's tiny size, counted
    # not measured, or a rundir that counts nothing: as it was, nothing asked
    for outcome, lab2 in ((Paired(status="same_binary"), labeller()),
                          (timed, labeller(cycles_size=None))):
        assert lab2._with_cycles(outcome, art[1], art[0]) == outcome
    lab3 = labeller()
    lab3.count_cycles = False  # the workers cannot count (a resume on another machine)
    assert lab3._with_cycles(timed, art[1], art[0]).cycles is None
    # an exact label at its own size is its own cycles effect: nothing asked
    m4 = _Measurements(9.0)
    exact = Paired(status="measured", speedup=1.3, ci95=(1.3, 1.3), pairs=1, metric="cycles")
    lab4 = labeller(metric="cycles", cycles_size="quick", measurements=m4)
    assert lab4._with_cycles(exact, art[1], art[0]).cycles == 1.3 and not m4.asked
    # a binary that is not deterministic falls back to time there: no cycles effect
    lab5 = labeller(measurements=_Measurements(1.25, metric="time"))
    assert lab5._with_cycles(timed, art[1], art[0]).cycles is None


# -- train-policy --require-sign-agreement --------------------------------------------------

def featured(i: int) -> dict:
    f = Features(round=0, depth=0, args=1, known_args=i % 2, callee_size=5 + 10 * i,
                 threshold=10, toplevel=False, branch_depth=0, recursive=False,
                 self_call=False, in_loop=bool(i % 2), in_recursive_function=False,
                 via_stub=False, inline_attribute="default", inlined_attribute="default",
                 specialise_attribute="default", specialised_attribute="default").row()
    f.pop("round")
    return f


def labels_tables(root: Path, cycles: bool = True) -> None:
    """Two benchmarks of eight sites each: even sites faster inlined, odd ones slower; the
    cycles agree at sites 0-3 and disagree (or are zero) at 4-7."""
    for bench in ("a", "b"):
        rows = []
        for i in range(8):
            effect = FASTER if i % 2 == 0 else SLOWER
            c = (0.03 if i % 2 == 0 else -0.03) if i < 4 else (0.0 if i == 4 else
                                                                -effect["effect"])
            r = {"benchmark": bench, "unit": "Main", "round": 0,
                 "key": f"C(Main.f{i}@m.ml:{i + 1}:0-9)", "callee": f"Main.f{i}",
                 "location": "", "heuristic_action": "dont_inline",
                 "heuristic_reason": "heuristic", **featured(i), "action": "inline",
                 "context": "alone", "status": "measured", **effect,
                 "speedup": math.exp(effect["effect"]), "pairs": 6, "trial": "labels",
                 "metric": "time"}
            if cycles:
                r["cycles_effect"] = c
            rows.append(r)
        (root / bench).mkdir(parents=True)
        pd.DataFrame(rows).to_csv(root / bench / "sites.csv", index=False)


def test_train_policy_requires_sign_agreement_and_says_what_it_set_aside(tmp_path):
    labels = tmp_path / "labels"
    labels_tables(labels)
    out = tmp_path / "p.policy"
    plain = invoke("train-policy", "--labels", str(labels), "--classifier", "logistic",
                   "--out", str(out))
    assert plain.exit_code == 0, plain.output
    assert "16 call sites from 2 benchmark(s): 8 inline, 8 dont_inline, 0 default" in \
        plain.stdout
    agreed = invoke("train-policy", "--labels", str(labels), "--classifier", "logistic",
                    "--out", str(out), "--require-sign-agreement")
    assert agreed.exit_code == 0, agreed.output
    (line,) = [x for x in agreed.stdout.splitlines() if x.startswith("labels a: ")]
    assert line == ("labels a: 8 rows, 8 measured; 4 sites labelled (2 inline, 2 dont_inline, "
                    "0 default), 4 without a measured row left out; 4 measured row(s) set "
                    "aside: a significant wall effect without a cycles effect of its sign")
    assert "8 call sites from 2 benchmark(s): 4 inline, 4 dont_inline, 0 default" in \
        agreed.stdout


def test_sign_agreement_refuses_what_it_cannot_judge_in_one_line(tmp_path):
    old = tmp_path / "old"
    labels_tables(old, cycles=False)  # a table from before the column
    r = invoke("train-policy", "--labels", str(old), "--out", str(tmp_path / "p.policy"),
               "--require-sign-agreement")
    line = one_line_error(r)
    assert r.exit_code == 2 and "no cycles_effect column" in line, line
    # without the option the old table trains as before
    assert invoke("train-policy", "--labels", str(old), "--classifier", "logistic",
                  "--out", str(tmp_path / "p.policy")).exit_code == 0
    r = invoke("train-policy", "--rewards", str(tmp_path / "rewards"), "--out",
               str(tmp_path / "p.policy"), "--require-sign-agreement")
    assert r.exit_code == 2 and "only with --labels" in one_line_error(r)


# -- batch-log's CSV and assign-rewards' metric ---------------------------------------------

def test_batch_log_csv_ends_with_the_metric_column(tmp_path, capsys):
    from analysis.batch_log import COLUMNS, print_csv, summaries
    from dispatcher.core.records import BatchEntry
    rundir = tmp_path / "grid-sites"
    shutil.copytree(GOLDEN_LABELS, rundir)
    exp = json.loads((rundir / "experiment.json").read_text())
    exact = tmp_path / "grid-sites-exact"
    shutil.copytree(GOLDEN_LABELS, exact)
    (exact / "experiment.json").write_text(json.dumps({**exp, "metric": "cycles"}))
    journal = (exact / "journal.jsonl").read_text().splitlines()
    start = json.loads(journal[0])
    assert start["event"] == "start"
    (exact / "journal.jsonl").write_text("\n".join(
        [json.dumps({**start, "metric": "cycles"}), *journal[1:]]) + "\n")
    listed = [(BatchEntry(task="grid", rundir=str(p), algorithm="sites"), p)
              for p in (rundir, exact)]
    print_csv(summaries(listed))
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert COLUMNS[-1] == "metric" and list(rows[0])[-1] == "metric"
    assert [r["metric"] for r in rows] == ["time", "cycles"]


def test_assign_rewards_fits_one_metric_per_benchmark(tmp_path):
    from pipeline.rewards import fit_each, metrics_of, mixed_metrics
    timed = synthetic_candidates(30)
    timed.table["metric"] = "time"
    assert mixed_metrics("synthetic", timed) is None
    assert set(metrics_of(timed)) == {"time"}
    mixed = synthetic_candidates(30)
    mixed.table["metric"] = ["cycles" if c == "chain0" else "time"
                             for c in mixed.table["chain"]]
    why = mixed_metrics("synthetic", mixed)
    assert why is not None and "\n" not in why
    assert why.startswith("synthetic: its rundirs measured candidates in cycles and time "
                          "(in cycles: chain0; in time: chain1, chain2)"), why
    (fitted,) = list(fit_each({"synthetic": mixed}, [], 0, 0, tmp_path, 0.0, 1))
    assert fitted.error == why and fitted.result is None


# -- end to end ----------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_measure_sites_in_time_gives_each_label_its_cycles_effect(tmp_path, compiler):
    """The planted program's hottest site swept in wall time: the workers are asked whether
    they count, the rundir records the tiny size, and the label carries its cycles effect
    (the planted inlining executes far fewer cycles) beside its wall figure."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "store": str(tmp_path / "store"), "local": {"cpus": [min(os.sched_getaffinity(0))]},
        "run": {"runs": 2, "timeout": 30, "size": "quick"},
        "measure": {"max_pairs": 2, "canary_every": 0},
        "search": {"rundirs": str(tmp_path / "rundirs"),
                   "batch_log": str(tmp_path / "batch.log")}}))
    (tmp_path / "tasks").write_text(f"{PLANTED}\n")
    done = subprocess.run(
        [sys.executable, "-m", "commands", "measure-sites", "--config", str(cfg), "--tasks",
         str(tmp_path / "tasks"), "--sweep", "1"], cwd=tmp_path, capture_output=True,
        text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    from dispatcher.core.rundir import SitesRundir
    rundir = SitesRundir(next((tmp_path / "rundirs").iterdir()))
    assert rundir.experiment.cycles_size == "tiny" and rundir.experiment.metric == "time"
    labels = [e for e in rundir.events() if isinstance(e, LabelEvent)]
    assert labels and all(e.outcome.cycles for e in labels if e.outcome.measured)
    table = pd.read_csv(tmp_path / "labels" / "grid" / "sites.csv")
    measured = table[table["status"] == "measured"]
    assert len(measured) and measured["cycles_effect"].notna().all()
    assert set(measured["cycles_size"]) == {"tiny"} and set(measured["metric"]) == {"time"}
